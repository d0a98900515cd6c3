"""`--model-dir` as a user gives it: any Hugging Face directory becomes a receipted seed named by its
content (a changed directory is another seed, never the stale copy), a seed directory is used where it
is, and what a trained model keeps of its seed is every tokenizer file and never the seed's weights."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from conftest import QuietProgress as Quiet
from conftest import run_cli
from evidence.canonical import read_json
from orchestrate.stages.prepare import seed_from_model_dir
from training.seed import SeedError
from training.train import seed_files_kept


def test_a_model_directory_is_imported_once_by_its_content(tiny_seed, tmp_path):
    mine = tmp_path / "my-model"
    shutil.copytree(tiny_seed, mine)
    (mine / "receipt.json").unlink()
    seeds, p = tmp_path / "seeds", Quiet()
    first = seed_from_model_dir(mine, seeds, p)
    assert first.parent == seeds and first.name.startswith("local-") and "(imported, with a receipt)" in p.said[-1]
    r = read_json(first / "receipt.json")
    assert r["meta"]["kind"] == "local" and r["parameters"] == 205_120
    assert seed_from_model_dir(mine, seeds, p) == first and "(imported before: verified)" in p.said[-1]
    # the user edits their directory: another seed, the first one left as it was
    cfg = (mine / "generation_config.json")
    cfg.write_text(cfg.read_text().replace("{", '{"_edited": true, ', 1))
    second = seed_from_model_dir(mine, seeds, p)
    assert second != first and read_json(first / "receipt.json") == r
    # a name holds what it says: a copy under it of other files is refused, never used
    from evidence.canonical import canonical_sha256, file_sha256

    cfg.write_text(cfg.read_text().replace("{", '{"_again": true, ', 1))
    table = {p.name: file_sha256(p) for p in sorted(mine.iterdir()) if p.is_file()}
    shutil.copytree(first, seeds / f"local-{canonical_sha256(table)[:16]}")
    with pytest.raises(SeedError, match="does not hold the files .* had when it was hashed"):
        seed_from_model_dir(mine, seeds, p)
    # a seed directory (it holds its receipt) is verified and used where it is
    assert seed_from_model_dir(tiny_seed, seeds, p) == tiny_seed
    with pytest.raises(SeedError, match="is not a directory"):
        seed_from_model_dir(tmp_path / "nowhere", seeds, p)


def test_recovery_trial_neither_ignores_nor_lacks_a_model_dir(tmp_path):
    from orchestrate.cli import app

    res = CliRunner().invoke(app, ["recovery-trial", "--profile", "recovery", "--model-dir", str(tmp_path),
                                   "--out", str(tmp_path / "r")])
    flat = "".join(res.output.replace("│", "").split())  # typer's box folds long words: compare without spaces
    want = "".join(f"profile recovery's seed is 'tiny': --model-dir {tmp_path} would not be used".split())
    assert res.exit_code == 2 and want in flat, res.output
    assert not (tmp_path / "r").exists()


def test_a_trained_model_keeps_every_tokenizer_file_and_no_seed_weights(tmp_path):
    for name in ("config.json", "generation_config.json", "model.safetensors", "model-00001-of-00002.safetensors",
                 "model.safetensors.index.json", "pytorch_model.bin", "receipt.json", ".gitattributes",
                 "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "tokenizer.model",
                 "special_tokens_map.json", "added_tokens.json", "chat_template.jinja", "README.md"):
        (tmp_path / name).write_text("x")
    kept = [p.name for p in seed_files_kept(tmp_path, {"config.json", "generation_config.json", "model.safetensors"})]
    assert kept == ["README.md", "added_tokens.json", "chat_template.jinja", "generation_config.json", "merges.txt",
                    "special_tokens_map.json", "tokenizer.json", "tokenizer.model", "tokenizer_config.json",
                    "vocab.json"]


def test_a_model_the_probe_could_not_serve_is_refused_before_it_trains(tiny_seed, tmp_path):
    """A directory of your own that trains but whose architecture the replica's engine cannot run (here one
    whose rotary angles depend on the batch): `validate` and `run` refuse it at once, where the profile serves
    dev cases — not after training, when the probe starts — as every other refusal reads (no usage box);
    --no-serve, which leaves the probe out, lifts it in `validate`."""
    mine = tmp_path / "my-llama"
    shutil.copytree(tiny_seed, mine)
    cfg = json.loads((mine / "config.json").read_text())
    (mine / "config.json").write_text(json.dumps({**cfg, "rope_parameters": {"rope_type": "dynamic", "factor": 2.0,
                                                                              "rope_theta": 10000.0}}))
    for cmd in ("validate", "run"):
        where = ["--trials", str(tmp_path / "trials"), "--seeds", str(tmp_path / "seeds")] if cmd == "run" else []
        r = run_cli("-m", "orchestrate", cmd, "local-training-windows", "--profile", "gpu", "--model-dir", str(mine),
                    *where, cwd=tmp_path)
        flat = " ".join((r.stdout + r.stderr).split())
        assert r.returncode == 2, (cmd, r.stdout, r.stderr)
        for words in ("error:", "rotary embedding is 'dynamic'", "depend on its neighbours", "pass --no-serve"):
            assert words in flat, (cmd, words, r.stdout, r.stderr)
        assert "Traceback" not in flat and "Usage:" not in flat and "Invalid value" not in flat
    assert not (tmp_path / "trials").exists() and not (tmp_path / "seeds").exists()
    r = run_cli("-m", "orchestrate", "validate", "local-training-windows", "--profile", "gpu", "--model-dir", str(mine),
                "--no-serve", cwd=tmp_path)
    assert "rotary embedding" not in r.stdout + r.stderr, r.stderr
