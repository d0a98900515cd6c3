"""Are two runs of one arm equal, with and without the profile's `deterministic`, and what does it cost?

    python bench/determinism_bench.py --profile gpu-135m --arms single,diloco-four --updates 16 \
        [--runs 2] [--share-gpus] [--seeds .seeds] [--out results.json]

For each setting (deterministic off, then on) the arms' experiment is prepared once (its lineage too,
as `orchestrate run` prepares it) at the profile, scaled to `--updates` updates of one pass (tasks and
replay scaled with it, a group checkpoint after the last update), and each arm is trained `--runs`
times from the same prepared inputs through the real launch path (one process per rank; with
--share-gpus the ranks share the GPUs as `orchestrate run --share-gpus` does). Printed per arm and
setting: the runs' final states compared tensor by tensor (max |Δ|, identical or not), the first update
where their loss or gradient norm part, and the median update's seconds (the slowest rank's, updates
after the first). A pair's checkpoints are deleted once compared (a DiLoCo rank's is 2.7 GB at 135M).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrate.placement import visible_gpus  # noqa: E402
from orchestrate.recovery import COPY_HOME, compare_homes, first_parting, train_here  # noqa: E402
from training.config import address, lineage  # noqa: E402
from training.prepare import prepare_chain  # noqa: E402
from training.results import load_results  # noqa: E402
from training.seed import materialize  # noqa: E402


def scaled(cfg, updates: int, deterministic: bool):
    """The profile at `updates` updates of exactly one pass (tasks and replay in the profile's ratio), a
    checkpoint after the last update, `deterministic` as asked: validated again, as read from TOML."""
    p = cfg.profile
    docs = updates * cfg.global_batch
    replay = max(1, round(docs * p.replay / (p.tasks + p.replay)))
    over = {"updates": updates, "tasks": docs - replay, "replay": replay, "checkpoint_every": updates,
            "deterministic": deterministic}
    if p.sync_every:
        over["sync_every"] = min(p.sync_every, updates)
    prof = type(p).model_validate({**p.model_dump(), **over})
    return cfg.model_copy(update={"profile": prof})


def median_update(results: list[dict]) -> float:
    n = len(results[0]["updates"])
    return statistics.median(max(r["updates"][u]["seconds"] for r in results) for u in range(1, n))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="gpu-135m")
    ap.add_argument("--arms", default="single,diloco-four", help="arm names of one experiment's lineage")
    ap.add_argument("--updates", type=int, default=16)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--share-gpus", action="store_true")
    ap.add_argument("--seeds", default=str(ROOT / ".seeds"))
    ap.add_argument("--work")
    ap.add_argument("--out")
    args = ap.parse_args()
    arms = args.arms.split(",")
    name = address(arms[-1])[0]
    work = Path(args.work or tempfile.mkdtemp(prefix="determinism-"))
    rows = []
    for det in (False, True):
        chain = [scaled(c, args.updates, det) for c in lineage(name, args.profile)]
        cfg = chain[-1]
        md = Path(args.seeds) / cfg.profile.seed
        materialize(cfg.profile.seed, md)
        base = work / ("deterministic" if det else "default")
        homes = {id(c): base / c.experiment.name for c in chain}
        list(prepare_chain(chain, lambda c: homes[id(c)], md))
        prepared = homes[id(cfg)]
        for arm in arms:
            a = cfg.arm(arm)
            world = a.world_size
            gpus = None
            if cfg.profile.device == "cuda" and args.share_gpus:
                n, _ = visible_gpus()
                gpus = n if world > n else None
            runs = []
            for k in range(1, args.runs + 1):
                home = base / f"{arm}-run{k}"
                home.mkdir(parents=True)
                for f in COPY_HOME:
                    (shutil.copytree if (prepared / f).is_dir() else shutil.copy2)(prepared / f, home / f)
                t0 = time.monotonic()
                res = train_here(home, arm, world, md, gpus, max_restarts=0)
                if not res[-1].ok:
                    print(f"{arm} (deterministic={det}) run {k} FAILED: {res[-1].failure_text(5)}", flush=True)
                    rows.append({"arm": arm, "deterministic": det, "run": k, "failed": res[-1].failure_text(5)})
                    break
                runs.append((home, load_results(home, arm, world), time.monotonic() - t0))
            if len(runs) < 2:
                continue
            (ha, ra, sa), (hb, rb, sb) = runs[0], runs[1]
            c = compare_homes(ha, hb, arm, args.updates, ra, rb)
            part = first_parting(ra, rb, 0)
            row = {"arm": arm, "world_size": world, "shared_gpus": gpus, "deterministic": det,
                   "updates": args.updates, "identical": c.identical, "max_abs_diff": c.max_abs_diff,
                   "tensors": sum(p.tensors for r in c.ranks for p in r.parts.values()),
                   "first_parting_update": part.update, "parting": part.model_dump(),
                   "median_update_seconds": [median_update(ra), median_update(rb)],
                   "process_seconds": [sa, sb],
                   "numerics_deterministic": ra[0]["numerical_profile"].get("deterministic_algorithms", False),
                   "final_parameters": [[r["digests"]["final_parameters"] for r in ra],
                                        [r["digests"]["final_parameters"] for r in rb]]}
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k not in ("final_parameters", "parting")}), flush=True)
            for home, _, _ in runs:
                shutil.rmtree(home / "runs", ignore_errors=True)  # the states, once compared
    print("\n| arm | deterministic | two runs | max abs diff | first parting update | median update s (run 1, run 2) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if "failed" in r:
            print(f"| {r['arm']} | {r['deterministic']} | FAILED | | | |")
            continue
        print(f"| {r['arm']} | {r['deterministic']} | {'identical' if r['identical'] else 'DIFFERENT'} | "
              f"{r['max_abs_diff']!r} over {r['tensors']} tensors | {r['first_parting_update'] or '—'} | "
              f"{r['median_update_seconds'][0]:.4f}, {r['median_update_seconds'][1]:.4f} |")
    if args.out:
        Path(args.out).write_text(json.dumps({"profile": args.profile, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
