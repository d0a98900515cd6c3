"""Staging's relay through the trial's bucket: each artifact uploaded once (content-addressed, read
back), fetched and hashed by the hosts, a tampered object refused by name; the wheels a host's Python
already has at the pinned version not sent. The last test stages four network-namespace hosts (real
sshd, root only) through moto's S3 on the hosts' bridge."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from evidence.relay import RelayError, fetch, upload_once
from evidence.stores import open_store, staging_key
from orchestrate.remote import StagingError, wheel_dist, wheels_lacking


@pytest.fixture
def artifacts(tmp_path) -> dict[str, Path]:
    d = tmp_path / "seed"
    d.mkdir()
    (d / "model.safetensors").write_bytes(os.urandom(3 << 20))
    (d / "config.json").write_text('{"a": 1}')
    return {f"seed/{p.name}": p for p in sorted(d.iterdir())}


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_uploaded_once_fetched_and_verified(aws, artifacts, tmp_path):
    aws.client("s3").create_bucket(Bucket="relay")
    store = open_store("s3://relay/trials/t/", aws)
    table, sent = upload_once(store, list(artifacts.values()) * 2)  # the same file twice is one object
    assert sent == sum(p.stat().st_size for p in artifacts.values()) and len(table) == 2
    assert store.size(staging_key(sha(artifacts["seed/config.json"]))) == 8
    assert upload_once(store, artifacts.values())[1] == 0  # there already at its size: not sent
    manifest = {rel: table[p] for rel, p in artifacts.items()}
    for host in ("a", "b"):
        got = fetch("s3://relay/trials/t/", manifest, tmp_path / host, session=aws)
        assert got == {"files": 2, "fetched": 2, "bytes": sent}
        assert all(sha(tmp_path / host / rel) == sha(p) for rel, p in artifacts.items())
    assert fetch("s3://relay/trials/t/", manifest, tmp_path / "a", session=aws)["fetched"] == 0  # verified copies kept


def test_a_tampered_object_is_refused_by_name(aws, artifacts, tmp_path):
    aws.client("s3").create_bucket(Bucket="relay")
    store = open_store("s3://relay/trials/t/", aws)
    table, _ = upload_once(store, artifacts.values())
    big = table[artifacts["seed/model.safetensors"]]
    key = f"trials/t/{staging_key(big['sha256'])}"
    aws.client("s3").put_object(Bucket="relay", Key=key, Body=os.urandom(big["size"]))
    manifest = {rel: table[p] for rel, p in artifacts.items()}
    with pytest.raises(RelayError, match=rf"s3://relay/{key} reads as [0-9a-f]{{64}} .* staged as {big['sha256']} "
                                         r".*refused, seed/model.safetensors was not written"):
        fetch("s3://relay/trials/t/", manifest, tmp_path / "host", session=aws)
    assert not (tmp_path / "host" / "seed" / "model.safetensors").exists()
    assert not list((tmp_path / "host").rglob("*.relay"))
    # a broken earlier upload (another size) is replaced by the next run's upload, then fetched whole
    aws.client("s3").put_object(Bucket="relay", Key=key, Body=b"cut short")
    assert upload_once(store, artifacts.values())[1] == big["size"]
    got = fetch("s3://relay/trials/t/", manifest, tmp_path / "host", session=aws)
    assert got["files"] == 2 and sha(tmp_path / "host" / "seed" / "model.safetensors") == big["sha256"]


def test_the_manifest_writes_only_under_the_root(tmp_path):
    for bad in ("../escape", "/etc/passwd", "a/../../b"):
        with pytest.raises(RelayError, match="is not a path under"):
            fetch(f"file://{tmp_path}/store", {bad: {"sha256": "0" * 64, "size": 1}}, tmp_path / "root")


def test_the_host_command_refuses_with_exit_2(tmp_path, artifacts):
    store = open_store(f"file://{tmp_path}/store")
    table, _ = upload_once(store, artifacts.values())
    cfg = artifacts["seed/config.json"]
    (tmp_path / "store" / staging_key(table[cfg]["sha256"])).write_text('{"a": 2}')
    (tmp_path / "m.json").write_text(json.dumps({"seed/config.json": table[cfg]}))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-P", "-m", "evidence.relay", "fetch", "--store", f"file://{tmp_path}/store",
                        "--manifest", str(tmp_path / "m.json"), "--root", str(tmp_path / "root")],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 2 and f"staging/{table[cfg]['sha256']} reads as" in r.stderr, r.stderr


def test_only_the_wheels_the_host_lacks():
    lock = {"trials-0.1.0-py3-none-any.whl": "x", "torch-2.13.0-cp312-cp312-manylinux_2_28_x86_64.whl": "y",
            "Safe_Tensors-0.8.0-cp38-abi3-manylinux_2_17_x86_64.whl": "z"}
    assert wheel_dist("Safe_Tensors-0.8.0-cp38-abi3-manylinux_2_17_x86_64.whl") == ("safe-tensors", "0.8.0")
    # the AMI's torch matches the pin, build label and all: not sent; the project's own wheel always is
    ami = {"torch": "2.13.0", "trials": "0.1.0", "safe-tensors": "0.7.0"}
    assert wheels_lacking(lock, ami) == ["trials-0.1.0-py3-none-any.whl",
                                         "Safe_Tensors-0.8.0-cp38-abi3-manylinux_2_17_x86_64.whl"]
    # another build of the same release (the AMI's +cu130 against PyPI's wheel) is another torch: sent
    assert "torch-2.13.0-cp312-cp312-manylinux_2_28_x86_64.whl" in wheels_lacking(lock, {**ami, "torch": "2.13.0+cu130"})
    labelled = {"torch-2.13.0+cu130-cp312-cp312-manylinux_2_28_x86_64.whl": "y"}
    assert wheels_lacking(labelled, {"torch": "2.13.0+cu130"}) == []
    assert wheels_lacking(lock, {}) == list(lock)
    with pytest.raises(StagingError, match="not a wheel's file name"):
        wheel_dist("torch.tar.gz")


needs_root = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("/usr/sbin/sshd") is None,
                                reason="needs root and openssh-server (CI installs both)")


@needs_root
def test_four_hosts_staged_through_the_bucket(smoke_home, tiny_seed, tmp_path, monkeypatch):
    """Four namespace hosts, moto's S3 on their bridge: the controller sends one copy of the seed and
    inputs (into the bucket) and only the project's wheel and a manifest to each host; every host's
    files hash as the controller's; a tampered object is refused on the host by its name."""
    import boto3
    from moto.server import ThreadedMotoServer

    from machinery.netns import NetnsHosts, netns_cluster, operator_address
    from orchestrate.launch.command import free_port
    from orchestrate.remote import stage_reports

    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels),
                    str(ROOT)], check=True, capture_output=True)
    files = {f"home/{p.relative_to(smoke_home)}": p for p in sorted(smoke_home.rglob("*")) if p.is_file()}
    files |= {f"seed/{p.relative_to(tiny_seed)}": p for p in sorted(tiny_seed.rglob("*")) if p.is_file()}
    port, bridge = free_port(), operator_address()
    env = {"AWS_ENDPOINT_URL": f"http://{bridge}:{port}", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}
    for k in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    url = "s3://relay-loop/trials/relay-loop/"
    with NetnsHosts(4, tmp_path / "netns", env=env) as hs:
        server = ThreadedMotoServer(ip_address=bridge, port=port, verbose=False)
        server.start()
        try:
            s3 = boto3.Session(region_name="us-east-1").client("s3")
            s3.create_bucket(Bucket="relay-loop")
            cluster = netns_cluster(hs, url, python=sys.executable)
            ts = [cluster.transport(h) for h in cluster.by_rank]
            try:
                sent: dict[str, int] = {}
                said: list[str] = []
                digest, reports = stage_reports(cluster, ts, wheel_dir=wheels, files=files, relay=url,
                                                account=sent, say=said.append)
                one_copy = sum(p.stat().st_size for p in files.values())
                wheel = sum(p.stat().st_size for p in wheels.glob("*.whl"))
                assert sent["relay_bytes"] == sent["relay_stored_bytes"] == one_copy  # once, whatever the hosts
                assert 4 * wheel <= sent["ssh_bytes"] < 4 * (wheel + 200 * len(files))  # the wheel, a manifest
                assert all(r["fetched"]["files"] == len(files) and r["digest"] == digest for r in reports)
                for h, t in zip(cluster.by_rank, ts):  # every file in place, as the controller has it
                    out = t.run(f"cd {h.root} && sha256sum " + " ".join(sorted(files))).check("sha256sum").stdout
                    assert dict(reversed(line.split()) for line in out.splitlines()) == \
                        {rel: hashlib.sha256(p.read_bytes()).hexdigest() for rel, p in files.items()}

                # an object altered in the bucket: the host refuses it by name and writes nothing
                rel = max(files, key=lambda r: files[r].stat().st_size)
                key = url[len("s3://relay-loop/"):] + staging_key(hashlib.sha256(files[rel].read_bytes()).hexdigest())
                s3.put_object(Bucket="relay-loop", Key=key, Body=b"not the seed")
                h, t = cluster.by_rank[2], ts[2]
                t.run(f"rm {h.root}/{rel}").check("rm")
                with pytest.raises(StagingError, match=rf"{h.name}: fetching the staged artifacts .* exited 2: "
                                                       rf"error: s3://relay-loop/{key} reads as .* refused, {rel}"):
                    from orchestrate.remote import stage_host

                    stage_host(t, h, python=h.python, wheel_dir=wheels, lock={}, files=files, relay=url,
                               manifest=json.loads(t.run(f"cat {h.root}/staging-manifest.json").stdout))
                assert t.run(f"test -e {h.root}/{rel}").status != 0
            finally:
                for t in ts:
                    t.close()
        finally:
            server.stop()


def test_the_relay_is_chosen_for_a_stack_and_asked_for_elsewhere(tmp_path):
    """A stack's hosts have the instance role: staging relays there by default; elsewhere (hosts described by
    hand, the namespace test hosts among them, which may have no AWS credentials) it goes over SSH unless asked."""
    from orchestrate.cluster import Cluster

    hosts = [{"name": "h0", "rank": 0, "transport": "ssh", "address": "198.18.0.10", "private_address": "198.18.0.10",
              "host_key": "ssh-ed25519 AAAA", "root": "/opt/trial"}]
    base = {"hosts": hosts, "key_file": str(tmp_path / "k"), "store": "s3://b/trials/t/"}
    assert Cluster(source="pulumi", **base).relay == "s3://b/trials/t/"
    assert Cluster(source="hosts", **base).relay is None
    assert Cluster(source="hosts", staging="relay", **base).relay == "s3://b/trials/t/"
    assert Cluster(source="pulumi", staging="ssh", **base).relay is None
    with pytest.raises(ValueError, match="needs the trial's bucket"):
        Cluster(source="hosts", staging="relay", **{**base, "store": f"file://{tmp_path}/store"})
