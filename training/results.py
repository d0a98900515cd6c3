"""Reading a finished arm's per-rank `result.json` files back into one summary.

Group figures are recomputed from the ranks' raw records: an update's group time is the slowest
rank's, its global loss Σ_r loss_sum_r / W (DDP needs no extra collective to report it).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from evidence.canonical import read_json
from evidence.inputs import global_losses


class ArmSummary(BaseModel):
    """A finished arm in figures, for the console (`orchestrate run`), `python -m training summary`
    (`model_dump(mode="json")`, in this order) and the benchmarks. Times are the slowest rank's."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    arm: str
    kind: str
    world_size: int
    updates: int
    parameters: int
    step_seconds_median: float  # over updates, of each update's slowest rank
    step_seconds_mean: float
    updates_seconds: float
    training_loop_seconds: float
    payload_bytes_per_update: float  # logical collective payload per rank
    ring_wire_bytes_per_update: float  # what a ring all-reduce of it moves per rank
    loss_first: float  # global weighted response loss of the first and last update
    loss_last: float
    replicas_agree: bool  # every rank ended with the same parameters
    final_parameters: str | list[str]  # their digest; every rank's distinct one where they differ
    max_rss_bytes: int
    payload_bytes_by_update: list[int]


def result_paths(home: Path, arm: str, world: int) -> list[Path]:
    return [home / "runs" / arm / f"rank-{r}" / "result.json" for r in range(world)]


def finished(home: Path, arm: str, world: int) -> bool:
    return all(p.is_file() for p in result_paths(home, arm, world))


def load_results(home: Path, arm: str, world: int) -> list[dict[str, Any]]:
    return [read_json(p) for p in result_paths(home, arm, world)]


def summarize(results: list[dict[str, Any]]) -> ArmSummary:
    r0 = results[0]
    n = len(r0["updates"])
    step = [max(r["updates"][u]["seconds"] for r in results) for u in range(n)]
    losses = global_losses([r["updates"] for r in results])
    digests = {r["digests"]["final_parameters"] for r in results}
    return ArmSummary(
        arm=r0["arm"]["name"], kind=r0["arm"]["kind"], world_size=r0["world_size"],
        updates=n, parameters=r0["parameters"],
        step_seconds_median=statistics.median(step), step_seconds_mean=sum(step) / n,
        updates_seconds=max(r["timers"]["updates_seconds"] for r in results),
        training_loop_seconds=max(r["timers"]["training_loop_seconds"] for r in results),
        payload_bytes_per_update=r0["comm"]["training_payload_bytes_per_update"],
        ring_wire_bytes_per_update=sum(
            r0["comm"]["by_label"].get(k, {}).get("ring_wire_bytes", 0)
            for k in ("gradient", "outer-delta")) / n,
        loss_first=losses[0], loss_last=losses[-1],
        replicas_agree=len(digests) == 1,
        final_parameters=sorted(digests)[0] if len(digests) == 1 else sorted(digests),
        max_rss_bytes=max(r["resources"]["max_rss_bytes"] for r in results),
        payload_bytes_by_update=[sum(v["payload_bytes"] for v in u["comm"].values()
                                     if v) for u in r0["updates"]],
    )
