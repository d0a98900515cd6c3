"""Two `--trials` folders of the same run by two versions of the code, compared in structure: did a
restructuring change what a trial writes or prints?

    python bench/trial_shape.py TRIALS_A TRIALS_B [LOG_A LOG_B]

Compared: every JSON key path of each home's report.json, placement.json and attainability.json and
of the run records (values are not: timings differ between any two runs; bench/compare_homes.py
compares the facts); the files of every home and of the store, with times and content hashes in
their names masked; and, given the two runs' console logs, their lines with every number, time
stamp and path masked. Prints each difference; exit 1 when there is one.
"""

from __future__ import annotations

import difflib
import json
import re
import sys
from pathlib import Path

JSON_FILES = ("report.json", "placement.json", "attainability.json")
MASKS = [(re.compile(r"[0-9a-f]{64}"), "<sha256>"), (re.compile(r"(?<=/)[0-9a-f]{2}(?=/)"), "<xx>"),
         (re.compile(r"\d{8}T\d{6,12}Z"), "<time>"), (re.compile(r"/tmp/[^/\s]+"), "<dir>"),
         (re.compile(r"(?<![a-z])\d+(?:[.,]\d+)*"), "<n>"), (re.compile(r"[ \t]+"), " ")]


def key_paths(obj: object, at: str = "") -> set[str]:
    """Every key path of a JSON value; list items share one path (`[]`)."""
    out: set[str] = set()
    if isinstance(obj, dict):
        for k, v in obj.items():
            out |= {f"{at}/{k}"} | key_paths(v, f"{at}/{k}")
    elif isinstance(obj, list):
        for v in obj:
            out |= key_paths(v, f"{at}[]")
    return out


def mask(text: str) -> str:
    for pat, to in MASKS:
        text = pat.sub(to, text)
    return text


def shapes(trials: Path) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for home in sorted(p for p in trials.iterdir() if p.is_dir() and (p / "prepared.json").is_file()):
        for name in JSON_FILES:
            if (home / name).is_file():
                out[f"{home.name}/{name}"] = key_paths(json.loads((home / name).read_text()))
        out[f"{home.name}/files"] = {mask(str(p.relative_to(home))) for p in home.rglob("*") if p.is_file()}
    records = sorted((trials / "run-records").glob("*.json"))
    out["run-record"] = set().union(*(key_paths(json.loads(r.read_text())) for r in records)) if records else set()
    store = trials / "store"
    out["store/files"] = {mask(str(p.relative_to(store))) for p in store.rglob("*") if p.is_file()}
    return out


def main(argv: list[str]) -> int:
    a, b = shapes(Path(argv[0])), shapes(Path(argv[1]))
    differ = 0
    for k in sorted(set(a) | set(b)):
        only_a, only_b = a.get(k, set()) - b.get(k, set()), b.get(k, set()) - a.get(k, set())
        if only_a or only_b:
            differ += 1
            print(f"{k}: only in A {sorted(only_a)[:10]}; only in B {sorted(only_b)[:10]}")
        else:
            print(f"{k}: same ({len(a.get(k, ()))} entries)")
    if len(argv) == 4:
        la = [mask(x) for x in Path(argv[2]).read_text().splitlines()]
        lb = [mask(x) for x in Path(argv[3]).read_text().splitlines()]
        diff = [d for d in difflib.unified_diff(la, lb, "A", "B", lineterm="", n=0) if d[:1] in "+-"][2:]
        for d in diff:
            print(f"console {d}")
        differ += bool(diff)
        print(f"console: {len(la)} and {len(lb)} lines, {len(diff)} differing after masking numbers, times, paths, "
              "spacing")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
