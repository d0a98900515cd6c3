"""Benchmark: `prepare` wall time and supervised-token shares at the studies' full sizes.

    python bench/prepare_bench.py --model-dir .seeds/smollm2-135m [--out bench/results/YYYY-MM-DD-<topic>/prepare.json]

The `gpu` profiles name the SmolLM2-1.7B snapshot as seed; any SmolLM2 directory gives the same
tokenization (the family shares one 49,152-token tokenizer), so the 135M seed stands in here.
Each experiment is prepared into a fresh temporary home; the figures printed are measured, per run.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from training.config import lineage  # noqa: E402
from training.prepare import prepare_chain  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--profile", default="gpu")
    ap.add_argument("--experiments", nargs="+", default=["cooperative-learning", "batched-learning"])
    ap.add_argument("--out")
    args = ap.parse_args()
    rows = []
    for name in args.experiments:
        with tempfile.TemporaryDirectory() as tmp:
            # earlier experiments are prepared first: no task may recur; the last one's wall time counts
            chain = lineage(name, args.profile)
            t0 = time.monotonic()
            for _, _, res in prepare_chain(chain, lambda c: Path(tmp) / c.experiment.name, args.model_dir):
                wall, t0 = time.monotonic() - t0, time.monotonic()
        c = res["prepared"]["counts"]
        rows.append({
            "experiment": name, "profile": args.profile,
            "documents": c["task"]["documents"] + c["replay"]["documents"],
            "wall_seconds": round(wall, 2), "phases": res["record"]["seconds"],
            "task_target_tokens": c["task"]["target_tokens"],
            "replay_target_tokens": c["replay"]["target_tokens"],
            "probe_target_tokens": c["probes"]["target_tokens"],
            "task_share_of_documents": c["task_share_of_documents"],
            "task_share_of_targets": c["task_share_of_targets"],
            "task_share_of_weighted_targets": c["task_share_of_weighted_targets"],
            "replay_skipped_too_long": res["prepared"]["replay_source"].get("skipped_too_long"),
        })
    print(f"{'experiment':24} {'docs':>6} {'wall s':>7} {'task tok':>9} {'replay tok':>10} "
          f"{'task %':>7} {'task % w':>8}")
    for r in rows:
        print(f"{r['experiment']:24} {r['documents']:>6} {r['wall_seconds']:>7.2f} "
              f"{r['task_target_tokens']:>9} {r['replay_target_tokens']:>10} "
              f"{100 * r['task_share_of_targets']:>6.1f}% {100 * r['task_share_of_weighted_targets']:>7.1f}%")
    result = {"command": " ".join(["python", *sys.argv]), "machine": platform.machine(),
              "cpus": __import__("os").cpu_count(), "rows": rows}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
