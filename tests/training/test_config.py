"""Experiments as data: every experiment and profile resolves; bad configs are refused clearly."""

import shutil

import pytest

from training.config import ConfigError, arm_to_experiment, experiment_names, load_experiment, resolve


def test_all_resolve():
    assert experiment_names() == ["batched-learning", "cooperative-learning", "local-training-windows"]
    for name in experiment_names():
        for prof in ("smoke", "cpu", "gpu"):
            r = resolve(name, prof)
            assert r.epochs >= 1 and r.digest() == resolve(name, prof).digest()
    gpu = resolve("batched-learning", "gpu")
    assert (gpu.documents, gpu.global_batch, gpu.epochs) == (8192, 256, 4)
    ltw = resolve("local-training-windows", "gpu")
    d = ltw.arm("diloco-four")
    assert (d.sync_every, d.outer_lr, d.outer_momentum, ltw.docs_per_rank(d)) == (16, 0.7, 0.9, 2)
    assert arm_to_experiment("diloco-four") == "local-training-windows"
    assert arm_to_experiment("powersgd-pair") == "batched-learning"
    from training.config import lineage

    assert [r.experiment.name for r in lineage("batched-learning", "smoke")] == [
        "cooperative-learning", "local-training-windows", "batched-learning"]


def test_profiles_do_not_change_rules():
    for name in experiment_names():
        dumps = {p: resolve(name, p).as_dict()["experiment"] for p in ("smoke", "cpu", "gpu")}
        assert dumps["smoke"] == dumps["cpu"] == dumps["gpu"]


def test_bad_config_messages(tmp_path, monkeypatch):
    src = load_experiment.__globals__["config_dir"]()
    shutil.copy(src / "cooperative-learning.toml", tmp_path / "cooperative-learning.toml")
    monkeypatch.setenv("TRIAL_CONFIG_DIR", str(tmp_path))
    f = tmp_path / "cooperative-learning.toml"
    f.write_text(f.read_text().replace('serving_arm = "clean-pair"', 'serving_arm = "clean-quad"'))
    with pytest.raises(ConfigError, match="clean-quad"):
        load_experiment("cooperative-learning")
    f.write_text("name = [")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_experiment("cooperative-learning")
    shutil.copy(src / "cooperative-learning.toml", f)
    f.write_text(f.read_text().replace("updates = 16", "updates = 15", 1))
    with pytest.raises(ConfigError, match="whole number of passes"):
        resolve("cooperative-learning", "smoke")


@pytest.mark.parametrize("records", [(1, 1), (0, 0), (5, 3)])
def test_profile_record_range_validated(records):
    from pydantic import ValidationError

    from training.config import Profile

    with pytest.raises(ValidationError, match="records"):
        Profile(seed="tiny", tasks=8, replay=8, dev=1, test=1, probes=1, updates=2,
                max_context=64, records=records)


def test_profile_base_expands_to_the_written_out_profile(tmp_path, monkeypatch):
    """`base = "<profile>"` takes the base's keys (after its own base), then the profile's own; the
    resolved profile and its digest equal the one written out in full, and bad bases are refused."""
    import tomllib

    src = load_experiment.__globals__["config_dir"]()
    monkeypatch.setenv("TRIAL_CONFIG_DIR", str(tmp_path))
    f = tmp_path / "cooperative-learning.toml"
    text = (src / "cooperative-learning.toml").read_text()
    derived = resolve("cooperative-learning", "gpu-bench-packed", src)  # written with two levels of base
    raw = tomllib.loads(text)["profiles"]
    assert raw["gpu-bench-packed"]["base"] == "gpu-bench-compiled" and "tasks" not in raw["gpu-bench-packed"]
    full = {**raw["gpu-bench"], "compile": True, "fused_optimizer": True, "pack": True, "pack_tokens": 2048}
    lines = "\n".join(f"{k} = {v!r}".replace("True", "true").replace("(", "[").replace(")", "]")
                      for k, v in full.items())
    f.write_text(text + f"\n[profiles.written-out]\n{lines}\n")
    written = resolve("cooperative-learning", "written-out")
    assert written.profile == derived.profile
    assert written.as_dict()["profile"] == derived.as_dict()["profile"]
    # an override wins over the base's value; the base itself is unchanged
    f.write_text(text + '\n[profiles.longer]\nbase = "gpu-bench-packed"\nupdates = 32\n')
    assert resolve("cooperative-learning", "longer").profile.updates == 32
    assert resolve("cooperative-learning", "gpu-bench-packed").profile.updates == 16
    f.write_text(text + '\n[profiles.orphan]\nbase = "no-such"\n')
    with pytest.raises(ConfigError, match="profile orphan has base 'no-such'"):
        load_experiment("cooperative-learning")
    f.write_text(text + '\n[profiles.listed]\nbase = ["smoke"]\n')
    with pytest.raises(ConfigError, match="profile listed's base must be a profile's name"):
        load_experiment("cooperative-learning")
    f.write_text(text + '\n[profiles.a]\nbase = "b"\n\n[profiles.b]\nbase = "a"\n')
    with pytest.raises(ConfigError, match="profile bases form a cycle: a → b → a"):
        load_experiment("cooperative-learning")


