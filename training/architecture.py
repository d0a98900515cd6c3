"""Which models the serving replica's engine (training/engine.py) can run, judged from a model's
`config.json` alone — so that `validate` and `run` refuse a directory of your own whose architecture
the probe could not serve before anything trains, not after (the replica says the same when it starts)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping


def unservable(config: Mapping[str, Any] | Any) -> str | None:
    """Why the engine cannot run a model of this config (a `config.json` mapping or a transformers
    config), or None."""
    c = config if isinstance(config, Mapping) else config.to_dict()
    kind = c.get("model_type")
    if kind != "llama":
        return (f"the serving engine runs Llama-architecture decoders (model_type \"llama\"); this model's "
                f"is {kind!r}")
    if c.get("attention_bias") or c.get("mlp_bias"):
        return "the serving engine runs Llama decoders without projection biases; this model has them"
    rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
    kind = rope.get("rope_type") or rope.get("type") or "default"
    if kind != "default":
        return f"the serving engine runs the default rotary embedding; this model's is {kind!r}"
    if c.get("hidden_act", "silu") != "silu":
        return f"the serving engine runs SwiGLU (silu) MLPs; this model's activation is {c.get('hidden_act')!r}"
    if c.get("num_attention_heads", 1) % c.get("num_key_value_heads", c.get("num_attention_heads", 1)):
        return "the model's attention heads are not a whole multiple of its key/value heads"
    return None


def unservable_dir(model_dir: Path) -> str | None:
    """`unservable` of a model directory's config.json (None where there is none to read: the import's
    own check says so)."""
    try:
        return unservable(json.loads((model_dir / "config.json").read_text()))
    except (OSError, ValueError):
        return None
