"""`pulumi destroy`'s check (infra/teardown.py) against moto's S3, as the destroy gate's and each host's
hooks run it: with nothing preserved it refuses naming the store; a trial home preserved into the trial's
prefix lets the delete go on; a preserved object altered afterwards is refused naming the home's file;
`abandon_unpreserved` lets an unpreserved delete go on and leaves that choice in the bucket; within one
destroy the hosts trust what the gate verified. (That the program registers the hooks: tests/infra/
test_infra.py; the order the engine runs them in: tests/infra/test_destroy.py.)"""

from __future__ import annotations

import hashlib
import json
from types import SimpleNamespace

import pytest

from evidence.stores import object_key, preserve
from infra.teardown import NotPreserved, before_host_delete


def host(bucket: str | None) -> SimpleNamespace:
    """What Pulumi hands a before_delete hook for an instance (its old inputs, tags among them)."""
    tags = {"trial": "td-trial", "rank": "0"} | ({"evidence-bucket": bucket} if bucket else {})
    return SimpleNamespace(name="td-trial-rank-0", id="i-0123456789abcdef0", type="aws:ec2/instance:Instance",
                           urn="urn:pulumi:test::trials::aws:ec2/instance:Instance::td-trial-rank-0",
                           old_inputs={"tags": tags}, old_outputs=None, new_inputs=None, new_outputs=None)


def hook(aws, abandon: bool = False):
    return before_host_delete("td-trial", "us-east-1", abandon, session_for=lambda region: aws)


def test_destroy_waits_for_preservation_then_verifies_it(aws, tmp_path):
    s3 = aws.client("s3")
    s3.create_bucket(Bucket="td-evidence")
    with pytest.raises(NotPreserved, match=r"refusing to delete td-trial-rank-0 \(i-0123456789abcdef0\): "
                                           r"s3://td-evidence/trials/td-trial/ holds no preservation index"):
        hook(aws)(host("td-evidence"))
    with pytest.raises(NotPreserved, match="no evidence-bucket tag"):
        hook(aws)(host(None))

    home = tmp_path / "cooperative-learning-gpu"
    (home / "runs").mkdir(parents=True)
    (home / "commitments.jsonl").write_text('{"entry": 0}\n')
    (home / "runs" / "result.json").write_text('{"loss": 1.5}\n')
    # an index that lists nothing (the kind anyone could write) proves nothing
    s3.put_object(Bucket="td-evidence", Key="trials/td-trial/indexes/forged/20260101T000000000000Z.json",
                  Body=json.dumps({"format": "trial-evidence-index-v1", "files": {}}).encode())
    with pytest.raises(NotPreserved, match="forged: its preservation does not verify: .* lists no files"):
        hook(aws)(host("td-evidence"))
    s3.delete_object(Bucket="td-evidence", Key="trials/td-trial/indexes/forged/20260101T000000000000Z.json")
    preserve(home, "s3://td-evidence/trials/td-trial/", trial=home.name, session=aws)
    hook(aws)(host("td-evidence"))  # preserved and verified: the delete may go on
    # a home that committed (its log anchored in the store) but was never preserved
    s3.put_object(Bucket="td-evidence", Key="trials/td-trial/anchors/coop-smoke/ab12/00000000.json", Body=b"{}")
    with pytest.raises(NotPreserved, match="home\\(s\\) coop-smoke made commitments but were never preserved"):
        hook(aws)(host("td-evidence"))
    s3.delete_object(Bucket="td-evidence", Key="trials/td-trial/anchors/coop-smoke/ab12/00000000.json")
    # a commitment anchored after the home's newest preservation
    s3.put_object(Bucket="td-evidence", Key=f"trials/td-trial/anchors/{home.name}/ab12/00000000.json", Body=b"{}")
    with pytest.raises(NotPreserved, match="1 commitment\\(s\\) were anchored after its newest preservation"):
        hook(aws)(host("td-evidence"))
    s3.delete_object(Bucket="td-evidence", Key=f"trials/td-trial/anchors/{home.name}/ab12/00000000.json")

    # an object changed after preservation: the store no longer holds what the index names
    key = "trials/td-trial/" + object_key(hashlib.sha256((home / "runs" / "result.json").read_bytes()).hexdigest())
    s3.put_object(Bucket="td-evidence", Key=key, Body=b'{"loss": 9.9}\n')
    with pytest.raises(NotPreserved, match=r"cooperative-learning-gpu: its preservation does not verify: "
                                           r"runs/result.json"):
        hook(aws)(host("td-evidence"))


def test_abandoning_is_a_choice_written_to_the_bucket(aws):
    s3 = aws.client("s3")
    s3.create_bucket(Bucket="td-abandon")
    hook(aws, abandon=True)(host("td-abandon"))
    (obj,) = s3.list_objects_v2(Bucket="td-abandon", Prefix="trials/td-trial/abandoned/")["Contents"]
    rec = json.loads(s3.get_object(Bucket="td-abandon", Key=obj["Key"])["Body"].read())
    assert (rec["trial"], rec["instance"], rec["setting"]) == ("td-trial", "i-0123456789abcdef0",
                                                               "abandon_unpreserved: true")
    assert "holds no preservation index" in rec["found"]


def test_within_one_destroy_the_hosts_trust_the_gate(aws, tmp_path):
    """The gate's hook verifies the trial once; the instances' hooks, run later in the same program run,
    do not verify the same bucket and trial again (a full re-read per host) — but still refuse elsewhere."""
    from types import SimpleNamespace

    from infra.teardown import VERIFIED, before_gate_delete

    s3 = aws.client("s3")
    s3.create_bucket(Bucket="td-gate")
    s3.create_bucket(Bucket="td-other")
    home = tmp_path / "home"
    (home / "runs").mkdir(parents=True)
    (home / "commitments.jsonl").write_text('{"entry": 0}\n')
    (home / "runs" / "result.json").write_text('{"loss": 1.5}\n')
    preserve(home, "s3://td-gate/trials/td-trial/", trial=home.name, session=aws)
    gate = SimpleNamespace(name="td-trial-destroy-gate", id="", old_inputs={"bucket": "td-gate", "trial": "td-trial"},
                           old_outputs=None)
    VERIFIED.clear()
    try:
        with pytest.raises(NotPreserved, match="no evidence bucket recorded"):
            before_gate_delete("td-trial", "us-east-1", False, session_for=lambda r: aws)(
                SimpleNamespace(name="g", id="", old_inputs={}, old_outputs=None))
        before_gate_delete("td-trial", "us-east-1", False, session_for=lambda r: aws)(gate)
        assert VERIFIED == {("td-gate", "td-trial"): "preserved"}
        for o in s3.list_objects_v2(Bucket="td-gate")["Contents"]:  # the store emptied behind the gate's back
            s3.delete_object(Bucket="td-gate", Key=o["Key"])
        hook(aws)(host("td-gate"))  # trusted: verified by the gate in this run
        with pytest.raises(NotPreserved, match="holds no preservation index"):
            hook(aws)(host("td-other"))
    finally:
        VERIFIED.clear()
