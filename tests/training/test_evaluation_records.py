"""What `evaluate` and `select` hand to the orchestrator: a summary.json and a selection.json as the
trials wrote them (literals taken from real homes) read back into their models and dumped to the
same JSON — keys, values and each number's type — and to the same bytes."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from evidence.canonical import json_bytes
from training.evaluate import EvaluationSummary
from training.select import Selection

# bench/results/2026-12-02-share-gpus-1xh200/local-training-windows/home/evaluations/test/ddp-four/attempt-1/
SUMMARY = """{
  "accuracy": 0.111328125,
  "arm": "ddp-four",
  "attempt": 1,
  "cases": 1024,
  "correct": 114,
  "max_new_tokens": 128,
  "model_receipt": "2dd16d6671b20baf162b7b8f06900bfa444997606b5463cae3b936184a1f48d2",
  "probe_mean_loss": 0.12344730794109308,
  "retry_reason": null,
  "role": "test",
  "scoring": {
    "batch": 128,
    "cases_per_second": 54.342473040717444,
    "device": "cuda:0",
    "generated_tokens": 31222,
    "generated_tokens_per_second": 1656.9147395285938,
    "generation_dtype": "float32",
    "generation_seconds": 18.843456005999997,
    "load_seconds": 1.0129615159999048,
    "probe_seconds": 4.316204923999976
  },
  "seconds": 24.204440741999974
}
"""

# trials/local-training-windows-smoke/selection.json (every arm ran)
SELECTION = """{
  "baseline": "seed",
  "candidates": {
    "ddp-four": "1552a7098a75c2d4054217580b4ef902f2f02700ef7a06bda90d988e3dc64e7a",
    "diloco-four": "84fc8ea93692d5b59fc83daeb66217ed7e1d207c179e718eb272356b1bb5b4f5",
    "single": "6edf272d410c2171d76dff27aa7d00fc9f73ccb14c60c3e44e8214a77b953717"
  },
  "candidates_sha256": "526e4f8d435a60169851529da64df7827f804f7869ac674d44f1557b8012a7f2",
  "experiment": "local-training-windows",
  "primary": "diloco-four",
  "profile": "smoke",
  "rule": "the primary arm is fixed by the experiment's acceptance rules, never by a score",
  "serving": "diloco-four"
}
"""

# bench/results/2026-12-01-gpu-135m-1xh200/cooperative-learning/selection.json (an arm not run)
SELECTION_NOT_RUN = """{
  "baseline": "seed",
  "candidates": {
    "clean-single": "b76c9924c1ae2d6dd74e52888ad440aa313fb8e20ddcac0cc56d7c58858b75c3",
    "damaged-single": "71d942b2c42fd4d81073471ea2a9f82da38c9cdafc1a4871480486049f982c43"
  },
  "candidates_sha256": "eeea9a469171bb075bf9e352485f79131edc4d64f060ba828bca7dadf0e86a8e",
  "experiment": "cooperative-learning",
  "not_run": {
    "clean-pair": "not run: needs 2 GPUs, the cluster has 1"
  },
  "primary": "clean-single",
  "profile": "gpu-135m",
  "rule": "the primary arm is fixed by the experiment's acceptance rules, never by a score",
  "serving": "clean-pair"
}
"""


def typed(o):
    """The JSON with each number's type beside it: 1 and 1.0 differ here."""
    if isinstance(o, dict):
        return {k: typed(v) for k, v in o.items()}
    if isinstance(o, list):
        return [typed(v) for v in o]
    return (type(o).__name__, o)


@pytest.mark.parametrize("model,text", [(EvaluationSummary, SUMMARY), (Selection, SELECTION),
                                        (Selection, SELECTION_NOT_RUN)], ids=["summary", "selection", "not-run"])
def test_a_written_record_dumps_back_to_itself(model, text):
    data = json.loads(text)
    dumped = model.model_validate(data).model_dump(mode="json")
    assert typed(dumped) == typed(data)
    assert json_bytes(dumped) == text.encode()  # what write_json_atomic writes: the file's bytes


def test_the_summary_is_printed_in_the_order_it_was_built():
    """`training evaluate` prints the summary unsorted: its keys in the order `evaluate` has always built them."""
    s = EvaluationSummary.model_validate(json.loads(SUMMARY))
    assert list(s.model_dump(mode="json")) == ["arm", "role", "attempt", "model_receipt", "cases", "correct",
                                               "accuracy", "probe_mean_loss", "max_new_tokens", "seconds",
                                               "scoring", "retry_reason"]
    assert list(s.model_dump(mode="json")["scoring"]) == [
        "device", "batch", "generation_dtype", "generation_seconds", "generated_tokens", "cases_per_second",
        "generated_tokens_per_second", "probe_seconds", "load_seconds"]


def test_optional_parts_stay_absent():
    """A selection where every arm ran has no `not_run` key; a summary written before its scoring figures
    were kept has no `scoring` key — read and dumped, neither gains one."""
    sel = Selection.model_validate(json.loads(SELECTION))
    assert sel.not_run == {} and "not_run" not in sel.model_dump(mode="json")
    old = {k: v for k, v in json.loads(SUMMARY).items() if k != "scoring"}
    s = EvaluationSummary.model_validate(old)
    assert s.scoring is None and s.model_dump(mode="json") == old


def test_the_failures_follow_the_accuracy_and_dump_back():
    """A summary that keeps its wrong answers by reason (`failures`) has them after `accuracy`, as built, and
    reads and dumps back to itself."""
    data = json.loads(SUMMARY) | {"failures": {"malformed_json": 900, "wrong_value:skus": 10}}
    dumped = EvaluationSummary.model_validate(data).model_dump(mode="json")
    assert list(dumped)[5:9] == ["correct", "accuracy", "failures", "probe_mean_loss"]
    assert typed(dumped) == typed(data)


def test_a_printout_that_is_no_summary_is_refused():
    """What a host printed is validated (orchestrate/backends/ssh.py): a missing or unknown key is a
    ValueError, as a printout that is not JSON at all is."""
    data = json.loads(SUMMARY)
    with pytest.raises(ValidationError):
        EvaluationSummary.model_validate({k: v for k, v in data.items() if k != "correct"})
    with pytest.raises(ValueError):
        EvaluationSummary.model_validate(data | {"extra": 1})
