"""A task file sorted by difficulty, its splits labelled, at a profile that takes fewer cases than each
split holds: which cases does a study use, and what does each arm score on them?

    python bench/draw_bias.py OUT_DIR [--before OLD_CHECKOUT]

Builds, in OUT_DIR/study, 400 cases whose splits are labelled (train 200, dev 40, test 160) and sorted
easy to hard within each split, as an export by difficulty is: parity questions first (one word; a model
that learns to say "even" gets half), then sums of two-digit numbers, then of three-digit numbers. The
profile takes 100 training cases, 16 dev and 100 test. docs/your-own-study.md's small random Llama is the
model. Then runs

    orchestrate validate draw-bias --profile p100 --model-dir my-llama
    orchestrate run draw-bias --profile p100 --model-dir my-llama --trials trials-after

and, with --before (a checkout of the code before the draw, e.g. `git worktree add /tmp/old b53b2ff`),
the same run by that code into trials-before. Prints, for each: the draw's rule and seed as prepared.json
records it, per split how many of each family were used and the used test ids (first 12, and the sha256
of the whole list), and each arm's exact-match accuracy from report.json. A second clone running this
script prints the same ids: the draw depends only on the file and the generator seed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "your-own-study.md"

TOML = '''name = "draw-bias"
description = "a file sorted by difficulty, drawn"
generator_seed = 7
task_file = "../../cases.jsonl"
global_batch = 12
lr = 1e-2
warmup = 2
serving_arm = "ddp-pair"

[[arms]]
name = "seed"
kind = "seed"

[[arms]]
name = "single"
kind = "single"

[[arms]]
name = "ddp-pair"
kind = "ddp"
world_size = 2

[acceptance]
primary = "ddp-pair"
min_gain_pp = 5.0
noninferiority_vs = "single"
noninferiority_pp = -3.0

[profiles.p100]
seed = "local"
tasks = 100
dev = 16
test = 100
replay = 8
probes = 8
updates = 36
max_context = 320
replay_steps = [2, 4]
serving_requests = 8
'''


def cases() -> list[dict]:
    """400 cases, each split easy to hard: parity, then two-digit sums, then three-digit sums."""
    rng = random.Random(11)
    rows, prompts = [], set()
    for split, n in (("train", 200), ("dev", 40), ("test", 160)):
        made = []
        while len(made) < n:
            k = len(made)
            if k < n * 2 // 5:
                a = rng.randrange(10, 10000)
                case = {"prompt": f"Is {a} even or odd? Reply with one word.", "family": "parity",
                        "answer": "even" if a % 2 == 0 else "odd"}
            else:
                digits = 2 if k < n * 7 // 10 else 3
                a, b = rng.randrange(10 ** (digits - 1), 10 ** digits), rng.randrange(10 ** (digits - 1), 10 ** digits)
                case = {"prompt": f"What is {a} + {b}? Reply with the number only.", "family": f"sum{digits}",
                        "answer": a + b}
            if case["prompt"] not in prompts:
                prompts.add(case["prompt"])
                made.append({**case, "split": split, "id": f"{split}-{len(made):03d}"})
        rows += made
    return rows


def sh(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    print(f"$ {' '.join(cmd)}  → exit {p.returncode}", flush=True)
    return p


def summary(home: Path) -> dict:
    prepared = json.loads((home / "prepared.json").read_text())
    rows = [json.loads(line) for line in (home / "inputs" / "tasks.jsonl").read_text().splitlines()]
    used = {s: Counter(r["family"] for r in rows if r["split"] == s) for s in ("train", "dev", "test")}
    test_ids = [r["question"]["id"] for r in rows if r["split"] == "test"]
    report = json.loads((home / "report.json").read_text())
    return {"draw": prepared["task_source"].get("draw", "(none recorded: the first cases of each split in file order)"),
            "used_families": {s: dict(c) for s, c in used.items()},
            "test_ids_first_12": test_ids[:12], "test_ids_sha256": hashlib.sha256(json.dumps(test_ids).encode()).hexdigest(),
            "accuracy": {a: f"{v['correct']}/{v['cases']}" for a, v in report["accuracy"].items()}}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--before", type=Path, help="a checkout of the code before the draw")
    args = ap.parse_args()
    study = args.out.resolve() / "study"
    (study / "config" / "experiments").mkdir(parents=True, exist_ok=True)
    (study / "cases.jsonl").write_text("".join(json.dumps(r) + "\n" for r in cases()))
    (study / "config" / "experiments" / "draw-bias.toml").write_text(TOML)
    blocks = dict(re.findall(r"<!-- walk: file (\S+) -->\n```\w*\n(.*?)```", PAGE.read_text(), re.S))
    (study / "make_model.py").write_text(blocks["make_model.py"])
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("TRIAL_CONFIG_DIR", None)
    if not (study / "my-llama").is_dir():
        sh([sys.executable, "make_model.py"], study, env).check_returncode()
    out = {}
    runs = [("after", ROOT)] + ([("before", args.before.resolve())] if args.before else [])
    for label, code in runs:
        e = dict(env, PYTHONPATH=str(code))
        if label == "after":
            v = sh([sys.executable, "-m", "orchestrate", "validate", "draw-bias", "--profile", "p100", "--model-dir",
                    "my-llama"], study, e)
            print("\n".join(line for line in v.stdout.splitlines() if line.startswith(("tasks:", "drawn", "  ")) and
                            "←" not in line))
        r = sh([sys.executable, "-m", "orchestrate", "run", "draw-bias", "--profile", "p100", "--model-dir", "my-llama",
                "--trials", f"trials-{label}"], study, e)
        (args.out / f"run-{label}.log").write_text(r.stdout + r.stderr)
        if r.returncode != 0:
            print(r.stdout[-3000:], r.stderr[-3000:])
            return 1
        out[label] = summary(study / f"trials-{label}" / "draw-bias-p100")
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
