"""The delete check (infra/teardown.py `DeleteCheck`) against moto's EC2 and S3, as every delete hook of one
program run asks it: the trial's live hosts found by their tag, each host's evidence bucket verified. With
nothing preserved it refuses naming the store; a trial home preserved into the trial's prefix lets the
delete go on; a preserved object altered afterwards is refused naming the home's file; a stack with no live
host may always be deleted; `abandon_unpreserved` lets an unpreserved delete go on and leaves that choice in
the bucket (not in a preview); the stack's hosts are found by id when their tag is gone, and a check that
speaks for another account or region than theirs refuses; the answer is computed once per run, or settled by
the program. (That the program registers the hooks: tests/infra/test_infra.py; the order the engine runs them
in, from every state: tests/infra/test_destroy.py and test_failures.py.)"""

from __future__ import annotations

import hashlib
import json
import threading
import uuid
from types import SimpleNamespace

import pytest

from evidence.stores import object_key, preserve
from evidence.stores import S3Store
from infra.teardown import DeleteCheck, NotPreserved, OutsideTheStack, trial_prefix

INSTANCE = "aws:ec2/instance:Instance"


def resource(name: str = "td-trial-rank-0", typ: str = INSTANCE, rid: str = "i-0123456789abcdef0") -> SimpleNamespace:
    """What Pulumi hands a before_delete hook (`ResourceHookArgs`)."""
    return SimpleNamespace(name=name, id=rid, type=typ, urn=f"urn:pulumi:test::trials::{typ}::{name}",
                           old_inputs={}, old_outputs=None, new_inputs=None, new_outputs=None)


HELD: dict[str, list[str]] = {}
"""The hosts each test trial's stack holds (every one `trial.launch` made): what its program would register."""


@pytest.fixture
def trial(aws):
    """A trial name of its own (moto's server is the worker's) and a way to launch its hosts; every host it
    launched is terminated at the end."""
    name = f"td-{uuid.uuid4().hex[:8]}"
    ec2 = aws.client("ec2")
    made: list[str] = []

    def launch(bucket: str | None, n: int = 1) -> list[str]:
        ami = "ami-0123456789abcdef0"  # moto launches any image id
        tags = [{"Key": "trial", "Value": name}] + ([{"Key": "evidence-bucket", "Value": bucket}] if bucket else [])
        ids = [i["InstanceId"] for i in ec2.run_instances(
            ImageId=ami, InstanceType="g6e.xlarge", MinCount=n, MaxCount=n,
            TagSpecifications=[{"ResourceType": "instance", "Tags": tags}])["Instances"]]
        made.extend(ids)
        HELD.setdefault(name, []).extend(ids)
        return ids

    def outside(n: int = 1) -> list[str]:
        """Hosts of the trial the stack does not hold (an interrupted `up`'s create, one started by hand)."""
        ids = launch(None, n)
        HELD[name] = [i for i in HELD[name] if i not in ids]
        return ids

    yield SimpleNamespace(name=name, launch=launch, outside=outside)
    HELD.pop(name, None)
    if made:
        ec2.terminate_instances(InstanceIds=made)


def check(aws, trial: str, *, abandon: bool = False, dry_run: bool = False) -> DeleteCheck:
    c = DeleteCheck(trial, abandon, lambda: aws, dry_run=dry_run)
    c.hold(HELD.get(trial, []))  # the stack's own record (infra/held.py): the hosts its runs registered
    return c


def a_home(root, name: str = "cooperative-learning-gpu"):
    """A trial home with a commitment and a result: what a preservation index lists."""
    home = root / name
    (home / "runs").mkdir(parents=True, exist_ok=True)
    (home / "commitments.jsonl").write_text('{"entry": 0}\n')
    (home / "runs" / "result.json").write_text('{"loss": 1.5}\n')
    return home


