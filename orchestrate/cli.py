"""`orchestrate`: the user's entry point for a whole trial."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable, Optional

import typer
from rich.console import Console
from rich.text import Text

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Run budget-bounded training trials end to end.")
# logs and CI are not terminals: give tables room instead of rich's 80-column default. No markup:
# messages, paths and patterns hold brackets that rich would take for tags (`[a-z0-9]` once vanished
# from an error); a styled label is a Text (`say`). No wrapping of text: a long path stays whole
con = Console(stderr=True, width=None if sys.stderr.isatty() else 120, markup=False, soft_wrap=True)


def say(label: str, text: str, style: str = "bold") -> None:
    """One line: a styled label, then `text` exactly as given."""
    con.print(Text.assemble((label, style), " ", text), highlight=False)


@app.callback()
def _root() -> None:
    """Run budget-bounded training trials end to end."""


@app.command()
def run(arm: str = typer.Argument(..., help="the arm under trial, e.g. diloco-four, or an experiment's name "
                                             "(its primary arm)"),
        profile: str = typer.Option("cpu", help="smoke | cpu | gpu"),
        trials: Path = typer.Option(Path("trials"), help="where trial homes are created"),
        seeds: Path = typer.Option(Path(".seeds"), help="where seed models are materialized"),
        model_dir: Optional[Path] = typer.Option(None, help="seed directory for a 'local' seed"),
        store: Optional[str] = typer.Option(None, help="evidence store: file://DIR or s3://BUCKET/PREFIX "
                                                       "(default: the cluster's, else file://<trials>/store)"),
        cluster: Optional[Path] = typer.Option(None, help="cluster.json from `orchestrate up` (default: the "
                                                         "embedded local cluster)"),
        wheelhouse: Optional[Path] = typer.Option(None, help="SSH hosts: wheels of every dependency for the "
                                                            "hosts' Python (the project's own wheel is built)"),
        record: Optional[Path] = typer.Option(None, help="the run's record (stage seconds, arms not run, scoring "
                                                        "speed) as JSON; default "
                                                        "<trials>/run-records/<home>-<time>.json")
        ) -> None:
    """Run ARM's experiment: seed → prepare → commit → place → train every arm the cluster can place →
    select → score → serve → report → preserve, on the embedded local cluster or a cluster's SSH hosts.
    An arm whose ranks cannot each get their own GPU (or host) is reported as not run, never launched."""
    from training.config import arm_to_experiment, experiment_names, lineage, resolve
    from orchestrate.cluster import ClusterError
    from orchestrate.remote import StagingError
    from orchestrate.transport import TransportError
    from contextlib import ExitStack

    from training.errors import USER_ERRORS
    from training.hold import hold
    from training.prepare import prepare_chain
    from training.seed import materialize

    started = time.monotonic()
    placement = None
    held = ExitStack()
    clock = StageClock()
    home: Optional[Path] = None  # the last experiment's: the one trained here
    try:
        desc = _load_cluster(cluster)
        store_url = store or (desc.store if desc else f"file://{trials.resolve() / 'store'}")
        name = arm if arm in experiment_names() else arm_to_experiment(arm)
        cfg = resolve(name, profile)
        arm = arm if arm != name else cfg.experiment.acceptance.primary
        cfg.arm(arm)
        clock.about = {"experiment": name, "profile": profile, "arm": arm}
        chain = lineage(name, profile)
        home_of = lambda s: trials / f"{s.experiment.name}-{profile}"  # noqa: E731
        for step in chain:  # every home this run writes in, held until it ends: one run per home
            held.enter_context(hold(home_of(step), f"trial home {home_of(step)}"))
        if cfg.profile.seed == "local":
            if model_dir is None:
                raise typer.BadParameter(f"profile {profile} trains a local seed: pass --model-dir")
            md = model_dir
        else:
            md = seeds / cfg.profile.seed
            say("seed", f"{cfg.profile.seed} → {md}")
            with con.status("materializing / verifying the seed…"), clock("seed"):
                materialize(cfg.profile.seed, md, say=lambda m: say("seed", m))
        doing = f"preparing {name}" + (" and the experiments before it…" if cfg.experiment.previous else "…")
        with con.status(doing), clock("prepare"):
            for step, home, res in prepare_chain(chain, home_of, md):
                anchor_home(home, store_url)
                c = res["prepared"]["counts"]  # earlier experiments first: none of their tasks may recur
                say("prepare", f"{step.experiment.name}/{profile} → {home}"
                    + (f" (no task of {step.experiment.previous} recurs)" if step.experiment.previous else "")
                    + f": {res['status']} in {res['record']['seconds']['total']:.1f} s: "
                    f"{c['task']['documents']} task + {c['replay']['documents']} replay documents, "
                    f"task share of targets {c['task_share_of_targets']:.1%} unweighted / "
                    f"{c['task_share_of_weighted_targets']:.1%} weighted; committed")
        clock.about["home"] = str(home)
        placement = make_placement(desc, home, md, trials, wheelhouse)
        with clock("placement"):
            skipped = place_arms(cfg, home, placement)
        clock.about["not_run"] = skipped
        with clock("train"):
            summaries = train_arms(cfg, home, placement, not_run=skipped, stop_check=alarm_check(desc))
        anchor_home(home, store_url)  # the numerical profiles the ranks committed
        show_summaries(cfg, summaries)
        report = select_evaluate_report(cfg, home, md, placement, clock=clock, store_url=store_url)
        with clock("preserve"):
            rec = preserve_home(home, store_url, placement)
        clock.about |= {"report": str(report), "preserved": f"{rec['store']}{rec['index']}"}
    except GuardStopped as stop:  # the deadline or the transfer guard is near: keep what there is, then stop
        clock.exit = guard_stop(home, stop, cfg, store_url, placement)
        raise typer.Exit(clock.exit)
    except (*USER_ERRORS, ClusterError, StagingError, TransportError, ValueError, OSError) as e:
        # ValueError: data from a host that is not what it should be (JSON, numbers); OSError: the disk
        clock.exit, clock.about["error"] = 2, str(e)
        say("error:", str(e), style="bold red")
        raise typer.Exit(2)
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (`main`): ranks are stopped below, the record says so
        clock.exit, clock.about["error"] = 130, str(e) or "interrupted"
        raise
    except Exception as e:  # a bad option (typer's own message and exit), or a bug: recorded as it ends
        clock.exit, clock.about["error"] = None, repr(e)
        raise
    finally:
        if placement is not None:
            placement.close()
        clock.write(record, trials, home, started)
        held.close()
    from evidence.placement import SERVING_PROBE

    say(f"{arm}:", f"prepared, trained, selected, scored, {'' if SERVING_PROBE in skipped else 'served, '}"
        f"reported and preserved in {time.monotonic() - started:.1f} s → {report}; evidence "
        f"{rec['store']}{rec['index']}")
    if skipped:
        con.print("not run: " + "; ".join(f"{a} ({why.removeprefix('not run: ')})" for a, why in skipped.items())
                  + " — see the README's \"Placement\" for running them where the GPUs are",
                  highlight=False)
    con.print("stages: " + ", ".join(f"{k} {v:.1f} s" for k, v in clock.seconds.items())
              + f"; record {clock.path}", highlight=False)


class StageClock:
    """Seconds per stage of one `orchestrate run` (a stage entered twice adds up), and the run's
    machine-readable record, written however the run ends (once anything was prepared, or when
    `--record` names the file)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.about: dict = {}
        self.scoring: dict[str, dict] = {}
        self.exit = 0
        self.path: Optional[Path] = None

    def __call__(self, stage: str):
        import contextlib

        @contextlib.contextmanager
        def timed():
            t = time.monotonic()
            try:
                yield
            finally:
                self.seconds[stage] = self.seconds.get(stage, 0.0) + time.monotonic() - t
        return timed()

    def write(self, path: Optional[Path], trials: Path, home: Optional[Path], started: float) -> None:
        import datetime as dt

        from evidence.canonical import json_bytes, write_bytes_atomic
        from evidence.covered import CoveredFileError, guard_writes

        now = dt.datetime.now(dt.timezone.utc)
        if path is None:
            if home is None:  # refused before anything was prepared: nothing is written unless asked for
                return
            path = trials / "run-records" / f"{home.name}-{now.strftime('%Y%m%dT%H%M%SZ')}.json"
        data = json_bytes({"format": "trial-run-record-v1", "command": sys.argv, "ended_at": now.isoformat(),
                           "exit": self.exit, **self.about, "stages_seconds": self.seconds,
                           "total_seconds": time.monotonic() - started, "scoring": self.scoring})
        try:  # --record is the user's choice of path: never a trial home's evidence
            for p, d in guard_writes({path: data}).items():
                write_bytes_atomic(p, d)
            self.path = path
        except (CoveredFileError, OSError) as e:  # the run's own outcome stands; only its record is missing
            con.print(f"the run record is not written: {e}", highlight=False)


