"""The program's own AWS calls (the delete hooks' check, the `up`'s preservation check) speak as the stack's
provider does (infra/credentials.py): static keys, a profile from the stack's shared files, an assumed-role
chain and per-service endpoints, all from the stack's `aws:` config.

The end-to-end test runs `TRIALS_TEARDOWN=1 pulumi destroy --run-program` through the engine harness with
moto enforcing IAM (its `reset-auth` switch) and no credentials or endpoint in the environment: the only
identity that can see the trial's hosts and read its bucket is a role the stack's config assumes, with the
keys the config gives, at the endpoints the config names. A hook on boto3's default chain fails there."""

from __future__ import annotations

import json
import uuid

import boto3
import pytest
import requests

from evidence.stores import preserve
from infra.lease import statement as lease_statement
from infra.credentials import CredentialsError, StackAws, go_duration_s, open_session
from pulumi_engine import pulumi_run, teardown_env
from test_infra import CALLS, answers, live, stack_of
from test_teardown import a_home

TEARDOWN = teardown_env()


def test_the_stack_config_read_as_the_provider_reads_it():
    raw = {"region": "eu-west-1", "accessKey": "AKIA1", "secretKey": "s", "token": None,
           "assumeRoles": json.dumps([{"roleArn": "arn:aws:iam::123456789012:role/a", "sessionName": "x",
                                       "duration": "1h30m", "externalId": "e", "tags": {"k": "v"}},
                                      {"roleArn": "arn:aws:iam::123456789012:role/b"}]),
           "endpoints": json.dumps([{"s3": "http://198.18.0.1:5000", "sts": "http://198.18.0.1:5000"}]),
           "sharedCredentialsFiles": json.dumps(["~/creds"])}
    s = StackAws.from_config(raw)
    assert (s.region, s.access_key, s.shared_credentials_files) == ("eu-west-1", "AKIA1", ["~/creds"])
    assert [r.role_arn for r in s.assume_roles] == ["arn:aws:iam::123456789012:role/a", "arn:aws:iam::123456789012:role/b"]
    assert s.assume_roles[0].request() == {"RoleArn": "arn:aws:iam::123456789012:role/a", "RoleSessionName": "x",
                                           "ExternalId": "e", "DurationSeconds": 5400,
                                           "Tags": [{"Key": "k", "Value": "v"}]}
    assert s.endpoints == {"s3": "http://198.18.0.1:5000", "sts": "http://198.18.0.1:5000"}
    assert go_duration_s("15m") == 900 and go_duration_s("900s") == 900
    with pytest.raises(CredentialsError, match="aws:assumeRole is set: pulumi-aws 7 does not read it: set aws:assumeRoles"):
        StackAws.from_config({"assumeRole": json.dumps({"roleArn": "arn:aws:iam::123456789012:role/a"})})
    for key in ("assumeRoleWithWebIdentity", "sharedCredentialsFile", "stsRegion"):  # they change who calls
        with pytest.raises(CredentialsError, match=f"aws:{key} is set"):
            StackAws.from_config({key: "x"})
    with pytest.raises(CredentialsError, match=r"aws:assumeRoles\[0\]\.roleArn: String should match"):
        StackAws.from_config({"assumeRoles": json.dumps([{"roleArn": "not-an-arn"}])})
    with pytest.raises(CredentialsError, match="aws:endpoints is not JSON"):
        StackAws.from_config({"endpoints": "s3=http://x"})
    with pytest.raises(CredentialsError, match="only one of aws:accessKey and aws:secretKey"):
        open_session(StackAws(access_key="AKIA1"))


ELSEWHERE = ("AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN", "AWS_ROLE_SESSION_NAME", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
             "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_AUTHORIZATION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE")
"""What could send botocore to another source of credentials (real STS, a container endpoint, a profile of
this machine's): never set while these tests run."""