def test_destroy_waits_for_preservation_then_verifies_it(aws, trial, tmp_path):
    s3 = aws.client("s3")
    bucket = f"{trial.name}-evidence"
    s3.create_bucket(Bucket=bucket)
    (iid,) = trial.launch(bucket)
    prefix = f"trials/{trial.name}/"
    with pytest.raises(NotPreserved, match=rf"refusing to delete td-trial-rank-0 \(i-0123456789abcdef0\): trial "
                                           rf"{trial.name} is not preserved: s3://{bucket}/{prefix} holds no "
                                           rf"preservation index.*live hosts: {iid}.*abandon_unpreserved: true"):
        check(aws, trial.name).hook(resource())
    # an index that lists nothing (the kind anyone could write) proves nothing
    s3.put_object(Bucket=bucket, Key=f"{prefix}indexes/forged/20260101T000000000000Z.json",
                  Body=json.dumps({"format": "trial-evidence-index-v1", "files": {}}).encode())
    with pytest.raises(NotPreserved, match="forged: its preservation does not verify: .* lists no files"):
        check(aws, trial.name).hook(resource())
    s3.delete_object(Bucket=bucket, Key=f"{prefix}indexes/forged/20260101T000000000000Z.json")
    home = a_home(tmp_path)
    preserve(home, f"s3://{bucket}/{prefix}", trial=home.name, session=aws)
    check(aws, trial.name).hook(resource())  # preserved and verified: the delete may go on
    # a home that committed (its log anchored in the store) but was never preserved
    s3.put_object(Bucket=bucket, Key=f"{prefix}anchors/coop-smoke/ab12/00000000.json", Body=b"{}")
    with pytest.raises(NotPreserved, match="home\\(s\\) coop-smoke made commitments but were never preserved"):
        check(aws, trial.name).hook(resource())
    s3.delete_object(Bucket=bucket, Key=f"{prefix}anchors/coop-smoke/ab12/00000000.json")
    # a commitment anchored after the home's newest preservation
    s3.put_object(Bucket=bucket, Key=f"{prefix}anchors/{home.name}/ab12/00000000.json", Body=b"{}")
    with pytest.raises(NotPreserved, match="1 commitment\\(s\\) were anchored after its newest preservation"):
        check(aws, trial.name).hook(resource())
    s3.delete_object(Bucket=bucket, Key=f"{prefix}anchors/{home.name}/ab12/00000000.json")
    # an object changed after preservation: the store no longer holds what the index names
    key = prefix + object_key(hashlib.sha256((home / "runs" / "result.json").read_bytes()).hexdigest())
    s3.put_object(Bucket=bucket, Key=key, Body=b'{"loss": 9.9}\n')
    with pytest.raises(NotPreserved, match=r"cooperative-learning-gpu: its preservation does not verify: "
                                           r"runs/result.json"):
        check(aws, trial.name).hook(resource())


def test_a_home_discarded_unpreserved_does_not_hold_the_delete(aws, trial, tmp_path):
    """A home that committed but was let go (`orchestrate remove --unpreserved`) released its anchors: they
    stay in the bucket, no longer a home's, and the delete may go on once the rest is preserved; a
    damaged release record is refused by name, never taken as one (#55)."""
    from evidence.anchors import release
    from evidence.stores import open_store

    s3 = aws.client("s3")
    bucket = f"{trial.name}-evidence"
    s3.create_bucket(Bucket=bucket)
    trial.launch(bucket)
    prefix = f"trials/{trial.name}/"
    home = a_home(tmp_path)
    preserve(home, f"s3://{bucket}/{prefix}", trial=home.name, session=aws)
    s3.put_object(Bucket=bucket, Key=f"{prefix}anchors/coop-smoke/{'ab' * 32}/00000000.json", Body=b"{}")
    with pytest.raises(NotPreserved, match="home\\(s\\) coop-smoke made commitments but were never preserved"):
        check(aws, trial.name).hook(resource())
    (key,) = release(open_store(f"s3://{bucket}/{prefix}", aws), "coop-smoke", home="h", files=1, size=1, reason="r")
    check(aws, trial.name).hook(resource())  # released: the delete may go on
    s3.put_object(Bucket=bucket, Key=f"{prefix}{key}", Body=b'{"format": "commitment-anchors-release-v1"}')
    with pytest.raises(NotPreserved, match=f"{key}: damaged, not an anchors release"):
        check(aws, trial.name).hook(resource())


def test_every_live_host_s_bucket_is_checked(aws, trial, tmp_path):
    """Hosts of one trial tagged with two buckets (a stack whose bucket was replaced, say): both must verify;
    a live host without the tag cannot be checked and is refused; terminated hosts hold nothing."""
    s3 = aws.client("s3")
    good, other = f"{trial.name}-a", f"{trial.name}-b"
    for b in (good, other):
        s3.create_bucket(Bucket=b)
    home = a_home(tmp_path)
    preserve(home, f"s3://{good}/trials/{trial.name}/", trial=home.name, session=aws)
    trial.launch(good, n=2)
    check(aws, trial.name).hook(resource())
    (stray,) = trial.launch(other)
    with pytest.raises(NotPreserved, match=f"s3://{other}/trials/{trial.name}/ holds no preservation index"):
        check(aws, trial.name).hook(resource())
    aws.client("ec2").terminate_instances(InstanceIds=[stray])
    check(aws, trial.name).hook(resource())
    (untagged,) = trial.launch(None)
    with pytest.raises(NotPreserved, match=f"{untagged} carry no evidence-bucket tag"):
        check(aws, trial.name).hook(resource())


