"""CPU a smoke rank uses, start to exit, as `python -m training train` runs it (#34: every test that trains
starts such processes, and most of their CPU is start-up). Runs alternate between the trees given, so a
change is measured against the tree before it on the same machine at the same time:

    git worktree add /tmp/before <commit>
    python bench/rank_cpu.py --tree /tmp/before --tree . --runs 5

Each run: a fresh copy of one prepared cooperative-learning/smoke home (tiny seed, built once under
--work), one rank of clean-single, OMP_NUM_THREADS=1; user and system CPU of the rank's process from
`resource.getrusage(RUSAGE_CHILDREN)`, and its wall time."""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def prepared(work: Path) -> tuple[Path, Path]:
    """The tiny seed and a smoke home prepared from it, once."""
    seed, home = work / "seeds" / "tiny", work / "home"
    if not (home / "prepared.json").is_file():
        sys.path.insert(0, str(ROOT))
        from training.config import resolve
        from training.prepare import prepare
        from training.seed import materialize

        materialize("tiny", seed)
        shutil.rmtree(home, ignore_errors=True)
        prepare(resolve("cooperative-learning", "smoke"), home, seed)
    return seed, home


def one_rank(tree: Path, seed: Path, home: Path, work: Path) -> dict[str, float]:
    run_home = work / "run"
    shutil.rmtree(run_home, ignore_errors=True)
    shutil.copytree(home, run_home)
    env = dict(os.environ, WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(29500 + os.getpid() % 1000), OMP_NUM_THREADS="1")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "training", "train", "--home", str(run_home), "--arm", "clean-single",
                        "--model-dir", str(seed)], cwd=tree, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise SystemExit(f"{tree}: the rank exited {r.returncode}: {r.stderr[-2000:]}")
    return {"user": after.ru_utime - before.ru_utime, "sys": after.ru_stime - before.ru_stime, "wall": wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", type=Path, action="append", required=True, help="a checkout (repeat to compare)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--work", type=Path, default=Path("/tmp/rank-cpu"))
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    seed, home = prepared(a.work)
    got: dict[Path, list[dict[str, float]]] = {t: [] for t in a.tree}
    for i in range(a.runs):
        for t in a.tree:
            got[t].append(one_rank(t.resolve(), seed, home, a.work))
            print(f"run {i + 1} {t}: " + ", ".join(f"{k} {v:.2f} s" for k, v in got[t][-1].items()), flush=True)
    for t, rows in got.items():
        print(f"{t}: " + ", ".join(f"{k} mean {statistics.mean(r[k] for r in rows):.2f} s "
                                   f"(median {statistics.median(r[k] for r in rows):.2f})" for k in rows[0]))


if __name__ == "__main__":
    main()
