"""How much of a microbatch is real tokens, padded against packed, for a profile's prepared inputs.

    python bench/padding_share.py [--profile gpu-bench] [--seed tiny]

Prepares the lineage (cooperative-learning → local-training-windows → batched-learning) with the
given seed's tokenizer (the 1.7B architecture seed uses the tiny seed's tokenizer, so the token counts
are the same) and prints, per experiment and per (microbatch, ranks) of its arms, the share of real
tokens in the tensors the model sees: padded rows (as-is and rounded to 256, as under compile) and
packed rows (rounded to 1,024, as under compile), and packed rows of a fixed width (`pack_tokens`,
one shape). No model runs; CPU only.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from training.config import lineage  # noqa: E402
from training.corpus import Corpus  # noqa: E402
from training.objective import make_microbatches  # noqa: E402
from training.prepare import prepare_chain  # noqa: E402
from training.seed import materialize  # noqa: E402
from training.trainer import PACK_MULTIPLE, PAD_MULTIPLE  # noqa: E402


def share(corpus: Corpus, plan: list[list[int]], microbatch: int | None, ranks: int, *,
          pack: bool, multiple: int | None, pack_tokens: int | None = None) -> float:
    real = seen = 0
    for docs in plan:
        k = len(docs) // ranks
        for r in range(ranks):
            for mb in make_microbatches(corpus, docs[r * k:(r + 1) * k], microbatch, pad_id=0,
                                        pad_multiple=multiple, pack=pack, pack_tokens=pack_tokens):
                real += sum(len(corpus.doc(d)) for d in mb.docs)
                seen += mb.input_ids.numel()
    return real / seen


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="gpu-bench")
    ap.add_argument("--seed", default="tiny", help="whose tokenizer to prepare with")
    ap.add_argument("--pack-tokens", default="2048,4096,8192",
                    help="comma-separated fixed packed-row widths to report (pack_tokens)")
    args = ap.parse_args()
    seed_dir = ROOT / ".seeds" / args.seed
    materialize(args.seed, seed_dir)
    work = Path(tempfile.mkdtemp(prefix="padding-"))
    chain = [cfg.model_copy(update={"profile": cfg.profile.model_copy(update={"seed": args.seed})})
             for cfg in lineage("batched-learning", args.profile)]
    for cfg, home, _ in prepare_chain(chain, lambda c: work / c.experiment.name, seed_dir):
        corpus = Corpus.load(home / "inputs" / "train.safetensors")
        plan = json.loads((home / "inputs" / "schedule.json").read_text())["updates"]
        lengths = corpus.lengths
        print(f"{cfg.experiment.name}: {len(corpus)} documents of {lengths.min()}–{lengths.max()} tokens "
              f"(mean {lengths.mean():.0f}), {len(plan[0])} per update")
        for arm in cfg.experiment.arms:
            if not arm.trains:
                continue
            row = {name: share(corpus, plan, arm.microbatch, arm.world_size, pack=pack, multiple=m)
                   for name, pack, m in (("padded", False, None), (f"padded/{PAD_MULTIPLE}", False, PAD_MULTIPLE),
                                         (f"packed/{PACK_MULTIPLE}", True, PACK_MULTIPLE))}
            for t in (int(x) for x in args.pack_tokens.split(",") if x):
                if t >= int(lengths.max()):
                    row[f"rows of {t}"] = share(corpus, plan, arm.microbatch, arm.world_size, pack=True,
                                                multiple=None, pack_tokens=t)
            print(f"  {arm.name:15} microbatch {arm.microbatch or 'all':>3} × {arm.world_size} ranks: real tokens "
                  + ", ".join(f"{k} {v:.1%}" for k, v in row.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
