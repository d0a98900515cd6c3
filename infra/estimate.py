"""The estimate's shape: what `infra.plan.estimate` returns, `pulumi up` refuses on, `orchestrate
estimate`/`plan` print, and `--json` writes (`model_dump(mode="json")`, the keys the plan has always
written). One typed record, so a renamed field fails where it is read, not in a printout at run time."""

from __future__ import annotations

from typing import Iterator, Literal

from pydantic import BaseModel, ConfigDict, Field

Category = Literal["compute", "transfer", "storage_other"]


Number = int | float
"""A figure as it was computed: a whole number stays one in the JSON (`500`, not `500.0`), as the
dicts these models replaced wrote it."""


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Line(Frozen):
    """One priced line of the table."""

    category: Category
    item: str  # what is priced, in words (an arm's transfer lines start with "<arm>:")
    quantity: Number = Field(description="how many units of `unit`")
    unit: str
    unit_usd: Number = Field(description="USD per unit")
    usd: Number = Field(description="quantity × unit_usd × the line's factor (months of a monthly price)")
    source: str  # where the price comes from, and when it was observed


class ByReservation(Frozen):
    """USD per reservation of the budget split."""

    compute: Number
    transfer: Number
    storage_other: Number

    def items(self) -> Iterator[tuple[Category, float]]:
        """(reservation, USD) in the table's order."""
        yield from ((c, getattr(self, c)) for c in ("compute", "transfer", "storage_other"))


class Traffic(Frozen):
    """One arm's synchronizations and bytes over the ring (infra/plan.py's transfer model)."""

    arm: str
    kind: str  # a key of training.arms.KINDS
    world_size: int
    synchronizations: int
    payload_bytes_per_sync: int
    host_bytes_rx_plus_tx: Number = Field(description="bytes each host receives plus transmits over the whole arm")
    cross_zone_links: int = Field(description="ring links r → r+1 whose ends are in different zones")
    cross_zone_bytes: Number = Field(description="bytes over those links, each way counted once")


class Estimate(Frozen):
    """The table, its totals against the reservations, the traffic per arm, what each isolated host's
    transfer guard will see, and every problem that refuses the plan."""

    lines: list[Line]
    totals_usd: ByReservation = Field(description="estimated USD per reservation")
    total_usd: Number = Field(description="estimated USD, all reservations")
    reserved_usd: ByReservation = Field(description="the budget split's reservations, USD")
    budget_usd: Number = Field(description="the whole budget, USD")
    traffic: list[Traffic]
    isolated_ranks: list[int]  # hosts outside the zone holding the most hosts
    isolated_host_bytes: dict[int, float] = Field(
        description="by isolated rank: the ring's bytes rx + tx over every arm it runs")
    isolated_host_planned_bytes: dict[int, float] = Field(
        description="by isolated rank: what its counters will show (ring bytes with protocol overhead, plus staging)")
    staging_bytes_per_host: int = Field(description="bytes staging sends each host (seed and wheelhouse)")
    protocol_overhead: Number = Field(description="fraction added to the ring's bytes for headers, ACKs and NCCL")
    transfer_guard_bytes: Number = Field(description="each isolated host's transfer guard, bytes rx + tx")
    guard_fraction: Number = Field(description="share of the guard at which the controller stops the group")
    guard_stop_bytes: Number = Field(description="guard_fraction × transfer_guard_bytes")
    stopped_days: Number = Field(description="days the stopped volumes bill after the deadline until down")
    problems: list[str]  # every reason the plan is refused; empty: it fits
