"""A grace after the deadline, as evidence: what `orchestrate start --grace` granted (when, how long, which hosts,
what it costs) — written into the trial home before any host starts, never overwritten (one file per grant),
preserved with the home and shown by the report. The cloud's deadline stop and each host's own check end a grace
whether or not the controller that granted it survives (infra/sweep.py); this record is what it cost."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from evidence.canonical import EvidenceFileError, read_json, write_json_atomic

GRACE_DIR = "cloud"
GRACE_FORMAT = "trial-grace-v1"


class GraceHost(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    instance_id: str
    rank: int | None
    instance_type: str
    usd: float = Field(ge=0)  # its compute and public address for the grace's minutes


class Grace(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    format: str = GRACE_FORMAT
    trial: str
    deadline: dt.datetime
    granted_at: dt.datetime
    start: dt.datetime
    end: dt.datetime
    minutes: float = Field(gt=0)
    cap_minutes: float = Field(ge=0)
    reason: str
    hosts: list[GraceHost]
    usd: float = Field(ge=0)  # every host's, at the prices `plan` uses
    price_source: str


def grace_path(home: Path, granted_at: dt.datetime) -> Path:
    return Path(home) / GRACE_DIR / f"grace-{granted_at.astimezone(dt.timezone.utc):%Y%m%dT%H%M%SZ}.json"


def write_grace(home: Path, grace: Grace) -> Path:
    """The record, under a name of its own (the next free one when two grants share a second): evidence is never
    overwritten."""
    first = grace_path(home, grace.granted_at)
    first.parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        path = first if n == 1 else first.with_name(f"{first.stem}-{n}.json")
        try:
            with open(path, "x"):  # claims the name, or fails if another grant holds it
                pass
        except FileExistsError:
            continue
        write_json_atomic(path, grace.model_dump(mode="json"))
        return path
    raise FileExistsError(f"{first}: no free name beside it")


def read_graces(home: Path) -> list[Grace]:
    """Every grace record of the home, in the order granted, each through the guarded reader; a damaged one is
    refused by name."""
    out = []
    for path in sorted((Path(home) / GRACE_DIR).glob("grace-*.json")):
        try:
            out.append(Grace.model_validate(read_json(path)))
        except ValidationError as e:
            raise EvidenceFileError(f"{path}: not a grace record ({e.error_count()} problem(s): "
                                    f"{e.errors()[0]['loc']} {e.errors()[0]['msg']})") from None
    return out