def _load_cluster(path: Optional[Path]):
    """The cluster description, or None for the embedded local cluster."""
    import datetime as dt

    from orchestrate.cluster import ClusterError, load
    from orchestrate.guard import Guard

    if path is None:
        return None
    desc = load(path)
    left = None if desc.deadline is None else (desc.deadline - dt.datetime.now(dt.timezone.utc)).total_seconds()
    if left is not None and left < Guard().margin_s:
        raise ClusterError(f"{path}: the deadline {desc.deadline.isoformat()} is "
                           + ("past" if left <= 0 else f"{left / 60:.1f} min away")
                           + f"; the controller stops {Guard().margin_s / 60:.0f} min before it, so nothing starts")
    if desc.budget_name:  # the cloud's own account of the spend: a spent budget starts nothing
        from botocore.exceptions import BotoCoreError, ClientError

        from orchestrate.cloud import budget_note, cluster_budget

        try:
            b = cluster_budget(desc)
        except (BotoCoreError, ClientError) as e:
            raise ClusterError(f"cannot read the trial's budget {desc.budget_name}: {e}") from None
        # a spent budget starts nothing; an unspent one proves little: its figure is hours old
        if b["actual_usd"] >= b["limit_usd"]:
            raise ClusterError(f"the trial's budget {desc.budget_name} is spent (${b['actual_usd']:.2f} of "
                               f"${b['limit_usd']:.2f}); nothing starts ({budget_note(b)})")
        say("budget", f"{desc.budget_name}: {budget_note(b)}")
    say("cluster", f"{path}: {desc.source}, {len(desc.hosts)} host(s)"
        + (f", deadline {desc.deadline.isoformat()}" if desc.deadline else ""))
    return desc


def alarm_check(desc) -> Callable[[], str | None] | None:
    """For a cluster in the cloud with transfer alarms: a check that names any alarm in ALARM. A failed
    read is said and not a stop (the alarm's own action stops its host either way)."""
    if desc is None or not desc.trial or not desc.guarded_ranks:
        return None
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    from orchestrate.cloud import raised_alarm

    session = boto3.Session(region_name=desc.region)

    def check() -> str | None:
        try:
            return raised_alarm(session, desc.trial)
        except (BotoCoreError, ClientError) as e:
            say("warning:", f"could not read the transfer alarms: {e}", style="bold yellow")
            return None

    return check


def make_placement(desc, home: Path, model_dir: Path, trials: Path, wheelhouse: Optional[Path]):
    from orchestrate.guard import Guard
    from orchestrate.trial import LocalPlacement, RemotePlacement, build_wheelhouse

    if desc is None or desc.source == "local":
        return LocalPlacement(model_dir, guard=Guard(deadline=desc.deadline) if desc else None,
                              hosts=len(desc.hosts) if desc else None)
    with con.status("building the wheelhouse…"):
        wheels = build_wheelhouse(trials / ".wheelhouse", wheelhouse)
    return RemotePlacement(desc, home, model_dir, wheel_dir=wheels,
                           say=lambda m: con.print(f"  {m}", highlight=False))


def anchor_home(home: Path, url: str) -> dict | None:
    """Every commitment of the home's log not yet in the store, anchored there (`evidence.anchors`);
    returns the log's anchors in the store (what preservation records)."""
    from evidence.anchors import anchor_log
    from evidence.stores import open_store

    got = anchor_log(home, open_store(url))
    if got and got["added"]:
        say("anchor", f"{got['added']} commitment(s) of {home.name} anchored in {url}")
    return got


def place_arms(cfg, home: Path, placement) -> dict[str, str]:
    """Where this cluster can run the experiment's arms, decided before anything launches and
    committed (or, on a later run, the home's committed placement); prints what is not run.
    Returns what is not run: arm (or the serving probe) → reason."""
    from evidence.commitments import CommitmentLog
    from evidence.placement import SERVING_PROBE, not_run
    from orchestrate import placement as pl
    from training.results import finished

    d = placement.devices(pl.trial_device(cfg))
    done = {a.name for a in cfg.experiment.arms if a.kind != "seed" and finished(home, a.name, a.world_size)}
    rec, now = pl.commit_placement(cfg, home, d, finished=done,
                                   probed=CommitmentLog(home).latest("serving") is not None)
    if rec is None:
        return {}
    skipped = not_run(rec)
    gpus = ("a CPU profile, no GPU needed" if pl.trial_device(cfg) != "cuda" else
            f"{d.gpus_per_host[0]} GPU(s) on this machine ({d.gpus_from})" if not d.one_rank_per_host else
            f"GPUs per host {list(d.gpus_per_host)} ({d.gpus_from})")
    say("place", f"{cfg.experiment.name}/{cfg.profile_name} on the {d.source} cluster, {gpus}: "
        + ("committed" if now else "as committed at this home's first run"))
    for what, why in skipped.items():
        con.print(f"  {what}: {why}", highlight=False)
    if skipped:
        runs = [r["arm"] for r in rec["arms"] if r["runs"]]
        acc = cfg.experiment.acceptance
        con.print(f"  trained: {', '.join(runs) or 'none'}; gates that need what is not run are shown as not "
                  "evaluated, the selection rules unchanged"
                  + (f"; the primary arm {acc.primary} is not run: its gates are not evaluated"
                     if acc.primary in skipped else "")
                  + ("; no serving probe" if SERVING_PROBE in skipped else ""), highlight=False)
    return skipped


