"""A host preserving its checkpoint payloads (`preserve_part`) with the hosts' own role, as S3 answers it.

moto's server enforces IAM here (its `reset-auth` switch): every request is signed with the credentials
of an assumed role whose policy is the stack's own `host_access`, and moto refuses what the policy does
not allow. Two things S3 does that moto does not are added on the host's boto3 session, each decided
from that same policy document, not hard-coded:

- HeadObject of a missing key answers 404 only to a caller allowed s3:ListBucket on the bucket, 403 to
  anyone else (AWS's HeadObject reference, cited in docs/aws.md #31). moto always answers 404: the
  hook turns moto's 404 into S3's bodiless 403 when the policy, evaluated for a request without
  s3:prefix (HeadObject carries none), does not allow ListBucket.
- A condition on s3:prefix (StringLike) limits ListBucket; moto ignores conditions it does not know.
  The hook refuses a listing whose prefix the policy's condition does not match, with S3's
  AccessDenied.

The old `S3Store.size` took the 403 for an error, so the host's preservation failed: the first test
fails on it."""

from __future__ import annotations

import fnmatch
import json
import uuid
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import boto3
import pytest
import requests
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ClientError

from evidence.canonical import file_sha256
from evidence.stores import PreservationError, object_key, preserve_part
from infra.bucket import host_access

BUCKET, TRIAL_PREFIX = "evidence-hosts", "trials/t/"
CKPT = "runs/ddp-four/rank-1/checkpoints/step-000008"


def allows_list(policy: dict, bucket_arn: str, prefix: str | None) -> bool:
    """Whether `policy` allows s3:ListBucket on the bucket for a request whose s3:prefix is `prefix`
    (None: the request carries no such key, as HeadObject). Only what the hosts' policy uses is
    understood (Allow statements, StringLike on s3:prefix); anything else stops the test rather than
    being guessed. A condition on a key the request lacks does not match (IAM's rule for operators
    without IfExists)."""
    for st in policy["Statement"]:
        actions = [st["Action"]] if isinstance(st["Action"], str) else st["Action"]
        resources = [st["Resource"]] if isinstance(st["Resource"], str) else st["Resource"]
        if st["Effect"] != "Allow" or not any(a in ("s3:ListBucket", "s3:*") for a in actions) \
                or not any(fnmatch.fnmatchcase(bucket_arn, r) for r in resources):
            continue
        cond = st.get("Condition")
        if not cond:
            return True
        if set(cond) != {"StringLike"} or set(cond["StringLike"]) != {"s3:prefix"}:
            raise NotImplementedError(f"the emulation does not evaluate {cond}")
        patterns = cond["StringLike"]["s3:prefix"]
        patterns = [patterns] if isinstance(patterns, str) else patterns
        if prefix is not None and any(fnmatch.fnmatchcase(prefix, p) for p in patterns):
            return True
    return False


class _Body:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def stream(self, **_):
        yield self.data


def s3_as_aws_answers(session: boto3.Session, policy: dict, bucket_arn: str) -> None:
    """Register on `session` what S3 does and moto does not (see the module's note)."""

    def head(response_dict, **_):
        if response_dict["status_code"] == 404 and not allows_list(policy, bucket_arn, None):
            response_dict["status_code"] = 403
            response_dict["body"] = b""  # a HEAD's error has no body: botocore names it "403"

    def listing(request, **_):
        q = parse_qs(urlparse(request.url).query, keep_blank_values=True)
        prefix = q["prefix"][0] if "prefix" in q else None
        if not allows_list(policy, bucket_arn, prefix):
            body = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code>'
                    b"<Message>Access Denied</Message></Error>")
            return AWSResponse(request.url, 403, {"Content-Type": "application/xml"}, _Body(body))
        return None

    session.events.register("before-parse.s3.HeadObject", head)
    session.events.register("before-send.s3.ListObjectsV2", listing)


@pytest.fixture
def iam(aws, moto_url):
    """moto with IAM enforced: `host(policy)` gives a session of a role holding `policy` (with S3's
    answers added), `admin` a session allowed everything. Enforcement is switched off again after."""
    iam_c = aws.client("iam")
    run = uuid.uuid4().hex[:8]  # moto's state outlives a test: names of this one's own
    aws.client("s3").create_bucket(Bucket=BUCKET)
    operator = iam_c.create_user(UserName=f"operator-{run}")["User"]["Arn"]
    iam_c.put_user_policy(UserName=f"operator-{run}", PolicyName="all", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
    k = iam_c.create_access_key(UserName=f"operator-{run}")["AccessKey"]
    admin = boto3.Session(aws_access_key_id=k["AccessKeyId"], aws_secret_access_key=k["SecretAccessKey"],
                          region_name="us-east-1")
    iam_c, sts = admin.client("iam"), admin.client("sts")  # signed as the operator once IAM is enforced
    # on EC2 the instance profile assumes the role; here the operator does (moto checks an AWS principal)
    trust = json.dumps({"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Action": "sts:AssumeRole",
        "Principal": {"Service": "ec2.amazonaws.com", "AWS": operator}}]})
    made = 0

    def host(policy: dict) -> boto3.Session:
        nonlocal made
        made += 1
        name = f"trial-host-{run}-{made}"
        arn = iam_c.create_role(RoleName=name, AssumeRolePolicyDocument=trust)["Role"]["Arn"]
        iam_c.put_role_policy(RoleName=name, PolicyName="host-evidence", PolicyDocument=json.dumps(policy))
        c = sts.assume_role(RoleArn=arn, RoleSessionName="i-0123456789abcdef0")["Credentials"]
        s = boto3.Session(aws_access_key_id=c["AccessKeyId"], aws_secret_access_key=c["SecretAccessKey"],
                          aws_session_token=c["SessionToken"], region_name="us-east-1")
        s3_as_aws_answers(s, policy, f"arn:aws:s3:::{BUCKET}")
        return s

    was = requests.post(f"{moto_url}/moto-api/reset-auth", data=b"0").json()["PREVIOUS_INITIAL_NO_AUTH_ACTION_COUNT"]
    try:
        yield host, admin
    finally:
        requests.post(f"{moto_url}/moto-api/reset-auth", data=str(was).encode())
        s3 = aws.client("s3")  # the next test's bucket starts empty
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
            for o in page.get("Contents", []):
                s3.delete_object(Bucket=BUCKET, Key=o["Key"])
        s3.delete_bucket(Bucket=BUCKET)