def test_gpu_135m_is_the_gpu_scale_with_the_real_seed():
    """gpu-135m: the gpu profile's data scale and the experiment's rules, with the SmolLM2-135M seed;
    only the seed, the speed switches and the scoring batch differ, and every rule still resolves."""
    data = ("tasks", "replay", "dev", "test", "probes", "updates", "max_context", "records", "replay_steps",
            "replay_parts", "global_batch", "sync_every", "dense_warmup", "checkpoint_every", "device", "dtype")
    # local-training-windows checkpoints once, after the last update, at 135M: a DiLoCo rank's group
    # checkpoint is 2.7 GB there and every one is kept (the config says why); its recovery profile has its own
    sparse = {"local-training-windows": {"checkpoint_every"}}
    for name in experiment_names():
        small, full = resolve(name, "gpu-135m"), resolve(name, "gpu")
        assert small.as_dict()["experiment"] == full.as_dict()["experiment"]
        same = [k for k in data if k not in sparse.get(name, set())]
        assert {k: getattr(small.profile, k) for k in same} == {k: getattr(full.profile, k) for k in same}
        assert (small.profile.seed, full.profile.seed) == ("smollm2-135m", "local")
        assert (small.profile.device, small.profile.dtype) == ("cuda", "bfloat16")
        changed = {k for k, v in small.profile.model_dump().items() if v != getattr(full.profile, k)}
        assert changed <= {"seed", "compile", "fused_optimizer", "pack", "pack_tokens", "score_batch", "score_dtype",
                           *sparse.get(name, ())}
        assert small.profile.updates * small.global_batch % small.documents == 0
    ltw = resolve("local-training-windows", "gpu-135m").profile
    assert ltw.checkpoint_every == ltw.updates  # one group checkpoint, after the last update
    assert resolve("local-training-windows", "gpu-135m-recovery").profile.checkpoint_every < ltw.updates
    batched = resolve("batched-learning", "gpu-135m")
    assert (batched.documents, batched.global_batch, batched.epochs) == (8192, 256, 4)
    assert batched.profile.pack and batched.profile.compile  # packing on CUDA needs the compiled decoder
    from training.config import lineage

    assert [r.profile_name for r in lineage("batched-learning", "gpu-135m")] == ["gpu-135m"] * 3


def _ltw_copy(src, tmp_path, monkeypatch, edit) -> None:
    """local-training-windows (and the experiment before it) copied from `src` into a config folder of
    the test's, with `edit` applied to its TOML text."""
    for name in ("cooperative-learning", "local-training-windows"):
        shutil.copy(src / f"{name}.toml", tmp_path / f"{name}.toml")
    monkeypatch.setenv("TRIAL_CONFIG_DIR", str(tmp_path))
    f = tmp_path / "local-training-windows.toml"
    f.write_text(edit(f.read_text()))


