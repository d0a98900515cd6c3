"""`select`: collect every predetermined candidate's acknowledgments, commit them, then commit the
selection — before any test scoring, and independent of any score.

The candidates are every trained arm of the experiment (fixed by the experiment, not by results).
An arm's acknowledgment is the sha256 of each rank's result.json, the final model's receipt digest
and (when the profile checkpoints) each rank's last manifest; all are verified first: ranks agree on
the final parameters, each result belongs to its rank, the model's files match its receipt, and the
receipt vouches for the agreed parameters. The selection names the experiment's primary arm and
serving arm as written in its rules.

An arm the committed placement did not run (the cluster could not give each of its ranks a GPU,
evidence/placement.py) is no candidate; it is listed with its reason under `not_run`, decided before
any training and so independent of any result. The rules stay as written even when the primary or
serving arm is among them: the report then shows the gates that need it as not evaluated.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from evidence.canonical import file_sha256, read_json, write_json_atomic
from evidence.commitments import CommitmentLog
from evidence.placement import committed_placement, not_run
from evidence.receipts import verify_receipt
from training.errors import TrainError

CANDIDATES = "candidates.json"
SELECTION = "selection.json"
RULE = "the primary arm is fixed by the experiment's acceptance rules, never by a score"


class Selection(BaseModel):
    """The committed selection: `selection.json` (`model_dump(mode="json")`, in this order — the order
    `training select` prints) and what `select` returns. `not_run` is written only when the placement
    left an arm out."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    experiment: str
    profile: str
    primary: str  # the experiment's primary arm, as its acceptance rules name it
    serving: str
    baseline: str  # the arm that does not train: the seed
    candidates: dict[str, str]  # arm → its model's receipt digest
    candidates_sha256: str  # of candidates.json, committed just before
    rule: str = RULE
    # arm → why the committed placement did not run it (decided before any training)
    not_run: dict[str, str] = Field(default_factory=dict, exclude_if=lambda v: not v)


def acknowledge(home: Path, arm: Any) -> dict[str, Any]:
    run = home / "runs" / arm.name
    ranks = []
    for r in range(arm.world_size):
        p = run / f"rank-{r}" / "result.json"
        if not p.is_file():
            raise TrainError(f"candidate {arm.name} is not finished: {p} is missing")
        res = read_json(p)
        if res.get("rank") != r or res.get("arm", {}).get("name") != arm.name:
            raise TrainError(f"{p} belongs to rank {res.get('rank')} of {res.get('arm', {}).get('name')},"
                             f" not rank {r} of {arm.name}")
        manifest = None
        mdir = run / f"rank-{r}" / "manifests"
        if mdir.is_dir() and any(mdir.glob("step-*.json")):
            last = sorted(mdir.glob("step-*.json"))[-1]
            manifest = {"path": str(last.relative_to(home)), "sha256": file_sha256(last)}
        ranks.append({"rank": r, "result": str(p.relative_to(home)), "sha256": file_sha256(p),
                      "final_parameters": res["digests"]["final_parameters"], "manifest": manifest})
    if len({x["final_parameters"] for x in ranks}) != 1:
        raise TrainError(f"candidate {arm.name}: ranks disagree on the final parameters")
    mfiles = {x["manifest"]["sha256"] for x in ranks if x["manifest"]}
    if len(mfiles) > 1:
        raise TrainError(f"candidate {arm.name}: ranks hold different last manifests")
    model = run / "model"
    receipt = read_json(model / "receipt.json")
    verify_receipt(model, receipt, what=f"{arm.name} model")
    if receipt["meta"].get("parameters_sha256") != ranks[0]["final_parameters"]:
        raise TrainError(f"{model}'s receipt does not vouch for the parameters the ranks agreed on")
    return {"arm": arm.name, "kind": arm.kind, "world_size": arm.world_size, "ranks": ranks,
            "model": {"dir": str(model.relative_to(home)), "receipt_digest": receipt["digest"]},
            "servable": arm.servable}


def select(home: str | os.PathLike[str], cfg: Any) -> Selection:
    home = Path(home)
    log = CommitmentLog(home)
    if log.latest("selection") is not None:
        raise TrainError(f"{home} already has a committed selection ({SELECTION}); it is made once")
    skipped = {a: why for a, why in not_run(committed_placement(home)).items()
               if a in {x.name for x in cfg.experiment.arms}}
    arms = [a for a in cfg.experiment.arms if a.trains and a.name not in skipped]
    acks = [acknowledge(home, a) for a in arms]
    write_json_atomic(home / CANDIDATES, {"experiment": cfg.experiment.name, "candidates": acks,
                                          **({"not_run": skipped} if skipped else {})})
    log.append("candidates", CANDIDATES, {"arms": [a.name for a in arms]})
    acc = cfg.experiment.acceptance
    selection = Selection(
        experiment=cfg.experiment.name, profile=cfg.profile_name, primary=acc.primary,
        serving=cfg.experiment.serving_arm, baseline=next(a.name for a in cfg.experiment.arms if not a.trains),
        candidates={a["arm"]: a["model"]["receipt_digest"] for a in acks},
        candidates_sha256=file_sha256(home / CANDIDATES), not_run=skipped)
    write_json_atomic(home / SELECTION, selection.model_dump(mode="json"))
    log.append("selection", SELECTION, {"primary": acc.primary})
    return selection
