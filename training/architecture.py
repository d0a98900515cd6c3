"""Which models the serving replica's engine (training/engine.py) can run, judged from a model's
`config.json` alone — so that `validate` and `run` refuse a directory of your own whose architecture
the probe could not serve before anything trains, not after (the replica says the same when it starts).

The engine runs the model's own transformers modules; what it needs from an architecture is that its
attention goes through transformers' cache and attention seams and that its positions are a function of
each row's own position. `SERVED` is exactly the set tests/training/test_architectures.py checks with a
tiny random model of each (tokens equal to `generate()`'s, bit-identical alone and beside neighbours):
a model type is served because it was tested, not because it looks like one that was."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

SERVED: dict[str, str] = {
    "llama": "Llama 1/2/3.x, SmolLM, TinyLlama (rotary default, llama3, linear, yarn)",
    "mistral": "Mistral (sliding window)",
    "qwen2": "Qwen2, Qwen2.5 (q/k/v biases)",
    "qwen3": "Qwen3 (q/k norms)",
    "phi3": "Phi-3 (fused q/k/v and gate/up)",
    "gemma": "Gemma (scaled embeddings, GeGLU)",
    "gemma2": "Gemma 2 (attention and final logit soft-capping, alternating sliding windows)",
    "gpt2": "GPT-2 (learned positions, Conv1D projections)",
    "olmo2": "OLMo 2 (q/k norms, post-norms)",
    "starcoder2": "StarCoder2 (biases, GELU MLP)",
    "granite": "Granite (embedding, residual, attention and logit multipliers)",
}
"""The architectures served, by `model_type` (docs/serving-models.md is their table)."""

BATCH_DEPENDENT_ROPE = {"dynamic", "longrope"}
"""Rotary types whose angles transformers computes from the batch's largest position
(modeling_rope_utils.py `dynamic_rope_update`): a row's arithmetic would depend on its neighbours."""


LEARNED_POSITIONS = {"gpt2": "n_positions"}
"""Served types whose positions are a learned table (its size, by config key): a position past it is a
device-side fault, so the engine refuses a `max_len` beyond it."""


def _rope_types(c: Mapping[str, Any]) -> set[str]:
    """Every rotary type the config names, in `rope_scaling` (the legacy key, which transformers 5.24 reads
    first: modeling_rope_utils.py) and `rope_parameters` (possibly one per layer type, e.g. Gemma 3); Phi-3's
    legacy "su" and "yarn" are what its config class turns into "longrope" (configuration_phi3.py)."""
    found: set[str] = set()
    for rope in (c.get("rope_scaling"), c.get("rope_parameters")):
        if not isinstance(rope, Mapping):
            continue
        inner = [v for v in rope.values() if isinstance(v, Mapping)]
        for r in inner or [rope]:
            kind = str(r.get("rope_type") or r.get("type") or "default")
            found.add("longrope" if c.get("model_type") == "phi3" and kind in ("su", "yarn") else kind)
    return found


def learned_positions(config: Mapping[str, Any] | Any) -> int | None:
    """The size of the model's learned position table, where it has one."""
    c = config if isinstance(config, Mapping) else config.to_dict()
    key = LEARNED_POSITIONS.get(c.get("model_type", ""))
    return c.get(key) if key else None


def unservable(config: Mapping[str, Any] | Any) -> str | None:
    """Why the engine cannot run a model of this config (a `config.json` mapping or a transformers
    config), or None."""
    c = config if isinstance(config, Mapping) else config.to_dict()
    kind = c.get("model_type")
    if c.get("auto_map"):
        return ("the model ships its own modeling code (config.json's auto_map); the serving engine runs only "
                "transformers' own modules")
    if c.get("is_encoder_decoder"):
        return f"the model ({kind!r}) is an encoder-decoder; the serving engine runs decoder-only causal LMs"
    if kind not in SERVED:
        return (f"the serving engine runs the architectures it is tested with ({', '.join(sorted(SERVED))}; "
                f"docs/serving-models.md); this model's model_type is {kind!r}")
    if c.get("use_bidirectional_attention") or c.get("is_causal") is False:
        return ("the model attends bidirectionally (use_bidirectional_attention / is_causal); the serving engine "
                "decodes causal LMs")
    if bad := sorted(_rope_types(c) & BATCH_DEPENDENT_ROPE):
        return (f"the model's rotary embedding is {bad[0]!r}, whose angles transformers computes from the "
                "batch's largest position, so a request's tokens would depend on its neighbours")
    heads, kv = c.get("num_attention_heads") or c.get("n_head"), c.get("num_key_value_heads")
    if heads and kv and heads % kv:
        return "the model's attention heads are not a whole multiple of its key/value heads"
    return None


def unservable_dir(model_dir: Path) -> str | None:
    """`unservable` of a model directory's config.json (None where there is none to read: the import's
    own check says so)."""
    try:
        return unservable(json.loads((model_dir / "config.json").read_text()))
    except (OSError, ValueError):
        return None