def test_a_profile_scales_an_arm_setting_only_where_it_takes_effect(tmp_path, monkeypatch):
    """A profile's sync_every replaces the DiLoCo arms' own H: shown by `scaled()`, run by the trainer's
    settings, and refused where it would not take effect as written (#33)."""
    from training.arms import kind

    src = load_experiment.__globals__["config_dir"]()
    r = resolve("local-training-windows", "smoke")
    d = r.arm("diloco-four")
    assert r.scaled() == [("diloco-four", "sync_every", 16, 4)]
    assert r.arm_settings(d)["sync_every"] == 4 and resolve("local-training-windows", "gpu").arm_settings(d)["sync_every"] == 16
    kind("diloco").settings_model(**r.arm_settings(d))  # what the trainer validates and runs
    # a second DiLoCo arm with an H of its own: one profile value would erase the difference
    second = '\n[[arms]]\nname = "diloco-eight"\nkind = "diloco"\nworld_size = 4\nsync_every = 8\nouter_lr = 0.7\nouter_momentum = 0.9\n'
    _ltw_copy(src, tmp_path, monkeypatch, lambda t: t.replace("\n[acceptance]", second + "\n[acceptance]", 1))
    with pytest.raises(ConfigError, match=r"sync_every = 4, which would replace each arm's own \(diloco-four: 16, diloco-eight: 8\)"):
        resolve("local-training-windows", "smoke")
    assert resolve("local-training-windows", "gpu").arm_settings(resolve("local-training-windows", "gpu").arm("diloco-eight"))["sync_every"] == 8
    # H = 0 was accepted and silently ignored (the arm's own H ran): now refused by the kind's own rule
    _ltw_copy(src, tmp_path, monkeypatch, lambda t: t.replace("sync_every = 4 ", "sync_every = 0 ", 1))
    with pytest.raises(ConfigError, match="sync_every = 0, which arm diloco-four \\(diloco\\) refuses"):
        resolve("local-training-windows", "smoke")
    # an arm without a setting its kind needs, at a profile that does not supply it: refused at resolve
    # (and so by `validate`), not by the ranks mid-trial
    _ltw_copy(src, tmp_path, monkeypatch, lambda t: t.replace("sync_every = 16\n", "", 1))
    with pytest.raises(ConfigError, match="local-training-windows/gpu: arm diloco-four: .*sync_every"):
        resolve("local-training-windows", "gpu")
    # a value no arm of the experiment takes
    f = tmp_path / "cooperative-learning.toml"
    f.write_text((src / "cooperative-learning.toml").read_text().replace("checkpoint_every = 8", "checkpoint_every = 8\nsync_every = 4", 1))
    with pytest.raises(ConfigError, match="profile sets sync_every = 4, but no arm of cooperative-learning takes it"):
        resolve("cooperative-learning", "smoke")


def test_an_arm_is_addressed_as_experiment_slash_arm_where_its_name_is_not_unique(tmp_path, monkeypatch):
    """A copied experiment repeats arm names: the short name is then refused with the way to say which,
    and `EXPERIMENT/ARM` (or the experiment's name, for its primary) still addresses each (#33)."""
    from training.config import address

    src = load_experiment.__globals__["config_dir"]()
    for name in experiment_names():
        shutil.copy(src / f"{name}.toml", tmp_path / f"{name}.toml")
    (tmp_path / "my-windows.toml").write_text((src / "local-training-windows.toml").read_text()
                                              .replace('name = "local-training-windows"', 'name = "my-windows"', 1))
    monkeypatch.setenv("TRIAL_CONFIG_DIR", str(tmp_path))
    with pytest.raises(ConfigError, match=r"arm 'diloco-four' is an arm of 2 experiments \(local-training-windows, "
                                          r"my-windows\): name one, as local-training-windows/diloco-four or "
                                          r"my-windows/diloco-four"):
        address("diloco-four")
    assert address("my-windows/diloco-four") == ("my-windows", "diloco-four")
    assert address("local-training-windows/ddp-four") == ("local-training-windows", "ddp-four")
    assert address("my-windows") == ("my-windows", "diloco-four")  # an experiment: its primary arm
    assert address("clean-pair") == ("cooperative-learning", "clean-pair")  # still unique: the short name works
    with pytest.raises(ConfigError, match="experiment my-windows has no arm 'clean-pair'"):
        address("my-windows/clean-pair")


