"""The report, recomputed from raw evidence in a trial home — or refused when the evidence disagrees —
in three steps with their hand-offs visible: `verify` (evidence/report/verify.py) → `Verified` →
`compute` (compute.py) → `Report`, its gates `Gate`s (gate.py) → `render` (render.py: report.json,
report.md; figures.py: the PNGs).

Checks (verify), in order (the first failure stops the report with a message; nothing is changed or removed):
  1. the commitments log's hash chain; the selection committed before every test evaluation; every
     prepared input against the hash in the committed prepared.json;
  2. every selected model against its receipt and the digest the selection names; every candidate's
     rank results against the hashes committed in candidates.json, each result belonging to its rank;
  3. each rank's documents per update against the committed global schedule (its contiguous slice)
     and, for DiLoCo, its outer steps against the sync schedule (every H updates and the last);
  4. every evaluation attempt's files against its receipt; every raw answer re-checked strictly
     against the committed task answers, and the recorded verdict (and reason) must match, as must the
     user's id where a record carries one and the summary's failure counts where it keeps them;
  5. recovery comparison receipts found under the home, against their own digests (read as the recovery
     trial's own report reads them: recovery.py);
  6. the first committed serving probe (evidence/serving.py): its receipt, the fixed workload at every
     committed concurrency level, the replicas' placement, the attempt bound, and every stored figure
     against its own per-request records.
  7. the gates' attainability committed before training (attainability.json, evidence/attainability.py):
     recomputed from prepared.json, verdicts and figures equal, cores as every rank recorded them
     (a home without it gets it computed from prepared.json).
Then (compute): accuracy per arm and why its answers failed (by the checker's reason, and per field),
paired gains (exact one-sided McNemar p, one-sided bounds), retention bounds,
the serving phases per concurrency level (throughput ratio, failover overhead, tokens/s against the
device's memory-bandwidth bound, token and model identity), the
experiment's gates — each listed as passed or failed (and whether it could have passed at this
profile at all), the selection unchanged — and costs kept
apart: active training, checkpoint, startup and whole-process seconds, allocated device-seconds,
dollars where a price is known (none on the local cluster).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from evidence.covered import CoveredFileError
from evidence.report.compute import Report, compute
from evidence.report.gate import Gate
from evidence.report.render import markdown, plots, write
from evidence.report.verify import EvidenceError, Verified, verify

__all__ = ["EvidenceError", "Gate", "Report", "Verified", "build_report", "compute", "markdown", "plots", "report",
           "verify", "write", "write_report", "write_report_numbered"]


def report(home: str | Path, *, store: str | None = None, trial: str | None = None) -> Report:
    """`store`: where the log's anchors are (default: the store preserved.json names, if any)."""
    return compute(verify(home, store=store, trial=trial))


def build_report(home: str | Path, *, store: str | None = None, trial: str | None = None) -> dict[str, Any]:
    """The report as report.json holds it (its callers compare it as JSON)."""
    return report(home, store=store, trial=trial).model_dump(mode="json")


def write_report(home: str | Path, output: str | Path, *, store: str | None = None,
                 trial: str | None = None) -> Report:
    """Build the report and write it to `output` (with report.md and the figures beside it)."""
    rep = report(home, store=store, trial=trial)
    write(rep, Path(output))
    return rep


def write_report_numbered(home: str | Path, output: str | Path, *, store: str | None = None,
                          trial: str | None = None) -> tuple[Report, Path]:
    """As `write_report`, but when `output` is evidence that this report would change (a report.json
    preserved before the evidence grew), to the next free `<stem>-<n>`: built once, written once."""
    rep, output = report(home, store=store, trial=trial), Path(output)
    for n in range(1, 1000):
        out = output if n == 1 else output.with_name(f"{output.stem}-{n}{output.suffix}")
        try:
            write(rep, out)
            return rep, out
        except CoveredFileError:
            continue
    raise EvidenceError(f"{output}: no free report name beside it")
