"""The command lines, as a user runs them."""

import json
import re
from pathlib import Path

from conftest import run_cli


def test_check_entry(smoke_home):
    from training.prepare import load_cases

    row = load_cases(smoke_home)["test-00003"]
    ok = run_cli("-m", "training", "check", "--home", str(smoke_home), "--case", "test-00003",
                 stdin=row["target"] + "\n")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout) == {"case": "test-00003", "correct": True, "reason": "ok"}
    bad = run_cli("-m", "training", "check", "--home", str(smoke_home), "--case", "test-00003",
                  stdin=row["target"] + " thanks!")
    assert json.loads(bad.stdout) == {"case": "test-00003", "correct": False, "reason": "trailing_text"}
    unknown = run_cli("-m", "training", "check", "--home", str(smoke_home), "--case", "test-99999")
    assert unknown.returncode == 2 and "no case 'test-99999'" in unknown.stderr


def test_check_refuses_uncommitted_home(tmp_path):
    r = run_cli("-m", "training", "check", "--home", str(tmp_path), "--case", "test-00000")
    assert r.returncode == 2 and "no 'prepare' commitment" in r.stderr


def test_prepare_bad_names_write_nothing(tmp_path, tiny_seed):
    r = run_cli("-m", "training", "prepare", "--experiment", "nope", "--profile", "smoke",
                "--home", str(tmp_path / "h"), "--model-dir", str(tiny_seed))
    assert r.returncode == 2 and "unknown experiment 'nope'" in r.stderr
    assert "local-training-windows" in r.stderr
    r = run_cli("-m", "training", "prepare", "--experiment", "cooperative-learning", "--profile",
                "huge", "--home", str(tmp_path / "h"), "--model-dir", str(tiny_seed))
    assert r.returncode == 2 and "no profile 'huge'" in r.stderr
    assert not (tmp_path / "h").exists()


def test_prepare_missing_seed_says_how_to_make_it(tmp_path):
    r = run_cli("-m", "training", "prepare", "--experiment", "cooperative-learning", "--profile",
                "smoke", "--home", str(tmp_path / "h"), "--model-dir", str(tmp_path / "seed"))
    assert r.returncode == 2 and "python -m training seed" in r.stderr


def test_evidence_verify(smoke_home, home_copy):
    ok = run_cli("-m", "evidence", "verify", "--home", str(smoke_home))
    assert ok.returncode == 0 and json.loads(ok.stdout)["kind"] == "prepare"
    (home_copy / "prepared.json").write_text("{}")
    bad = run_cli("-m", "evidence", "verify", "--home", str(home_copy))
    assert bad.returncode == 2 and "committed file changed" in bad.stderr


def test_orchestrate_run_smoke(finished_trial):
    r = finished_trial.first
    assert r.returncode == 0, r.stderr
    err = " ".join(r.stderr.split())
    assert "no task of" in err and "scored, served, reported and preserved in" in err
    assert str(finished_trial.trials) in err  # a path with brackets, printed as it is
    # the profile's H replaces the arm's own: said, with both values (#33)
    assert "diloco-four: sync_every = 4 (profile smoke; the arm's own: 16)" in err
    from evidence.canonical import read_json
    from training.prepare import require_prepared

    home = finished_trial.home
    p = require_prepared(home)
    assert p["previous"]["experiment"] == "cooperative-learning"
    rep = read_json(home / "report.json")  # the whole trial: train → select → test → serve → report
    assert rep["selection"]["primary"] == "diloco-four"
    # four replicas of the serving arm, one killed for the last phase; every request answered
    assert rep["serving"]["replicas"] == 4 and rep["serving"]["stopped"]["replica"] == "replica-3"
    assert [g["passed"] for g in rep["gates"] if g["gate"].startswith("serving")] == [True, True, True]
    assert set(rep["accuracy"]) == {"seed", "single", "ddp-four", "diloco-four"}
    assert rep["not_run"] == {} and rep["not_evaluated_gates"] == []  # one CPU machine places every arm
    # the gates a not-run arm would leave unevaluated carry the names the report gives them
    from evidence.placement import rule_gates

    acc = p["experiment"]["experiment"]["acceptance"]
    named = {g for g, _ in rule_gates(acc, rep["selection"]["primary"], rep["selection"]["baseline"])}
    assert len(named) == 6 and named <= {g["gate"] for g in rep["gates"]}
    # smoke's H = 4 gives 1/4 of DDP's bytes: the 1/8 gate fails, is listed, and changes nothing
    gate = next(g for g in rep["gates"] if g["gate"].startswith("bytes"))
    assert gate["value"] == 0.25 and not gate["passed"] and gate["gate"] in rep["failed_gates"]
    # every file of the home is in the default store, and the index verifies object by object
    preserved = read_json(home / "preserved.json")
    assert preserved["store"] == f"file://{finished_trial.store}/"
    r = run_cli("-m", "orchestrate", "down", "--home", str(home))
    assert r.returncode == 0 and f"verified {preserved['files']} objects" in " ".join(r.stderr.split()), r.stderr
    r = run_cli("-m", "orchestrate", "run", "no-such-arm", "--profile", "smoke")
    assert r.returncode == 2 and "no-such-arm" in r.stderr