def test_validate_shows_a_profile_value_replacing_the_experiments():
    """The experiment's global batch where a profile sets its own: what runs is the profile's, and the
    origin says whose value it replaced (#33: nothing overridden without it being visible)."""
    from training.config import origins

    got = origins("batched-learning", "cuda-smoke")
    assert resolve("batched-learning", "cuda-smoke").global_batch == got["global_batch"][0] == 32
    assert got["global_batch"][1] == "profile smoke (base of cuda-smoke), replacing the experiment's 256"
    assert origins("batched-learning", "gpu")["global_batch"] == (256, "experiment")  # no profile value: the experiment's


def test_serving_requests_are_committed_only_where_a_profile_sets_them():
    """The smoke profiles send 16 requests per probe phase, committed with the profile; a profile that
    sets none runs the studies' 64 and commits what it committed before the setting existed (its
    experiment digest unchanged: earlier homes still resume and verify); fewer than the client
    concurrency is refused."""
    from pydantic import ValidationError

    from evidence.serving import REQUESTS, requests_of
    from training.config import Profile

    for name in experiment_names():
        smoke, cpu = resolve(name, "smoke").as_dict(), resolve(name, "cpu").as_dict()
        assert smoke["profile"]["serving_requests"] == 16 and requests_of({"experiment": smoke}) == 16
        if name != "local-training-windows":  # the main job's cpu profile sizes its probe for 2 cores (#58)
            assert "serving_requests" not in cpu["profile"] and requests_of({"experiment": cpu}) == REQUESTS == 64
    # cooperative-learning's cpu profile digest as committed before serving_requests existed (7af96ad)
    assert resolve("cooperative-learning", "cpu").digest().startswith("3e9bb1fcca1b")
    with pytest.raises(ValidationError, match="serving_requests must be at least 4"):
        Profile(seed="tiny", tasks=8, replay=8, dev=1, test=1, probes=1, updates=2, max_context=64,
                serving_requests=3)


def test_serving_concurrency_is_committed_only_where_set_and_never_above_the_requests():
    """The smoke profiles sweep 1 and 4 in flight, committed with the profile; a profile that sets no
    levels commits what it did before the setting existed and runs the studies' sweep up to its
    requests; a level above the requests per phase and level, or levels out of order, are refused."""
    from pydantic import ValidationError

    from evidence.serving import LEVELS, levels_of
    from training.config import Profile

    for name in experiment_names():
        smoke, cpu = resolve(name, "smoke").as_dict(), resolve(name, "cpu").as_dict()
        assert smoke["profile"]["serving_concurrency"] == [1, 4] and levels_of({"experiment": smoke}) == (1, 4)
        if name != "local-training-windows":
            assert "serving_concurrency" not in cpu["profile"] and levels_of({"experiment": cpu}) == LEVELS
    main_job = resolve("local-training-windows", "cpu").as_dict()
    assert levels_of({"experiment": main_job}) == (4, 16) and main_job["profile"]["serving_slots"] == 2
    base = dict(seed="tiny", tasks=8, replay=8, dev=1, test=1, probes=1, updates=2, max_context=64)
    assert Profile(**base, serving_requests=8, serving_concurrency=[1, 8]).serving_concurrency == (1, 8)
    with pytest.raises(ValidationError, match=r"serving_concurrency = \[1, 16\]: level 16 is above the 8 requests "
                                              r"per phase and level \(serving_requests\), so it could never have that "
                                              r"many in flight; drop it or set serving_requests to at least 16"):
        Profile(**base, serving_requests=8, serving_concurrency=[1, 16])
    with pytest.raises(ValidationError, match="level 128 is above the 64 requests"):  # the studies' 64 unless set
        Profile(**base, serving_concurrency=[1, 128])
    for levels in ([4, 1], [1, 1], [0, 4], []):
        with pytest.raises(ValidationError, match="at least 1 each and strictly ascending"):
            Profile(**base, serving_concurrency=levels)


def test_a_new_profile_the_previous_experiment_lacks_is_refused_saying_what_to_add(tmp_path, monkeypatch):
    """Every experiment of a lineage is prepared at the run's profile, so a profile added to one experiment
    alone cannot run; the refusal names the experiment to add it to and why (it said only "no profile")."""
    from training.config import lineage

    src = load_experiment.__globals__["config_dir"]()
    _ltw_copy(src, tmp_path, monkeypatch, lambda t: t + '\n[profiles.mine]\nbase = "smoke"\n')
    with pytest.raises(ConfigError, match=r"local-training-windows/mine: local-training-windows's tasks must not "
                                          r"repeat those of cooperative-learning .* add \[profiles.mine\] to "
                                          r"cooperative-learning.toml too"):
        lineage("local-training-windows", "mine")
    coop = tmp_path / "cooperative-learning.toml"
    coop.write_text(coop.read_text() + '\n[profiles.mine]\nbase = "smoke"\n')
    assert [r.profile_name for r in lineage("local-training-windows", "mine")] == ["mine", "mine"]


