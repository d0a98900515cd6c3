"""Seconds per test file from a pytest JUnit XML (setup + call + teardown of each test), and, given the
"before" file too, the before → after table #34 asks for.

    python bench/suite_times.py AFTER.xml [--before BEFORE_PER_FILE.txt]

BEFORE_PER_FILE.txt is this script's own output of an earlier run (bench/results/…/per-file.txt)."""

from __future__ import annotations

import argparse
import collections
import xml.etree.ElementTree as ET
from pathlib import Path


def per_file(xml: Path) -> dict[str, tuple[float, int]]:
    secs: dict[str, float] = collections.defaultdict(float)
    count: dict[str, int] = collections.Counter()
    for case in ET.parse(xml).iter("testcase"):
        path = case.get("classname", "").replace(".", "/") + ".py"  # tests.orchestrate.test_x -> tests/orchestrate/test_x.py
        secs[path] += float(case.get("time", 0))
        count[path] += 1
    return {p: (secs[p], count[p]) for p in secs}


def read_before(path: Path) -> dict[str, float]:
    out = {}
    for line in path.read_text().splitlines()[1:]:
        parts = line.split()
        if len(parts) == 3:
            out[parts[2]] = float(parts[0])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("xml", type=Path)
    ap.add_argument("--before", type=Path)
    a = ap.parse_args()
    now = per_file(a.xml)
    total = sum(s for s, _ in now.values())
    if a.before is None:
        print(f" seconds tests file  (junit testcase times: setup + call + teardown; sum {total:.1f} s over "
              f"{sum(n for _, n in now.values())} tests)")
        for p, (s, n) in sorted(now.items(), key=lambda kv: -kv[1][0]):
            print(f"{s:8.1f} {n:5d} {p}")
        return
    before = read_before(a.before)
    print("| file | before s | after s | tests |\n|---|---|---|---|")
    for p in sorted(set(now) | set(before), key=lambda p: -max(before.get(p, 0), now.get(p, (0, 0))[0])):
        s, n = now.get(p, (0.0, 0))
        print(f"| {p} | {before.get(p, 0):.1f} | {s:.1f} | {n} |")
    print(f"| **sum of test times** | {sum(before.values()):.1f} | {total:.1f} | {sum(n for _, n in now.values())} |")


if __name__ == "__main__":
    main()