def no_other_source(monkeypatch, tmp_path) -> None:
    for k in ELSEWHERE:
        monkeypatch.delenv(k, raising=False)
    empty = tmp_path / "empty-aws-file"
    empty.write_text("")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(empty))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(empty))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def test_a_profile_in_the_stack_beats_the_environment_s_keys(tmp_path, monkeypatch):
    """As the provider: a profile named in the stack is used though the environment holds other keys."""
    no_other_source(monkeypatch, tmp_path)
    creds = tmp_path / "credentials"
    creds.write_text("[trial-operator]\naws_access_key_id = AKIAFROMPROFILE\naws_secret_access_key = p\n")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFROMENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "e")
    s = open_session(StackAws(region="us-east-1", profile="trial-operator", shared_credentials_files=[str(creds)]))
    assert s.session.get_credentials().access_key == "AKIAFROMPROFILE"
    static = open_session(StackAws(region="us-east-1", access_key="AKIASTATIC", secret_key="x", profile="trial-operator",
                                   shared_credentials_files=[str(creds)]))
    assert static.session.get_credentials().access_key == "AKIASTATIC"  # static keys beat a profile
    assert open_session(StackAws(region="us-east-1")).session.get_credentials().access_key == "AKIAFROMENV"


class AtMoto:
    """A session whose every client is at moto's URL, whatever the environment says later (the test takes the
    environment's endpoint away): nothing here may reach another address."""

    def __init__(self, session: boto3.Session, url: str) -> None:
        self.session, self.url, self.region_name = session, url, session.region_name

    def client(self, service: str, **kw):
        return self.session.client(service, endpoint_url=self.url, **kw)