def select_evaluate_report(cfg, home: Path, seed_dir: Path, placement=None, clock=None,
                           store_url: str | None = None) -> Path:
    """select (once) → test scoring of the seed and every candidate (once each) → the serving probe
    (once) → the report. What the committed placement did not run is neither scored nor probed. With
    `store_url`, the log is anchored there before the report checks it."""
    from evidence.commitments import CommitmentLog
    from evidence.placement import SERVING_PROBE, committed_placement, not_run
    from evidence.report import EvidenceError, write_report_numbered
    from training.errors import TrainError
    from orchestrate.trial import LocalPlacement
    from evidence.attempts import attempts
    from training.evaluate import attempts_dir
    from training.select import select

    clock = clock or StageClock()
    placement = placement or LocalPlacement(seed_dir)
    skipped = not_run(committed_placement(home))
    with clock("select"):
        if CommitmentLog(home).latest("selection") is None:
            sel = select(home, cfg)
            say("select", f"committed: primary {sel['primary']} (fixed by the rules), "
                f"{len(sel['candidates'])} candidates acknowledged"
                + (f"; not run: {', '.join(a for a in sel['not_run'])}" if sel.get("not_run") else ""))
    with clock("score"):
        for a in cfg.experiment.arms:
            if a.name in skipped:
                con.print(f"test {a.name}: not scored, {skipped[a.name]}", highlight=False)
                continue
            tried = attempts(attempts_dir(home, "test", a.name))
            if any(e["kind"] == "test-evaluation" and e["data"].get("arm") == a.name
                   for e in CommitmentLog(home).entries()):  # scored: an attempt committed
                say("test", f"{a.name}: already scored, attempts kept")
                continue
            retry = f"attempt(s) {', '.join(d.name for d in tried)} did not finish" if tried else None
            with con.status(f"scoring {a.name} on the test cases…"):
                res = placement.evaluate(home, a.name, "test", seed_dir, retry=retry)
            sc = res.get("scoring") or {}
            clock.scoring[a.name] = {k: res[k] for k in ("cases", "correct", "accuracy", "probe_mean_loss", "seconds",
                                                         "max_new_tokens")} | {"scoring": sc}
            say("test", f"{a.name}: {res['correct']}/{res['cases']} exact, retention probe loss "
                f"{res['probe_mean_loss']:.4f} ({res['seconds']:.1f} s"
                + (f"; generation {sc['generation_seconds']:.1f} s in batches of {sc['batch']} on {sc['device']}"
                   f" ({sc['generation_dtype']}): {sc['cases_per_second']:.2f} cases/s, "
                   f"{sc['generated_tokens_per_second']:,.0f} generated tokens/s" if sc.get("cases_per_second")
                   else "") + ")")
    with clock("serve"):
        if SERVING_PROBE in skipped:
            con.print(f"serve {cfg.experiment.serving_arm}: {skipped[SERVING_PROBE]}", highlight=False)
        elif CommitmentLog(home).latest("serving") is None:
            serve_probe(cfg, home, placement=placement)
        else:
            say("serve", "already probed, attempts kept")
    with clock("report"):
        if store_url:
            anchor_home(home, store_url)
        try:  # a preserved report that the grown evidence changes is kept: this one takes the next name
            rep, out = write_report_numbered(home, home / "report.json", store=store_url)
        except EvidenceError as e:
            raise TrainError(f"evidence is inconsistent, no report written: {e}") from None
        if out.name != "report.json":
            say("report", f"{home / 'report.json'} is preserved evidence and the evidence has grown since: this "
                          f"report is {out.name}")
    for g in rep["gates"]:
        con.print(f"  gate {g['gate']}: " + (f"not evaluated ({g['reason']})" if g["passed"] is None else
                                             f"{g['value']:.4g} → {'passed' if g['passed'] else 'FAILED'}"),
                  highlight=False)
    show_final(rep)
    return out


def show_final(rep: dict) -> None:
    """The trial in one table: test accuracy per arm (and what was not run), payload per update, and the gates."""
    from rich.table import Table
    from rich.text import Text

    t = Table(title=f"{rep['experiment']}/{rep['profile']}: result (primary {rep['selection']['primary']})")
    for col in ("arm", "test exact", "accuracy", "MB/update"):
        t.add_column(col, justify="right")
    for arm, a in rep["accuracy"].items():
        mb = rep["arms"].get(arm, {}).get("payload_bytes_per_update")
        t.add_row(arm, f"{a['correct']}/{a['cases']}", f"{a['accuracy']:.1%}", "—" if mb is None else f"{mb / 1e6:,.2f}")
    for what, why in rep.get("not_run", {}).items():
        t.add_row(Text(what), Text(why), "—", "—")
    con.print(t)
    failed, unevaluated = rep.get("failed_gates", []), rep.get("not_evaluated_gates", [])
    con.print(f"gates: {len(rep['gates']) - len(failed) - len(unevaluated)} of {len(rep['gates'])} passed"
              + (f"; failed: {'; '.join(failed)}" if failed else "")
              + (f"; not evaluated: {'; '.join(unevaluated)}" if unevaluated else ""), highlight=False)


def preserve_home(home: Path, url: str, placement=None, leave_host_payloads: str | None = None) -> dict:
    """Every file of the home into the evidence store, each object read back, and — with the placement
    the ranks ran on — every host's checkpoint payloads from that host; raises TrainError."""
    from evidence.stores import PreservationError, preserve as run_preserve
    from orchestrate.transport import TransportError
    from training.errors import TrainError

    anchors = anchor_home(home, url)
    try:
        with con.status(f"preserving {home} → {url}…"):
            parts = placement.host_parts(url) if placement is not None else None
            rec = run_preserve(home, url, trial=home.resolve().name, host_parts=parts,
                               leave_host_payloads=leave_host_payloads,
                               anchors=anchors and {k: anchors[k] for k in ("prefix", "count")})
    except (PreservationError, TransportError, OSError) as e:
        raise TrainError(f"preservation failed, nothing may be torn down: {e}") from None
    say("preserve", f"{rec['files']} files, {rec['bytes'] / 1e6:,.1f} MB "
        f"({rec['uploaded_bytes'] / 1e6:,.1f} MB uploaded now), every object read back")
    return rec


def serve_probe(cfg, home: Path, retry: str | None = None, placement=None) -> dict:
    """The serving probe: one replica per rank of the serving arm (at least two), where the trial's
    ranks run — processes on this machine for the embedded local cluster (no placement, or a
    LocalPlacement), one per host for SSH hosts (a RemotePlacement), reached over SSH forwards."""
    from orchestrate.local import threads_per_rank
    from orchestrate.serving import local_probe, replicas_probe
    from orchestrate.trial import RemotePlacement

    arm = cfg.arm(cfg.experiment.serving_arm)
    n = max(2, arm.world_size)  # one replica per rank, and at least two: the last phase stops one
    line = lambda m: con.print(f"  {m}", highlight=False)  # noqa: E731
    if isinstance(placement, RemotePlacement):
        hosts = ", ".join(h.name for h in placement.hosts[:n])
        say("serve", f"{arm.name}: {n} replicas on the hosts ({hosts}, where its ranks ran), reached over SSH "
            f"forwards, 1 → {n} → {n} with one stopped")
        with con.status("serving probe…"):
            res = replicas_probe(home, arm.name, n, lambda: placement.replicas(home, arm.name, n), retry=retry,
                                 say=line)
    else:
        say("serve", f"{arm.name}: {n} replicas on this machine, 1 → {n} → {n} with one stopped")
        with con.status("serving probe…"):
            res = local_probe(home, arm.name, n, threads=threads_per_rank(n), retry=retry, say=line)
    r = res.get("throughput_ratio_replicas_vs_single")
    con.print(f"  throughput {n} replicas / 1: {'—' if r is None else f'{r:.2f}'}; "
              f"tasks with differing tokens: {len(res['tasks_with_differing_tokens'])}; "
              f"model identities: {len(res['model_identities'])} → {res['attempt']}", highlight=False)
    return res