def test_a_stack_without_live_hosts_can_always_be_deleted(aws, trial):
    """Nothing unpreserved can sit on a disk that does not exist: a first `up` that failed before any host,
    or a trial whose hosts are gone, is destroyed without a preservation (the evidence bucket is retained
    by the destroy anyway). No bucket is even read."""
    reads: list[str] = []
    aws.events.register("before-send.s3", lambda request, **_: reads.append(request.url))
    c = check(aws, trial.name)
    for r in (resource(), resource("td-trial-members-in", "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule", "sgr-1")):
        c.hook(r)
    assert c.verdict("x") == "no hosts" and reads == []


def test_abandoning_is_a_choice_written_to_the_bucket_but_not_by_a_preview(aws, trial):
    s3 = aws.client("s3")
    bucket = f"{trial.name}-abandon"
    s3.create_bucket(Bucket=bucket)
    trial.launch(bucket)
    prefix = f"trials/{trial.name}/abandoned/"
    preview = check(aws, trial.name, abandon=True, dry_run=True)
    preview.hook(resource())
    assert preview.verdict("x") == "abandoned" and s3.list_objects_v2(Bucket=bucket, Prefix=prefix)["KeyCount"] == 0
    check(aws, trial.name, abandon=True).hook(resource())
    (obj,) = s3.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]
    rec = json.loads(s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read())
    assert (rec["trial"], rec["instance"], rec["setting"]) == (trial.name, "i-0123456789abcdef0",
                                                               "abandon_unpreserved: true")
    assert "holds no preservation index" in rec["found"]


def test_a_host_without_its_tag_is_still_found_and_another_account_is_not_trusted(aws, trial):
    """The stack's own hosts are looked up by id as well (a `trial` tag removed by hand would otherwise hide
    one); and a check whose identity is in another account or region than the stack's hosts refuses, since it
    would find none of them and let everything go."""
    s3, ec2 = aws.client("s3"), aws.client("ec2")
    bucket = f"{trial.name}-ids"
    s3.create_bucket(Bucket=bucket)
    (iid,) = trial.launch(bucket)
    ec2.delete_tags(Resources=[iid], Tags=[{"Key": "trial"}])
    assert check(aws, trial.name).verdict("x") == "no hosts"  # by tag alone: nothing seen
    c = check(aws, trial.name)
    c.know(iid, f"arn:aws:ec2:us-east-1:123456789012:instance/{iid}")
    with pytest.raises(NotPreserved, match=f"holds no preservation index.*live hosts: {iid}"):
        c.hook(resource("td-trial-members-in", "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule", "sgr-1"))
    for arn, where in ((f"arn:aws:ec2:us-east-1:210987654321:instance/{iid}", "account 210987654321, us-east-1"),
                       (f"arn:aws:ec2:eu-west-1:123456789012:instance/{iid}", "account 123456789012, eu-west-1")):
        c = check(aws, trial.name)
        c.know(iid, arn)
        with pytest.raises(NotPreserved, match=rf"the check speaks as account 123456789012 in us-east-1, but the "
                                               rf"stack's host\(s\) {iid} \({where}\) are elsewhere"):
            c.hook(resource())
    # an instance's own hook tells the check its id and ARN (the old outputs the engine hands it)
    c = check(aws, trial.name)
    with pytest.raises(NotPreserved, match="holds no preservation index"):
        c.hook(SimpleNamespace(**{**vars(resource(rid=iid)),
                                  "old_outputs": {"arn": f"arn:aws:ec2:us-east-1:123456789012:instance/{iid}"}}))


def test_the_program_settles_the_run_s_answer(aws, trial):
    """An `up` the program let change hosts (a preserved trial, verified at its start) keeps that answer to
    its end: the hooks of its deletes give it without asking again."""
    trial.launch(f"{trial.name}-gone")  # a live host whose bucket holds nothing: a fresh check would refuse
    c = check(aws, trial.name)
    c.settle("preserved")
    c.hook(resource())
    assert c.verdict("x") == "preserved"


