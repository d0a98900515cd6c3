"""Benchmark: every training arm of the three experiments, through the real launch path.

    python bench/arms_bench.py [--profile smoke] [--out bench/results/YYYY-MM-DD-<topic>/arms.json]

Prepares cooperative-learning → local-training-windows → batched-learning (each excluding the
previous experiment's tasks) in a fresh work directory, then trains every arm with one process per
rank (`python -m training train`, the embedded local cluster's launcher) and prints, per arm, the
step time and the logical collective payload per update, measured at the collectives. Checks that
DiLoCo's payload per update is exactly 1/H of DDP's and prints PowerSGD's dense and compressed
payloads separately. Every figure comes from the ranks' result.json files of this run. Arms train
one at a time: one that fails is recorded under "failed" (exit 1) and the others' figures still stand.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrate.progress import ConsoleProgress, stderr_console  # noqa: E402
from orchestrate.recovery import IO_BASELINE  # noqa: E402
from orchestrate.stages.train import train_arms  # noqa: E402
from orchestrate.backends.local import LocalBackend  # noqa: E402
from training.config import lineage  # noqa: E402
from training.prepare import prepare_chain  # noqa: E402
from training.errors import TrainError  # noqa: E402
from training.results import load_results  # noqa: E402
from training.seed import materialize  # noqa: E402


def powersgd_split(results: list[dict]) -> dict[str, float | int]:
    recs = results[0]["updates"]
    dense = [r["comm"]["gradient"]["payload_bytes"] for r in recs if not r["powersgd_compressed"]]
    comp = [r["comm"]["gradient"]["payload_bytes"] for r in recs if r["powersgd_compressed"]]
    return {"dense_updates": len(dense), "compressed_updates": len(comp),
            "dense_payload_bytes_per_update": sum(dense) / max(1, len(dense)),
            "compressed_payload_bytes_per_update": sum(comp) / max(1, len(comp))}


def measure_bf16_peak(n: int = 8192, seconds: float = 3.0) -> float:
    """FLOP/s of back-to-back bf16 n×n matmuls on GPU 0: the peak MFU is measured against."""
    import torch

    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    iters, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            a @ b
        torch.cuda.synchronize()
        iters += 10
    return 2 * n ** 3 * iters / (time.perf_counter() - t0)


def throughput(home: Path, results: list[dict], world: int, peak: float | None) -> dict:
    """Tokens per update from the committed document table (prompt + target tokens of the update's
    documents), active seconds from the journal, and MFU ≈ 6 · parameters · tokens / (active time ·
    peak · GPUs): the usual dense estimate, which counts the LM head for every token although only
    target positions reach it here, so it slightly overstates the work."""
    docs = {}
    with open(home / "inputs" / "documents.jsonl") as f:
        for line in f:
            d = json.loads(line)
            docs[d["index"]] = d["prompt_tokens"] + d["targets"]
    ups = results[0]["updates"]
    tokens = sum(docs[i] for u in ups for i in u["global_docs"])
    active = max(sum(u["seconds"] for u in r["updates"]) for r in results)
    params = results[0]["parameters"]
    out = {"active_seconds": active, "tokens_per_update": tokens / len(ups), "tokens_per_second": tokens / active,
           "parameters": params,
           # the first update: where compilation fell before train.py compiled ahead of the loop
           "active_seconds_after_first": max(sum(u["seconds"] for u in r["updates"][1:]) for r in results)}
    out["step_seconds_median"] = statistics.median(max(r["updates"][i]["seconds"] for r in results)
                                                   for i in range(len(ups)))
    if peak and params:
        out["mfu"] = 6 * params * tokens / (active * peak * world)
        # steady state: the median update (a compiled run's first updates include compilation)
        out["mfu_median_step"] = 6 * params * (tokens / len(ups)) / (out["step_seconds_median"] * peak * world)
    return out


def adjust(cfg, ranks: int | None, checkpoint_every: int | None, pack_tokens: int | None = None,
           pack_rows: int | None = None, updates: int | None = None, deterministic: bool = False):
    """The benchmark's overrides, applied before `prepare` so the prepared inputs record them."""
    if ranks:
        arms = [a.model_copy(update={"world_size": ranks}) if a.world_size > 1 else a
                for a in cfg.experiment.arms]
        cfg = cfg.model_copy(update={"experiment": cfg.experiment.model_copy(update={"arms": arms})})
    update = {k: v for k, v in (("pack_tokens", pack_tokens), ("pack_rows", pack_rows), ("updates", updates),
                                ("deterministic", deterministic)) if v}
    if checkpoint_every is not None:  # 0 too: none, as asked
        update["checkpoint_every"] = checkpoint_every
    if update:  # validated again, as a profile read from TOML would be
        cfg = cfg.model_copy(update={"profile": type(cfg.profile).model_validate(
            {**cfg.profile.model_dump(), **update})})
    return cfg


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="smoke")
    ap.add_argument("--seeds", default=str(ROOT / ".seeds"))
    ap.add_argument("--model-dir", help="seed directory (profiles whose seed is 'local')")
    ap.add_argument("--work", help="work directory (default: a fresh temporary one)")
    ap.add_argument("--out")
    ap.add_argument("--arms", help="comma-separated arm names, or EXPERIMENT:ARM, to train (default: every arm)")
    ap.add_argument("--max-world", type=int, help="skip arms with more ranks (e.g. the GPUs present)")
    ap.add_argument("--label", default="", help="a name for this run's setting, e.g. nvlink or sockets")
    ap.add_argument("--peak", action="store_true", help="measure the bf16 matmul peak of GPU 0 and "
                                                        "report model FLOP utilization per arm")
    ap.add_argument("--ranks", type=int, help="run every multi-rank arm on this many ranks instead "
                                              "(e.g. ddp-four and diloco-four as pairs on 2 GPUs); "
                                              "the arm keeps its name, results record the world size")
    ap.add_argument("--checkpoint-every", type=int, help="publish group checkpoints every N updates")
    ap.add_argument("--pack-tokens", type=int, help="packed-row width for a profile with pack = true")
    ap.add_argument("--pack-rows", type=int, help="packed rows per forward (a profile with pack_tokens)")
    ap.add_argument("--updates", type=int, help="updates per arm instead of the profile's (a shorter run)")
    ap.add_argument("--deterministic", action="store_true", help="the profile's deterministic = true (every "
                                                                 "kernel deterministic): what it costs")
    ap.add_argument("--io-baseline", action="store_true", help="each rank also times a plain write "
                                                               "+ fsync of one checkpoint's bytes "
                                                               "(TRIAL_IO_BASELINE=1)")
    args = ap.parse_args()
    if args.io_baseline:
        os.environ.update(IO_BASELINE)  # inherited by the rank processes
    wanted = set(args.arms.split(",")) if args.arms else None
    peak = measure_bf16_peak() if args.peak else None
    if peak:
        print(f"bf16 matmul peak of GPU 0: {peak / 1e12:.1f} TFLOP/s")

    chain = [adjust(cfg, args.ranks, args.checkpoint_every, args.pack_tokens, args.pack_rows, args.updates,
                    args.deterministic)
             for cfg in lineage("batched-learning", args.profile)]
    kind = chain[0].profile.seed
    md = Path(args.model_dir) if args.model_dir else Path(args.seeds) / kind
    if not args.model_dir:
        materialize(kind, md)
    work = Path(args.work or tempfile.mkdtemp(prefix="arms-bench-"))
    rows, checks, failed = [], {}, []
    t_all = time.monotonic()
    progress = ConsoleProgress(stderr_console())  # what train_arms says of each arm: on stderr, as `orchestrate run`
    for cfg, home, _ in prepare_chain(chain, lambda c: work / f"{c.experiment.name}-{args.profile}", md):
        keep = [a for a in cfg.experiment.arms if not a.trains or (
            (wanted is None or a.name in wanted or f"{cfg.experiment.name}:{a.name}" in wanted)
            and (args.max_world is None or a.world_size <= args.max_world))]
        skipped = [a.name for a in cfg.experiment.arms if a not in keep]
        if skipped:
            print(f"{cfg.experiment.name}: not trained here: {', '.join(skipped)}")
        for arm in keep:
            if not arm.trains:
                continue
            one = cfg.model_copy(update={"experiment": cfg.experiment.model_copy(update={"arms": [arm]})})
            try:  # one arm at a time: an arm that fails loses only itself, the others' figures stay
                [summary] = train_arms(one, home, LocalBackend(md), progress)
            except TrainError as e:
                failed.append({"experiment": cfg.experiment.name, "arm": arm.name, "error": str(e)})
                print(f"{cfg.experiment.name}:{arm.name} FAILED, the benchmark goes on: {e}")
                continue
            s = summary.model_dump(mode="json")  # the row: the arm's summary, and what the benchmark adds below
            s["experiment"] = cfg.experiment.name
            results = load_results(home, arm.name, arm.world_size)
            if arm.kind == "powersgd":
                s["powersgd"] = powersgd_split(results)
            s["throughput"] = throughput(home, results, arm.world_size, peak)
            s["whole_process_seconds"] = max(r["resources"]["wall_seconds_since_start"] for r in results)
            s["cuda_max_reserved_bytes"] = max((r["resources"].get("cuda_max_reserved_bytes") or 0) for r in results)
            s["losses"] = [u["loss"] for u in results[0]["updates"]]  # the curve (single-rank arms)
            s["pack_rows"] = cfg.profile.pack_rows
            # under compile, train.py compiles before the timed loop; the slowest rank's time
            s["compile_warm_up_seconds"] = max((r["timers"].get("compile_warm_up_seconds") or 0.0) for r in results)
            s["checkpoint_io"] = [{"rank": r["rank"], **r["checkpoints"]["io"]} for r in results
                                  if r["checkpoints"]["io"]]
            rows.append(s)
        by = {s["arm"]: s for s in rows if s["experiment"] == cfg.experiment.name}
        if {"diloco-four", "ddp-four"} <= set(by):
            h = load_results(home, "diloco-four", cfg.arm("diloco-four").world_size)[0][
                "numerical_profile"]["arm"]["sync_every"]
            ratio = by["diloco-four"]["payload_bytes_per_update"] / by["ddp-four"]["payload_bytes_per_update"]
            checks["diloco_over_ddp_payload"] = {"ratio": ratio, "sync_every": h, "one_over_h": 1 / h,
                                                 "exact": ratio == 1 / h}
            dt, dd = by["diloco-four"]["throughput"], by["ddp-four"]["throughput"]
            active = dt["active_seconds"] / dd["active_seconds"]
            later = dt["active_seconds_after_first"] / max(dd["active_seconds_after_first"], 1e-9)
            checks["diloco_over_ddp_active"] = {"ratio": active, "target_max": 0.12, "met": active <= 0.12,
                                                "ratio_after_first": later, "met_after_first": later <= 0.12}
        if {"powersgd-pair", "single"} <= set(by):
            ps, one = by["powersgd-pair"], by["single"]
            checks["powersgd"] = {
                "payload_over_dense": (ps["powersgd"]["compressed_payload_bytes_per_update"]
                                       / ps["powersgd"]["dense_payload_bytes_per_update"]),
                "active_speedup_vs_single": one["throughput"]["active_seconds"] / ps["throughput"]["active_seconds"],
                "active_speedup_after_first": (one["throughput"]["active_seconds_after_first"]
                                               / max(ps["throughput"]["active_seconds_after_first"], 1e-9)),
                "whole_process_speedup_vs_single": one["whole_process_seconds"] / ps["whole_process_seconds"],
                "median_step_speedup_vs_single": (one["throughput"]["step_seconds_median"]
                                                  / ps["throughput"]["step_seconds_median"]),
                "targets": {"payload_over_dense_max": 1 / 40, "speedup_min": 1.10}}

    print(f"\n{'experiment':23} {'arm':15} {'ranks':>5} {'upd':>4} {'step s med':>10} {'step s mean':>11} "
          f"{'loop s':>7} {'payload B/update':>17} {'ring wire B/update':>19}")
    for s in rows:
        print(f"{s['experiment']:23} {s['arm']:15} {s['world_size']:>5} {s['updates']:>4} "
              f"{s['step_seconds_median']:>10.4f} {s['step_seconds_mean']:>11.4f} "
              f"{s['training_loop_seconds']:>7.2f} {s['payload_bytes_per_update']:>17,.0f} "
              f"{s['ring_wire_bytes_per_update']:>19,.0f}")
    for s in rows:
        t = s["throughput"]
        print(f"{s['arm']:15} active {t['active_seconds']:.2f} s, {t['tokens_per_update']:,.0f} tokens/update, "
              f"{t['tokens_per_second']:,.0f} tokens/s"
              + (f", MFU {t['mfu']:.1%} of {peak / 1e12:.0f} TFLOP/s per GPU (median update: "
                 f"{t['mfu_median_step']:.1%})" if t.get("mfu") is not None else "")
              + (f"; compiled before the loop in {s['compile_warm_up_seconds']:.1f} s"
                 if s["compile_warm_up_seconds"] else ""))
    c = checks.get("diloco_over_ddp_payload")
    if c:
        print(f"\nDiLoCo / DDP logical payload per update = {c['ratio']!r}; 1/H = 1/{c['sync_every']} = "
              f"{c['one_over_h']!r}: {'exact' if c['exact'] else 'NOT EQUAL'}")
        a = checks["diloco_over_ddp_active"]
        print(f"DiLoCo / DDP active time = {a['ratio']:.4f} (target ≤ 0.12: {'met' if a['met'] else 'NOT met'}); "
              f"after the first update (compilation) {a['ratio_after_first']:.4f} "
              f"({'met' if a['met_after_first'] else 'NOT met'})")
    if "powersgd" in checks:
        p = checks["powersgd"]
        print(f"PowerSGD compressed / dense payload = {p['payload_over_dense']:.4f} (≤ 1/40 = 0.025); "
              f"speedup vs single: active {p['active_speedup_vs_single']:.3f} (after the first update "
              f"{p['active_speedup_after_first']:.3f}), whole process "
              f"{p['whole_process_speedup_vs_single']:.3f}, median update "
              f"{p['median_step_speedup_vs_single']:.3f} (targets ≥ 1.10)")
    for s in rows:
        for io in s["checkpoint_io"]:
            r = io["rank"]
            if io.get("checkpoint_write_seconds_mean") and io.get("write_over_plain"):
                rate = io["plain_write_bytes"] / io["plain_write_seconds"]
                print(f"{s['arm']} rank {r}: checkpoint write {io['checkpoint_write_seconds_mean']:.2f} s, "
                      f"plain write + fsync of {io['plain_write_bytes'] / 1e9:.2f} GB {io['plain_write_seconds']:.2f} s "
                      f"({rate / 1e9:.2f} GB/s): checkpoint at {1 / io['write_over_plain']:.1%} of the "
                      f"plain rate (target ≥ 80 %)")
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
        "profile": args.profile, "seed": kind, "work": str(work), "label": args.label,
        "command": " ".join(sys.argv), "bf16_peak_flops": peak,
        "nccl_env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")},
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                    "torch": torch.__version__,
                    "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None},
        "wall_seconds": time.monotonic() - t_all, "arms": rows, "checks": checks, "failed": failed,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
        print(f"wrote {args.out}")
    for f in failed:
        print(f"FAILED {f['experiment']}:{f['arm']}: {f['error']}")
    return 0 if (c is None or c["exact"]) and not failed else 1


if __name__ == "__main__":
    raise SystemExit(main())