GUARD_STOP_EXIT = 3
"""`orchestrate run`'s exit status when the controller's guard stopped training (deadline or transfer
guard near) and what the trial had so far was preserved."""


class GuardStopped(Exception):
    """The controller's guard stopped an arm's group; not restarted, not an error of the arm."""

    def __init__(self, arm: str, said: str):
        super().__init__(f"{arm}: {said}")
        self.arm, self.said = arm, said


def guard_stop(home: Path, stop: GuardStopped, cfg, url: str, placement=None) -> int:
    """Record what the guard stopped in the home (`stops/<time>.json`) and preserve every file the
    controller holds, so the hosts can be taken down without losing the trial: the finished arms, the
    stopped arm's rank logs, the commitments. The stopped arm's checkpoints stay where its ranks wrote
    them (on SSH hosts, their volumes, which the cloud's deadline stops rather than deletes); `run`
    again, with a later deadline, resumes from them."""
    import datetime as dt

    from evidence.canonical import write_json_atomic
    from training.errors import USER_ERRORS
    from training.results import finished

    try:
        at = dt.datetime.now(dt.timezone.utc)
        done = [a.name for a in cfg.experiment.arms if a.kind != "seed" and finished(home, a.name, a.world_size)]
        rel = f"stops/{at.strftime('%Y%m%dT%H%M%S%fZ')}.json"
        write_json_atomic(home / rel, {"format": "trial-stop-v1", "at": at.isoformat(), "stopped_by": "guard",
                                       "guard": stop.said, "arm": stop.arm, "finished_arms": done,
                                       "rank_logs": f"logs/{stop.arm}"})
        say("stopped", f"{stop.arm} by the controller's guard: {stop.said}", style="bold yellow")
        con.print(f"  finished before it: {', '.join(done) or 'none'}; recorded in {home / rel}", highlight=False)
        rec = preserve_home(home, url, placement)
    except (*USER_ERRORS, OSError, ValueError) as e:  # the stop stands; what is on disk stays where it is
        say("error:", f"stopped by the guard ({stop.said}), and then: {e}", style="bold red")
        return 2
    con.print(f"the trial so far is preserved ({rec['store']}{rec['index']}): `orchestrate down --home {home}` "
              f"may proceed; `orchestrate run` again, with a later deadline, resumes where it stopped", highlight=False)
    return GUARD_STOP_EXIT


def train_arms(cfg, home: Path, placement, not_run: dict[str, str] | None = None,
               stop_check: Callable[[], str | None] | None = None) -> list[dict]:
    """Train every arm of the experiment the placement runs, one after another (never two jobs on
    one device); an arm in `not_run` is never launched. Before each arm it would launch,
    `stop_check` may name a reason to stop (a raised cloud alarm): the trial then stops as when the
    controller's guard stops it."""
    from training.errors import TrainError
    from training.results import finished, load_results, summarize

    out = []
    for a in cfg.experiment.arms:
        if a.kind == "seed":
            continue
        if a.name in (not_run or {}):
            con.print(f"train {a.name}: {not_run[a.name]}", highlight=False)
            continue
        if finished(home, a.name, a.world_size):
            say("train", f"{a.name}: already finished, results kept")
        else:
            reason = stop_check() if stop_check else None
            if reason:
                raise GuardStopped(a.name, reason)
            say("train", f"{a.name} ({a.kind}, {a.world_size} rank"
                f"{'s' if a.world_size > 1 else ''}) → {home / 'runs' / a.name}")
            # with group checkpoints, a failed group is restarted once from the common manifest
            attempts = placement.train(home, a, max_restarts=1 if cfg.profile.checkpoint_every else 0,
                                       echo=lambda line: con.print(f"  {line}", highlight=False))
            if attempts and not attempts[-1].ok:  # none: it had finished on the hosts and was collected
                if attempts[-1].reason == "guard":
                    raise GuardStopped(a.name, attempts[-1].guard or "")
                raise TrainError(f"arm {a.name} failed; {attempts[-1].failure_text()}")
        out.append(summarize(load_results(home, a.name, a.world_size)))
    return out


def show_summaries(cfg, summaries: list[dict]) -> None:
    from rich.table import Table

    t = Table(title=f"{cfg.experiment.name}/{cfg.profile_name}: training")
    for col in ("arm", "ranks", "updates", "step s", "loop s", "MB/update", "loss first", "loss last",
                "replicas"):
        t.add_column(col, justify="right", no_wrap=True)
    for s in summaries:
        t.add_row(s["arm"], str(s["world_size"]), str(s["updates"]), f"{s['step_seconds_median']:.3f}",
                  f"{s['training_loop_seconds']:.1f}", f"{s['payload_bytes_per_update'] / 1e6:.2f}",
                  f"{s['loss_first']:.4f}", f"{s['loss_last']:.4f}",
                  "agree" if s["replicas_agree"] else "DIFFER")
    con.print(t)
    con.print("step s: median over updates of the slowest rank; MB/update: logical collective payload "
              "per rank; loss: global weighted response loss of the first and last update")


