"""Benchmark: every training arm of the three experiments, through the real launch path.

    python bench/arms_bench.py [--profile smoke] [--out bench/results/arms-smoke.json]

Prepares cooperative-learning → local-training-windows → batched-learning (each excluding the
previous experiment's tasks) in a fresh work directory, then trains every arm with one process per
rank (`python -m training train`, the embedded local cluster's launcher) and prints, per arm, the
step time and the logical collective payload per update, measured at the collectives. Checks that
DiLoCo's payload per update is exactly 1/H of DDP's and prints PowerSGD's dense and compressed
payloads separately. Every figure comes from the ranks' result.json files of this run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrate.cli import train_arms  # noqa: E402
from training.config import lineage  # noqa: E402
from training.prepare import prepare  # noqa: E402
from training.results import load_results  # noqa: E402
from training.seed import materialize  # noqa: E402


def powersgd_split(results: list[dict]) -> dict[str, float | int]:
    recs = results[0]["updates"]
    dense = [r["comm"]["gradient"]["payload_bytes"] for r in recs if not r["powersgd_compressed"]]
    comp = [r["comm"]["gradient"]["payload_bytes"] for r in recs if r["powersgd_compressed"]]
    return {"dense_updates": len(dense), "compressed_updates": len(comp),
            "dense_payload_bytes_per_update": sum(dense) / max(1, len(dense)),
            "compressed_payload_bytes_per_update": sum(comp) / max(1, len(comp))}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="smoke")
    ap.add_argument("--seeds", default=str(ROOT / ".seeds"))
    ap.add_argument("--model-dir", help="seed directory (profiles whose seed is 'local')")
    ap.add_argument("--work", help="work directory (default: a fresh temporary one)")
    ap.add_argument("--out")
    args = ap.parse_args()

    chain = lineage("batched-learning", args.profile)
    kind = chain[0].profile.seed
    md = Path(args.model_dir) if args.model_dir else Path(args.seeds) / kind
    if not args.model_dir:
        materialize(kind, md)
    work = Path(args.work or tempfile.mkdtemp(prefix="arms-bench-"))
    rows, checks = [], {}
    previous = None
    t_all = time.monotonic()
    for cfg in chain:
        home = work / f"{cfg.experiment.name}-{args.profile}"
        prepare(cfg, home, md, previous_home=str(previous) if previous else None)
        previous = home
        for s in train_arms(cfg, home, md):
            s["experiment"] = cfg.experiment.name
            arm = cfg.arm(s["arm"])
            if arm.kind == "powersgd":
                s["powersgd"] = powersgd_split(load_results(home, arm.name, arm.world_size))
            rows.append(s)
        if cfg.experiment.name == "local-training-windows":
            by = {s["arm"]: s for s in rows if s["experiment"] == cfg.experiment.name}
            h = load_results(home, "diloco-four", 4)[0]["numerical_profile"]["arm"]["sync_every"]
            ratio = by["diloco-four"]["payload_bytes_per_update"] / by["ddp-four"]["payload_bytes_per_update"]
            checks["diloco_over_ddp_payload"] = {"ratio": ratio, "sync_every": h, "one_over_h": 1 / h,
                                                 "exact": ratio == 1 / h}

    print(f"\n{'experiment':23} {'arm':15} {'ranks':>5} {'upd':>4} {'step s med':>10} {'step s mean':>11} "
          f"{'loop s':>7} {'payload B/update':>17} {'ring wire B/update':>19}")
    for s in rows:
        print(f"{s['experiment']:23} {s['arm']:15} {s['world_size']:>5} {s['updates']:>4} "
              f"{s['step_seconds_median']:>10.4f} {s['step_seconds_mean']:>11.4f} "
              f"{s['training_loop_seconds']:>7.2f} {s['payload_bytes_per_update']:>17,.0f} "
              f"{s['ring_wire_bytes_per_update']:>19,.0f}")
    c = checks["diloco_over_ddp_payload"]
    print(f"\nDiLoCo / DDP logical payload per update = {c['ratio']!r}; 1/H = 1/{c['sync_every']} = "
          f"{c['one_over_h']!r}: {'exact' if c['exact'] else 'NOT EQUAL'}")
    for s in rows:
        if "powersgd" in s:
            p = s["powersgd"]
            print(f"{s['arm']}: {p['dense_updates']} dense updates at {p['dense_payload_bytes_per_update']:,.0f} "
                  f"B, {p['compressed_updates']} compressed at {p['compressed_payload_bytes_per_update']:,.0f} B "
                  f"({p['compressed_payload_bytes_per_update'] / p['dense_payload_bytes_per_update']:.4f} of dense)")
            if p["compressed_payload_bytes_per_update"] == p["dense_payload_bytes_per_update"]:
                print("  (nothing was compressible: PowerSGD compresses an n×m matrix only when "
                      "(n + m)·rank·2 < n·m, and at rank 32 no matrix of this seed qualifies)")
    import torch

    report = {
        "profile": args.profile, "seed": kind, "work": str(work),
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                    "torch": torch.__version__,
                    "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None},
        "wall_seconds": time.monotonic() - t_all, "arms": rows, "checks": checks,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
        print(f"wrote {args.out}")
    return 0 if c["exact"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
