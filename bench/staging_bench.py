"""Staging on network-namespace hosts (real sshd, root only): the bytes that leave the controller and
the wall time to stage N hosts with the same seed and a prepared home, one host after another
(`--workers 1`, as staging was before) and all at once (the default now).

    sudo .venv/bin/python bench/staging_bench.py --hosts 4 --seed .seeds/smollm2-135m [--workers 1,4]

Every host shares this machine's two cores and its disk, so the parallel figure is what the SSH
transfers and installs overlap here, not what four real hosts with their own cores and links reach;
and the bytes are what staging over SSH sends either way (an in-region relay would change those).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrate.cluster import netns_cluster  # noqa: E402
from orchestrate.netns import NetnsHosts  # noqa: E402
from orchestrate.remote import stage_reports, wheelhouse_lock  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--seed", type=Path, required=True, help="a seed directory (e.g. .seeds/smollm2-135m)")
    ap.add_argument("--workers", default="1,4", help="comma-separated: hosts staged at once, per measurement")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="staging-bench-"))
    wheels = work / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(wheels), str(ROOT)], check=True, capture_output=True)
    files = {f"seed/{p.relative_to(args.seed)}": p for p in sorted(args.seed.rglob("*")) if p.is_file()}
    per_host = sum(p.stat().st_size for p in files.values()) + sum((wheels / n).stat().st_size
                                                                    for n in wheelhouse_lock(wheels))
    rows = []
    for workers in [int(w) for w in args.workers.split(",")]:
        with NetnsHosts(args.hosts, work / f"netns-{workers}") as hs:
            cluster = netns_cluster(hs, "file:///unused", python=sys.executable)
            ts = [cluster.transport(h) for h in cluster.by_rank]
            try:
                t0 = time.monotonic()
                digest, _ = stage_reports(cluster, ts, wheel_dir=wheels, files=files, workers=workers,
                                          say=lambda m: print(f"  {m}", flush=True))
                wall = time.monotonic() - t0
            finally:
                for t in ts:
                    t.close()
        rows.append({"hosts": args.hosts, "workers": workers, "bytes_from_controller": per_host * args.hosts,
                     "wall_seconds": wall, "environment": digest[:16]})
        print(f"hosts {args.hosts}, staged {workers} at a time: {per_host * args.hosts / 1e6:,.1f} MB from the "
              f"controller, {wall:.1f} s", flush=True)
    if len(rows) > 1:
        print(f"wall time, sequential / parallel: {rows[0]['wall_seconds'] / rows[-1]['wall_seconds']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"seed": str(args.seed), "files": len(files), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
