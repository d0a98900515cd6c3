"""The serving engine's architecture table (#66): per architecture training/architecture.py serves, a tiny
random model of its config (tests/training/tiny_architectures.py) — the engine's greedy tokens against
transformers' own `generate()` on the same device (n of n, near-ties counted: training/engine.py
`NEAR_TIE`), and each request bit-identical alone and beside neighbours joining and leaving.

    python bench/architecture_table.py --out table.json                       # CPU, every architecture
    python bench/architecture_table.py --device cuda --names llama,qwen2,gemma2,gpt2 --out gpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "training")]
os.environ["ATEN_CPU_CAPABILITY"] = "default"  # as `training serve` runs a replica (training/engine.py)

import torch  # noqa: E402
import transformers  # noqa: E402

from tiny_architectures import CONFIGS, table_row  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--names", default=",".join(CONFIGS))
    ap.add_argument("--slots", type=int, default=3)
    ap.add_argument("--out")
    args = ap.parse_args()
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"{name}, torch {torch.__version__}, transformers {transformers.__version__}, "
          f"CPU kernels {torch.backends.cpu.get_cpu_capability()}", flush=True)
    print("| architecture | model_type | equal to generate() | near-ties | differ | bit-identical beside neighbours "
          "| slots used | compiled | engine start s |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows = []
    for n in args.names.split(","):
        r = table_row(n, device, slots=args.slots)
        rows.append(r)
        print(f"| {n} | {r['model_type']} | {r['equal_to_generate']}/{r['requests']} | {r['near_ties']} | {r['differ']} "
              f"| {r['bit_identical_beside_neighbours']}/{r['requests']} | {r['slots_used']} | {r['compiled']} "
              f"| {r['engine_seconds']} |", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"device": name, "torch": torch.__version__,
                                              "transformers": transformers.__version__, "rows": rows}, indent=1))
    return 0 if all(r["differ"] == 0 and r["bit_identical_beside_neighbours"] == r["requests"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
