"""What preservation writes and hands on: the index it puts in the store, the record it leaves in the
home (`preserved.json`), and what a verification of an index found.

Each dumps (`model_dump(mode="json")`) to exactly the JSON written before these were models: the same
keys, the same values of the same types. Strict, so that nothing is coerced on the way in (a size of
`6.0` from a host is refused rather than written as `6`); frozen, since each is a fact once made."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from evidence.sealed import Sealed

_FACT = ConfigDict(extra="forbid", frozen=True, strict=True)


class Anchors(BaseModel):
    """Where the home's commitments log is anchored in the store (`evidence.anchors.anchor_log`), and how
    many of its entries: recorded so that `verify_index` misses any anchor that disappears."""

    model_config = _FACT

    prefix: str
    count: int


class IndexEntry(BaseModel):
    """One preserved file: its object's key is its sha256. `verified_by`: the SSH host that uploaded and
    hashed it where it lies (a checkpoint payload); absent from the index for everything else."""

    model_config = _FACT

    sha256: str
    size: int
    verified_by: str | None = None


class HostPayloadsLeft(BaseModel):
    """Checkpoint payloads left on their hosts on purpose (`--leave-host-payloads`), and why."""

    model_config = _FACT

    reason: str
    paths: list[str]


class Index(BaseModel):
    """The index of one preservation, written in the store under indexes/<trial>/<time>.json. `anchors`
    and `host_payloads_left` are absent, not null, when there are none (`body`)."""

    model_config = _FACT

    format: str = "trial-evidence-index-v1"
    trial: str
    store: str
    at: str
    files: dict[str, IndexEntry]
    bytes: int
    anchors: Anchors | None = None
    host_payloads_left: HostPayloadsLeft | None = None

    def body(self) -> dict[str, Any]:
        """The JSON object written: every None left out (an entry's `verified_by` too)."""
        return self.model_dump(mode="json", exclude_none=True)


class Preserved(Sealed):
    """The home's preservation record (`preserved.json`): where its evidence went, the index's digest, and
    the paths the index covers (known without the store: `evidence.covered`). It lies outside its own
    index, so it seals itself: `digest` is the canonical sha256 of every other field."""

    model_config = _FACT

    store: str
    index: str  # the index's key in the store
    index_sha256: str
    files: int
    bytes: int
    uploaded_bytes: int  # by this preservation; objects the store held already are not sent again
    at: str
    paths: list[str]
    anchors: Anchors | None
    digest: str


class Verified(BaseModel):
    """What `verify_index` re-read: the index, how many objects and bytes it names, and every file's
    sha256 by its path in the home (what `remove` compares the home with)."""

    model_config = _FACT

    index: str
    files: int
    bytes: int
    sha256: dict[str, str]
