"""A prepared home's committed inputs, read the same way by the host stages and by the report:
the check that every input still has its committed hash, the task cases (and the id a user's task
file gave each), how a task file's cases were chosen (`drawn`), and the global loss of an update recomputed from every rank's records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from evidence.canonical import file_sha256, read_jsonl


def changed_input(home: Path, prepared: dict[str, Any]) -> Path | None:
    """The first input of `prepared.json` that is missing or no longer has its committed hash."""
    for name, digest in prepared["inputs"].items():
        p = Path(home) / "inputs" / name
        if not p.is_file() or file_sha256(p) != digest:
            return p
    return None


def load_cases(home: str | Path) -> dict[str, dict[str, Any]]:
    """Every task case of the home (all splits), by case id."""
    return {row["case_id"]: row for row in read_jsonl(Path(home) / "inputs" / "tasks.jsonl")}


def user_id(case: dict[str, Any]) -> Any:
    """The id the user's task file gave this case (its `id`, any JSON value), or None: a case of the
    generated families, or a line without one. A case from a task file names its file and line in
    `question` (training/sources.py, `JsonlFile.cases`); a generated case's `question` never does."""
    q = case.get("question")
    if isinstance(q, dict) and "file" in q and "line" in q:
        return q.get("id")
    return None


def id_text(uid: Any) -> str:
    """A user's id as a command line names it: a string as it is, any other JSON value as JSON (`17`)."""
    return uid if isinstance(uid, str) else json.dumps(uid, ensure_ascii=False)


def global_losses(rank_updates: list[list[dict[str, Any]]]) -> list[float]:
    """Σ_r loss_sum_r / W per update, from every rank's records (W: the update's global weighted
    target count): DDP needs no extra collective to report it, and anyone can recompute it."""
    return [sum(r["loss_sum_local"] for r in recs) / recs[0]["weighted_targets_global"]
            for recs in zip(*rank_updates)]


def drawn(described: dict[str, Any]) -> str:
    """How a task file's cases were chosen, in one line, from prepared.json's `task_source` (what
    `validate`, `run` and the report say)."""
    d, used = described.get("draw"), described.get("used", {})
    of = lambda s, n: f"{s} {used.get(s, 0)} of {n}"  # noqa: E731
    if d is None:
        return ("cases: the first of each split in file order (the rule of a home prepared before draws were recorded)"
                if described.get("split_by") == "file" else "cases: test, dev, then train from one shuffle by the "
                "generator seed (a home prepared before draws were recorded)")
    if d["rule"] == "pinned":
        return (f"cases: pinned by case_ids {d['file']} (sha256 {d['sha256'][:12]}…): "
                + ", ".join(of(s, d["from"][s]) for s in ("train", "dev", "test"))
                if "file" not in d["from"] else f"cases: pinned by case_ids {d['file']} (sha256 {d['sha256'][:12]}…)")
    if d["rule"] == "seeded":
        fams = lambda s: ", ".join(f"{f} {a}/{b}" for f, (a, b) in d["families"][s].items())  # noqa: E731
        return (f"cases: drawn per split by generator seed {d['seed']}, stratified by family, never in file order — "
                + "; ".join(f"{of(s, d['from'][s])} ({fams(s)})" for s in ("train", "dev", "test") if used.get(s)))
    return (f"cases: test, dev, then train from one shuffle of the file's {d['from']['file']} by generator seed "
            f"{d['seed']}")