@pytest.fixture
def unsigned_scheduler():
    """EventBridge Scheduler for the destroy check's look for stray deadline stops (infra/teardown.py
    `trial_stops`), answered by a loopback server holding no schedule: once moto enforces IAM it refuses every
    Scheduler call SignatureDoesNotMatch whatever the keys (moto/iam/access_control.py signs the request again
    without its query string), and the setting is moto's process-wide. The identity tested is EC2's, S3's, STS's
    and SSM's; the calls this server saw are kept, to show the check asked."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # ListSchedules: GET /schedules?NamePrefix=...
            seen.append(self.path)
            body = json.dumps({"Schedules": []}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


@pytest.fixture
def enforced(aws, moto_url):
    """moto enforcing IAM: an admin for the test's own set-up, a stack operator whose keys may only assume
    `role`, and `role`, which may list instances and use the trial's buckets."""
    run = uuid.uuid4().hex[:8]
    iam = aws.client("iam")
    iam.create_user(UserName=f"admin-{run}")
    iam.put_user_policy(UserName=f"admin-{run}", PolicyName="all", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
    k = iam.create_access_key(UserName=f"admin-{run}")["AccessKey"]
    admin = AtMoto(boto3.Session(aws_access_key_id=k["AccessKeyId"], aws_secret_access_key=k["SecretAccessKey"],
                                 region_name="us-east-1"), moto_url)
    operator = iam.create_user(UserName=f"operator-{run}")["User"]["Arn"]
    role = iam.create_role(RoleName=f"trial-destroyer-{run}", AssumeRolePolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                "Principal": {"AWS": operator}}]}))["Role"]["Arn"]
    iam.put_user_policy(UserName=f"operator-{run}", PolicyName="assume", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole", "Resource": role}]}))
    iam.put_role_policy(RoleName=f"trial-destroyer-{run}", PolicyName="check", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Action": ["ec2:DescribeInstances", "scheduler:ListSchedules"], "Resource": "*"},
            {"Effect": "Allow", "Action": ["s3:ListBucket", "s3:GetObject", "s3:PutObject",
                                           "s3:GetObjectAttributes"], "Resource": "*"},
            # the operation lease (infra/lease.py), as docs/aws.md grants it
            # moto authorizes SSM's actions against "*" only (moto/iam/access_control.py: no resource of its own
            # for them), so the statement's resources (infra/lease.py, AWS's rule) cannot be tested here
            {**lease_statement(), "Resource": "*"}]}))
    ok = iam.create_access_key(UserName=f"operator-{run}")["AccessKey"]
    was = requests.post(f"{moto_url}/moto-api/reset-auth", data=b"0").json()["PREVIOUS_INITIAL_NO_AUTH_ACTION_COUNT"]
    try:
        yield {"admin": admin, "admin_keys": {"AWS_ACCESS_KEY_ID": k["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": k["SecretAccessKey"]},
               "role": role, "key": ok["AccessKeyId"], "secret": ok["SecretAccessKey"], "url": moto_url}
    finally:
        requests.post(f"{moto_url}/moto-api/reset-auth", data=str(was).encode())


def test_the_check_speaks_as_the_stack_does_when_only_its_config_holds_credentials(enforced, aws, monkeypatch, tmp_path,
                                                                                   unsigned_scheduler):
    admin, url = enforced["admin"], enforced["url"]
    trial = f"cr-{uuid.uuid4().hex[:6]}"
    bucket = f"{trial}-evidence"
    admin.client("s3").create_bucket(Bucket=bucket)
    (iid,) = [i["InstanceId"] for i in admin.client("ec2").run_instances(
        ImageId="ami-0123456789abcdef0", InstanceType="g6e.xlarge", MinCount=1, MaxCount=1,
        TagSpecifications=[{"ResourceType": "instance", "Tags": [
            {"Key": "trial", "Value": trial}, {"Key": "evidence-bucket", "Value": bucket}]}])["Instances"]]
    cluster = live(trial=trial)
    rules = answers(trial) + [{"type": "aws:ec2/instance:Instance", "name": f"{trial}-rank-0", "id": iid}]
    # mocks: the state to destroy (rank 0: iid); the admin takes the trial's lease
    up = pulumi_run("up", stack_of(cluster), answers=rules, calls=CALLS, env=enforced["admin_keys"])
    assert up.returncode == 0, up.errors
    # nothing in the environment: no keys, no endpoint, no profile, no role, no container or instance metadata
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(k, raising=False)
    no_other_source(monkeypatch, tmp_path)
    env = dict(TEARDOWN)
    endpoints = json.dumps([{"ec2": url, "s3": url, "sts": url, "ssm": url, "scheduler": unsigned_scheduler[0]}])
    roles = json.dumps([{"roleArn": enforced["role"], "sessionName": "trials-destroy"}])

    def destroy(**aws_config):
        config = {**stack_of(cluster), **{f"aws:{k}": v for k, v in aws_config.items()}}
        return pulumi_run("destroy", config, state=up.state, answers=rules, calls=CALLS, env=env)

    with_keys = {"accessKey": enforced["key"], "secretKey": enforced["secret"], "endpoints": endpoints}
    # the stack's own identity: the check sees the live host and reads the bucket, and refuses (unpreserved)
    d = destroy(**with_keys, assumeRoles=roles)
    assert d.failed and f"s3://{bucket}/trials/{trial}/ holds no preservation index" in d.failed, d.failed
    assert iid in d.failed and not [s for s in d.steps if s["outcome"] not in ("failed", "not started")]
    # controls: without the config's keys there is no identity at all; without its role, one that may not look:
    # the lease (the first call) is refused, nothing registered, nothing deleted
    d = destroy(endpoints=endpoints, assumeRoles=roles)
    assert d.returncode == 1 and "lease of trial" in d.errors and "credentials" in d.errors.lower(), d.errors
    assert not d.steps and [r.typ for r in d.resources] == ["pulumi:pulumi:Stack"]
    d = destroy(**with_keys)
    assert d.returncode == 1 and "lease of trial" in d.errors, d.errors
    assert "Unauthorized" in d.errors or "denied" in d.errors.lower() or "not authorized" in d.errors.lower(), d.errors
    assert not d.steps and [r.typ for r in d.resources] == ["pulumi:pulumi:Stack"]
    # preserved (by the admin): the same stack's identity verifies it, and the destroy goes through
    home = a_home(tmp_path, "local-training-windows-gpu")
    preserve(home, f"s3://{bucket}/trials/{trial}/", trial=home.name, session=admin)
    d = destroy(**with_keys, assumeRoles=roles)
    assert d.failed is None, d.failed
    assert {s["outcome"] for s in d.steps if s["custom"] and s["type"].startswith("aws:")} == \
        {"deleted (mocks only)", "retained"}
    assert any(p.startswith("/schedules?NamePrefix=" + trial) for p in unsigned_scheduler[1])  # the stops were asked for
    admin.client("ec2").terminate_instances(InstanceIds=[iid])