def test_a_guard_stop_preserves_the_trial_so_far(tmp_path, tiny_seed, monkeypatch):
    """The controller's guard speaks once the first arm has finished an update (in-process, so the
    moment is the same on any machine): that group is stopped, the stop is recorded, everything the
    controller holds is preserved (exit 3), and teardown is then allowed."""
    import datetime as dt
    import shutil

    from typer.testing import CliRunner

    from evidence.canonical import read_json
    from orchestrate.cli import app
    from orchestrate.cluster import local_cluster, save
    from orchestrate.guard import Guard

    seeds = tmp_path / "seeds"
    seeds.mkdir()
    shutil.copytree(tiny_seed, seeds / "tiny")
    c = local_cluster(4, tmp_path, f"file://{tmp_path / 'store'}")
    c.deadline = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=3)  # a guard that can speak
    save(c, tmp_path / "cluster.json")
    home = tmp_path / "trials" / "local-training-windows-smoke"
    beat = home / "runs" / "single" / "rank-0" / "heartbeat.json"
    said = "the deadline is near (test)"
    monkeypatch.setattr(Guard, "__call__", lambda self: said if beat.exists() else None)
    r = CliRunner().invoke(app, ["run", "diloco-four", "--profile", "smoke", "--trials", str(tmp_path / "trials"),
                                 "--seeds", str(seeds), "--cluster", str(tmp_path / "cluster.json")])
    assert r.exit_code == 3, r.output
    (stop_file,) = (home / "stops").glob("*.json")
    stop = read_json(stop_file)
    assert (stop["stopped_by"], stop["guard"], stop["arm"], stop["finished_arms"]) == ("guard", said, "single", [])
    assert not (home / "runs" / "single" / "rank-0" / "result.json").exists()  # stopped mid-run
    assert not (home / "report.json").exists()  # nothing past training ran
    preserved = read_json(home / "preserved.json")
    assert preserved["store"] == f"file://{tmp_path / 'store'}/"
    index = read_json(Path(tmp_path / "store" / preserved["index"]))
    assert str(stop_file.relative_to(home)) in index["files"]
    assert "logs/single/attempt-1/rank-0.log" in index["files"]  # the stopped group's log
    assert "runs/single/rank-0/heartbeat.json" in index["files"]
    r = run_cli("-m", "orchestrate", "down", "--home", str(home))
    assert r.returncode == 0 and f"verified {preserved['files']} objects" in " ".join(r.stderr.split()), r.stderr


