"""recovery-comparison.json as a model: it dumps to exactly the JSON written when it was a dict, and its
digest is the one the dict gave (`evidence.report.verify` checks it against the file)."""

from __future__ import annotations

import copy

from evidence.canonical import canonical_sha256, json_bytes
from orchestrate.recovery import Comparison, RankComparison, RecoveryComparison


def _part(tensors: int, elements: int, max_abs_diff: float = 0.0, mismatches: list[str] | None = None) -> dict:
    return {"tensors": tensors, "elements": elements, "max_abs_diff": max_abs_diff, "mismatches": mismatches or []}


RANK_0 = {"rank": 0, "update": _part(0, 0), "model": _part(21, 336192), "optimizer": _part(60, 410260),
          "rng": _part(2, 5680), "outer": _part(40, 410240), "powersgd": _part(0, 0),
          "max_abs_diff": 0.0, "identical": True}
RANK_1 = {**RANK_0, "rank": 1, "model": _part(21, 336192, 2.384185791015625e-07, ["model/step: 3 != 4"]),
          "max_abs_diff": 2.384185791015625e-07, "identical": False}

WRITTEN = {  # the shape recovery_trial wrote as a dict (values from a smoke run, one rank made to differ)
    "format": "trial-recovery-comparison-v1",
    "experiment": "local-training-windows", "profile": "smoke", "arm": "diloco-four",
    "world_size": 2, "updates": 16, "checkpoint_every": 8, "device": "cpu",
    "shared": {"ranks": 2, "gpus": 1},
    "from_step": 8, "kill": {"rank": 1, "after_update": 11},
    "failure": {
        "killed_at": 1796554965.3473203, "observed_rank": 1, "reason": "exit",
        "observed_at": 1796554965.58316, "survivors_stopped_at": 1796554965.826737,
        "kill_to_observed_seconds": 0.2358396053314209, "kill_to_survivors_stopped_seconds": 0.4794166088104248,
        "exit_codes": [-15, -9],
    },
    "resumed_from": [8, 8],
    "comparison": {"step": 16, "ranks": [RANK_0, RANK_1], "max_abs_diff": 2.384185791015625e-07,
                   "identical": False, "final_parameter_digests_equal": True},
    "checkpoint_io_per_rank": [
        {"rank": 0, "checkpoint_publish_seconds_mean": 0.20613360999959696, "plain_write_bytes": 4155815,
         "restore_over_plain": 5.266509778015942},
        {"rank": 1},
    ],
    "restore_per_rank": [{"bytes": 4153255, "orphaned": [], "seconds": 0.22384793699893635, "step": 8,
                          "verify_and_load_seconds": 0.220177507999324}] * 2,
    "seconds": {"uninterrupted": 47.70735022699955, "recovered_total": 89.5737096060002},
    "uninterrupted_final_parameters": ["0b6499d86616336f33c34cd8c07c25ddf8167ca051fb9ae994f7d2b5b0257ff8"] * 2,
}
OLD_DIGEST = canonical_sha256(WRITTEN)  # the old computation: the dict before its digest was added


def test_a_comparison_dumps_and_digests_as_the_dict_did():
    body = copy.deepcopy(WRITTEN)
    rep = RecoveryComparison.sealed(**body)
    assert rep.digest == OLD_DIGEST
    assert rep.body() == {**WRITTEN, "digest": OLD_DIGEST}
    assert json_bytes(rep.body()) == json_bytes({**WRITTEN, "digest": OLD_DIGEST})  # the file, byte for byte
    assert canonical_sha256(rep.body(exclude_digest=True)) == OLD_DIGEST
    assert body == WRITTEN  # the caller's data left as it was


def test_a_written_comparison_reads_back_as_itself():
    written = {**WRITTEN, "digest": OLD_DIGEST}
    rep = RecoveryComparison.model_validate(written)
    assert rep.body() == written and rep.digest == OLD_DIGEST
    c = rep.comparison
    assert isinstance(c, Comparison) and isinstance(c.ranks[0], RankComparison)
    assert rep.failure.reason == "exit" and rep.failure.kill_to_observed_seconds == 0.2358396053314209
    assert set(c.ranks[1].parts) == {"update", "model", "optimizer", "rng", "outer", "powersgd"}
    assert c.ranks[1].parts["model"].mismatches == ["model/step: 3 != 4"]
    assert sum(p.tensors for r in c.ranks for p in r.parts.values()) == 2 * (21 + 60 + 2 + 40)


def test_numbers_keep_their_types():
    """An int stays an int and a float a float: `0` and `0.0` are different bytes in the file."""
    rank = RankComparison.model_validate({**RANK_0, "model": _part(21, 336192, 0)})
    assert type(rank.parts["model"].max_abs_diff) is int and type(rank.max_abs_diff) is float
    assert rank.model_dump(mode="json") == {**RANK_0, "model": _part(21, 336192, 0)}


def test_the_first_parting_update_is_the_first_whose_loss_or_gradient_norm_differs_on_any_rank():
    """The bisect the control rests on (#57): two runs' journals, compared exactly from the checkpoint on;
    on the GPU without deterministic algorithms the loss of update 1 was equal and its gradient norm not."""
    from orchestrate.recovery import first_parting

    def run(*per_rank: list[tuple[float, float]]) -> list[dict]:
        return [{"updates": [{"loss_sum_local": l, "grad_norm": g} for l, g in ups]} for ups in per_rank]

    same = [(4.0, 1.0), (3.0, 0.9), (2.5, 0.8), (2.0, 0.7)]
    a = run(same, same)
    assert first_parting(a, run(same, same), 0).update is None
    b = run(same, [*same[:2], (2.5, 0.8000001), (2.0, 0.7)])  # rank 1's third update: its gradient norm only
    p = first_parting(a, b, 0)
    assert (p.update, p.rank, p.a, p.b) == (3, 1, [2.5, 0.8], [2.5, 0.8000001])
    assert first_parting(a, b, 3).update is None  # updates up to the checkpoint are not compared
