"""The AWS path as one piece, in emulation (root only): the Pulumi program under Pulumi's mocks, whose
instances answer with four network-namespace hosts (real sshd) and whose key pair carries the test's
key; AWS itself is moto's server on the hosts' bridge, so the hosts reach it too (the instances, bucket,
budget, topic and transfer alarm exist there under the outputs' names). Then the CLI as a user types it:

  up (from the saved outputs) → plan → run diloco-four (ranks over SSH, evidence into moto's S3, read
  back, each host preserving its own checkpoint payloads) → status (spend, alarm, who hears it) → down refusing an unpreserved home → preserve → down
  (verified, instances stopped) → a second run stopped before its first arm by a transfer alarm in
  ALARM, its evidence preserved → instances terminated: nothing left billing → the destroy hook
  passing on the preserved trial and refusing an unpreserved one.

What this does not show: host keys come from `--host-keys` here (the console reader, tested with real
consoles' format and real sshd keys in tests/orchestrate/test_host_keys.py, cannot read these hosts' keys from
moto, whose console is a fixed text); Pulumi itself creates nothing (mocks), so the hook is called as
the engine would call it, with the instance's inputs.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pulumi
import pytest
import yaml

from conftest import example_stack, run_cli
from evidence.canonical import read_json

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("/usr/sbin/sshd") is None,
                                reason="needs root and openssh-server (CI installs both)")

TRIAL, REGION, ACCOUNT = "aws-loop", "us-east-1", "123456789012"


class Cloud(pulumi.runtime.Mocks):
    """Pulumi's mocks answering with what exists: the namespace hosts' addresses, moto's instance ids,
    bucket and topic."""

    def __init__(self, hosts, instance_ids: list[str], bucket: str, topic: str):
        self.hosts, self.ids, self.bucket, self.topic = hosts, instance_ids, bucket, topic
        self.resources: list = []

    def new_resource(self, args):
        self.resources.append(args)
        out = dict(args.inputs)
        if args.typ == "aws:ec2/instance:Instance":
            rank = int(args.name.rsplit("-", 1)[1])
            address = self.hosts.hosts[rank].address
            return [self.ids[rank], out | {"privateIp": address, "publicIp": address,
                                           "arn": f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/{self.ids[rank]}"}]
        if args.typ == "aws:s3/bucket:Bucket":
            out["bucket"] = self.bucket
        if args.typ == "aws:sns/topic:Topic":
            out["arn"] = self.topic
        out.setdefault("arn", f"arn:aws:mock:::{args.name}")
        return [f"{args.name}-id", out]

    def call(self, args):
        if args.token == "aws:ec2/getAmi:getAmi":
            return {"id": "ami-0123456789abcdef0", "name": "Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2.9"}
        return {}


def stack_outputs(stack: Path, mocks: Cloud) -> dict:
    """What `pulumi up` then `pulumi stack output --json` give for the stack, under the mocks."""
    from infra.plan import TrialConfig
    from infra.program import build

    conf = yaml.safe_load(stack.read_text())["config"]
    cfg = TrialConfig.model_validate({**conf["trials:cluster"], "region": conf["aws:region"]})
    asyncio.set_event_loop(asyncio.new_event_loop())
    pulumi.runtime.set_mocks(mocks, project="trials", stack="loop", preview=False)
    got: dict = {}

    @pulumi.runtime.test
    def go():
        return pulumi.Output.from_input(build(cfg)).apply(got.update)

    go()
    return json.loads(json.dumps(got))


def said(r) -> str:
    return " ".join((r.stdout + r.stderr).split())


@pytest.fixture
def cloud(monkeypatch):
    """moto's server where the hosts reach it too (the bridge's address, 198.18.0.1), with the
    environment that points this process, its subprocesses and every host session at it (a real host
    uses its instance role; these use moto's test credentials and never ask for instance metadata)."""
    import boto3
    from moto.server import ThreadedMotoServer

    from orchestrate.launch.command import free_port

    port = free_port()
    env = {"AWS_ENDPOINT_URL": f"http://198.18.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION, "AWS_EC2_METADATA_DISABLED": "true"}
    for k in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    servers: list = []

    def start() -> object:  # once the bridge holds the address
        server = ThreadedMotoServer(ip_address="198.18.0.1", port=port, verbose=False)
        server.start()
        servers.append(server)
        return boto3.Session(region_name=REGION)

    yield SimpleNamespace(env=env, start=start)
    for server in servers:
        server.stop()


def test_the_aws_loop_in_emulation(cloud, tiny_seed, tmp_path):
    from orchestrate.cloud import reconcile
    from orchestrate.netns import NetnsHosts
    from infra.teardown import NotPreserved, before_host_delete

    trials, seeds = tmp_path / "trials", tmp_path / "seeds"
    shutil.copytree(tiny_seed, seeds / "tiny")
    # hosts that share this machine's two cores: one thread per rank, as the netns cluster would split them
    with NetnsHosts(4, tmp_path / "netns", env={"OMP_NUM_THREADS": "1", **cloud.env}) as hs:
        aws = cloud.start()
        ec2, s3, cw, sns = (aws.client(n) for n in ("ec2", "s3", "cloudwatch", "sns"))
        ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        zones = ["us-east-1c"] * 3 + ["us-east-1d"]
        ids = [ec2.run_instances(ImageId=ami, InstanceType="g6e.xlarge", MinCount=1, MaxCount=1,
                                 Placement={"AvailabilityZone": z}, TagSpecifications=[{"ResourceType": "instance",
                                 "Tags": [{"Key": "trial", "Value": TRIAL}, {"Key": "rank", "Value": str(r)}]}])
               ["Instances"][0]["InstanceId"] for r, z in enumerate(zones)]
        s3.create_bucket(Bucket="aws-loop-evidence")
        topic = sns.create_topic(Name="aws-loop-alerts")["TopicArn"]
        sns.subscribe(TopicArn=topic, Protocol="email", Endpoint="operator@example.com")
        aws.client("budgets").create_budget(AccountId=ACCOUNT, Budget={
            "BudgetName": f"{TRIAL}-budget", "BudgetLimit": {"Amount": "100.0", "Unit": "USD"},
            "TimeUnit": "ANNUALLY", "BudgetType": "COST"})
        cw.put_metric_alarm(AlarmName=f"{TRIAL}-transfer-3", ComparisonOperator="GreaterThanThreshold",
                            EvaluationPeriods=1, Threshold=3.1e12, MetricName="NetworkIn", Namespace="AWS/EC2",
                            Period=3600, Statistic="Sum")
        stack = example_stack(tmp_path, trial=TRIAL, ssh_public_key=f"{hs.client_key}.pub", ssh_user="root",
                              host_python=sys.executable)
        mocks = Cloud(hs, ids, "aws-loop-evidence", topic)
        outputs = stack_outputs(stack, mocks)
        (key_pair,) = [r for r in mocks.resources if r.typ == "aws:ec2/keyPair:KeyPair"]
        assert key_pair.inputs["publicKey"] == " ".join(Path(f"{hs.client_key}.pub").read_text().split()[:2])
        (tmp_path / "outputs.json").write_text(json.dumps(outputs))
        (tmp_path / "keys.json").write_text(json.dumps({str(h.index): h.host_key for h in hs.hosts}))

        # up: the cluster from the saved outputs
        r = run_cli("-m", "orchestrate", "up", "--pulumi-outputs", str(tmp_path / "outputs.json"), "--key-file",
                    str(hs.client_key), "--host-keys", str(tmp_path / "keys.json"), "--out", str(tmp_path / "cluster.json"),
                    "--addresses", "outputs")  # the namespace hosts' addresses, not moto's made-up ones
        assert r.returncode == 0, said(r)
        cluster = json.loads((tmp_path / "cluster.json").read_text())
        assert cluster["store"] == f"s3://aws-loop-evidence/trials/{TRIAL}/" and cluster["alert_topic"] == topic
        for h in cluster["hosts"]:  # the namespaces share one filesystem (each host works in its own root)
            h["root"] = str(hs.hosts[h["rank"]].root)  # and one host name, which resolves to none of their
            h["interface"] = "eth0"  # addresses: gloo is told the interface, as a real host's name needs not
        (tmp_path / "cluster.json").write_text(json.dumps(cluster))

        r = run_cli("-m", "orchestrate", "plan", "diloco-four", "--stack", str(stack), "--no-quota")
        assert r.returncode == 0, said(r)

        run = ("-m", "orchestrate", "run", "--profile", "smoke", "--trials", str(trials), "--seeds", str(seeds),
               "--cluster", str(tmp_path / "cluster.json"))
        r = run_cli(*run[:3], "diloco-four", *run[3:], timeout=1500)
        assert r.returncode == 0, said(r)[-4000:]
        assert "pulumi, 4 host(s)" in said(r) and f"staged {TRIAL}-3" in said(r)  # host names come from the stack
        # staged through the bucket: one copy left the controller, each host fetched and hashed its own
        assert "relay: " in said(r) and said(r).count("fetched from the store and verified") >= 4
        home = trials / "local-training-windows-smoke"
        preserved = read_json(home / "preserved.json")
        assert preserved["store"] == f"s3://aws-loop-evidence/trials/{TRIAL}/"
        (key,) = [o["Key"] for o in s3.list_objects_v2(Bucket="aws-loop-evidence",
                                                       Prefix=f"trials/{TRIAL}/indexes/{home.name}/")["Contents"]]
        index = json.loads(s3.get_object(Bucket="aws-loop-evidence", Key=key)["Body"].read())
        # each host preserved the checkpoint payloads on its volume into the bucket itself
        assert {f.get("verified_by") for rel, f in index["files"].items() if rel.startswith("hosts/")} == \
            {f"{TRIAL}-{r}" for r in range(4)}

        r = run_cli("-m", "orchestrate", "status", "--cluster", str(tmp_path / "cluster.json"), "--home", str(home))
        assert r.returncode == 0 and "of $100.00" in said(r), said(r)
        assert f"transfer alarms {TRIAL}-transfer-3 OK; topic reaches operator@example.com (email, confirmed)" in said(r)

        # the experiment before it was prepared, never preserved: down refuses until it is
        coop = trials / "cooperative-learning-smoke"
        down = ("-m", "orchestrate", "down", "--aws-trial", TRIAL, "--region", REGION)
        r = run_cli(*down, "--home", str(coop))
        assert r.returncode == 2 and "has not been preserved" in said(r)
        assert {i["State"]["Name"] for res in ec2.describe_instances(InstanceIds=ids)["Reservations"]
                for i in res["Instances"]} == {"running"}  # nothing was stopped
        r = run_cli("-m", "orchestrate", "preserve", "--home", str(coop), "--store", cluster["store"])
        assert r.returncode == 0, said(r)

        # a second run, stopped by the transfer alarm before its first arm; what it has is preserved
        cw.set_alarm_state(AlarmName=f"{TRIAL}-transfer-3", StateValue="ALARM", StateReason="test: over the guard")
        r = run_cli(*run[:3], "clean-pair", *run[3:], timeout=900)
        assert r.returncode == 3 and f"transfer alarm {TRIAL}-transfer-3 in ALARM" in said(r), said(r)[-3000:]
        (stop,) = (coop / "stops").glob("*.json")
        assert read_json(stop)["finished_arms"] == []
        assert read_json(coop / "preserved.json")["store"] == cluster["store"]

        r = run_cli(*down, "--home", str(home))
        assert r.returncode == 0 and "stopped 4 instance(s)" in said(r), said(r)

        # `pulumi destroy`: the hook on each host lets the preserved trial go, refuses one with nothing kept
        def host_args(rank: int, bucket: str) -> SimpleNamespace:
            return SimpleNamespace(name=f"{TRIAL}-rank-{rank}", id=ids[rank], old_outputs=None,
                                   old_inputs={"tags": {"evidence-bucket": bucket}})

        before_host_delete(TRIAL, REGION, False, session_for=lambda region: aws)(host_args(0, "aws-loop-evidence"))
        s3.create_bucket(Bucket="aws-loop-empty")
        with pytest.raises(NotPreserved, match="holds no preservation index"):
            before_host_delete(TRIAL, REGION, False, session_for=lambda region: aws)(host_args(0, "aws-loop-empty"))
        ec2.terminate_instances(InstanceIds=ids)
        assert not [f for f in reconcile(aws, TRIAL) if f.billing]
