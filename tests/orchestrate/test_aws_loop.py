"""The AWS path as one piece, in emulation (root only), walking the README's commands in order: the
Pulumi program run as Pulumi's engine runs it (tests/pulumi_engine.py) for `pulumi up` and for
`TRIALS_TEARDOWN=1 pulumi destroy --run-program`, its instances answered by four network-namespace hosts
(real sshd) and its key pair carrying the test's key; AWS itself is moto's server on the hosts' bridge, so
the hosts reach it too. The evidence bucket and its settings are created in moto from the program's own
registrations (MotoProvider); the instances, budget, topic and transfer alarm exist there under the
outputs' names. Then the CLI as a user types it:

  (config set: the stack file) → plan → pulumi up → stack output → up (from the saved outputs) → run
  diloco-four --no-serve (ranks over SSH, evidence into moto's S3, read back, each host preserving its own
  checkpoint payloads; the serving probe on the hosts, the same RemoteReplicas over the same SSH transport,
  is tests/orchestrate/test_remote_trial.py's and test_remote_serving.py's, so this loop leaves it out) →
  status (spend, alarm, who hears it) → down refusing an unpreserved home, and pulumi destroy refused then
  too, deleting nothing → preserve → a second run stopped before its first arm by a transfer alarm in ALARM,
  its evidence preserved → down (verified, instances stopped) → pulumi destroy: the gate's
  hook verifies the trial in moto's S3 in the program's process, every resource but the evidence is deleted
  (the instances terminated: nothing left billing), and the bucket, its settings and its preserved indexes
  are still there and verify.

What this does not show: host keys come from `--host-keys` here (the console reader, tested with real
consoles' format and real sshd keys in tests/orchestrate/test_host_keys.py, cannot read these hosts' keys from
moto, whose console is a fixed text); no provider plugin runs: only the bucket's settings and the instances'
termination reach moto, every other resource exists in the mocks alone (docs/aws-emulation.md).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import example_stack, run_cli
from evidence.canonical import read_json
from pulumi_engine import is_provider, pulumi_run, stack_config

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("/usr/sbin/sshd") is None,
                                reason="needs root and openssh-server (CI installs both)")

TRIAL, REGION, ACCOUNT = "aws-loop", "us-east-1", "123456789012"
BUCKET = "aws-loop-evidence"
TEARDOWN = {"TRIALS_TEARDOWN": "1"}


def cloud_answers(hosts, instance_ids: list[str], topic: str) -> list[dict]:
    """What the engine answers for what exists: the namespace hosts' addresses under moto's instance ids,
    the bucket's name, the topic."""
    rules = [{"type": "aws:ec2/instance:Instance", "name": f"{TRIAL}-rank-{r}", "id": iid,
              "outputs": {"privateIp": hosts.hosts[r].address, "publicIp": hosts.hosts[r].address,
                          "arn": f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/{iid}"}}
             for r, iid in enumerate(instance_ids)]
    return rules + [{"type": "aws:s3/bucket:Bucket", "id": BUCKET, "outputs": {"bucket": BUCKET}},
                    {"type": "aws:sns/topic:Topic", "outputs": {"arn": topic}}]


CALLS = {"aws:ec2/getAmi:getAmi": {"id": "ami-0123456789abcdef0", "name": "Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2.9"}}


def in_the_account(steps: list[dict]) -> list[dict]:
    return [s for s in steps if s["custom"] and not is_provider(s["type"])]


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
    from infra.teardown import verify_preserved
    from orchestrate.cloud import reconcile
    from orchestrate.netns import NetnsHosts

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
        topic = sns.create_topic(Name="aws-loop-alerts")["TopicArn"]
        sns.subscribe(TopicArn=topic, Protocol="email", Endpoint="operator@example.com")
        aws.client("budgets").create_budget(AccountId=ACCOUNT, Budget={
            "BudgetName": f"{TRIAL}-budget", "BudgetLimit": {"Amount": "100.0", "Unit": "USD"},
            "TimeUnit": "ANNUALLY", "BudgetType": "COST"})
        cw.put_metric_alarm(AlarmName=f"{TRIAL}-transfer-3", ComparisonOperator="GreaterThanThreshold",
                            EvaluationPeriods=1, Threshold=3.1e12, MetricName="NetworkIn", Namespace="AWS/EC2",
                            Period=3600, Statistic="Sum")

        # pulumi stack init; pulumi config set --path trials:cluster.ssh_public_key / .deadline
        stack = example_stack(tmp_path, trial=TRIAL, ssh_public_key=f"{hs.client_key}.pub", ssh_user="root",
                              host_python=sys.executable)
        engine = dict(answers=cloud_answers(hs, ids, topic), calls=CALLS, provider="moto")

        # orchestrate plan
        r = run_cli("-m", "orchestrate", "plan", "diloco-four", "--stack", str(stack), "--no-quota")
        assert r.returncode == 0, said(r)

        # pulumi up: the program as the engine starts it; the bucket and its settings made in moto
        up = pulumi_run("up", stack_config(stack), **engine)
        assert up.returncode == 0 and up.failed is None, up.errors + up.stderr[-3000:]
        (key_pair,) = up.of("aws:ec2/keyPair:KeyPair")
        assert key_pair.inputs["publicKey"] == " ".join(Path(f"{hs.client_key}.pub").read_text().split()[:2])
        assert s3.get_bucket_versioning(Bucket=BUCKET)["Status"] == "Enabled"

        # pulumi stack output --json > outputs.json
        (tmp_path / "outputs.json").write_text(json.dumps(up.exports))
        (tmp_path / "keys.json").write_text(json.dumps({str(h.index): h.host_key for h in hs.hosts}))

        # up: the cluster from the saved outputs
        r = run_cli("-m", "orchestrate", "up", "--pulumi-outputs", str(tmp_path / "outputs.json"), "--key-file",
                    str(hs.client_key), "--host-keys", str(tmp_path / "keys.json"), "--out", str(tmp_path / "cluster.json"),
                    "--addresses", "outputs")  # the namespace hosts' addresses, not moto's made-up ones
        assert r.returncode == 0, said(r)
        cluster = json.loads((tmp_path / "cluster.json").read_text())
        assert cluster["store"] == f"s3://{BUCKET}/trials/{TRIAL}/" and cluster["alert_topic"] == topic
        for h in cluster["hosts"]:  # the namespaces share one filesystem (each host works in its own root)
            h["root"] = str(hs.hosts[h["rank"]].root)  # and one host name, which resolves to none of their
            h["interface"] = "eth0"  # addresses: gloo is told the interface, as a real host's name needs not
        (tmp_path / "cluster.json").write_text(json.dumps(cluster))

        run = ("-m", "orchestrate", "run", "--profile", "smoke", "--trials", str(trials), "--seeds", str(seeds),
               "--cluster", str(tmp_path / "cluster.json"), "--no-serve")
        r = run_cli(*run[:3], "diloco-four", *run[3:], timeout=1500)
        assert r.returncode == 0, said(r)[-4000:]
        assert "pulumi, 4 host(s)" in said(r) and f"staged {TRIAL}-3" in said(r)  # host names come from the stack
        # staged through the bucket: one copy left the controller, each host fetched and hashed its own
        assert "relay: " in said(r) and said(r).count("fetched from the store and verified") >= 4
        home = trials / "local-training-windows-smoke"
        assert not (home / "serving").exists() and read_json(home / "placement.json")["cluster"]["no_serve"]
        preserved = read_json(home / "preserved.json")
        assert preserved["store"] == f"s3://{BUCKET}/trials/{TRIAL}/"
        (key,) = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=f"trials/{TRIAL}/indexes/{home.name}/")["Contents"]]
        index = json.loads(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())
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
        # and so does pulumi destroy: its gate refuses first, and nothing at all is deleted
        refused = pulumi_run("destroy", stack_config(stack), state=up.state, env=TEARDOWN, **engine)
        assert refused.returncode == 0 and refused.failed and "before hook" in refused.failed, refused.failed
        assert refused.steps[0]["name"] == f"{TRIAL}-destroy-gate" and refused.steps[0]["outcome"] == "failed"
        assert not [st for st in in_the_account(refused.steps) if st["outcome"] not in ("failed", "not started")]
        assert {i["State"]["Name"] for res in ec2.describe_instances(InstanceIds=ids)["Reservations"]
                for i in res["Instances"]} == {"running"}
        assert s3.get_public_access_block(Bucket=BUCKET)["PublicAccessBlockConfiguration"]["BlockPublicAcls"]
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

        # TRIALS_TEARDOWN=1 pulumi destroy --run-program: the gate's hook verifies the preserved trial in
        # moto's S3 from the program's own process, then everything goes but the evidence
        gone = pulumi_run("destroy", stack_config(stack), state=up.state, env=TEARDOWN, **engine)
        assert gone.returncode == 0 and gone.failed is None, gone.failed or gone.errors
        assert gone.steps[0]["name"] == f"{TRIAL}-destroy-gate" and gone.record["hook_calls"][0]["error"] == ""
        kept = {st["name"] for st in in_the_account(gone.steps) if st["outcome"] == "retained"}
        assert kept == {f"{TRIAL}-evidence{x}" for x in ("", "-versioning", "-sse", "-private", "-owner", "-tls")}
        assert {st["outcome"] for st in in_the_account(gone.steps) if st["name"] not in kept} <= \
            {"deleted", "deleted (mocks only)"} and gone.state == []
        assert not [f for f in reconcile(aws, TRIAL) if f.billing]  # the instances were terminated by the destroy
        # the evidence outlived the stack: the bucket, what keeps it safe, and every preserved index, verified
        assert s3.get_bucket_versioning(Bucket=BUCKET)["Status"] == "Enabled"
        assert all(s3.get_public_access_block(Bucket=BUCKET)["PublicAccessBlockConfiguration"].values())
        assert s3.get_bucket_encryption(Bucket=BUCKET)["ServerSideEncryptionConfiguration"]["Rules"]
        assert s3.get_bucket_ownership_controls(Bucket=BUCKET)["OwnershipControls"]["Rules"] == \
            [{"ObjectOwnership": "BucketOwnerEnforced"}]
        homes = verify_preserved(BUCKET, TRIAL, session=aws)
        assert set(homes) == {home.name, coop.name}