def test_run_reports_an_arm_the_gpus_cannot_place_and_runs_the_rest(tmp_path, tiny_seed, monkeypatch):
    """One GPU (TRIAL_GPUS=1) for cooperative-learning: clean-pair's two ranks cannot each get their
    own GPU, so it is not run — reported before anything launches, never launched, never restarted —
    while the single arms train, are selected and scored; the serving probe (of clean-pair) is not run
    and its gates are not evaluated; the report and the evidence store hold it all. CI has no GPU: the
    smoke profile's ranks run on CPU while placement treats the profile as a CUDA one (in-process)."""
    import shutil

    from typer.testing import CliRunner

    from evidence.canonical import read_json
    from evidence.commitments import CommitmentLog
    from orchestrate.cli import app

    seeds = tmp_path / "seeds"
    seeds.mkdir()
    shutil.copytree(tiny_seed, seeds / "tiny")
    monkeypatch.setenv("TRIAL_GPUS", "1")
    monkeypatch.setattr("orchestrate.placement.trial_device", lambda cfg: "cuda")
    record = tmp_path / "record.json"
    r = CliRunner().invoke(app, ["run", "cooperative-learning", "--profile", "smoke", "--trials",
                                 str(tmp_path / "trials"), "--seeds", str(seeds), "--record", str(record)])
    out = " ".join(r.output.split())
    assert r.exit_code == 0, r.output
    why = "not run: needs 2 GPUs, the cluster has 1"
    assert f"clean-pair: {why}" in out and "1 GPU(s) on this machine (TRIAL_GPUS)" in out
    assert out.index(f"clean-pair: {why}") < out.index("train clean-single")  # said up front
    home = tmp_path / "trials" / "cooperative-learning-smoke"
    assert not (home / "runs" / "clean-pair").exists() and not (home / "logs" / "clean-pair").exists()
    kinds = [e["kind"] for e in CommitmentLog(home).entries()]
    assert kinds[:2] == ["prepare", "placement"] and "numerical-profile" in kinds  # placed before training
    assert read_json(home / "selection.json")["not_run"] == {"clean-pair": why}
    assert read_json(home / "selection.json")["serving"] == "clean-pair"  # the rules, unchanged
    assert sorted(p.name for p in (home / "evaluations" / "test").iterdir()) == ["clean-single", "damaged-single",
                                                                                 "seed"]
    assert not (home / "serving").exists()
    rep = read_json(home / "report.json")
    assert rep["not_run"] == {"clean-pair": why, "serving probe": "not run: its arm clean-pair is not run "
                                                                  "(needs 2 GPUs, the cluster has 1)"}
    serving = [g for g in rep["gates"] if g["gate"].startswith("serving")]
    assert len(serving) == 3 and all(g["passed"] is None for g in serving)
    assert rep["not_evaluated_gates"] == [g["gate"] for g in serving]
    assert {g["gate"] for g in rep["gates"] if g["passed"] is not None} >= {"gain ≥ 5.0 pp", "McNemar p ≤ 0.01"}
    assert set(rep["accuracy"]) == {"seed", "clean-single", "damaged-single"}
    assert "not evaluated: serving probe not run" in (home / "report.md").read_text()
    index = read_json(tmp_path / "trials" / "store" / read_json(home / "preserved.json")["index"])
    assert "placement.json" in index["files"]
    rec = read_json(record)
    assert rec["exit"] == 0 and rec["not_run"] == rep["not_run"] and rec["arm"] == "clean-single"
    assert set(rec["stages_seconds"]) == {"judge", "seed", "prepare", "placement", "train", "select", "score",
                                          "serve", "report", "preserve"}
    assert set(rec["scoring"]) == {"seed", "clean-single", "damaged-single"}
    assert all(s["scoring"]["generated_tokens"] > 0 for s in rec["scoring"].values())
    assert "stages: seed" in out and "judge" in out and f"record {record}" in out


