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
