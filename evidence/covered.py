"""The files of a trial home that are evidence: what the commitments log, a receipt or the
preservation record covers. A command that writes into a home at a path its user chose (the report's
`--output`) must never replace one of them with other bytes; writing the same bytes again is
harmless (re-running a finished trial recomputes an identical report).
"""

from __future__ import annotations

from pathlib import Path

from evidence.canonical import EvidenceFileError, read_json
from evidence.commitments import LOG_NAME, CommitmentError, CommitmentLog
from evidence.errors import UserError
from evidence.stores import PRESERVED, read_preserved


class CoveredFileError(UserError, RuntimeError):
    """A write that would replace a file of evidence; nothing was written."""


def covered(home: str | Path) -> dict[Path, str]:
    """Every covered file of `home` (resolved path) → what covers it. A cover that cannot be read is
    skipped here: whoever reads evidence refuses it by name, and this only guards writes."""
    home = Path(home).resolve()
    out: dict[Path, str] = {home / LOG_NAME: "the commitments log"}
    try:
        entries = CommitmentLog(home).entries()
    except CommitmentError:
        entries = []
    for e in entries:
        out.setdefault(home / e["subject"], f"commitment {e['seq']} ({e['kind']})")
    for name, what in (("prepared.json", "prepared.json's input hashes"),
                       ("candidates.json", "candidates.json's result hashes")):
        try:
            doc = read_json(home / name)
        except EvidenceFileError:
            continue
        paths = ([f"inputs/{n}" for n in doc.get("inputs", {})] if name == "prepared.json"
                 else [r.get("result", "") for c in doc.get("candidates", []) for r in c.get("ranks", [])])
        for rel in paths:
            out.setdefault(home / rel, what)
    for receipt in sorted(home.rglob("receipt.json")):
        try:
            files = read_json(receipt, keys=("files",))["files"]
        except EvidenceFileError:
            continue
        out.setdefault(receipt, "a receipt (itself)")
        for rel in files:
            out.setdefault(receipt.parent / rel, f"the receipt {receipt.relative_to(home)}")
    try:
        rec = read_preserved(home)
        for rel in rec.paths:
            out.setdefault(home / rel, f"the preservation index {rec.index}")
    except EvidenceFileError:
        pass
    return out


def home_of(path: str | Path) -> Path | None:
    """The trial home `path` is in (the nearest folder above it holding a commitments log or a
    preservation record), if any."""
    for d in Path(path).resolve().parents:
        if (d / LOG_NAME).is_file() or (d / PRESERVED).is_file():
            return d
    return None


def guard_writes(writes: dict[Path, bytes]) -> dict[Path, bytes]:
    """The writes that would change something (identical rewrites dropped); raises, writing nothing,
    when any would replace, in whichever trial home it lies, a covered file, the preservation record,
    or any other file that is not an earlier output of the same kind (`report*`)."""
    covers: dict[Path, dict[Path, str]] = {}
    todo = {}
    for path, data in writes.items():
        p = Path(path).resolve()
        if p.is_file() and p.read_bytes() == data:
            continue
        home = home_of(p)
        if home is not None:
            cover = covers.setdefault(home, {**covered(home), home / PRESERVED: "itself (the preservation record)"})
            if p in cover:
                raise CoveredFileError(f"{path} is evidence covered by {cover[p]}: it is never written over "
                                       "(choose another output; nothing was written)")
            if p.exists() and not p.name.startswith("report"):
                raise CoveredFileError(f"{path} is a file of the trial home {home}: only new files or an earlier "
                                       "report may be written there (choose another output; nothing was written)")
        todo[path] = data
    return todo