def _copies(tmp_path, monkeypatch, **more: str) -> None:
    """Every shipped experiment copied into a config folder of its own, with `more` (file stem → text)."""
    src = load_experiment.__globals__["config_dir"]()
    for name in experiment_names(src):
        shutil.copy(src / f"{name}.toml", tmp_path / f"{name}.toml")
    for stem, text in more.items():
        (tmp_path / f"{stem}.toml").write_text(text)
    monkeypatch.setenv("TRIAL_CONFIG_DIR", str(tmp_path))


def test_an_arm_several_experiments_have_is_refused_whatever_their_primaries(tmp_path, monkeypatch):
    """`single` is an arm of two shipped experiments and the primary of a third: it was resolved to that
    third without a word (#55); now every experiment having it is a choice, named as EXPERIMENT/ARM."""
    from training.config import address

    src = load_experiment.__globals__["config_dir"]()
    mine = ((src / "batched-learning.toml").read_text().replace('name = "batched-learning"', 'name = "mine"', 1)
            .replace('primary = "powersgd-pair"', 'primary = "single"', 1)
            .replace('noninferiority_vs = "single"\n', "").replace('min_speedup_vs = "single"\n', ""))
    _copies(tmp_path, monkeypatch, mine=mine)
    assert load_experiment("mine").acceptance.primary == "single"
    with pytest.raises(ConfigError) as e:
        address("single")
    assert str(e.value) == ("arm 'single' is an arm of 3 experiments (batched-learning, local-training-windows, "
                            "mine): name one, as batched-learning/single or local-training-windows/single or "
                            "mine/single")
    assert address("mine/single") == ("mine", "single") and address("mine") == ("mine", "single")
    assert address("clean-single") == ("cooperative-learning", "clean-single")  # unique: the short name works
    with pytest.raises(ConfigError, match=r"no experiment has an arm or is named 'diloco-fuor' \(did you mean "
                                          r"diloco-four\?\)"):
        address("diloco-fuor")
    # a file that is not valid may have the arm: named, not passed over
    (tmp_path / "mine.toml").write_text(mine.replace("[profiles.smoke]", "[profiles.smoke]\ndevv = 3", 1))
    with pytest.raises(ConfigError, match=r"local-training-windows/single; and mine.toml, which is not valid, has it "
                                          r"too \(.*mine.toml: profiles.smoke.devv: unknown key .*\)$"):
        address("single")
    assert address("diloco-four") == ("local-training-windows", "diloco-four")  # mine has none: still resolved
    (tmp_path / "mine.toml").write_text(mine.replace("[profiles.smoke]", "[profiles.smoke", 1))  # no arms readable
    with pytest.raises(ConfigError, match=r"^arm 'diloco-four' is an arm of local-training-windows, and mine.toml, "
                                          r"which is not valid, may have it too \(.*mine.toml: not valid TOML at line "
                                          r"\d+, column \d+: .*\): fix that file, or name the arm as "
                                          r"local-training-windows/diloco-four$"):
        address("diloco-four")
    assert address("local-training-windows/diloco-four") == ("local-training-windows", "diloco-four")