def test_abandoning_gives_up_a_host_without_its_bucket_tag_too(aws, trial):
    s3 = aws.client("s3")
    bucket = f"{trial.name}-known"
    s3.create_bucket(Bucket=bucket)
    trial.launch(bucket)
    trial.launch(None)
    check(aws, trial.name, abandon=True).hook(resource())
    (obj,) = s3.list_objects_v2(Bucket=bucket, Prefix=f"trials/{trial.name}/abandoned/")["Contents"]
    assert "carry no evidence-bucket tag" in json.loads(s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read())["found"]


def test_one_answer_per_run_shared_by_every_hook(aws, trial, tmp_path):
    """The hooks of one wave run in parallel: the hosts are listed and the store verified once, and every
    hook gets that answer — a refusal too (each naming its own resource)."""
    s3 = aws.client("s3")
    bucket = f"{trial.name}-once"
    s3.create_bucket(Bucket=bucket)
    trial.launch(bucket, n=2)
    listed: list[str] = []
    aws.events.register("before-send.ec2.DescribeInstances", lambda request, **_: listed.append(request.url))
    c = check(aws, trial.name)
    errors: list[str] = []

    def one(i: int) -> None:
        try:
            c.hook(resource(f"td-trial-thing-{i}", "aws:ec2/subnet:Subnet", f"subnet-{i}"))
        except NotPreserved as e:
            errors.append(str(e))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 12 and len(listed) == 1 and c.asked == 12
    assert {e.split(":")[0] for e in errors} == {f"refusing to delete td-trial-thing-{i} (subnet-{i})" for i in range(12)}
    # preserved behind its back: the run keeps its answer (a destroy is one decision); a new run sees it
    preserve(a_home(tmp_path), f"s3://{bucket}/trials/{trial.name}/", trial="cooperative-learning-gpu", session=aws)
    with pytest.raises(NotPreserved):
        c.hook(resource())
    check(aws, trial.name).hook(resource())


def test_hosts_that_cannot_be_listed_are_not_taken_for_none(aws, trial):
    """A live host exists; a check that cannot see it (no credentials, EC2 out of reach) refuses."""
    trial.launch(f"{trial.name}-unseen")

    def broken():
        raise RuntimeError("no credentials")
    with pytest.raises(NotPreserved, match="the check could not run: RuntimeError: no credentials"):
        DeleteCheck(trial.name, False, broken, dry_run=False).hook(resource())
    ec2_down = SimpleNamespace(client=lambda service, **kw: SimpleNamespace(
        get_paginator=lambda op: (_ for _ in ()).throw(ConnectionError("EC2 unreachable"))))
    with pytest.raises(NotPreserved, match="the hosts of trial .* cannot be listed: EC2 unreachable"):
        DeleteCheck(trial.name, False, lambda: ec2_down, dry_run=False).hook(resource())


def test_an_instance_the_stack_does_not_hold_refuses_every_delete_preserved_or_abandoned(aws, trial, tmp_path):
    """#65: an instance tagged with the trial that the stack does not hold (an interrupted `up`'s create, one
    started by hand) refuses every delete — preserved or abandoned — naming it and how to end it; ended, the
    preserved trial's delete goes on."""
    s3 = aws.client("s3")
    bucket = f"{trial.name}-evidence"
    s3.create_bucket(Bucket=bucket)
    held = trial.launch(bucket, 2)
    home = a_home(tmp_path)
    preserve(home, S3Store.url_for(bucket, trial_prefix(trial.name)), trial=home.name, session=aws)
    assert check(aws, trial.name).verdict("x") == "preserved"
    (orphan,) = trial.outside()
    for abandon in (False, True):
        with pytest.raises(OutsideTheStack, match=rf"refusing to delete td-trial-rank-0 .*instance\(s\) of trial "
                                                  rf"{trial.name} that this stack does not hold exist: {orphan} \(rank "
                                                  rf"none, running.*terminate-instances --region us-east-1"):
            check(aws, trial.name, abandon=abandon).hook(resource(rid=held[0]))
    assert not [k for k in s3.list_objects_v2(Bucket=bucket).get("Contents", []) if "abandoned/" in k["Key"]]
    aws.client("ec2").terminate_instances(InstanceIds=[orphan])
    assert check(aws, trial.name).verdict("x") == "preserved"