def test_a_terminated_run_stops_its_ranks_and_says_so(tmp_path, tiny_seed):
    """SIGTERM (what `timeout` and schedulers send) ends `orchestrate run` the way Ctrl-C does: its
    ranks are stopped by pid, and its record is written with the reason (before, Python obeyed the
    signal at once: no record, and a rank process could outlive its supervisor)."""
    import shutil
    import signal

    from conftest import proc_state, signal_cli_when

    seeds = tmp_path / "seeds"
    seeds.mkdir()
    shutil.copytree(tiny_seed, seeds / "tiny")
    record = tmp_path / "record.json"
    beat = tmp_path / "trials" / "local-training-windows-smoke" / "runs" / "single" / "rank-0" / "heartbeat.json"
    run, err = signal_cli_when(beat, signal.SIGTERM, "-m", "orchestrate", "run", "diloco-four", "--profile", "smoke",
                               "--trials", str(tmp_path / "trials"), "--seeds", str(seeds), "--record", str(record),
                               timeout=240)
    rank = json.loads(beat.read_text())["pid"]
    assert run.returncode == 130
    assert proc_state(rank) is None  # stopped, and reaped
    rec = json.loads(record.read_text())
    assert rec["exit"] == 130 and rec["error"] == "terminated (SIGTERM)", rec
    assert "Traceback" not in err
    # said in the moment (#55: it ended with no line): what is kept, what the next run does, how to resume
    home = tmp_path / "trials" / "local-training-windows-smoke"
    told = " ".join(err.split())
    assert f"terminated (SIGTERM) during train: kept {home} (its committed inputs, placement)" in told, err[-3000:]
    assert "nothing of it still runs" in told
    assert re.search(r"the next run: single (resumes from update \d+|starts again; its unfinished attempt is set aside "
                     r"under \S+/runs/single/attempts \(kept, not used\))", told), err[-3000:]
    assert (f"to resume: orchestrate run diloco-four --profile smoke --trials {tmp_path / 'trials'} --seeds {seeds} "
            f"--record {record}") in told


def test_a_model_dir_the_profile_would_not_train_is_refused(tmp_path):
    """`--model-dir` is trained only by a profile whose seed is "local"; elsewhere it was silently
    ignored (the built-in seed trained). Now refused by name, before any home is written (#33)."""
    r = run_cli("-m", "orchestrate", "run", "diloco-four", "--profile", "smoke", "--model-dir", str(tmp_path),
                "--trials", str(tmp_path / "trials"), "--seeds", str(tmp_path / "seeds"))
    flat = "".join(r.stderr.replace("│", "").split())  # typer's box folds long words: compare without spaces
    want = "".join(f"--model-dir {tmp_path} is not used by profile smoke, whose seed is 'tiny'".split())
    assert r.returncode == 2 and want in flat, r.stderr
    assert not (tmp_path / "trials").exists() and not (tmp_path / "seeds").exists()


