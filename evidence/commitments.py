"""The commitments log: an append-only, hash-chained record of what was fixed, and when.

Pre-registration is only as strong as its enforcement. Each entry commits the sha256 of a file (the
prepared inputs, a candidate list, a selection) and links to the previous entry's hash, so editing or
deleting an earlier line breaks every later link. Sequencing rules (what must already be committed,
and what must not yet have happened) are data in `RULES`, checked on every append; later stages call
`require` and refuse to run when their prerequisite is absent or its file has changed since.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evidence.canonical import EvidenceFileError, canonical_bytes, canonical_sha256, file_sha256, parse_json
from evidence.errors import UserError

LOG_NAME = "commitments.jsonl"
GENESIS = "0" * 64


class CommitmentError(UserError, RuntimeError):
    """The log is broken, or a stage ran out of order."""


@dataclass(frozen=True)
class Rule:
    requires: tuple[str, ...] = ()  # each must be committed before this kind
    not_after: tuple[str, ...] = ()  # none of these may already be committed
    once: bool = False  # at most one entry of this kind per log


# The trial's sequence. Kinds not listed here are refused: a typo must not slip past the rules.
RULES: dict[str, Rule] = {
    "prepare": Rule(once=True),
    "placement": Rule(requires=("prepare",), not_after=("candidates",), once=True),  # arms the cluster runs
    # what each gate can reach at this profile (evidence/attainability.py), fixed before training
    "attainability": Rule(requires=("prepare",), not_after=("candidates",), once=True),
    "numerical-profile": Rule(requires=("prepare",)),
    "candidates": Rule(requires=("prepare",), not_after=("selection",)),
    "selection": Rule(requires=("candidates",), not_after=("test-evaluation",), once=True),
    "dev-evaluation": Rule(requires=("selection",)),
    "test-evaluation": Rule(requires=("selection",)),
    "serving": Rule(requires=("selection",)),
    "report": Rule(requires=("prepare",)),
}


def _utcnow() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


_FIELDS = {"seq": int, "kind": str, "subject": str, "sha256": str, "data": dict, "at": str,
           "prev": str, "hash": str}


def _check_rule(kind: str, kinds: set[str]) -> None:
    """Raise unless `kind` may follow a log whose committed kinds are `kinds`."""
    rule = RULES.get(kind)
    if rule is None:
        raise CommitmentError(f"unknown commitment kind '{kind}' (known: {sorted(RULES)})")
    for need in rule.requires:
        if need not in kinds:
            raise CommitmentError(f"'{kind}' needs a '{need}' commitment first")
    for late in rule.not_after:
        if late in kinds:
            raise CommitmentError(f"'{kind}' refused: '{late}' was already committed")
    if rule.once and kind in kinds:
        raise CommitmentError(f"'{kind}' is committed once per trial and already was")


def _entry_hash(entry: dict[str, Any]) -> str:
    return canonical_sha256({k: v for k, v in entry.items() if k != "hash"})


class CommitmentLog:
    """One log per trial home (`<home>/commitments.jsonl`); subjects are paths relative to home."""

    def __init__(self, home: str | os.PathLike[str]):
        self.home = Path(home)
        self.path = self.home / LOG_NAME

    # -- reading -------------------------------------------------------------------------------
    def entries(self) -> list[dict[str, Any]]:
        """All entries, after checking every hash, link and sequencing rule; raises on any break.

        The chain is keyless: it proves order and detects edits of a log whose head hash (`head`)
        is known from elsewhere. Anchoring the head outside the home (the evidence store's index)
        is what detects a truncated or wholly rewritten log.
        """
        if not self.path.exists():
            return []
        entries = []
        prev = GENESIS
        try:
            raw = self.path.read_bytes()
        except OSError as e:
            raise CommitmentError(f"{self.path}: cannot be read ({e.strerror or e})") from None
        lines = raw.split(b"\n")
        if lines[-1]:
            raise CommitmentError(f"{self.path}:{len(lines)}: the last entry is cut short (no end of line)")
        for lineno, line in enumerate(lines[:-1], 1):
            if not line.strip():
                raise CommitmentError(f"{self.path}:{lineno}: blank line in commitments log")
            try:  # the strict reader: no NaN, no duplicate key, valid UTF-8
                entry = parse_json(line, f"{self.path}:{lineno}")
            except EvidenceFileError as e:
                raise CommitmentError(str(e)) from None
            if not isinstance(entry, dict) or set(entry) != set(_FIELDS) or not all(
                    type(entry[k]) is t for k, t in _FIELDS.items()):
                raise CommitmentError(f"{self.path}:{lineno}: not a commitment entry")
            if canonical_bytes(entry) != line:  # each line is written canonical: any other form was edited
                raise CommitmentError(f"{self.path}:{lineno}: not written as the log writes entries; edited")
            if entry.get("seq") != lineno - 1:
                raise CommitmentError(f"{self.path}:{lineno}: sequence number out of order")
            if entry.get("prev") != prev:
                raise CommitmentError(
                    f"{self.path}:{lineno}: chain broken (entry does not link to line "
                    f"{lineno - 1}); the log was edited"
                )
            if entry.get("hash") != _entry_hash(entry):
                raise CommitmentError(f"{self.path}:{lineno}: entry hash mismatch; edited")
            try:
                _check_rule(entry["kind"], {e["kind"] for e in entries})
            except CommitmentError as e:
                raise CommitmentError(f"{self.path}:{lineno}: out of sequence: {e}") from None
            prev = entry["hash"]
            entries.append(entry)
        return entries

    def head(self) -> str:
        """The last entry's hash (GENESIS for an empty log): what an outside record anchors."""
        entries = self.entries()
        return entries[-1]["hash"] if entries else GENESIS

    def latest(self, kind: str) -> dict[str, Any] | None:
        found = [e for e in self.entries() if e["kind"] == kind]
        return found[-1] if found else None

    def require(self, kind: str, subject: str | None = None) -> dict[str, Any]:
        """The latest `kind` entry, after checking its subject file still has the committed hash."""
        entry = self.latest(kind)
        if entry is None:
            raise CommitmentError(
                f"no '{kind}' commitment in {self.path}; run the '{kind}' stage first"
            )
        if subject is not None and entry["subject"] != subject:
            raise CommitmentError(
                f"'{kind}' commitment names {entry['subject']}, not {subject}"
            )
        self.verify_subject(entry)
        return entry

    def verify_subject(self, entry: dict[str, Any]) -> None:
        p = self.home / entry["subject"]
        if not p.is_file():
            raise CommitmentError(f"committed file missing: {p} ({entry['kind']} entry)")
        digest = file_sha256(p)
        if digest != entry["sha256"]:
            raise CommitmentError(
                f"committed file changed: {p} now hashes {digest[:16]}…, the '{entry['kind']}' "
                f"commitment recorded {entry['sha256'][:16]}…"
            )

    # -- writing -------------------------------------------------------------------------------
    def append(self, kind: str, subject: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
        """Commit `home/subject` under `kind`, enforcing RULES under an exclusive file lock."""
        if kind not in RULES:
            raise CommitmentError(f"unknown commitment kind '{kind}' (known: {sorted(RULES)})")
        rule = RULES[kind]
        subject_path = self.home / subject
        if not subject_path.is_file():
            raise CommitmentError(f"cannot commit {subject_path}: no such file")
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.home / (LOG_NAME + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            entries = self.entries()
            _check_rule(kind, {e["kind"] for e in entries})
            for e in entries:
                if e["kind"] in rule.requires:
                    self.verify_subject(e)
            entry: dict[str, Any] = {
                "seq": len(entries),
                "kind": kind,
                "subject": subject,
                "sha256": file_sha256(subject_path),
                "data": data or {},
                "at": _utcnow(),
                "prev": entries[-1]["hash"] if entries else GENESIS,
            }
            entry["hash"] = _entry_hash(entry)
            with open(self.path, "ab") as f:
                f.write(canonical_bytes(entry) + b"\n")
                f.flush()
                os.fsync(f.fileno())
        return entry
