"""Write a random-init Hugging Face directory of the SmolLM2-1.7B architecture (from its published
config values, no weights downloaded), with the tokenizer of an existing seed, for GPU benchmarks.

    python bench/make_arch_seed.py --tokenizer-from .seeds/tiny --out /tmp/arch-1.7b [--layers 24]

Then `python -m training seed --kind local --source /tmp/arch-1.7b --out .seeds/local` receipts it.
1,711,376,384 parameters at the full 24 layers (tied embeddings). Random init with a fixed seed.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

SMOLLM2_1_7B = dict(vocab_size=49152, hidden_size=2048, intermediate_size=8192, num_hidden_layers=24,
                    num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=8192,
                    rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
                    pad_token_id=2, rope_parameters={"rope_theta": 130000.0, "rope_type": "default"})


def parameter_shapes(**overrides) -> list[tuple[int, ...]]:
    """The architecture's parameter shapes, in the model's order (the tied embedding once), read from
    the real Llama module built on the meta device: no memory, and no hand-written list to drift."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**{**SMOLLM2_1_7B, **overrides}))
    return [tuple(p.shape) for p in model.parameters()]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer-from", required=True, help="a seed directory whose tokenizer to copy")
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=24)
    args = ap.parse_args()
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    t0 = time.perf_counter()
    torch.manual_seed(0)
    cfg = LlamaConfig(**{**SMOLLM2_1_7B, "num_hidden_layers": args.layers})
    model = LlamaForCausalLM(cfg)
    n = sum(p.numel() for p in model.parameters())
    out = Path(args.out)
    model.save_pretrained(out, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        src = Path(args.tokenizer_from) / name
        if src.is_file():
            shutil.copy2(src, out / name)
    print(f"{out}: {n:,} parameters, {args.layers} layers, {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
