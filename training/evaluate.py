"""`evaluate --role dev|test --arm A`: greedy answers to every case, strictly checked, plus the
retention probes' response loss — each attempt kept, none silently replaced.

    evaluations/<role>/<arm>/attempt-<n>/started.json    written first: a crashed attempt stays visible
    evaluations/<role>/<arm>/attempt-<n>/answers.jsonl   every raw answer with its verdict (`answer_record`)
    evaluations/<role>/<arm>/attempt-<n>/probes.jsonl    response loss (nats per target token) per probe
    evaluations/<role>/<arm>/attempt-<n>/summary.json
    evaluations/<role>/<arm>/attempt-<n>/receipt.json    then committed as '<role>-evaluation'

Scoring needs a committed selection (dev included: it scores the complete selection, never an
intermediate checkpoint). A second attempt for the same role and arm needs `retry_reason`, which is
recorded. The model is verified against the receipt the selection names (the seed arm: against the
receipt prepare used) before it is loaded.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from evidence.attempts import attempts, next_attempt
from evidence.canonical import read_json, write_json_atomic
from evidence.checker import Verdict, check_answer, failure_counts
from evidence.commitments import CommitmentLog
from evidence.inputs import user_id
from evidence.receipts import make_receipt
from training.corpus import Corpus
from training.errors import TrainError
from training.heap import long_lived
from training.prepare import load_cases, require_prepared
from training.seed import load_tokenizer, quiet_libraries, verify_seed


class Scoring(BaseModel):
    """How an attempt was scored, and how fast: generated tokens count each answer up to and including
    its end token (padding after a row's end is not counted); probes are scored in FP32. A speed is
    None when generation took no measurable time."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    device: str
    batch: int
    generation_dtype: str
    generation_seconds: float
    generated_tokens: int
    cases_per_second: float | None
    generated_tokens_per_second: float | None
    probe_seconds: float
    load_seconds: float


class EvaluationSummary(BaseModel):
    """An attempt in figures: `summary.json` (`model_dump(mode="json")`, in this order — the order
    `training evaluate` prints), what a backend's `evaluate` returns and the run record's `scoring`
    entry is taken from. A summary written before its scoring figures were kept has none (no key).
    Counts are ints; every float here is a quotient or a clock reading, never a whole number stored
    as an int, so no figure changes type on its way through."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    arm: str
    role: Literal["dev", "test"]
    attempt: int
    model_receipt: str  # the receipt digest of the model scored
    cases: int
    correct: int
    accuracy: float
    # the wrong answers by the checker's reason ({"malformed_json": 3, "wrong_value:total": 2}; {} when none
    # is wrong): the report's breakdown of why answers failed. A summary written before it was kept has
    # none (no key), and the report of its home shows no breakdown, as before
    failures: dict[str, int] | None = Field(default=None, exclude_if=lambda v: v is None)
    probe_mean_loss: float  # retention probes' response loss, nats per target token
    max_new_tokens: int
    seconds: float
    scoring: Scoring | None = Field(default=None, exclude_if=lambda v: v is None)
    retry_reason: str | None


def answer_record(case: dict[str, Any], text: str, token_ids: list[int], verdict: Verdict) -> dict[str, Any]:
    """One line of answers.jsonl: the case, the raw answer (its text and tokens) and the checker's verdict;
    and `id`, the id the user's task file gave the case, only where it gave one — a generated case's
    record, or one of a line without an id, is what it always was."""
    row = {"case_id": case["case_id"], "family": case["family"], "heldout_variant": case["heldout_variant"],
           "text": text, "token_ids": token_ids, **verdict.as_dict()}
    uid = user_id(case)
    if uid is not None:
        row["id"] = uid
    return row


def attempts_dir(home: Path, role: str, arm: str) -> Path:
    return home / "evaluations" / role / arm


def model_dir_for(home: Path, arm: str, selection: dict[str, Any], seed_dir: Path | None,
               prepared: dict[str, Any]) -> tuple[Path, str]:
    if arm == selection["baseline"]:
        if seed_dir is None:
            raise TrainError(f"evaluating the seed arm '{arm}' needs --model-dir (the seed prepare used)")
        receipt = verify_seed(seed_dir)
        if receipt["digest"] != prepared["model"]["receipt_digest"]:
            raise TrainError(f"{seed_dir} is not the seed these inputs were prepared with")
        return seed_dir, receipt["digest"]
    if arm not in selection["candidates"]:
        raise TrainError(f"arm '{arm}' is not in the committed selection "
                         f"({', '.join([selection['baseline'], *selection['candidates']])})")
    d = home / "runs" / arm / "model"
    receipt = verify_seed(d)  # same layout as a seed: every file re-hashed against receipt.json
    if receipt["digest"] != selection["candidates"][arm]:
        raise TrainError(f"{d} has receipt {receipt['digest']}, the selection names "
                         f"{selection['candidates'][arm]}")
    return d, receipt["digest"]


def prompt_text(tok: Any, case: dict[str, Any]) -> str:
    """The case's prompt as the model sees it: one user turn and the generation prompt."""
    return tok.apply_chat_template([{"role": "user", "content": case["prompt"]}], tokenize=False,
                                   add_generation_prompt=True)


def generation_budget(tok: Any, cases: Any) -> int:
    """max_new_tokens: twice the longest reference answer of these cases, plus 8 — room for a wrong
    answer to be wrong at length without letting a runaway answer run forever."""
    return 2 * max(len(tok(json.dumps(c["answer"]), add_special_tokens=False)["input_ids"])
                   for c in cases) + 8


def eos_ids(model: Any, tok: Any) -> set[int]:
    """Every token that ends an answer: the generation config's (one or a list) and the tokenizer's."""
    ids = model.generation_config.eos_token_id
    ids = set(ids if isinstance(ids, (list, tuple)) else [] if ids is None else [ids])
    return ids | ({tok.eos_token_id} if tok.eos_token_id is not None else set())


def answer_tokens(seq: Any, eos: set[int]) -> list[int]:
    """A generated row up to and including its first end token: what one-at-a-time generation returns
    (a batched row continues with padding once it has ended)."""
    out = []
    for t in (int(x) for x in seq):
        out.append(t)
        if t in eos:
            break
    return out


def generate_answers(model: Any, tok: Any, cases: list[dict[str, Any]], *, batch: int, max_new_tokens: int,
                     device: Any, autocast_dtype: Any = None, after: Any = None) -> list[list[int]]:
    """Greedy answers to `cases`, `batch` prompts at a time, in the cases' order.

    Prompts are left-padded and masked; `generate` derives each row's positions from the mask
    (cumulative sum − 1), so a padded row sees the positions and keys its prompt has alone: in exact
    arithmetic batching changes nothing. What can differ is rounding, since another batch shape may
    pick other kernels; tests/training/test_scoring.py checks token-for-token equality with one-at-a-time
    generation on CPU in FP32, and bench/scoring_bench.py measures it on the GPU for each dtype.
    `autocast_dtype` (CUDA only) runs generation's matmuls in that dtype. `after(done)` is called
    after each batch with the number of cases answered."""
    import torch  # start-up: ~1.5 s; orchestrate reads this module on every command

    tok.padding_side = "left"
    if tok.pad_token_id is None:  # a tokenizer saved without one (transformers 5.17 drops it): pad with
        tok.pad_token = tok.eos_token  # the end token; the mask hides padding, so the answers do not change
    pad = tok.pad_token_id
    eos = eos_ids(model, tok)
    cast = (torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype is not None and device.type == "cuda"
            else contextlib.nullcontext())
    out: list[list[int]] = []
    for i in range(0, len(cases), batch):
        chunk = cases[i:i + batch]
        enc = tok([prompt_text(tok, c) for c in chunk], add_special_tokens=False, return_tensors="pt",
                  padding=True).to(device)
        with torch.no_grad(), cast:
            # stop at any end token the answer would stop at: a seed saved without <|im_end|> in its
            # generation config otherwise runs every row to max_new_tokens (the answers are the same)
            gen = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad,
                                 eos_token_id=sorted(eos))
        out += [answer_tokens(seq, eos) for seq in gen[:, enc["input_ids"].shape[1]:].tolist()]
        if after is not None:
            after(len(out))
    return out