@app.command()
def up(local: bool = typer.Option(False, "--local", help="the embedded local cluster on this machine"),
       hosts: int = typer.Option(4, help="--local: how many ranks"),
       stack: Optional[str] = typer.Option(None, help="a Pulumi stack's name: its outputs read through Pulumi's "
                                                      "Automation API (needs the pulumi CLI)"),
       pulumi_outputs: Optional[Path] = typer.Option(None, help="a stack's `pulumi stack output --json`, saved"),
       key_file: Optional[Path] = typer.Option(None, help="--stack/--pulumi-outputs: the private half of the "
                                                          "stack's ssh_public_key"),
       host_keys: Optional[Path] = typer.Option(None, help="--stack/--pulumi-outputs: JSON {rank: 'ssh-ed25519 AAAA…'} you "
                                                           "checked yourself (default: read from each instance's "
                                                           "console output)"),
       boot_wait: float = typer.Option(900, help="--stack/--pulumi-outputs: seconds to wait for booting instances to "
                                                 "print their host keys"),
       addresses: str = typer.Option("cloud", help="--stack/--pulumi-outputs: 'cloud' reads each host's current "
                                                   "addresses from EC2 (a stop/start gives new public ones); "
                                                   "'outputs' takes the stack outputs' as they are"),
       store: Optional[str] = typer.Option(None, help="--local: evidence store (default file://trials/store)"),
       out: Path = typer.Option(Path("cluster.json"), help="where to write the description")) -> None:
    """Write cluster.json: the embedded local cluster, or a Pulumi stack's hosts from its outputs
    (`pulumi up` creates them; this only describes them, and checks every field)."""
    import json

    from botocore.exceptions import BotoCoreError, ClientError

    from evidence.covered import CoveredFileError, guard_writes
    from orchestrate.cloud import HostKeysMissing
    from orchestrate.cluster import ClusterError, local_cluster, pulumi_cluster, save

    aws_errors = (BotoCoreError, ClientError)

    try:
        if [local, pulumi_outputs is not None, stack is not None].count(True) != 1:
            raise ClusterError("pass exactly one of --local, --stack and --pulumi-outputs")
        if local:
            desc = local_cluster(hosts, Path.cwd(), store or f"file://{(Path('trials') / 'store').resolve()}")
        else:
            from infra.outputs import OutputsError, parse_outputs, read_stack_outputs

            if key_file is None:
                raise ClusterError("--stack/--pulumi-outputs need --key-file (the private half of the stack's "
                                   "ssh_public_key)")
            try:
                keys = {int(k): v for k, v in json.loads(host_keys.read_text()).items()} if host_keys else None
                text = json.dumps(read_stack_outputs(stack)) if stack else pulumi_outputs.read_text()
            except OutputsError as e:
                raise ClusterError(str(e)) from None
            except (OSError, ValueError, AttributeError) as e:
                raise ClusterError(f"cannot read {host_keys or pulumi_outputs}: {e}") from None
            if addresses not in ("cloud", "outputs"):
                raise ClusterError(f"--addresses {addresses!r}: give 'cloud' or 'outputs'")
            if addresses == "cloud":  # the outputs' addresses are those of `pulumi up`, gone after a stop
                import boto3

                from orchestrate.cloud import current_addresses, with_current_addresses

                try:
                    parsed = parse_outputs(text)
                except OutputsError as e:
                    raise ClusterError(str(e)) from None
                now = current_addresses(boto3.Session(region_name=parsed.region), [h.instance_id for h in parsed.hosts])
                text = json.dumps(with_current_addresses(json.loads(text), now))
                say("cluster", "addresses as EC2 reports them now: " + ", ".join(
                    f"rank {h.rank} {now[h.instance_id]['public_ip']}" for h in parsed.hosts))
            if keys is None:  # from the consoles, where cloud-init printed them at first boot
                import boto3

                from orchestrate.cloud import console_output, pin_host_keys

                try:
                    parsed = parse_outputs(text)
                except OutputsError as e:
                    raise ClusterError(str(e)) from None
                # cloud-init prints the keys at an instance's first boot only: after a stop/start the
                # console has none, so the keys pinned earlier for the same instances are kept
                keys = kept_host_keys(out, {h.rank: h.instance_id for h in parsed.hosts})
                if keys:
                    say("cluster", f"host keys kept from {out} for rank(s) {sorted(keys)} (the same instances; "
                                   "cloud-init prints them only at first boot)")
                todo = {h.rank: h.instance_id for h in parsed.hosts if h.rank not in keys}
                if todo:
                    session = boto3.Session(region_name=parsed.region)
                    say("cluster", f"reading {len(todo)} instance console(s) for their SSH host keys")
                    keys |= pin_host_keys(todo, lambda iid: console_output(session, iid), wait_s=boot_wait,
                                          say=lambda m: say("cluster", m))
            desc = pulumi_cluster(text, key_file=str(key_file.resolve()), host_keys=keys)
            missing = [h.rank for h in desc.hosts if h.host_key is None]
            if missing:
                raise ClusterError(f"no pinned host key for rank(s) {missing}: --host-keys names none for them "
                                   "(an unknown host key is never accepted)")
        guard_writes({out: b""})  # --out is the user's choice of path: never a trial home's evidence
        save(desc, out)
    except (ClusterError, CoveredFileError, ValueError, OSError, HostKeysMissing) as e:  # ValueError: pydantic's
        say("error:", str(e), style="bold red")                                           # or a key's refusal
        raise typer.Exit(2)
    except aws_errors as e:
        say("error:", f"reading the instances (addresses, consoles) failed: {e}", style="bold red")
        raise typer.Exit(1)
    say("cluster", f"{desc.source}: {len(desc.hosts)} host(s), store {desc.store} → {out}")


def kept_host_keys(path: Path, instances: dict[int, str]) -> dict[int, str]:
    """{rank: host key} pinned in an earlier cluster.json at `path` for the same instance at the same
    rank; nothing from a file that is absent or unreadable, or for a rank whose instance changed (a
    replaced host has new keys, read from its console)."""
    from orchestrate.cluster import ClusterError, load

    if not path.is_file():
        return {}
    try:
        prev = load(path)
    except ClusterError:
        return {}
    return {h.rank: h.host_key for h in prev.hosts
            if h.host_key and h.instance_id and instances.get(h.rank) == h.instance_id}


@app.command()
def probe(home: Path = typer.Option(..., help="a trial home with a committed selection"),
          retry: Optional[str] = typer.Option(None, help="run another probe; the reason is recorded"),
          cluster: Optional[Path] = typer.Option(None, help="cluster.json the trial ran on: its SSH hosts serve "
                                                           "(default: replicas on this machine)"),
          seeds: Path = typer.Option(Path(".seeds"), help="SSH hosts: where the profile's seed is materialized"),
          model_dir: Optional[Path] = typer.Option(None, help="SSH hosts: the seed directory (a 'local' seed)"),
          wheelhouse: Optional[Path] = typer.Option(None, help="SSH hosts: wheels of every dependency")) -> None:
    """Run the serving probe (one replica per rank of the serving arm, at least two): on this machine,
    or with --cluster one per SSH host, where the trial's ranks ran."""
    from orchestrate.cluster import ClusterError
    from orchestrate.remote import StagingError
    from orchestrate.transport import TransportError
    from training.errors import USER_ERRORS
    from training.hold import hold
    from training.prepare import require_prepared
    from training.train import resolved_from_prepared

    placement = None
    try:
        with hold(home, f"trial home {home}"):
            cfg = resolved_from_prepared(require_prepared(home))
            desc = _load_cluster(cluster)
            if desc is not None and desc.source != "local":  # the hosts are staged (again) from the seed
                md = model_dir or seeds / cfg.profile.seed
                placement = make_placement(desc, home, md, home.parent, wheelhouse)
            serve_probe(cfg, home, retry=retry, placement=placement)
    except (*USER_ERRORS, ClusterError, StagingError, TransportError) as e:
        say("error:", str(e), style="bold red")
        raise typer.Exit(2)
    finally:
        if placement is not None:
            placement.close()


@app.command()
def estimate(stack: Path = typer.Option(Path("Pulumi.dev.yaml"), help="a Pulumi stack config file"),
             as_json: bool = typer.Option(False, "--json", help="print the estimate as JSON")) -> None:
    """The cost and traffic estimate of a stack's plan against its budget (what `pulumi up` checks)."""
    import json

    from infra.plan import estimate as run_estimate, table

    cfg = _stack_config(stack)
    est = run_estimate(cfg, _now())
    if as_json:
        print(json.dumps(est, indent=1))
    else:
        print(table(est))
    for p in est["problems"]:
        say("does not fit:", p, style="bold red")
    raise typer.Exit(1 if est["problems"] else 0)


def _now():
    import datetime as dt

    return dt.datetime.now(dt.timezone.utc)


def _stack_config(stack: Path):
    import yaml
    from pydantic import ValidationError

    from infra.plan import TrialConfig

    try:
        conf = yaml.safe_load(stack.read_text())["config"]
        return TrialConfig.model_validate({**conf["trials:cluster"], "region": conf["aws:region"]})
    except (OSError, KeyError, TypeError, yaml.YAMLError, ValidationError) as e:
        say("error:", f"{stack}: {e}", style="bold red")
        raise typer.Exit(2)


