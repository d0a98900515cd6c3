"""The deadline stop over time, in emulation (#64): each case's host, with the cloud's sweep and the host's own
check together, then each alone — what stopped it and how many minutes after it ran past the deadline:

    python bench/deadline_timeline.py [--precision-s 59]

The program runs through the engine harness (tests/pulumi_engine.py) against a moto server on loopback of its own;
Scheduler, Lambda, EC2's lifecycle and the hosts' timers run on a virtual clock (tests/machinery/aws_clock.py,
whose docstring cites what each follows). Prints a Markdown table; touches nothing else."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for sub in ("tests", "tests/infra"):
    sys.path.insert(0, str(ROOT / sub))
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--precision-s", type=float, default=59, help="how late Scheduler fires (its precision: < 60 s)")
    a = ap.parse_args()
    import boto3

    from local_moto import local_moto

    with local_moto():
        import deadline_world as w

        s = boto3.Session(region_name="us-east-1")
        ec2 = s.client("ec2")
        world = w.up(ec2, s.client("sns"), s.client("sqs"))
        rows = []
        with tempfile.TemporaryDirectory() as tmp:
            for mode in ("both", "cloud alone", "host alone"):
                rows += w.timeline(ec2, world, Path(tmp), mode)
        print(f"deadline {world.deadline.isoformat()}; Scheduler fires {a.precision_s:g} s late (its 60 s precision at "
              "its worst), the first rate() run one minute after the start date; EC2 boots in 90 s\n")
        print(w.table(rows))
        bad = [r for r in rows if r.minutes_after is None]
        print(f"\n{len(rows) - len(bad)} of {len(rows)} stopped; the longest {max(r.minutes_after or 0 for r in rows):.2f} min")


if __name__ == "__main__":
    main()
