"""select → evaluate → serve → report, in that order and each once: candidates and the selection are
committed before any test case is scored, every evaluation attempt is kept, and the report is
recomputed from the raw evidence. What the committed placement did not run is neither scored nor
probed, and its gates are shown as not evaluated."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from evidence.attempts import attempts
from evidence.commitments import CommitmentLog
from evidence.placement import SERVING_PROBE
from evidence.report import EvidenceError, write_report_numbered
from orchestrate.backends.local import LocalBackend
from orchestrate.progress import Progress
from orchestrate.serving import replicas_probe
from orchestrate.stages.preserve import anchor_home
from training.errors import TrainError
from training.evaluate import attempts_dir
from training.select import select

if TYPE_CHECKING:
    from evidence.report import Report
    from orchestrate.backends import Backend
    from training.config import Resolved


def select_primary(cfg: Resolved, home: Path, progress: Progress) -> None:
    """The selection, committed once: a later run of the same home keeps the first one."""

    if CommitmentLog(home).latest("selection") is None:
        sel = select(home, cfg)
        progress.say("select", f"committed: primary {sel.primary} (fixed by the rules), "
                     f"{len(sel.candidates)} candidates acknowledged"
                     + (f"; not run: {', '.join(a for a in sel.not_run)}" if sel.not_run else ""))


def evaluate_test(cfg: Resolved, home: Path, seed_dir: Path, backend: Backend, skipped: dict[str, str],
                  progress: Progress, scoring: dict[str, dict]) -> None:
    """Every arm that ran scored on the test cases once; an arm scored before (an attempt committed)
    is not scored again, and an attempt that did not finish is named as the retry's reason. Each arm's
    figures go into `scoring` as soon as it is scored, so a failure at a later arm keeps them."""

    for a in cfg.experiment.arms:
        if a.name in skipped:
            progress.line(f"test {a.name}: not scored, {skipped[a.name]}")
            continue
        tried = attempts(attempts_dir(home, "test", a.name))
        if any(e["kind"] == "test-evaluation" and e["data"].get("arm") == a.name
               for e in CommitmentLog(home).entries()):  # scored: an attempt committed
            progress.say("test", f"{a.name}: already scored, attempts kept")
            continue
        retry = f"attempt(s) {', '.join(d.name for d in tried)} did not finish" if tried else None
        with progress.status(f"scoring {a.name} on the test cases…"):
            res = backend.evaluate(home, a.name, "test", seed_dir, retry=retry)
        sc = res.scoring
        scoring[a.name] = {k: getattr(res, k) for k in ("cases", "correct", "accuracy", "probe_mean_loss", "seconds",
                                                        "max_new_tokens")} | {"scoring": sc.model_dump() if sc else {}}
        progress.say("test", f"{a.name}: {res.correct}/{res.cases} exact, retention probe loss "
                     f"{res.probe_mean_loss:.4f} ({res.seconds:.1f} s"
                     + (f"; generation {sc.generation_seconds:.1f} s in batches of {sc.batch} on {sc.device}"
                        f" ({sc.generation_dtype}): {sc.cases_per_second:.2f} cases/s, "
                        f"{sc.generated_tokens_per_second:,.0f} generated tokens/s" if sc and sc.cases_per_second
                        else "") + ")")


def serve_once(cfg: Resolved, home: Path, backend: Backend, skipped: dict[str, str], progress: Progress) -> None:
    """The serving probe, unless the placement left it out or a probe is already committed."""

    if SERVING_PROBE in skipped:
        progress.line(f"serve {cfg.experiment.serving_arm}: {skipped[SERVING_PROBE]}")
    elif CommitmentLog(home).latest("serving") is None:
        serve_probe(cfg, home, progress, backend=backend)
    else:
        progress.say("serve", "already probed, attempts kept")


def serve_probe(cfg: Resolved, home: Path, progress: Progress, retry: str | None = None,
                backend: Backend | None = None) -> dict:
    """The serving probe: one replica per rank of the serving arm (at least two), where the trial's
    ranks run — processes on this machine for the embedded local cluster (no backend, or the local
    one), one per host for SSH hosts (the SSH backend), reached over SSH forwards."""

    backend = backend or LocalBackend()
    arm = cfg.arm(cfg.experiment.serving_arm)
    n = max(2, arm.world_size)  # one replica per rank, and at least two: the last phase stops one
    progress.say("serve", f"{arm.name}: {n} replicas {backend.replicas_where(n)}, 1 → {n} → {n} with one stopped")
    with progress.status("serving probe…"):
        res = replicas_probe(home, arm.name, n, lambda: backend.replicas(home, arm.name, n), retry=retry,
                             say=lambda m: progress.line(f"  {m}"))
    ratios = ", ".join(f"{'—' if r is None else f'{r:.2f}'} at {c} in flight" for c, r in (
        (c, b.get("throughput_ratio_replicas_vs_single")) for c, b in res["by_level"].items()))
    progress.line(f"  throughput {n} replicas / 1: {ratios}; "
                  f"tasks with differing tokens: {len(res['tasks_with_differing_tokens'])}; "
                  f"model identities: {len(res['model_identities'])} → {res['attempt']}")
    return res


def write_trial_report(home: Path, store_url: str | None, progress: Progress) -> tuple[Report, Path]:
    """The report, recomputed from the home's evidence (anchored in `store_url` first, when given).
    A preserved report that the grown evidence changes is kept: this one takes the next name.
    Raises TrainError when the evidence is inconsistent; no report is written then."""

    if store_url:
        anchor_home(home, store_url, progress)
    try:
        rep, out = write_report_numbered(home, home / "report.json", store=store_url)
    except EvidenceError as e:
        raise TrainError(f"evidence is inconsistent, no report written: {e}") from None
    if out.name != "report.json":
        progress.say("report", f"{home / 'report.json'} is preserved evidence and the evidence has grown since: "
                     f"this report is {out.name}")
    return rep, out