@app.command()
def plan(arm: str = typer.Argument(..., help="the arm under trial, e.g. diloco-four"),
         stack: Path = typer.Option(Path("Pulumi.dev.yaml"), help="a Pulumi stack config file"),
         quota: bool = typer.Option(True, help="read the account's G/VT vCPU quota and the zones' instance-type "
                                               "offerings (needs AWS credentials); --no-quota: no AWS reads"),
         wheelhouse: Optional[Path] = typer.Option(None, help="the wheelhouse staging will upload (its size counts)"),
         uplink_mbps: float = typer.Option(100.0, min=0.001, max=1e6,
                                           help="this machine's upload rate, Mbit/s, for the staging time"),
         as_json: bool = typer.Option(False, "--json")) -> None:
    """Cost, hours and bytes of ARM's experiment (the arm and its controls) against the budget split,
    the hosts' vCPUs against the account's G-instance quota, and what staging sends from this machine.
    Exit 1 when anything does not fit."""
    import json

    from rich.table import Table

    from infra.plan import GB, estimate as run_estimate, table
    from infra.prices import INSTANCE_TYPES
    from training.config import ConfigError, arm_to_experiment, resolve

    cfg = _stack_config(stack)
    try:
        exp = resolve(arm_to_experiment(arm), "gpu").experiment
    except ConfigError as e:
        say("error:", str(e), style="bold red")
        raise typer.Exit(2)
    names = {a.name for a in exp.arms}
    arms = [a for a in cfg.arms if a.name in names]
    if arm not in {a.name for a in arms}:
        say("error:", f"{stack} plans no arm '{arm}' (it plans: "
            f"{', '.join(a.name for a in cfg.arms)})", style="bold red")
        raise typer.Exit(2)
    if wheelhouse is not None and not wheelhouse.is_dir():
        say("error:", f"--wheelhouse {wheelhouse} is not a directory", style="bold red")
        raise typer.Exit(2)
    staging = staging_upload(cfg, wheelhouse, uplink_mbps)
    # the isolated host's counters see staging too: the guard check counts it
    est = run_estimate(cfg.model_copy(update={"arms": arms}), _now(), wheelhouse_bytes=staging["wheelhouse_bytes"])
    problems = list(est["problems"])
    if staging["hours"] > cfg.hours:
        problems.append(f"staging sends {staging['bytes'] / 1e9:,.2f} GB from this machine, even through the bucket: "
                        f"{staging['hours']:.2f} h at {uplink_mbps:g} Mbit/s, more than the {cfg.hours:g} h paid for")
    need = sum(int(INSTANCE_TYPES.get(h.instance_type, {}).get("vcpus") or 0) for h in cfg.hosts)
    vcpu: dict = {"hosts_vcpus": need, "quota": None, "note": None}
    zones: dict = {"checked": False, "note": "not checked (--no-quota: no AWS reads)"}
    if quota:
        import boto3
        from botocore.exceptions import BotoCoreError, ClientError

        from orchestrate.cloud import G_VT_VCPU_QUOTA, read_vcpu_quota, zone_offerings

        session = boto3.Session(region_name=cfg.region)
        try:
            vcpu["quota"] = read_vcpu_quota(session)
        except (BotoCoreError, ClientError) as e:
            vcpu["note"] = f"quota not readable: {e}"
        try:  # zone names differ between accounts; a zone may not offer the type at all
            by_id = cfg.hosts[0].zone_is_id
            zones = {"checked": True, "by_id": by_id, **zone_offerings(
                session, sorted({h.zone for h in cfg.hosts}), sorted({h.instance_type for h in cfg.hosts}), by_id=by_id)}
            for h in cfg.by_rank:
                if h.instance_type not in zones["zones"][h.zone]:
                    problems.append(f"host {h.rank}'s zone {h.zone} does not offer {h.instance_type} in this account "
                                    f"(offered in: {', '.join(zones['offered_in'].get(h.instance_type, [])) or 'none'} "
                                    f"of {cfg.region}): choose one of those, as a zone ID (use1-az4), which names the "
                                    "same physical zone in every account")
        except (BotoCoreError, ClientError) as e:
            zones = {"checked": False, "note": f"not checked (offerings not readable: {e})"}
        if vcpu["quota"] is not None and need > vcpu["quota"]:
            problems.append(f"the hosts need {need} G/VT vCPUs; the account's quota in {cfg.region} is "
                            f"{vcpu['quota']:g} (Service Quotas {G_VT_VCPU_QUOTA[1]}): ask for more before `pulumi up`")
    usd = {x["arm"]: sum(ln["usd"] for ln in est["lines"]  # the estimate's own priced lines, per arm
                         if ln["category"] == "transfer" and ln["item"].startswith(f"{x['arm']}:"))
           for x in est["traffic"]}
    placed = _plan_placement(exp, cfg, {a.name for a in arms}, problems)
    if as_json:
        print(json.dumps({**est, "arm": arm, "experiment": exp.name, "hours": cfg.hours,
                          "deadline": cfg.deadline and cfg.deadline.isoformat(), "vcpu": vcpu,
                          "placement": placed, "staging": staging, "zones": zones, "problems": problems}, indent=1))
        raise typer.Exit(1 if problems else 0)
    t = Table(title=f"{arm} ({exp.name}) on {len(cfg.hosts)} host(s) in {cfg.region}, {cfg.hours:g} h, "
                    f"deadline {cfg.deadline.isoformat() if cfg.deadline else 'not set'}")
    for col in ("arm", "ranks", "GPUs", "syncs", "payload/sync", "rx+tx per host", "cross-zone", "transfer USD"):
        t.add_column(col, justify="right")
    fits = {r["arm"]: r for r in (placed or {}).get("arms", [])}
    for x in est["traffic"]:
        r = fits.get(x["arm"])
        t.add_row(x["arm"], str(x["world_size"]),
                  "—" if r is None else "not run" if r["reason"] else "fits" if r["gpus_known"] else "unknown",
                  str(x["synchronizations"]),
                  f"{x['payload_bytes_per_sync'] / GB:,.2f} GB", f"{x['host_bytes_rx_plus_tx'] / 1e12:,.3f} TB",
                  f"{x['cross_zone_bytes'] / 1e12:,.3f} TB", f"{usd[x['arm']]:,.2f}")
    con.print(t)
    if placed is not None:
        print(f"GPUs: {placed['cluster']['gpus_per_host']} per host ({placed['cluster']['gpus_from']}), one rank per "
              f"host; an arm that does not fit is not run (`orchestrate run` trains the others)")
        for r in placed["arms"]:
            if r["reason"]:
                print(f"  {r['arm']}: {r['reason']}")
    print(table(est))
    print(f"vCPUs: the hosts need {need}; G/VT quota "
          + (f"{vcpu['quota']:g}" if vcpu["quota"] is not None else f"unknown ({vcpu['note'] or 'not asked'})"))
    per_host = (f"{staging['seed_bytes'] / 1e9:,.2f} GB seed, 4 bytes × {cfg.parameters:,} parameters + "
                f"{staging['wheelhouse_bytes'] / 1e9:,.2f} GB wheelhouse" + ("" if wheelhouse else " (not given: --wheelhouse)"))
    print(f"staging through the trial's bucket (what `orchestrate run` does on this stack): ({per_host}) once + the "
          f"project's wheel to each of {staging['hosts']} host(s) = {staging['bytes'] / 1e9:,.2f} GB leave this machine: "
          f"{staging['hours']:.2f} h at {uplink_mbps:g} Mbit/s (--uplink-mbps), {staging['hours'] / cfg.hours:.0%} of "
          f"the {cfg.hours:g} h paid for; the hosts fetch it in region")
    print(f"staging over SSH alone (no bucket): {staging['hosts']} host(s) × ({per_host}) = "
          f"{staging['ssh_only_bytes'] / 1e9:,.2f} GB: {staging['ssh_only_hours']:.2f} h at {uplink_mbps:g} Mbit/s")
    if zones["checked"]:
        print("zones: " + "; ".join(
            f"{z}{'' if zones['by_id'] else ' (' + zones['zone_ids'].get(z, '?') + ' in this account)'} offers "
            f"{', '.join(t) or 'none of the types'}" for z, t in zones["zones"].items()))
    else:
        print(f"zones: {zones['note']}; `pulumi up` fails at the first host whose zone lacks its type")
    print(f"transfer guard: the controller stops a group at {cfg.guard_fraction:.0%} (guard_fraction, the same number on "
          f"the hosts) of each isolated host's {cfg.transfer_guard_bytes / 1e12:.3f} TB; the host's own guard and its "
          "NetworkIn/NetworkOut alarms stop it at 100 %")
    per_day = sum(ln["usd"] for ln in est["lines"] if ln["item"].startswith("stopped:")) / (cfg.stopped_days or 1)
    left = est["reserved_usd"]["storage_other"] - est["totals_usd"]["storage_other"]
    if cfg.stopped_days:
        print(f"stopped volumes: ${per_day:.2f} a day after the deadline until `orchestrate down` ({cfg.stopped_days:g} "
              f"d counted, stopped_days); the storage reservation has ${left:.2f} left" +
              (f", {left / per_day:.1f} more days" if per_day and left > 0 else ""))
    else:
        print("stopped volumes: not counted (stopped_days = 0): they bill every day after the deadline until "
              "`orchestrate down`")
    print(f"stops: the cloud schedule at the deadline and the transfer guards are the bounds. The budget "
          f"(${cfg.budget.total_usd:g}, {'the region' if cfg.budget_filter == 'region' else 'the trial tag'}'s spend) "
          "and its stop action are a late backstop: AWS Budgets sees costs hours late (its data is refreshed at "
          f"least daily), so a {cfg.hours:g}-h trial's spend may not show in it before the deadline")
    for p in problems:
        say("does not fit:", p, style="bold red")
    raise typer.Exit(1 if problems else 0)