def test_a_trial_takes_only_the_primary_arm(tmp_path, monkeypatch):
    """A trial trains every arm and judges the primary: naming another arm ran the whole experiment under
    that arm's name (#55). `judged` refuses it, saying what runs and the commands that do."""
    from training.config import address, not_judged

    _copies(tmp_path, monkeypatch)
    for spec in ("local-training-windows/single", "ddp-four"):
        with pytest.raises(ConfigError) as e:
            address(spec, judged=True)
        arm = spec.split("/")[-1]
        assert str(e.value) == (
            f"arm {arm} is not the primary arm of local-training-windows: a trial runs every arm of "
            "local-training-windows (seed, single, ddp-four, diloco-four) and judges its primary arm, diloco-four: "
            "run `orchestrate run local-training-windows` (or `orchestrate run local-training-windows/diloco-four`), "
            f"which trains {arm} too")
        assert address(spec) == ("local-training-windows", arm)  # a command that uses the arm takes any
    for spec in ("local-training-windows", "diloco-four", "local-training-windows/diloco-four"):
        assert address(spec, judged=True) == ("local-training-windows", "diloco-four")
    assert not_judged(load_experiment("local-training-windows"), "diloco-four") is None


def test_every_validation_error_is_one_line_naming_the_file_the_key_and_the_fix(tmp_path, monkeypatch):
    """Pydantic's own text (three lines an error, its own terms, a URL) became one line per error: the
    file, the key as the TOML writes it (an arm by its name), what is wrong and the fix (#55)."""
    src = load_experiment.__globals__["config_dir"]()
    text = (src / "batched-learning.toml").read_text()
    bad = (text.replace("task = 8", "taks = 8", 1)
           .replace("world_size = 2\nmicrobatch = 8", 'world_size = "two"\nmicrobatch = 8', 1)
           .replace('primary = "powersgd-pair"\n', "", 1)
           .replace("[profiles.smoke]\nseed = \"tiny\"", "[profiles.smoke]\nseed = \"tiny\"\ndevv = 2", 1)
           .replace('[profiles.cpu]\nseed = "smollm2-135m"', '[profiles.cpu]\nseed = "smollm2-135m"\ndevice = "tpu"', 1))
    _copies(tmp_path, monkeypatch, **{"batched-learning": bad})
    with pytest.raises(ConfigError) as e:
        load_experiment("batched-learning")
    f = tmp_path / "batched-learning.toml"
    profile_keys = ", ".join([*__import__("training.config").config.Profile.model_fields, "base"])
    assert str(e.value).splitlines() == [
        f"{f}: weights.taks: unknown key (did you mean task?); the keys allowed in weights: task, replay",
        f'{f}: arms.powersgd-pair.world_size = "two": expected an integer',
        f"{f}: acceptance.primary: required, and missing: add it (a string)",
        f"{f}: profiles.smoke.devv: unknown key (did you mean dev?); the keys allowed in profiles.smoke: {profile_keys}",
        f"{f}: profiles.cpu.device = \"tpu\": expected one of 'cpu' or 'cuda'",
    ]  # cuda-smoke (base = "smoke") repeats smoke's unknown key: said once, where it is written
    f.write_text(text.replace("records = [3, 5]", "records = [3, 5, 7]", 1).replace("updates = 16", "updates = 16.5", 1))
    assert str(pytest.raises(ConfigError, load_experiment, "batched-learning").value).splitlines() == [
        f"{f}: profiles.smoke.updates = 16.5: expected a whole number",
        f"{f}: profiles.smoke.records = [3, 5, 7]: 3 item(s), more than the 2 allowed"]
    f.write_text(text.replace('primary = "powersgd-pair"', 'primary = "powersgd-quad"', 1))
    assert str(pytest.raises(ConfigError, load_experiment, "batched-learning").value) == (
        f'{f}: acceptance.primary = "powersgd-quad" names no arm: name one of the arms (seed, single, powersgd-pair)')
    f.write_text(text.replace("\n[[arms]]\nname = \"single\"", "\n[[arms]]\nname = \"seed\"", 1))
    assert "arms: more than one arm is named seed: give each arm its own name" in str(
        pytest.raises(ConfigError, load_experiment, "batched-learning").value)
    f.write_text(text.replace("lr = 3e-5", "lr = fast", 1))
    assert str(pytest.raises(ConfigError, load_experiment, "batched-learning").value) == (
        f"{f}: not valid TOML at line 8, column 6: invalid value")
    f.write_bytes(b'name = "batched\xff"\n')
    assert str(pytest.raises(ConfigError, load_experiment, "batched-learning").value) == (
        f"{f}: not UTF-8 text (byte 15): save it as UTF-8")
    # the file's name is the experiment's: said with the fix either way
    f.write_text(text.replace('name = "batched-learning"', 'name = "batched"', 1))
    assert str(pytest.raises(ConfigError, load_experiment, "batched-learning").value) == (
        f'{f}: name = "batched", and the file is batched-learning.toml: an experiment\'s file is named for it '
        '(NAME.toml): rename the file to batched.toml, or set name = "batched-learning"')


