"""The gates' attainability at this profile, committed before the first arm trains.

`orchestrate run` analyses every gate of the home's committed experiment and profile
(evidence/attainability.py) on the cluster the placement decided, writes `attainability.json` and
commits it, once per home, before the candidates — the same moment as the placement, so a gate that
cannot pass at this scale is on record before any result could colour the reading. The report
recomputes it from prepared.json and refuses a record that disagrees.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from evidence.attainability import ATTAINABILITY, analyse
from evidence.canonical import read_json, write_json_atomic
from evidence.commitments import CommitmentLog
from evidence.placement import PlacementRecord


def cluster_basis(source: str | None, *, shared_cores: bool) -> dict[str, Any] | None:
    """{"source", "cores"} of the placement's cluster (its `source`; None: a home without a placement).
    `shared_cores`: its ranks all run on this machine (the embedded local cluster's, and hosts whose
    cluster says `shared_cores`), so its CPU cores (os.cpu_count(), what each rank records too) are
    theirs to share; hosts of their own: None."""
    if source is None:
        return None
    return {"source": source, "cores": os.cpu_count() if shared_cores else None}


def commit_attainability(home: Path, placement: PlacementRecord | None, *,
                         shared_cores: bool) -> tuple[dict[str, Any] | None, bool]:
    """The home's committed analysis, made and committed now when it has none and nothing has been a
    candidate yet (`shared_cores`: as `cluster_basis`). Returns (the record in force, whether it was
    committed now); None for a home whose candidates were committed first (the report then computes it
    from prepared.json)."""
    log = CommitmentLog(home)
    entry = log.latest("attainability")
    if entry is not None:
        log.verify_subject(entry)
        return read_json(home / entry["subject"]), False
    if log.latest("candidates") is not None:
        return None, False
    log.require("prepare", "prepared.json")  # the rules and profile analysed are the committed ones
    prepared = read_json(home / "prepared.json")
    source = None if placement is None else placement.cluster.source
    rec = analyse(prepared["experiment"], cluster_basis(source, shared_cores=shared_cores))
    write_json_atomic(home / ATTAINABILITY, rec)
    log.append("attainability", ATTAINABILITY,
               {"unattainable": [g["gate"] for g in rec["gates"] if g["attainable"] is False]})
    return rec, True