def hosts_policy() -> dict:
    """The stack's own host policy for the bucket and the trial's prefix (infra/bucket.py)."""
    return json.loads(host_access(f"arn:aws:s3:::{BUCKET}", TRIAL_PREFIX))


def host_home(root: Path, payload: bytes = b"weights of rank 1") -> Path:
    home = root / "home"
    (home / CKPT).mkdir(parents=True)
    (home / CKPT / "receipt.json").write_text(json.dumps({"files": {"state.bin": {"bytes": len(payload)}}}))
    (home / CKPT / "state.bin").write_bytes(payload)
    return home


def puts(session: boto3.Session) -> list[str]:
    sent: list[str] = []
    session.events.register("before-send.s3.PutObject", lambda request, **_: sent.append(request.url))
    return sent


def test_a_host_preserves_its_part_though_s3_answers_403_for_a_missing_key(iam, tmp_path):
    host, admin = iam
    policy = hosts_policy()
    s = host(policy)
    url = f"s3://{BUCKET}/{TRIAL_PREFIX}"
    missing = f"{TRIAL_PREFIX}{object_key('0' * 64)}"
    with pytest.raises(ClientError) as e:  # what the host sees: S3's answer, not moto's 404
        s.client("s3").head_object(Bucket=BUCKET, Key=missing)
    assert e.value.response["Error"]["Code"] == "403"
    home = host_home(tmp_path)
    sent = puts(s)
    part = preserve_part(home, url, session=s)
    digest = file_sha256(home / CKPT / "state.bin")
    assert part == {f"{CKPT}/state.bin": {"sha256": digest, "size": 17}}
    assert len(sent) == 1
    body = admin.client("s3").get_object(Bucket=BUCKET, Key=f"{TRIAL_PREFIX}{object_key(digest)}")["Body"].read()
    assert body == b"weights of rank 1"
    # again: the object is there now (HeadObject answers 200), read back, not sent again
    assert preserve_part(home, url, session=s) == part and len(sent) == 1


def test_with_listbucket_unconditioned_s3_answers_404_and_the_host_path_is_the_same(iam, tmp_path):
    """The other answer S3 may give: a role allowed to list the bucket gets 404 for a missing key."""
    host, _ = iam
    policy = hosts_policy()
    for st in policy["Statement"]:
        st.pop("Condition", None)
    s = host(policy)
    with pytest.raises(ClientError) as e:
        s.client("s3").head_object(Bucket=BUCKET, Key=f"{TRIAL_PREFIX}{object_key('1' * 64)}")
    assert e.value.response["Error"]["Code"] == "404"
    home = host_home(tmp_path, b"other weights")
    part = preserve_part(home, f"s3://{BUCKET}/{TRIAL_PREFIX}", session=s)
    assert part[f"{CKPT}/state.bin"]["sha256"] == file_sha256(home / CKPT / "state.bin")


def test_a_denied_upload_is_never_taken_for_absence_or_success(iam, tmp_path):
    """A role that may not write (s3:PutObject removed): the missing object is found missing, the upload
    is refused by IAM, and preservation fails naming the object; nothing is in the bucket."""
    host, admin = iam
    policy = hosts_policy()
    for st in policy["Statement"]:
        if isinstance(st["Action"], list):
            st["Action"] = [a for a in st["Action"] if a != "s3:PutObject"]
    s = host(policy)
    home = host_home(tmp_path)
    with pytest.raises(PreservationError, match=r"objects/sha256/.*the store refused the upload.*AccessDenied"):
        preserve_part(home, f"s3://{BUCKET}/{TRIAL_PREFIX}", session=s)
    assert admin.client("s3").list_objects_v2(Bucket=BUCKET)["KeyCount"] == 0


def test_a_store_outside_the_hosts_prefix_is_refused_not_taken_for_empty(iam, tmp_path):
    """Another trial's prefix: HeadObject is denied (no s3:GetObject there) and so is the listing (the
    s3:prefix condition does not match): the store cannot say, and preservation stops naming both."""
    host, _ = iam
    s = host(hosts_policy())
    with pytest.raises(PreservationError, match=r"refused both HeadObject \(403\) and a listing under the key "
                                                r"\(AccessDenied\)"):
        preserve_part(host_home(tmp_path), f"s3://{BUCKET}/trials/another/", session=s)