def test_the_stack_config_and_cluster_json_are_refused_in_the_same_lines(tmp_path):
    """The same helper names the key and the fix in the other files a user writes by hand."""
    import json

    import yaml

    from infra.plan import StackConfigError, trial_config
    from orchestrate.cluster import ClusterError, load, local_cluster, save

    conf = yaml.safe_load((load_experiment.__globals__["config_dir"]().parents[1] / "Pulumi.dev.yaml").read_text())
    cluster = {**conf["config"]["trials:cluster"], "hourz": 3}
    cluster["hosts"] = [{**cluster["hosts"][0], "zone": 5}, *cluster["hosts"][1:]]
    with pytest.raises(StackConfigError) as e:
        trial_config(cluster, "us-east-1", where="Pulumi.x.yaml")
    lines = str(e.value).splitlines()
    assert lines[0] == "Pulumi.x.yaml: trials:cluster.hosts[0].zone = 5: expected a string"
    assert lines[1].startswith("Pulumi.x.yaml: trials:cluster.hourz: unknown key (did you mean hours?); the keys "
                               "allowed in trials:cluster: trial, region, hosts,")
    path = save(local_cluster(2, tmp_path, "file:///s"), tmp_path / "cluster.json")
    data = json.loads(path.read_text())
    data["hosts"][1]["rank"] = "one"
    path.write_text(json.dumps(data))
    with pytest.raises(ClusterError) as e:
        load(path)
    assert str(e.value) == f'{path}: hosts.local-1.rank = "one": expected an integer'


def test_a_profile_without_checkpoint_every_checkpoints_by_default_outside_the_digest(tmp_path):
    """A profile of a study of the user's own cases that its writer gave no checkpoints resumes a stopped arm
    from its last quarter, not update 0: a quarter of the updates, shown with its origin, while the digest
    holds the profile's own null (every home prepared before stands); 0 turns it off; a profile's own value
    runs as written. The built-in studies' profiles keep what they chose (a full state is gigabytes)."""
    from training.config import Profile, origins

    src = (shutil.os.path.dirname(__file__) + "/../../config/experiments/cooperative-learning.toml")
    text = open(src).read().replace('name = "cooperative-learning"', 'name = "own"', 1)
    text = text.replace("heldout_test_fraction", "# heldout_test_fraction")
    text = "task_file = \"cases.jsonl\"\n" + "\n".join(line for line in text.splitlines() if not line.startswith("records"))
    (tmp_path / "own.toml").write_text(text)
    cfg = resolve("own", "cpu", tmp_path)
    assert cfg.profile.checkpoint_every is None and cfg.profile.updates == 8 and cfg.checkpoint_interval == 2
    assert cfg.as_dict()["profile"]["checkpoint_every"] is None
    value, origin = origins("own", "cpu", tmp_path)["profile.checkpoint_every"]
    assert value == 2 and origin.startswith("default: a checkpoint every 2 of the 8 updates") and "not in the digest" in origin
    assert resolve("own", "smoke", tmp_path).checkpoint_interval == 8  # its own
    off = cfg.model_copy(update={"profile": cfg.profile.model_copy(update={"checkpoint_every": 0})})
    assert off.checkpoint_interval == 0
    odd = cfg.model_copy(update={"profile": cfg.profile.model_copy(update={"updates": 10})})
    assert odd.checkpoint_interval == 3  # rounded up: at most four checkpoints and the last
    built_in = resolve("cooperative-learning", "cpu")
    assert built_in.checkpoint_interval == 0 and origins("cooperative-learning", "cpu")["profile.checkpoint_every"] == (None, "default")
    assert built_in.digest().startswith("3e9bb1fcca1b")  # as committed before the default (7af96ad)
    with pytest.raises(ValueError, match="checkpoint_every must be at least 0"):
        Profile(seed="tiny", tasks=8, replay=8, dev=1, test=1, probes=1, updates=2, max_context=64, checkpoint_every=-1)