def test_list_and_validate_show_the_study_before_it_runs(tmp_path, monkeypatch):
    """`orchestrate list` names every experiment, arm and profile; `orchestrate validate` shows each value
    of the resolved study with its origin (the profile's H replacing the arm's own is visible) and
    refuses, by name, a study `run` would refuse (#33)."""
    import shutil

    r = run_cli("-m", "orchestrate", "list")
    assert r.returncode == 0, r.stderr
    assert "arm diloco-four: diloco, 4 rank(s) [primary, serving]" in r.stdout
    assert "local-training-windows:" in r.stdout and "profiles: smoke, cuda-smoke" in r.stdout
    r = run_cli("-m", "orchestrate", "validate", "diloco-four", "--profile", "cuda-smoke", "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["experiment"] == "local-training-windows" and got["previous"] == ["cooperative-learning"]
    assert got["values"]["arms.diloco-four.sync_every"] == {
        "value": 4, "from": "profile smoke (base of cuda-smoke), replacing the arm's own 16"}
    assert got["values"]["profile.device"] == {"value": "cuda", "from": "profile cuda-smoke"}
    assert got["values"]["damaged_fraction"]["from"] == "default"
    assert got["values"]["arms.ddp-four.world_size"] == {"value": 4, "from": "arm ddp-four"}
    # a study `run` would refuse: validate refuses it the same way, naming the value
    from training.config import config_dir

    for name in ("cooperative-learning", "local-training-windows"):
        shutil.copy(config_dir() / f"{name}.toml", tmp_path / f"{name}.toml")
    f = tmp_path / "local-training-windows.toml"
    f.write_text(f.read_text().replace("sync_every = 4 ", "sync_every = 0 ", 1))
    monkeypatch.setenv("TRIAL_CONFIG_DIR", str(tmp_path))
    r = run_cli("-m", "orchestrate", "validate", "local-training-windows", "--profile", "smoke")
    assert r.returncode == 2 and "sync_every = 0, which arm diloco-four (diloco) refuses" in " ".join(r.stderr.split())


def test_remove_deletes_only_a_home_whose_every_file_is_preserved(finished_trial, tmp_path):
    """`orchestrate remove`: the documented way to free a trial's disk. A home never preserved, or one
    holding a file its verified index does not hold as it is now, is refused by name and left whole;
    a preserved home goes, and its evidence stays in the store (#33)."""
    import shutil

    home = tmp_path / "trials" / finished_trial.home.name  # a copy: its record names the fixture's store
    shutil.copytree(finished_trial.home, home)
    (home / "notes.txt").write_text("mine, not preserved")
    before = sorted(p.relative_to(home) for p in home.rglob("*"))
    r = run_cli("-m", "orchestrate", "remove", "--home", str(home))
    said = " ".join(r.stderr.split())
    assert r.returncode == 2 and "holds 1 file(s) its evidence index" in said and "notes.txt" in said, said
    assert sorted(p.relative_to(home) for p in home.rglob("*")) == before
    (home / "notes.txt").unlink()
    kept = (home / "report.md").read_bytes()  # a changed file, and a link (never preserved), are refused too
    (home / "report.md").write_bytes(kept + b"\nmy note")
    (home / "elsewhere").symlink_to(tmp_path)
    r = run_cli("-m", "orchestrate", "remove", "--home", str(home))
    said = " ".join(r.stderr.split())
    assert r.returncode == 2 and "holds 2 file(s)" in said and "elsewhere, report.md" in said, said
    (home / "report.md").write_bytes(kept)
    (home / "elsewhere").unlink()
    bare = tmp_path / "bare"
    shutil.copytree(home, bare, ignore=shutil.ignore_patterns("preserved.json"))
    r = run_cli("-m", "orchestrate", "remove", "--home", str(bare))
    assert r.returncode == 2 and "has not been preserved" in r.stderr and bare.is_dir()
    r = run_cli("-m", "orchestrate", "remove", "--home", str(home))
    assert r.returncode == 0, r.stderr
    assert not home.exists() and "removed" in r.stderr
    assert tmp_path.is_dir() and (tmp_path / "bare").is_dir()  # the link's target, and nothing outside the home, kept
    r = run_cli("-m", "orchestrate", "down", "--home", str(finished_trial.home))  # the store still verifies
    assert r.returncode == 0, r.stderr


def test_names_are_resolved_loudly_and_a_bad_experiment_file_is_one_line_a_key(tmp_path, monkeypatch):
    """#55, as a user types it: an arm name that several experiments have is refused with the choices
    (it picked the one whose primary it was, without a word); `run EXPERIMENT/ARM` of an arm that is
    not the primary is refused by name (it ran the whole experiment, the arm part ignored); one broken
    TOML no longer stops `list` with pydantic's dump, and every error is one line: file, key, fix."""
    import shutil

    from training.config import config_dir

    src = config_dir()
    for f in src.glob("*.toml"):
        shutil.copy(f, tmp_path / f.name)
    (tmp_path / "mine.toml").write_text(  # a copy whose primary is `single`
        (src / "batched-learning.toml").read_text().replace('name = "batched-learning"', 'name = "mine"', 1)
        .replace('primary = "powersgd-pair"', 'primary = "single"', 1)
        .replace('noninferiority_vs = "single"\n', "").replace('min_speedup_vs = "single"\n', ""))
    broken = tmp_path / "broken.toml"
    broken.write_text((src / "cooperative-learning.toml").read_text()
                      .replace('name = "cooperative-learning"', 'name = "broken"', 1)
                      .replace('[[arms]]\nname = "clean-single"', '[[arms]]\nname = "own-single"', 1)
                      .replace('primary = "clean-single"', 'primary = "own-single"', 1)
                      .replace("dev = 16", "devv = 16", 1).replace("world_size = 2", 'world_size = "two"', 1))
    monkeypatch.setenv("TRIAL_CONFIG_DIR", str(tmp_path))

    def cli(*args: str) -> tuple[int, str, str]:
        r = run_cli("-m", "orchestrate", *args)
        assert "Traceback" not in r.stderr + r.stdout, r.stderr
        return r.returncode, r.stdout, r.stderr

    code, out, err = cli("list")  # every valid experiment listed; the broken one in one line; then exit 2
    assert code == 2, err
    assert [ln.split(":")[0] for ln in out.splitlines() if not ln.startswith(" ")] == [
        "batched-learning", "broken", "cooperative-learning", "local-training-windows", "mine"]
    assert f"broken: not valid — {broken}: arms.clean-pair.world_size = \"two\": expected an integer (and 1 more: " \
           "`orchestrate validate broken` shows each)" in out.splitlines()  # the first of its problems, and a count
    assert "  arm single: single, 1 rank(s) [primary]" in out.splitlines()  # mine's
    code, _, err = cli("validate", "broken", "--profile", "smoke")
    assert (code, err.splitlines()) == (2, [
        f'error: {broken}: arms.clean-pair.world_size = "two": expected an integer',
        (f"{broken}: profiles.smoke.devv: unknown key (did you mean dev? dev is required, and missing); the keys "
         "allowed in profiles.smoke: seed, device, dtype, tasks, replay, dev, test, probes, updates, global_batch, "
         "max_context, records, replay_steps, replay_parts, sync_every, dense_warmup, checkpoint_every, case_ids, compile, "
         "fused_optimizer, pack, pack_tokens, pack_rows, score_batch, score_dtype, serving_requests, "
         "serving_concurrency, serving_slots, serving_dtype, deterministic, "
         "base")])

    code, _, err = cli("gates", "single")  # two experiments have it, and it is mine's primary
    assert (code, err.splitlines()[0]) == (2, ("error: arm 'single' is an arm of 3 experiments (batched-learning, "
                                               "local-training-windows, mine): name one, as batched-learning/single or "
                                               "local-training-windows/single or mine/single"))
    code, _, err = cli("gates", "clean-pair")  # the broken file has it too: named, not passed over
    assert (code, err.splitlines()[0]) == (2, (
        f"error: arm 'clean-pair' is an arm of cooperative-learning, and broken.toml, which is not valid, has it too "
        f"({broken}: arms.clean-pair.world_size = \"two\": expected an integer): fix that file, or name the arm as "
        "cooperative-learning/clean-pair"))
    code, out, err = cli("gates", "diloco-four")  # unique, and the broken file has no such arm: resolved
    assert code == 0 and out.startswith("local-training-windows: gates at profile cpu"), err
    code, out, err = cli("gates", "local-training-windows/single")  # the arm selects nothing here: said
    assert code == 0 and out.startswith("local-training-windows: gates"), err
    assert err.splitlines()[0] == (
        "note: arm single is not the primary arm of local-training-windows: a trial runs every arm of "
        "local-training-windows (seed, single, ddp-four, diloco-four) and judges its primary arm, diloco-four: the "
        "gates below are diloco-four's")

    trials = tmp_path / "trials"
    for spec in ("local-training-windows/single", "ddp-four"):  # a trial judges the primary: another is refused
        code, _, err = cli("run", spec, "--profile", "smoke", "--trials", str(trials))
        arm = spec.split("/")[-1]
        assert (code, err.splitlines()[0]) == (2, (
            f"error: arm {arm} is not the primary arm of local-training-windows: a trial runs every arm of "
            "local-training-windows (seed, single, ddp-four, diloco-four) and judges its primary arm, diloco-four: "
            "run `orchestrate run local-training-windows` (or `orchestrate run local-training-windows/diloco-four`), "
            f"which trains {arm} too"))
    assert not trials.exists()  # nothing left behind

    code, out, _ = cli("run", "--help")
    said = " ".join(w for w in out.split() if w != "│")
    assert code == 0 and "--profile <str> one of the experiment's profiles (`orchestrate list` shows each " \
                         "experiment's; default: cpu)" in said and "smoke | cpu" not in said
