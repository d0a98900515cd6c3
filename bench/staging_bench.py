"""Staging on network-namespace hosts (real sshd, root only): the bytes that leave the controller and
the wall time to stage N hosts with the same seed and a prepared home, one host after another
(`--workers 1`, as staging was before) and all at once (the default now); over SSH alone (`ssh`) and
through the trial's bucket (`relay`: moto's S3 server on the hosts' bridge, 198.18.0.1, as
tests/orchestrate/test_aws_loop.py runs it — the controller uploads each artifact once, the hosts fetch it).

    sudo .venv/bin/python bench/staging_bench.py --hosts 4 --seed .seeds/smollm2-135m [--workers 1,4] \
        [--modes ssh,relay]

The bytes are counted as they are sent (`stage_reports(account=…)`): over SSH to the hosts, and into
the bucket. With the relay the controller also reads every object back once (download, not uplink).

Every host shares this machine's two cores and its disk, so the parallel figure is what the SSH
transfers and installs overlap here, not what four real hosts with their own cores and links reach;
and the bytes are what staging over SSH sends either way (an in-region relay would change those).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the namespace hosts: tests/machinery/

from machinery.netns import NetnsHosts, netns_cluster  # noqa: E402
from orchestrate.launch.command import free_port  # noqa: E402
from orchestrate.remote import stage_reports, wheelhouse_lock  # noqa: E402

logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's server: one line per request otherwise


PORT = free_port()  # moto on the bridge; the hosts reach it there
AWS_ENV = {"AWS_ENDPOINT_URL": f"http://198.18.0.1:{PORT}", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}
BUCKET = "staging-bench"


def measure(mode: str, workers: int, hosts: int, work: Path, wheels: Path, files: dict[str, Path]) -> dict:
    """Stage `hosts` fresh namespace hosts once; what left the controller and how long it took."""
    if mode not in ("ssh", "relay"):
        raise SystemExit(f"unknown mode {mode!r} (ssh, relay)")
    with NetnsHosts(hosts, work / f"netns-{mode}-{workers}", env=AWS_ENV) as hs:
        server = None
        relay = None
        if mode == "relay":  # once the bridge holds the address
            import boto3
            from moto.server import ThreadedMotoServer

            server = ThreadedMotoServer(ip_address="198.18.0.1", port=PORT, verbose=False)
            server.start()
            boto3.Session().client("s3").create_bucket(Bucket=BUCKET)
            relay = f"s3://{BUCKET}/trials/bench/"
        cluster = netns_cluster(hs, relay or "file:///unused", python=sys.executable)
        ts = [cluster.transport(h) for h in cluster.by_rank]
        sent: dict[str, int] = {}
        try:
            t0 = time.monotonic()
            digest, _ = stage_reports(cluster, ts, wheel_dir=wheels, files=files, workers=workers, relay=relay,
                                      account=sent, say=lambda m: print(f"  {m}", flush=True))
            wall = time.monotonic() - t0
        finally:
            for t in ts:
                t.close()
            if server is not None:
                server.stop()
    return {"mode": mode, "hosts": hosts, "workers": workers, "ssh_bytes": sent["ssh_bytes"],
            "relay_bytes": sent["relay_bytes"], "bytes_from_controller": sent["ssh_bytes"] + sent["relay_bytes"],
            "wall_seconds": wall, "environment": digest[:16]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--seed", type=Path, required=True, help="a seed directory (e.g. .seeds/smollm2-135m)")
    ap.add_argument("--workers", default="1,4", help="comma-separated: hosts staged at once, per measurement")
    ap.add_argument("--modes", default="ssh", help="comma-separated: ssh (every host from the controller), "
                    "relay (through moto's S3 on the bridge)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    for k, v in AWS_ENV.items():  # the controller's boto3 and every host session talk to moto only
        os.environ[k] = v
    for k in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        os.environ.pop(k, None)

    work = Path(tempfile.mkdtemp(prefix="staging-bench-"))
    wheels = work / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(wheels), str(ROOT)], check=True, capture_output=True)
    files = {f"seed/{p.relative_to(args.seed)}": p for p in sorted(args.seed.rglob("*")) if p.is_file()}
    per_host = sum(p.stat().st_size for p in files.values()) + sum((wheels / n).stat().st_size
                                                                    for n in wheelhouse_lock(wheels))
    rows = []
    for mode in args.modes.split(","):
        for workers in [int(w) for w in args.workers.split(",")]:
            rows.append(measure(mode, workers, args.hosts, work, wheels, files))
            r = rows[-1]
            print(f"{mode}, hosts {args.hosts}, staged {workers} at a time: {r['bytes_from_controller'] / 1e6:,.1f} MB "
                  f"from the controller ({r['ssh_bytes'] / 1e6:,.1f} MB over SSH, {r['relay_bytes'] / 1e6:,.1f} MB into "
                  f"the bucket; {per_host / 1e6:,.1f} MB per host), {r['wall_seconds']:.1f} s", flush=True)
    if len(rows) > 1:
        print(f"first / last: wall time {rows[0]['wall_seconds'] / rows[-1]['wall_seconds']:.2f}x, bytes from the "
              f"controller {rows[0]['bytes_from_controller'] / rows[-1]['bytes_from_controller']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"seed": str(args.seed), "files": len(files), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
