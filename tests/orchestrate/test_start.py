"""`orchestrate start` as a user types it, against moto: a stack's stopped hosts started before the deadline; after
it only inside a grace — refused without one, above the cap, for a home that is not one — recorded in the home
before any host starts, the hosts tagged with it; nothing recorded when nothing can start (#64)."""

from __future__ import annotations

import datetime as dt
import json

from conftest import run_cli
from evidence.grace import read_graces
from infra.sweep import GRACE_TAG

TRIAL = "start-test"


def cluster_json(tmp_path, ids: list[str], deadline: dt.datetime, cap: float | None = 60, name: str = "cluster.json"):
    hosts = [{"rank": r, "name": f"{TRIAL}-{r}", "transport": "ssh", "address": f"198.18.0.{10 + r}",
              "private_address": f"10.42.0.{10 + r}", "root": "/opt/trial", "instance_id": iid}
             for r, iid in enumerate(ids)]
    key = tmp_path / "id_ed25519"
    key.write_text("not read: start reaches no host")
    c = {"format": "trial-cluster-v1", "source": "pulumi", "hosts": hosts, "key_file": str(key),
         "store": f"s3://{TRIAL}-evidence/trials/{TRIAL}/",
         "deadline": deadline.isoformat(), "region": "us-east-1", "trial": TRIAL}
    if cap is not None:
        c["grace_cap_minutes"] = cap
    path = tmp_path / name
    path.write_text(json.dumps(c))
    return path


def launch(ec2, n: int) -> list[str]:
    return [ec2.run_instances(ImageId="ami-0123456789abcdef0", InstanceType="g6e.xlarge", MinCount=1, MaxCount=1,
                              TagSpecifications=[{"ResourceType": "instance", "Tags": [
                                  {"Key": "trial", "Value": TRIAL}, {"Key": "rank", "Value": str(r)}]}])
            ["Instances"][0]["InstanceId"] for r in range(n)]


def said(r) -> str:
    return " ".join((r.stdout + r.stderr).split())


def test_start_before_and_after_the_deadline(aws, tmp_path):
    ec2 = aws.client("ec2")
    ids = launch(ec2, 2)
    ec2.stop_instances(InstanceIds=ids)
    home = tmp_path / "home"
    home.mkdir()
    (home / "commitments.jsonl").write_text("")
    now = dt.datetime.now(dt.timezone.utc)
    # before the deadline: started, no grace needed (and none taken)
    c = cluster_json(tmp_path, ids, now + dt.timedelta(hours=1))
    r = run_cli("-m", "orchestrate", "start", "--cluster", str(c), "--grace", "10", "--home", str(home), "--yes")
    assert r.returncode == 2 and "has not passed: no grace is needed" in said(r), said(r)
    r = run_cli("-m", "orchestrate", "start", "--cluster", str(c))
    assert r.returncode == 0 and "started 2 host(s)" in said(r), said(r)
    states = {i["State"]["Name"] for res in ec2.describe_instances(InstanceIds=ids)["Reservations"] for i in res["Instances"]}
    assert states == {"running"}
    ec2.stop_instances(InstanceIds=ids)
    # after it: refused without a grace, naming the command; refused above the cap and without a home
    c = cluster_json(tmp_path, ids, now - dt.timedelta(minutes=5))
    r = run_cli("-m", "orchestrate", "start", "--cluster", str(c))
    assert r.returncode == 2 and "has passed" in said(r) and "--grace MINUTES --home" in said(r) and "at most 60 min" in said(r)
    r = run_cli("-m", "orchestrate", "start", "--cluster", str(c), "--grace", "61", "--home", str(home), "--yes")
    assert r.returncode == 2 and "give 1 to 60 minutes" in said(r), said(r)
    r = run_cli("-m", "orchestrate", "start", "--cluster", str(c), "--grace", "10", "--yes")
    assert r.returncode == 2 and "--grace needs --home" in said(r)
    r = run_cli("-m", "orchestrate", "start", "--cluster", str(c), "--grace", "10", "--home", str(tmp_path), "--yes")
    assert r.returncode == 2 and "is not a trial home" in said(r)
    r = run_cli("-m", "orchestrate", "start", "--cluster", str(c), "--grace", "10", "--home", str(home), stdin="n\n")
    assert r.returncode == 2 and "not granted: nothing was started or tagged" in said(r), said(r)
    assert read_graces(home) == []
    old = cluster_json(tmp_path, ids, now - dt.timedelta(minutes=5), cap=None, name="old.json")  # made before graces
    r = run_cli("-m", "orchestrate", "start", "--cluster", str(old), "--grace", "10", "--home", str(home), "--yes")
    assert r.returncode == 2 and "predates graces" in said(r)
    for res in ec2.describe_instances(InstanceIds=ids)["Reservations"]:  # nothing was started or tagged
        for i in res["Instances"]:
            assert i["State"]["Name"] == "stopped" and GRACE_TAG not in {t["Key"] for t in i["Tags"]}
    # granted: recorded in the home first, then every host tagged, then started
    r = run_cli("-m", "orchestrate", "start", "--cluster", str(c), "--grace", "10", "--home", str(home), "--yes")
    assert r.returncode == 0 and "grace 10 min for 2 host(s)" in said(r) and "started 2 host(s)" in said(r), said(r)
    (g,) = read_graces(home)
    assert g.minutes == 10 and g.end - g.start == dt.timedelta(minutes=10) and len(g.hosts) == 2
    assert g.usd == round(2 * round((1.861 + 0.005) * 12 / 60, 4), 4)  # 10 min and the 2 its stop may come late
    tags = {t["Value"] for res in ec2.describe_instances(InstanceIds=ids)["Reservations"] for i in res["Instances"]
            for t in i["Tags"] if t["Key"] == GRACE_TAG}
    assert tags == {f"{g.start:%Y-%m-%dT%H:%M:%SZ}/{g.end:%Y-%m-%dT%H:%M:%SZ}"}
    assert "report none yet in the home" in said(r)
    # a host still stopping: refused before anything is recorded
    ec2.stop_instances(InstanceIds=ids)
    ec2.terminate_instances(InstanceIds=ids)
    r = run_cli("-m", "orchestrate", "start", "--cluster", str(c), "--grace", "10", "--home", str(home), "--yes")
    assert r.returncode == 2 and "nothing to start" in said(r), said(r)
    assert len(read_graces(home)) == 1
