"""Every price and instance limit the estimate uses, in one table, each with its source and date.

On-demand list prices change; a stack may override any entry (`prices:` in the stack config) and the
estimate then names the override as its source. GB here is 10^9 bytes: more GB than AWS's 2^30
convention, so transfer is never under-estimated.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Price:
    usd: float
    unit: str
    source: str
    as_of: str


# us-east-1, on demand
PRICES: dict[str, Price] = {
    "instance/g6e.xlarge": Price(1.861, "hour", "AWS EC2 on-demand pricing page, observed in the two-GPU "
                                                "study (1 x L40S, 4 vCPU, 32 GiB)", "2026-11"),
    "instance/g6e.2xlarge": Price(2.242, "hour", "AWS EC2 on-demand pricing page (1 x L40S, 8 vCPU, 64 GiB)",
                                  "2026-11"),
    "transfer/cross-zone-out": Price(0.01, "GB", "AWS EC2 data transfer: between AZs in a region, "
                                                 "charged on each side", "2026-11"),
    "transfer/cross-zone-in": Price(0.01, "GB", "AWS EC2 data transfer: between AZs in a region, "
                                                "charged on each side", "2026-11"),
    "ebs/gp3-storage": Price(0.08, "GB-month", "AWS EBS pricing, gp3", "2026-11"),
    "ebs/gp3-throughput": Price(0.04, "MBps-month above 125", "AWS EBS pricing, gp3", "2026-11"),
    "ebs/gp3-iops": Price(0.005, "IOPS-month above 3000", "AWS EBS pricing, gp3", "2026-11"),
    "vpc/public-ipv4": Price(0.005, "hour", "AWS VPC pricing: each public IPv4 address, in use or idle "
                                            "(since 2024-02-01)", "2026-11"),
    "s3/standard-storage": Price(0.023, "GB-month", "AWS S3 pricing, Standard, first 50 TB", "2026-11"),
    # the deadline stop after the deadline: one Scheduler invocation of one Lambda run a minute (infra/sweep.py);
    # priced as if no free tier applied (both services have one), so never under the bill
    "scheduler/invocation": Price(1.00e-6, "invocation", "AWS EventBridge Scheduler pricing: $1.00 per million "
                                                         "invocations after 14 million a month free", "2026-12"),
    "lambda/request": Price(0.20e-6, "request", "AWS Lambda pricing, us-east-1: $0.20 per million requests",
                            "2026-12"),
    "lambda/gb-second": Price(0.0000166667, "GB-second", "AWS Lambda pricing, us-east-1, x86: $0.0000166667 per "
                                                          "GB-second", "2026-12"),
    # a budget with actions, beyond the first two of the account (62 budget-days a month free): the AWS Price List's
    # AWSBudgets offer, usage type ActionEnabledBudgetsUsage, $0.00 for budget-days 0-62 and $0.10 above
    "budgets/action-enabled-budget-day": Price(0.10, "budget-day", "AWS Budgets pricing (AWS Price List, AWSBudgets: "
                                                                   "$0.10 per action-enabled budget-day past 62 a "
                                                                   "month)", "2026-12"),
    "cloudwatch/alarm": Price(0.10, "alarm-month", "Amazon CloudWatch pricing: standard-resolution alarm metric",
                              "2026-12"),
}

# Facts about instance types the plan needs beside the price (vCPUs against the G-instance quota,
# the EBS baseline that caps a volume's provisioned throughput). None: not known here — the outputs
# say so rather than guess.
INSTANCE_TYPES: dict[str, dict[str, float | int | None]] = {
    "g6e.xlarge": {"vcpus": 4, "gpus": 1, "ebs_baseline_mb_s": 125.0},  # the four-worker study's figure
    "g6e.2xlarge": {"vcpus": 8, "gpus": 1, "ebs_baseline_mb_s": None},
}

HOURS_PER_MONTH = 730.0  # AWS's convention for prorating monthly prices


def price(key: str, overrides: dict[str, float] | None = None) -> Price:
    if overrides and key in overrides:
        unit = PRICES[key].unit if key in PRICES else "hour" if key.startswith("instance/") else "?"
        return Price(float(overrides[key]), unit, "stack config override", "-")
    if key not in PRICES:
        raise KeyError(f"no price for '{key}' in infra/prices.py; add it there or set prices.{key} in the stack config")
    return PRICES[key]
