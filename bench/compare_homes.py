"""Two trials of the same experiments compared, fact by fact: did a change alter what a trial does?

    python bench/compare_homes.py TRIALS_A TRIALS_B [--json OUT]

TRIALS_A and TRIALS_B are `--trials` directories of `orchestrate run … --profile P` made by two
versions of the code (same profile, same seed). For every home both hold it compares the report's
verdicts (every gate and whether it passed) and accuracies, the inputs' hashes, the seed receipt,
and per arm the numerical profile, the final parameters' digest and every update's loss sum and
outer step. Timing gates (speedups, active time) are measured on the clock and may differ between
any two runs; they are listed apart. `prepared.json` names the previous experiment's commitment-log
head, which holds that run's times, so its digest differs between any two runs of a lineage: it is
compared with that field left out. Exit status 1 when a fact other than a timing differs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

TIMED = ("speedup", "active time")  # gates decided by wall-clock measurements


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def facts(home: Path) -> dict[str, object]:
    rep = json.loads((home / "report.json").read_text())
    prepared = json.loads((home / "prepared.json").read_text())
    if isinstance(prepared.get("previous"), dict):
        prepared["previous"] = {k: v for k, v in prepared["previous"].items()
                                if k not in ("commitment_hash", "prepared_sha256")}
    f: dict[str, object] = {"accuracy": rep["accuracy"], "not_run": rep["not_run"],
                            "prepared.json (less the previous run's log head)": prepared}
    for g in rep["gates"]:
        f[("timed gate: " if any(t in g["gate"] for t in TIMED) else "gate: ") + g["gate"]] = g["passed"]
    for p in sorted((home / "inputs").rglob("*")):
        if p.is_file():
            f[f"inputs/{p.relative_to(home / 'inputs')}"] = sha(p)
    for arm in sorted(d for d in (home / "runs").iterdir() if (d / "numerical-profile.json").is_file()):
        f[f"{arm.name}: numerical profile"] = sha(arm / "numerical-profile.json")
        for res in sorted(arm.glob("rank-*/result.json")):
            r = json.loads(res.read_text())
            who = f"{arm.name} {res.parent.name}"
            f[f"{who}: final parameters"] = r["digests"]["final_parameters"]
            f[f"{who}: seed receipt"] = r["digests"]["seed_receipt"]
            f[f"{who}: loss sums and outer steps"] = [(u["loss_sum_local"], u["outer_step"]) for u in r["updates"]]
    return f


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    homes = sorted(p.name for p in args.a.iterdir() if (p / "report.json").is_file()
                   and (args.b / p.name / "report.json").is_file())
    if not homes:
        print(f"no home with a report.json in both {args.a} and {args.b}", file=sys.stderr)
        return 2
    out, bad = {}, 0
    for name in homes:
        a, b = facts(args.a / name), facts(args.b / name)
        keys = sorted(set(a) | set(b))
        differ = [k for k in keys if a.get(k) != b.get(k)]
        hard = [k for k in differ if not k.startswith("timed gate: ")]
        bad += len(hard)
        out[name] = {"facts": len(keys), "identical": len(keys) - len(differ), "differ": differ,
                     "arms": sorted({k.split(":")[0] for k in keys if k.endswith("numerical profile")})}
        print(f"{name}: {len(keys) - len(differ)} of {len(keys)} facts identical "
              f"(arms {', '.join(out[name]['arms'])})")
        for k in differ:
            print(f"  {'timing, may differ' if k not in hard else 'DIFFERS'}: {k}: {a.get(k)} → {b.get(k)}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
