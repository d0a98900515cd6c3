"""`orchestrate` speaks to AWS as the stack does (#65, orchestrate/identity.py): the stack's hosts live in another
account (moto's 111111111111) whose keys exist only in the stack's config; the environment holds another
account's keys (moto's default, 123456789012). `up`, `status`, `down` and `plan`, given the stack's config (or a
cluster.json `up` wrote from it), see and stop the stack's hosts; the same commands on the environment's identity
see none of them — what the issue reproduced — and with no credentials at all they refuse instead of a traceback."""

from __future__ import annotations

import json
import os

import yaml

from conftest import ROOT, run_cli
from test_host_keys import ECDSA, ED, outputs

OTHER = "111111111111"


def said(r) -> str:
    return " ".join((r.stdout + r.stderr).split())


def test_up_status_down_and_plan_speak_as_the_stack(aws, tmp_path, finished_trial, monkeypatch):
    sts = aws.client("sts")
    c = sts.assume_role(RoleArn=f"arn:aws:iam::{OTHER}:role/setup", RoleSessionName="setup")["Credentials"]
    import boto3

    admin = boto3.Session(aws_access_key_id=c["AccessKeyId"], aws_secret_access_key=c["SecretAccessKey"],
                          aws_session_token=c["SessionToken"], region_name="us-east-1")
    iam = admin.client("iam")
    user = f"operator-{os.getpid()}-{tmp_path.name[-6:]}"
    iam.create_user(UserName=user)
    key = iam.create_access_key(UserName=user)["AccessKey"]
    trial = f"id-{tmp_path.name[-6:].replace('_', '')}".lower()
    ec2 = admin.client("ec2")
    ids = [ec2.run_instances(ImageId="ami-0123456789abcdef0", InstanceType="g6e.xlarge", MinCount=1, MaxCount=1,
                             TagSpecifications=[{"ResourceType": "instance", "Tags": [
                                 {"Key": "trial", "Value": trial}, {"Key": "rank", "Value": str(r)}]}])
           ["Instances"][0]["InstanceId"] for r in range(2)]
    assert aws.client("sts").get_caller_identity()["Account"] != OTHER  # the environment is another account
    # the stack's config: the example stack, with its own keys (plain here; `secure:` ones go through the CLI)
    conf = yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text())
    conf["config"]["aws:accessKey"], conf["config"]["aws:secretKey"] = key["AccessKeyId"], key["SecretAccessKey"]
    stack = tmp_path / "Pulumi.other.yaml"
    stack.write_text(yaml.safe_dump(conf))
    public = {i["InstanceId"]: i.get("PublicIpAddress") for r in ec2.describe_instances(InstanceIds=ids)["Reservations"]
              for i in r["Instances"]}
    out = tmp_path / "outputs.json"
    out.write_text(json.dumps(outputs([{"rank": r, "instance_id": i, "instance_type": "g6e.xlarge", "zone": "us-east-1a",
                                        "private_ip": f"10.42.0.{10 + r}", "public_ip": public[i]}
                                       for r, i in enumerate(ids)], trial=trial)))
    (tmp_path / "key").write_text("unused")
    (tmp_path / "keys.json").write_text(json.dumps({"0": ED, "1": ECDSA}))
    up = ("-m", "orchestrate", "up", "--pulumi-outputs", str(out), "--key-file", str(tmp_path / "key"),
          "--host-keys", str(tmp_path / "keys.json"), "--out", str(tmp_path / "cluster.json"))
    # before: the environment's identity does not see the stack's hosts
    r = run_cli(*up)
    assert r.returncode == 1 and "InvalidInstanceID.NotFound" in said(r), said(r)
    # up: as the stack — the hosts' addresses, and cluster.json records whose identity to use
    r = run_cli(*up, "--stack-config", str(stack))
    assert r.returncode == 0, said(r)
    cluster = json.loads((tmp_path / "cluster.json").read_text())
    assert cluster["stack_config"] == str(stack.resolve())
    # status: the hosts found (none missing), none outside; without the recorded config: none found
    from orchestrate.cluster import load
    from orchestrate.status import address_warnings, outside_warnings
    from orchestrate.cloud import trial_instances
    from orchestrate.identity import stack_session

    desc = load(tmp_path / "cluster.json")
    mine = trial_instances(stack_session(desc.stack_config, desc.region), trial)
    assert sorted(i.instance_id for i in mine) == sorted(ids)
    assert address_warnings(desc, {i.rank: i for i in mine}) == [] and outside_warnings(desc, mine) == []
    theirs = trial_instances(stack_session(None, desc.region), trial)
    assert theirs == [] and address_warnings(desc, {}) != []
    # down: the environment's identity stops nothing; the stack's stops both
    down = ("-m", "orchestrate", "down", "--home", str(finished_trial.home), "--aws-trial", trial, "--region", "us-east-1")
    r = run_cli(*down)
    assert r.returncode == 0 and "stopped 0 instance(s)" in said(r), said(r)
    r = run_cli(*down, "--stack-config", str(stack))
    assert r.returncode == 0 and "stopped 2 instance(s)" in said(r), said(r)
    states = {i["State"]["Name"] for r in ec2.describe_instances(InstanceIds=ids)["Reservations"] for i in r["Instances"]}
    assert states <= {"stopping", "stopped"}
    # no credentials in the environment at all: the commands given the stack's config still speak (as the stack),
    # the others refuse instead of a traceback
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(k)
    empty = tmp_path / "empty"
    empty.write_text("")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(empty))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(empty))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    r = run_cli(*down)
    assert r.returncode == 2 and "no AWS credentials resolve" in said(r) and "Traceback" not in said(r), said(r)
    r = run_cli("-m", "orchestrate", "plan", "diloco-four", "--stack", str(ROOT / "Pulumi.dev.yaml"), "--json")
    assert "Unable to locate credentials" in r.stdout  # the example stack names no identity: none to read with
    r = run_cli("-m", "orchestrate", "plan", "diloco-four", "--stack", str(stack), "--json")
    assert "Unable to locate credentials" not in r.stdout and "Traceback" not in r.stderr, r.stdout[-600:]
    r = run_cli(*down, "--stack-config", str(stack))
    assert r.returncode == 0 and "stopped 0 instance(s)" in said(r) and "stopped" in said(r), said(r)  # already stopped
    print(f"\nenvironment's identity: up refused (hosts not found), down stopped 0; the stack's: up wrote "
          f"cluster.json, status found {len(mine)} hosts, down stopped 2; no credentials: down refused (exit 2)")


def test_a_secret_key_in_the_stack_needs_the_cli_and_says_so(tmp_path, monkeypatch):
    """A stack whose `aws:secretKey` is encrypted (`secure:`) is decrypted by `pulumi config get` only: without the
    CLI on PATH the command refuses, naming the key, instead of speaking as someone else."""
    import pytest

    from orchestrate.identity import IdentityError, stack_session

    conf = yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text())
    conf["config"]["aws:accessKey"] = "AKIAEXAMPLEEXAMPLE00"
    conf["config"]["aws:secretKey"] = {"secure": "v1:AAAABBBBCCCC"}
    stack = tmp_path / "Pulumi.sec.yaml"
    stack.write_text(yaml.safe_dump(conf))
    monkeypatch.setenv("PATH", str(tmp_path))  # no pulumi here
    with pytest.raises(IdentityError, match=r"keeps aws:secretKey encrypted \(secure:\); decrypting it needs the pulumi CLI"):
        stack_session(stack, "us-east-1")
    with pytest.raises(IdentityError, match="cannot be read"):
        stack_session(tmp_path / "Pulumi.gone.yaml", "us-east-1")
