"""Reading a finished arm's per-rank `result.json` files back into one summary.

Group figures are recomputed from the ranks' raw records: an update's group time is the slowest
rank's, its global loss Σ_r loss_sum_r / W (DDP needs no extra collective to report it).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from evidence.canonical import read_json
from evidence.inputs import global_losses


def result_paths(home: Path, arm: str, world: int) -> list[Path]:
    return [home / "runs" / arm / f"rank-{r}" / "result.json" for r in range(world)]


def finished(home: Path, arm: str, world: int) -> bool:
    return all(p.is_file() for p in result_paths(home, arm, world))


def load_results(home: Path, arm: str, world: int) -> list[dict[str, Any]]:
    return [read_json(p) for p in result_paths(home, arm, world)]


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    r0 = results[0]
    n = len(r0["updates"])
    step = [max(r["updates"][u]["seconds"] for r in results) for u in range(n)]
    losses = global_losses([r["updates"] for r in results])
    digests = {r["digests"]["final_parameters"] for r in results}
    return {
        "arm": r0["arm"]["name"], "kind": r0["arm"]["kind"], "world_size": r0["world_size"],
        "updates": n, "parameters": r0["parameters"],
        "step_seconds_median": statistics.median(step), "step_seconds_mean": sum(step) / n,
        "updates_seconds": max(r["timers"]["updates_seconds"] for r in results),
        "training_loop_seconds": max(r["timers"]["training_loop_seconds"] for r in results),
        "payload_bytes_per_update": r0["comm"]["training_payload_bytes_per_update"],
        "ring_wire_bytes_per_update": sum(
            r0["comm"]["by_label"].get(k, {}).get("ring_wire_bytes", 0)
            for k in ("gradient", "outer-delta")) / n,
        "loss_first": losses[0], "loss_last": losses[-1],
        "replicas_agree": len(digests) == 1,
        "final_parameters": sorted(digests)[0] if len(digests) == 1 else sorted(digests),
        "max_rss_bytes": max(r["resources"]["max_rss_bytes"] for r in results),
        "payload_bytes_by_update": [sum(v["payload_bytes"] for v in u["comm"].values()
                                        if v) for u in r0["updates"]],
    }
