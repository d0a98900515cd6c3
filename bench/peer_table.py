"""One table: torchtitan's anchor and the project's single arm, measured in the same GPU call.

    python bench/peer_table.py --peak peak.json --torchtitan tt-bs16.json [...] \
        --project single-rows4.json [...] [--out table.md]

Both sides are counted the same way: 6 · N · tokens per second against the bf16 matmul peak
measured in that call (`peak.json`, written by the anchor's `mm.py`), N the parameters each side
reports (the same 1.7B architecture), tokens the real tokens of a step (torchtitan's synthetic rows
have no padding; the project's rows count only document tokens, not the packed rows' padded tails).
Steady state on both sides: torchtitan's median timed step after its warm-up steps, the project's
median update (its compilation ran before the loop).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

GIB = 2 ** 30


def torchtitan_row(path: Path, peak: float) -> dict:
    r = json.loads(path.read_text())
    tok, sec = r["tokens_per_step"], r["sec_per_step_median_events"]
    return {"run": f"torchtitan 0.3.0, local batch {r['local_batch_size']}", "tokens": tok, "seconds": sec,
            "tokens_per_s": tok / sec, "mfu": 6 * r["nparams"] * tok / sec / peak,
            "peak_gib": r["max_memory_reserved_GiB"], "params": r["nparams"],
            "mean_tokens_per_s": r["tokens_per_s_events"]}


def project_rows(path: Path, peak: float) -> list[dict]:
    out = []
    for a in json.loads(path.read_text())["arms"]:
        t = a["throughput"]
        tok, sec = t["tokens_per_update"], t["step_seconds_median"]
        out.append({"run": f"project {a['arm']}, {a.get('pack_rows', 1)} row(s) of 2,048 per forward",
                    "tokens": tok, "seconds": sec, "tokens_per_s": tok / sec,
                    "mfu": 6 * t["parameters"] * tok / sec / peak,
                    "peak_gib": a.get("cuda_max_reserved_bytes", 0) / GIB, "params": t["parameters"],
                    "mean_tokens_per_s": t["tokens_per_second"], "losses": a.get("losses")})
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--peak", required=True, help="mm.py's JSON (median_tflops)")
    ap.add_argument("--torchtitan", nargs="*", default=[])
    ap.add_argument("--project", nargs="*", default=[])
    ap.add_argument("--out")
    args = ap.parse_args()
    peak = json.loads(Path(args.peak).read_text())["median_tflops"] * 1e12
    rows = ([torchtitan_row(Path(p), peak) for p in args.torchtitan if Path(p).exists()]
            + [r for p in args.project if Path(p).exists() for r in project_rows(Path(p), peak)])
    best_tt = max((r["tokens_per_s"] for r in rows if r["run"].startswith("torchtitan")), default=None)
    lines = [f"bf16 matmul peak measured in this call: {peak / 1e12:.1f} TFLOP/s",
             "", "| run | tokens/step | s/step (median) | tokens/s | vs torchtitan's best | MFU 6·N·T | "
             "tokens/s over all timed steps | peak reserved GiB |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r['tokens_per_s'] / best_tt:.3f}" if best_tt else "-"
        lines.append(f"| {r['run']} | {r['tokens']:,.0f} | {r['seconds']:.3f} | {r['tokens_per_s']:,.0f} | {ratio} | "
                     f"{r['mfu']:.1%} | {r['mean_tokens_per_s']:,.0f} | {r['peak_gib']:.1f} |")
    for r in rows:
        if r.get("losses"):
            lines.append(f"\n{r['run']}: loss by update " + ", ".join(f"{x:.4f}" for x in r["losses"]))
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