def scoring_settings(prepared: dict[str, Any]) -> tuple[int, str]:
    """(cases per generation batch, generation dtype) as the committed profile says; homes prepared
    before these settings existed score as they did then (16, FP32)."""
    prof = prepared["experiment"]["profile"]
    return int(prof.get("score_batch", 16)), str(prof.get("score_dtype", "float32"))


def evaluate(home: str | os.PathLike[str], arm: str, role: str, *, seed_dir: Path | None = None,
             retry_reason: str | None = None, batch: int | None = None,
             say=lambda m: None) -> EvaluationSummary:
    """Score `arm` on every case of `role`; `batch` overrides the profile's `score_batch` (benchmarks)."""
    with long_lived():  # loaded once, kept to the end: out of the collector's sight (training/heap.py)
        # torch here, not at the top: orchestrate reads this module on every command, and here it loads
        # with no collector passes
        import torch

        from training.objective import WeightedResponseLoss, collate

    home = Path(home)
    if role not in ("dev", "test"):
        raise TrainError("--role is dev or test")
    prepared = require_prepared(home)
    log = CommitmentLog(home)
    log.require("selection", "selection.json")  # raises, naming the missing stage
    selection = read_json(home / "selection.json")
    model_dir, receipt_digest = model_dir_for(home, arm, selection, seed_dir, prepared)
    from training.runtime import device_lock, pick_device  # torch's (see above)

    wants_cuda = prepared["experiment"]["profile"]["device"] == "cuda" and torch.cuda.is_available()
    device = pick_device("cuda" if wants_cuda else "cpu", int(os.environ.get("LOCAL_RANK", "0")))
    lock = device_lock(device)  # noqa: F841 — before any attempt starts or model is allocated

    root = attempts_dir(home, role, arm)
    earlier = attempts(root)
    if earlier and not retry_reason:
        raise TrainError(f"{role} evaluation of {arm} already has {len(earlier)} attempt(s) under {root}; "
                         "every attempt is kept — pass --retry REASON to run another (recorded)")
    n = next_attempt(root)
    out = root / f"attempt-{n}"
    out.mkdir(parents=True)
    write_json_atomic(out / "started.json", {"arm": arm, "role": role, "attempt": n, "at": time.time(),
                                             "model_receipt": receipt_digest, "retry_reason": retry_reason})
    t0 = time.perf_counter()
    quiet_libraries()
    with long_lived():
        from transformers import AutoModelForCausalLM  # ~1 s, likewise

        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
        tok = load_tokenizer(model_dir, verified=True)
    model.to(device)
    score_batch, score_dtype = scoring_settings(prepared)
    batch = batch or score_batch
    cast = getattr(torch, score_dtype) if device.type == "cuda" and score_dtype != "float32" else None
    cases = [c for c in load_cases(home).values() if c["split"] == role]
    max_new = generation_budget(tok, cases)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t_gen = time.perf_counter()
    answers = generate_answers(model, tok, cases, batch=batch, max_new_tokens=max_new, device=device,
                               autocast_dtype=cast,
                               after=lambda k: say(f"{role} {arm}: {k}/{len(cases)} answered"))
    sync()
    gen_s = time.perf_counter() - t_gen
    rows = []
    for c, ids in zip(cases, answers):
        text = tok.decode(ids, skip_special_tokens=True).strip()
        rows.append(answer_record(c, text, ids, check_answer(text, c["schema"], c["answer"])))
    with open(out / "answers.jsonl", "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, sort_keys=True) + "\n")

    t_probe = time.perf_counter()
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    probes = Corpus.load(home / "inputs" / "probes.safetensors")
    probes.weights[:] = 1
    loss_fn = WeightedResponseLoss(model)
    probe_rows = []
    with torch.no_grad():
        for d in range(len(probes)):
            mb = collate(probes, [d], pad_id=pad).to(device)
            s = float(loss_fn(*mb.args()))
            probe_rows.append({"probe": d, "targets": mb.weighted_targets, "loss": s / mb.weighted_targets})
    with open(out / "probes.jsonl", "w", encoding="utf-8") as f:
        for r in probe_rows:
            f.write(json.dumps(r, sort_keys=True) + "\n")
    probe_s = time.perf_counter() - t_probe
    correct = sum(r["correct"] for r in rows)
    tokens = sum(len(r["token_ids"]) for r in rows)
    summary = EvaluationSummary(
        arm=arm, role=role, attempt=n, model_receipt=receipt_digest, cases=len(rows), correct=correct,
        accuracy=correct / max(1, len(rows)),
        failures=failure_counts(r["reason"] for r in rows if not r["correct"]),
        probe_mean_loss=sum(r["loss"] for r in probe_rows) / max(1, len(probe_rows)),
        max_new_tokens=max_new, seconds=time.perf_counter() - t0,
        scoring=Scoring(device=str(device), batch=batch, generation_dtype=score_dtype if cast else "float32",
                        generation_seconds=gen_s, generated_tokens=tokens,
                        cases_per_second=len(rows) / gen_s if gen_s > 0 else None,
                        generated_tokens_per_second=tokens / gen_s if gen_s > 0 else None,
                        probe_seconds=probe_s, load_seconds=t_gen - t0),
        retry_reason=retry_reason)
    write_json_atomic(out / "summary.json", summary.model_dump(mode="json"))
    receipt = make_receipt(out, meta={"arm": arm, "role": role, "attempt": n}, exclude=["started.json"])
    write_json_atomic(out / "receipt.json", receipt)
    log.append(f"{role}-evaluation", str((out / "receipt.json").relative_to(home)),
               {"arm": arm, "attempt": n, "receipt_digest": receipt["digest"],
                "retry_reason": retry_reason})
    return summary