def staging_upload(cfg, wheelhouse: Optional[Path], uplink_mbps: float) -> dict:
    """What staging sends from the operator's machine, over its uplink: the seed (FP32 safetensors, 4
    bytes a parameter) and the wheelhouse. Over SSH alone (a cluster without a bucket) once to every
    host; through the stack's bucket (the relay, evidence/relay.py: what `orchestrate run` does on a
    stack) once in all, plus the project's wheel and a manifest to each host (under a MB each,
    counted as PROJECT_WHEEL_BYTES). The budget is checked against the relay's figure."""
    wheels = sum(p.stat().st_size for p in wheelhouse.glob("*.whl")) if wheelhouse and wheelhouse.is_dir() else 0
    seed, hosts = 4 * cfg.parameters, len(cfg.hosts)
    ssh = hosts * (seed + wheels)
    relay = seed + wheels + hosts * PROJECT_WHEEL_BYTES

    def hours(b: int) -> float:
        return b * 8 / (uplink_mbps * 1e6) / 3600

    return {"hosts": hosts, "seed_bytes": seed, "wheelhouse_bytes": wheels, "uplink_mbps": uplink_mbps,
            "bytes": relay, "hours": hours(relay), "ssh_only_bytes": ssh, "ssh_only_hours": hours(ssh)}


PROJECT_WHEEL_BYTES = 1_000_000
"""An upper bound on the project's own wheel and a staging manifest (0.24 MB and ~2 KB at 2026-12-01):
what still goes over SSH to each host when the relay carries the rest."""


def _plan_placement(exp, cfg, planned: set[str], problems: list[str]) -> dict | None:
    """Whether each planned arm's ranks get a GPU each on the stack's hosts (one rank per host; GPUs per
    instance type from infra/prices.py, None where unknown: the arm is then listed as "unknown"). A host 0
    without a GPU is a problem: nothing could train or score; an arm that does not fit is listed as not
    run, as `run` would."""
    from infra.prices import INSTANCE_TYPES
    from orchestrate.cluster import ClusterError
    from orchestrate.placement import hosts_devices, place

    gpus = [INSTANCE_TYPES.get(h.instance_type, {}).get("gpus") for h in cfg.by_rank]
    d = hosts_devices("stack", gpus, None, "infra/prices.py, per instance type")
    try:
        placed = {"cluster": d.as_dict(), **place(exp.arms, exp.serving_arm, "cuda", d)}
    except ClusterError as e:
        problems.append(str(e))
        return None
    placed["arms"] = [{**r, "gpus_known": None not in gpus[:r["world_size"]]} for r in placed["arms"]
                      if r["arm"] in planned]
    return placed


@app.command()
def status(cluster: Path = typer.Option(Path("cluster.json"), help="the trial's cluster.json"),
           home: Optional[Path] = typer.Option(None, help="the trial home (the embedded local cluster's ranks write there)"),
           as_json: bool = typer.Option(False, "--json")) -> None:
    """A running trial: spend so far, bytes against the transfer guard, time to the deadline, each rank's state."""
    import json

    from rich.table import Table

    from orchestrate.cluster import ClusterError, load
    from orchestrate.cloud import budget_note
    from orchestrate.status import trial_status

    try:
        desc = load(cluster)
        st = trial_status(desc, home)
    except (ClusterError, ValueError) as e:
        say("error:", str(e), style="bold red")
        raise typer.Exit(2)
    if as_json:
        print(json.dumps(st, indent=1))
        return
    left = st["seconds_to_deadline"]
    spend = st["spend"]
    say(f"{desc.trial or desc.source}:", "deadline "
        + ("none" if left is None else f"{st['deadline']} ({left / 60:,.1f} min left)" if left > 0
        else f"{st['deadline']} (PASSED)")
        + "; spend " + ("— (no AWS budget: embedded or test cluster)" if spend is None
        else f"unknown ({spend['error']})" if "error" in spend
        else budget_note(spend)))
    tb = Table()
    for col in ("rank", "host", "zone", "state", "arm", "update", "heartbeat age", "rx+tx", "of guard"):
        tb.add_column(col, justify="right")
    for h in st["hosts"]:
        age = h.get("heartbeat_age_s")
        tb.add_row(str(h["rank"]), h["host"], h["zone"] or "—", h["state"], h.get("arm") or "—",
                   "—" if h.get("update") is None else str(h["update"]), "—" if age is None else f"{age:,.0f} s",
                   "—" if h.get("bytes_rx_tx") is None else f"{h['bytes_rx_tx'] / 1e9:,.3f} GB",
                   f"{h['guard_fraction']:.1%}" if "guard_fraction" in h else "—")
    con.print(tb)
    for w in st.get("addresses") or []:
        say("warning:", w, style="bold yellow")
    alerts = st.get("alerts")
    if alerts is not None and "error" in alerts:
        say("alerts:", f"unknown ({alerts['error']})", style="bold yellow")
    elif alerts is not None:
        say("alerts:", "transfer alarms " + (", ".join(f"{a['name']} {a['state']}" for a in alerts["alarms"]) or "none")
            + "; topic reaches " + (", ".join(f"{s['endpoint']} ({s['protocol']}, {s['state']})"
                                              for s in alerts["subscriptions"]) or "no one"))
        for w in alerts["warnings"]:
            say("warning:", w, style="bold yellow")


