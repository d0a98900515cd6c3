"""A report's gate as a model: its dump is the dict report.json held before there was one — the keys
that say what happened to it (`comparable`, `evaluated`, `reason`) only where they did, a count kept
an int — and a key no gate has is refused."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from evidence.attainability import labelled
from evidence.placement import SharedRanks, not_comparable, not_evaluated
from evidence.report import Gate
from evidence.serving import gates as serving_gates

LABEL = {"attainable": True, "attainability": "32 test cases: needs at least 7 discordant pairs"}
EVALUATED = {"gate": "gain ≥ 5.0 pp", "value": 6.25, "passed": True, **LABEL}
TIMED = {"gate": "active time ≤ 0.5 × ddp-four", "value": 0.61, "passed": False}


@pytest.mark.parametrize("built", [
    EVALUATED,
    {**not_comparable(TIMED, ("diloco-four",), {"diloco-four": SharedRanks(ranks=4, gpus=1)}), **LABEL},
    {**not_evaluated("McNemar p ≤ 0.01", "clean-single not run: needs 2 GPUs, the cluster has 1"), **LABEL},
    labelled(serving_gates(None)[0], {}),  # a home without a committed probe: value 0, an int
], ids=["evaluated", "not-comparable", "not-evaluated", "no-probe"])
def test_a_gate_dumps_to_the_dict_it_was_built_from(built):
    g = Gate.model_validate(built)
    assert g.model_dump() == built and g.model_dump(mode="json") == built
    assert json.dumps(g.model_dump(mode="json")) == json.dumps(built)  # key order and int/float as built


def test_what_a_gate_says_of_itself():
    shared = Gate.model_validate({**TIMED, "passed": None, "comparable": False, "reason": "not comparable: …", **LABEL})
    missing = Gate.model_validate({**not_evaluated("gain ≥ 5.0 pp", "not in the home"), **LABEL})
    cannot = Gate.model_validate({**TIMED, "attainable": False, "attainability": "H = 4: 0.25"})
    assert (shared.failed, shared.not_evaluated, shared.unattainable_failure) == (False, False, False)
    assert (missing.failed, missing.not_evaluated) == (False, True)
    assert (cannot.failed, cannot.unattainable_failure, Gate.model_validate(EVALUATED).failed) == (True, True, False)


def test_a_key_no_gate_has_is_refused():
    with pytest.raises(ValidationError):
        Gate.model_validate({**EVALUATED, "comment": "x"})
    with pytest.raises(ValidationError):
        Gate.model_validate({**EVALUATED, "comparable": True})  # only ever written as False
