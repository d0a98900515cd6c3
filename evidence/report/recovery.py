"""The recovery trial's report: recovery-comparison.json (written by `orchestrate recovery-trial`)
read back, its digest checked, and turned into a verdict a reader reads — what was run, how the
kill went, whether the recovered run ends where the uninterrupted one does, where the two first
part, what the control (the same checkpoint resumed without a kill) says, and the conclusion in
words. recovery-report.json and recovery-report.md beside the comparison hold it;
`python -m evidence recovery-report --out OUT` recomputes them and refuses when the files differ.

The comparison is the evidence, the report a reading of it: so the same words reach the trial
report's "## Recovery" lines (`verify` reads every comparison under a home through `recovery_verdict`).
Comparisons written before the control and the parting update existed (no `deterministic`,
`parting`, `control` keys) still verify, and read "control: not run".

The comparison is read through the very models its writer seals it with (`evidence.recovery`).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from evidence.canonical import EvidenceFileError, canonical_sha256, json_bytes, read_json, write_bytes_atomic
from evidence.covered import guard_writes
from evidence.recovery import Comparison, Number, Parting, RecoveryComparison

COMPARISON = "recovery-comparison.json"
REPORT = "recovery-report.json"  # Markdown beside it: recovery-report.md
RERUN = "run `orchestrate recovery-trial` again into a fresh --out"

_OUT = ConfigDict(extra="forbid", frozen=True)


class At(BaseModel):
    """Where a run first parts from the uninterrupted one, as the report states it: the update (1-based)
    and the rank (None: no update does)."""

    model_config = _OUT

    update: int | None
    rank: int | None


class Side(BaseModel):
    """One run against the uninterrupted one: identical or not, the largest |Δ| over how many tensors of
    how many ranks, the parts and ranks that differ, and where it first parts (None: not recorded)."""

    model_config = _OUT

    identical: bool
    max_abs_diff: Number
    tensors: int
    ranks: int
    differing_parts: list[str]
    differing_ranks: list[int]
    parting: At | None


class RecoveryVerdict(BaseModel):
    """What recovery-report.json holds: recomputed from the comparison alone, so the same file gives the
    same report byte for byte."""

    model_config = _OUT

    format: str = "trial-recovery-report-v1"
    comparison_file: str
    comparison_digest: str
    experiment: str
    profile: str
    arm: str
    world_size: int
    device: str
    shared_gpus: str | None  # "4 ranks on 1 GPU(s)", None: a GPU (or the CPU) per rank
    deterministic: bool | None  # None: written before the profile's `deterministic` was recorded
    kill_rank: int
    kill_after_update: int
    kill_to_observed_seconds: Number
    kill_to_survivors_stopped_seconds: Number
    from_step: int
    resumed_from: list[int]
    recovered: Side
    control: Side | None  # None: not run (--no-control, or written before the control existed)
    verdict: str  # IDENTICAL or DIFFERENT
    conclusion: str


def read_comparison(path: str | Path) -> RecoveryComparison:
    """recovery-comparison.json through the guarded reader, refused by name when it is not strict JSON,
    lacks what the report reads, or its contents differ from its own digest."""
    path = Path(path)
    raw = read_json(path, keys=("digest", "comparison"))
    if canonical_sha256({k: v for k, v in raw.items() if k != "digest"}) != raw["digest"]:
        raise EvidenceFileError(f"{path}: damaged, contents differ from its digest (it is evidence, never "
                                f"edited: {RERUN})")
    try:
        return RecoveryComparison.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise EvidenceFileError(f"{path}: damaged, {where}: {first['msg']} ({RERUN})") from None


def _side(c: Comparison, parting: Parting | None) -> Side:
    parts = sorted({name for r in c.ranks for name, p in r.parts.items() if p.max_abs_diff != 0 or p.mismatches})
    return Side(identical=c.identical, max_abs_diff=c.max_abs_diff,
                tensors=sum(p.tensors for r in c.ranks for p in r.parts.values()), ranks=len(c.ranks),
                differing_parts=parts, differing_ranks=[r.rank for r in c.ranks if not r.identical],
                parting=None if parting is None else At(update=parting.update, rank=parting.rank))


NOT_DETERMINISTIC = "the profile does not set deterministic = true; a run without it cannot be compared exactly"


def conclusion(recovered: Side, control: Side | None, deterministic: bool | None) -> str:
    """The verdict in words: the control tells a restart that loses state from numerics that do not
    repeat, and a profile without `deterministic` is named where it would explain a difference."""
    note = f"; {NOT_DETERMINISTIC}" if deterministic is False else ""
    if recovered.identical:
        said = "identical: every rank's final state equals the uninterrupted run's, tensor for tensor"
        if control is not None and not control.identical:
            said += " (though the control differs: the numerics did not repeat there" + note + ")"
        return said
    if control is None:
        return "different; no control was run, so a restart that loses state cannot be told from numerics " \
               "that do not repeat (run it with the control)" + note
    if not control.identical:
        return "not reproducible here: the control differs too" + note
    return "the restart does not restore every state: the control is identical"


def recovery_verdict(path: str | Path, *, relative_to: str | Path | None = None) -> RecoveryVerdict:
    """The report of one recovery-comparison.json (`relative_to`: the folder its name is given from)."""
    path = Path(path)
    w = read_comparison(path)
    rec = _side(w.comparison, w.parting)
    ctl = None if w.control is None else _side(w.control.comparison, w.control.parting)
    return RecoveryVerdict(
        comparison_file=str(path.relative_to(relative_to)) if relative_to is not None else path.name,
        comparison_digest=w.digest, experiment=w.experiment, profile=w.profile, arm=w.arm,
        world_size=w.world_size, device=w.device,
        shared_gpus=None if w.shared is None else f"{w.shared.ranks} ranks on {w.shared.gpus} GPU(s)",
        deterministic=w.deterministic, kill_rank=w.kill.rank, kill_after_update=w.kill.after_update,
        kill_to_observed_seconds=w.failure.kill_to_observed_seconds,
        kill_to_survivors_stopped_seconds=w.failure.kill_to_survivors_stopped_seconds,
        from_step=w.from_step, resumed_from=w.resumed_from, recovered=rec, control=ctl,
        verdict="IDENTICAL" if rec.identical else "DIFFERENT", conclusion=conclusion(rec, ctl, w.deterministic))


def _parts(s: Side) -> str:
    if s.identical:
        return "no part differs"
    return (f"differing: {', '.join(s.differing_parts) or 'no part by value (see the mismatches)'} "
            f"on rank(s) {', '.join(map(str, s.differing_ranks))}")


def _parting(p: At | None) -> str:
    if p is None:
        return "not recorded (written before the per-update comparison)"
    if p.update is None:
        return "never: every update's loss and gradient norm equal the uninterrupted run's on every rank"
    return f"update {p.update} (rank {p.rank}), the first whose loss or gradient norm differs"


def summary_line(v: RecoveryVerdict) -> str:
    """One line: the trial report's "## Recovery" entry and the console's."""
    r = v.recovered
    ctl = "control: not run" if v.control is None else (
        f"control {'IDENTICAL' if v.control.identical else 'DIFFERENT'} (max |Δ| = {v.control.max_abs_diff!r})")
    return (f"{v.verdict}, max |Δ| = {r.max_abs_diff!r} over {r.tensors:,} tensors of {r.ranks} ranks; {ctl} → "
            f"{v.conclusion}")


def markdown(v: RecoveryVerdict) -> str:
    """recovery-report.md: drawn from the verdict alone."""
    r, c = v.recovered, v.control
    det = {True: "yes (the profile's deterministic = true: every kernel deterministic)",
           False: f"no — {NOT_DETERMINISTIC}",
           None: "not recorded (the comparison was written before the setting existed)"}[v.deterministic]
    lines = [f"# Recovery trial: {v.arm} ({v.experiment}, {v.profile}) — {v.verdict}", "",
             f"**{v.conclusion[0].upper()}{v.conclusion[1:]}.**", "",
             "| | |", "|---|---|",
             f"| experiment / profile / arm | {v.experiment} / {v.profile} / {v.arm} |",
             f"| world size, device | {v.world_size} ranks on {v.device}"
             + (f", shared on purpose: {v.shared_gpus}" if v.shared_gpus else "") + " |",
             f"| deterministic | {det} |",
             f"| kill | rank {v.kill_rank} after update {v.kill_after_update}: failure observed "
             f"{v.kill_to_observed_seconds:.3f} s, survivors stopped {v.kill_to_survivors_stopped_seconds:.3f} s "
             "after the kill |",
             f"| resumed from | step {v.from_step} (each rank: {', '.join(map(str, v.resumed_from))}) |", "",
             "## Recovered run vs the uninterrupted run", "",
             f"- {v.verdict}: max |Δ| = {r.max_abs_diff!r} over {r.tensors:,} tensors of {r.ranks} ranks; {_parts(r)}",
             f"- first parts: {_parting(r.parting)}", "",
             "## Control: the same checkpoint resumed without a kill", ""]
    if c is None:
        lines += ["- control: not run (the trial ran with --no-control, or before the control existed)"]
    else:
        lines += [f"- {'IDENTICAL' if c.identical else 'DIFFERENT'}: max |Δ| = {c.max_abs_diff!r} over "
                  f"{c.tensors:,} tensors of {c.ranks} ranks; {_parts(c)}",
                  f"- first parts: {_parting(c.parting)}"]
    lines += ["", f"From {v.comparison_file} (digest {v.comparison_digest}, checked); recomputed by "
              "`python -m evidence recovery-report --out <the trial's folder>`.", ""]
    return "\n".join(lines)


def rendered(out: str | Path) -> tuple[RecoveryVerdict, dict[Path, bytes]]:
    """The verdict of the trial folder `out` and its recovery-report.json and .md, as bytes."""
    out = Path(out)
    v = recovery_verdict(out / COMPARISON, relative_to=out)
    return v, {out / REPORT: json_bytes(v.model_dump(mode="json")),
               (out / REPORT).with_suffix(".md"): markdown(v).encode("utf-8")}


class RecoveryReportDiffers(EvidenceFileError):
    """A recovery report on disk that its comparison no longer gives: never written over."""


def write_recovery_report(out: str | Path) -> tuple[RecoveryVerdict, list[Path]]:
    """Write the report beside the comparison (returned: the verdict and the files written). One already
    there is left as it is when it agrees with the recomputation and refused, nothing written, when it
    differs: a report is evidence too, never written over."""
    out = Path(out)
    v, files = rendered(out)
    differ = [p for p, data in files.items() if p.is_file() and p.read_bytes() != data]
    if differ:
        raise RecoveryReportDiffers(f"{', '.join(map(str, differ))}: differs from what {out / COMPARISON} gives "
                                    "now; nothing was written (move it aside to keep it, then run this again)")
    todo = guard_writes(files)
    for path, data in todo.items():
        write_bytes_atomic(path, data)
    return v, list(todo)