@app.command()
def preserve(home: Path = typer.Option(..., help="the trial home"),
             store: Optional[str] = typer.Option(None, help="file://DIR or s3://BUCKET/PREFIX "
                                                            "(default: the cluster's, else file://<home's parent>/store)"),
             cluster: Optional[Path] = typer.Option(None, help="the cluster the ranks ran on: each SSH host "
                                                               "preserves the checkpoint payloads that stayed on it"),
             leave_host_payloads: Optional[str] = typer.Option(None, help="REASON: preserve without the payloads "
                                                               "that stayed on the hosts (recorded in the index)")) -> None:
    """Upload every file of the home, content-addressed, each object read back and re-hashed; with
    --cluster, every SSH host preserves its own checkpoint payloads from where they are."""
    from orchestrate.cluster import ClusterError, load
    from orchestrate.remote import host_parts
    from training.errors import USER_ERRORS
    from training.hold import hold

    class Hosts:  # the one thing preserve_home asks of a placement
        def __init__(self, desc):
            self.desc, self.ts = desc, [desc.transport(h) for h in desc.by_rank]

        def host_parts(self, url: str):
            return host_parts(self.desc, self.ts, url, say=lambda m: say("preserve", m))

        def close(self) -> None:
            for t in self.ts:
                t.close()

    hosts = None
    try:
        desc = load(cluster) if cluster else None
        hosts = Hosts(desc) if desc is not None and any(h.transport == "ssh" for h in desc.hosts) else None
        url = store or (desc.store if desc else f"file://{home.resolve().parent / 'store'}")
        with hold(home, f"trial home {home}"):
            rec = preserve_home(home, url, hosts, leave_host_payloads)
    except (*USER_ERRORS, ClusterError) as e:
        say("error:", str(e), style="bold red")
        raise typer.Exit(2)
    finally:
        if hosts is not None:
            hosts.close()
    con.print(f"  → {rec['store']}{rec['index']}", highlight=False)


@app.command()
def down(home: Path = typer.Option(..., help="the trial home"),
         aws_trial: Optional[str] = typer.Option(None, help="stop and reconcile this trial's AWS hosts by tag"),
         region: Optional[str] = typer.Option(None, help="AWS region of --aws-trial")) -> None:
    """Tear down — only once the home's evidence index verifies in its store, object by object."""
    from evidence.canonical import EvidenceFileError
    from evidence.stores import PRESERVED, PreservationError, read_preserved, verify_index
    from training.hold import HeldError, hold

    rec_path = home / PRESERVED
    if not rec_path.is_file():
        say("refused:", f"{home} has not been preserved (no {PRESERVED}); run `orchestrate preserve --home "
            f"{home}` first — hosts stay up until the evidence is safe", style="bold red")
        raise typer.Exit(2)
    try:
        with hold(home, f"trial home {home}"):  # not while a run writes in it
            rec = read_preserved(home)
            with con.status("re-reading every preserved object…"):
                v = verify_index(rec["store"], rec["index"], rec["index_sha256"])
    except HeldError as e:
        say("refused:", str(e), style="bold red")
        raise typer.Exit(2)
    except (EvidenceFileError, PreservationError, OSError) as e:
        say("refused:", f"the evidence {rec_path} records does not verify: {e}", style="bold red")
        raise typer.Exit(2)
    say("verified", f"{v['files']} objects, {v['bytes'] / 1e6:,.1f} MB in {rec['store']}")
    if aws_trial is None:
        con.print("embedded local cluster: no hosts to stop", highlight=False)
        return
    import boto3

    from orchestrate.cloud import reconcile, stop_trial

    session = boto3.Session(region_name=region)
    stopped = stop_trial(session, aws_trial)
    con.print(f"stopped {len(stopped)} instance(s): {', '.join(stopped) or '—'}", highlight=False)
    left = reconcile(session, aws_trial)
    for f in left:
        con.print(f"  {f.kind} {f.id}: {f.state}{' — still billing' if f.billing else ''} {f.detail}",
                  highlight=False)
    if any(f.billing and f.kind == "instance" for f in left):
        raise typer.Exit(1)


@app.command("recovery-trial")
def recovery_trial_cmd(
        arm: str = typer.Option("diloco-four", help="the arm to interrupt"),
        profile: str = typer.Option("recovery", help="a profile with checkpoint_every set"),
        from_step: int = typer.Option(64, help="the uninterrupted run's checkpoint to start from"),
        kill_rank: int = typer.Option(1, help="the rank to kill"),
        kill_after: int = typer.Option(75, help="kill it after this many updates"),
        out: Path = typer.Option(Path("trials/recovery"), help="a fresh directory for the trial"),
        seeds: Path = typer.Option(Path(".seeds"), help="where seed models are materialized")) -> None:
    """Kill a rank mid-run, restart from the common checkpoint, compare with an uninterrupted run."""
    import json

    from orchestrate.recovery import recovery_trial
    from training.config import arm_to_experiment, lineage
    from training.errors import USER_ERRORS
    from training.seed import materialize

    try:
        name = arm_to_experiment(arm)
        chain = lineage(name, profile)
        if out.exists():
            raise typer.BadParameter(f"{out} exists; give a fresh --out")
        md = seeds / chain[-1].profile.seed
        materialize(chain[-1].profile.seed, md)
        rep = recovery_trial(out, experiment_chain=chain, arm=arm, model_dir=md, from_step=from_step,
                             kill_rank=kill_rank, kill_after=kill_after,
                             say=lambda m: con.print(m, highlight=False))
    except (*USER_ERRORS, ValueError, RuntimeError) as e:
        say("error:", str(e), style="bold red")
        raise typer.Exit(2)
    f, c = rep["failure"], rep["comparison"]
    con.print(f"kill → failure observed {f['kill_to_observed_seconds']:.3f} s, → survivors stopped "
              f"{f['kill_to_survivors_stopped_seconds']:.3f} s; resumed from {sorted(set(rep['resumed_from']))}")
    con.print(f"final state of every rank vs the uninterrupted run: max |Δ| = {c['max_abs_diff']!r} "
              f"over {sum(p['tensors'] for r in c['ranks'] for k, p in r.items() if isinstance(p, dict))} "
              f"tensors; {'IDENTICAL' if c['identical'] else 'DIFFERENT'}")
    print(json.dumps({"comparison": str(out / "recovery-comparison.json"), "digest": rep["digest"],
                      "max_abs_diff": c["max_abs_diff"], "identical": c["identical"],
                      "kill_to_survivors_stopped_seconds": f["kill_to_survivors_stopped_seconds"]}))
    if not c["identical"]:
        raise typer.Exit(1)


def main() -> None:
    import signal

    def terminated(signum: int, frame) -> None:
        raise KeyboardInterrupt("terminated (SIGTERM)")

    # `timeout`, a scheduler or `kill` ends a run with SIGTERM, which Python would obey at once, skipping
    # every `finally`: ranks left running, holds and records not written. As Ctrl-C, it unwinds instead.
    signal.signal(signal.SIGTERM, terminated)
    app()
