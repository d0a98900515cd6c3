"""Preservation: every file content-addressed in a file:// or s3:// store (moto's server), every
object read back and re-hashed, a corrupted read-back caught, teardown refusing until it verifies."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import run_cli
from evidence.canonical import file_sha256
from evidence.stores import (PRESERVED, PreservationError, S3Store, object_key, open_store, preserve,
                             verify_index)


@pytest.fixture
def home(smoke_home, tmp_path) -> Path:
    dst = tmp_path / "trials" / "coop-smoke"
    shutil.copytree(smoke_home, dst)
    (dst / "big.bin").write_bytes(os.urandom(6 << 20))  # above the 5 MiB multipart threshold used below
    return dst


def bucket(aws, name: str) -> str:
    aws.client("s3").create_bucket(Bucket=name)
    return name


def test_file_store_preserves_and_verifies(home, tmp_path):
    url = f"file://{tmp_path / 'store'}"
    rec = preserve(home, url, trial="coop-smoke")
    files = [p for p in home.rglob("*") if p.is_file() and p.name != PRESERVED]
    assert rec.files == len(files) and rec.uploaded_bytes == rec.bytes > 6 << 20
    for p in files:  # content-addressed: the key is the file's own sha256
        assert file_sha256(tmp_path / "store" / object_key(file_sha256(p))) == file_sha256(p)
    assert verify_index(url, rec.index, rec.index_sha256).files == len(files)
    again = preserve(home, url, trial="coop-smoke")  # nothing new: every object re-verified, none re-sent
    assert again.uploaded_bytes == 0 and again.files == rec.files
    victim = tmp_path / "store" / object_key(file_sha256(home / "prepared.json"))
    good = victim.read_bytes()
    victim.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))  # same size, other bytes: found by hashing
    with pytest.raises(PreservationError, match="prepared.json: .* reads back as"):
        verify_index(url, rec.index, rec.index_sha256)
    victim.write_bytes(good + b" ")  # another size: found before any object is hashed
    with pytest.raises(PreservationError, match=rf"prepared.json: .* is {len(good) + 1} bytes, the index says {len(good)}"):
        verify_index(url, rec.index, rec.index_sha256)


def test_s3_store_multipart_and_checksums(home, aws):
    name = bucket(aws, "evidence-multipart")
    store = S3Store(name, "trials/coop-smoke", aws, multipart_mb=5)
    rec = preserve(home, store, trial="coop-smoke")
    s3 = aws.client("s3")
    big = object_key(file_sha256(home / "big.bin"))
    head = s3.head_object(Bucket=name, Key=f"trials/coop-smoke/{big}", ChecksumMode="ENABLED")
    assert head["ContentLength"] == 6 << 20 and head["Metadata"]["sha256"] == file_sha256(home / "big.bin")
    assert head["ETag"].endswith('-2"')  # 6 MiB in 5 MiB parts: a real multipart upload of two parts
    keys = {o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=name) for o in page["Contents"]}
    assert f"trials/coop-smoke/{rec.index}" in keys and all(k.startswith("trials/coop-smoke/") for k in keys)
    assert verify_index(f"s3://{name}/trials/coop-smoke", rec.index, rec.index_sha256, session=aws)
    # an object replaced in the bucket afterwards is caught by a later verification
    s3.put_object(Bucket=name, Key=f"trials/coop-smoke/{object_key(file_sha256(home / 'prepared.json'))}",
                  Body=b"{}")
    with pytest.raises(PreservationError, match="prepared.json"):
        verify_index(f"s3://{name}/trials/coop-smoke", rec.index, rec.index_sha256, session=aws)


class CorruptingS3Store(S3Store):
    """Uploads other bytes than the file's, with the file's checksum claimed: the store accepts and
    echoes it (moto does not check), so only reading back can tell."""

    def put_file(self, key, path, sha256):
        import base64
        import hashlib

        data = path.read_bytes()
        bad = data[:-1] + bytes([data[-1] ^ 1]) if data else b"x"
        claimed = base64.b64encode(hashlib.sha256(data).digest()).decode()
        self.s3.put_object(Bucket=self.bucket, Key=self._key(key), Body=bad, ChecksumSHA256=claimed)


def test_corrupted_read_back_is_caught(home, aws):
    name = bucket(aws, "evidence-corrupt")
    with pytest.raises(PreservationError, match="reads back as .* written as"):
        preserve(home, CorruptingS3Store(name, "t", aws), trial="coop-smoke")
    assert not (home / PRESERVED).exists()  # no record: the evidence is not preserved
    listed = aws.client("s3").list_objects_v2(Bucket=name, Prefix="t/indexes/")
    assert listed["KeyCount"] == 0  # and no index was written


def test_unknown_store_refused(tmp_path):
    with pytest.raises(PreservationError, match="unknown evidence store"):
        open_store("ftp://x/y")
    with pytest.raises(PreservationError, match="names a bucket"):
        open_store("s3:///prefix")


def test_teardown_refuses_until_the_evidence_verifies(home, aws, moto_url):
    r = run_cli("-m", "orchestrate", "down", "--home", str(home))
    assert r.returncode == 2 and "has not been preserved" in r.stderr
    name = bucket(aws, "evidence-down")
    r = run_cli("-m", "orchestrate", "preserve", "--home", str(home), "--store", f"s3://{name}/trials/x")
    assert r.returncode == 0, r.stderr
    rec = json.loads((home / PRESERVED).read_text())
    assert rec["store"] == f"s3://{name}/trials/x/"
    r = run_cli("-m", "orchestrate", "down", "--home", str(home))
    assert r.returncode == 0 and "no hosts to stop" in r.stderr, r.stderr
    aws.client("s3").delete_object(Bucket=name, Key=f"trials/x/{object_key(file_sha256(home / 'big.bin'))}")
    r = run_cli("-m", "orchestrate", "down", "--home", str(home))
    assert r.returncode == 2 and "big.bin" in r.stderr and "does not verify" in r.stderr


def test_host_parts_in_the_index(tmp_path):
    """A home whose checkpoint receipt names a payload it does not hold (it stayed on its host): refused
    without the host's part; the host's part (preserve_part on the host's copy) makes it whole, listed
    under hosts/<host>/ as verified there; a part naming something else, or an object the store lacks,
    is refused naming the host; verify_index finds a host's object gone."""
    from evidence.stores import preserve_part, verify_index

    ckpt = "runs/ddp-four/rank-1/checkpoints/step-000008"
    home, host = tmp_path / "home", tmp_path / "host-1" / "home"
    for root in (home, host):
        (root / ckpt).mkdir(parents=True)
        (root / ckpt / "receipt.json").write_text(json.dumps({"files": {"state.bin": {"bytes": 6}}, "meta": {}}))
    (host / ckpt / "state.bin").write_bytes(b"weight")
    (home / "commitments.jsonl").write_text("")
    url = f"file://{tmp_path / 'store'}"
    with pytest.raises(PreservationError, match=r"1 checkpoint payload\(s\) the home's receipts name are on the hosts"):
        preserve(home, url, trial="t")
    with pytest.raises(PreservationError, match=r"ns-1: runs/ddp-four/rank-1/checkpoints/step-000008/state.bin is "
                                                r"not in the store"):
        preserve(home, url, trial="t", host_parts={"ns-1": {f"{ckpt}/state.bin": {
            "sha256": file_sha256(host / ckpt / "state.bin"), "size": 6}}})
    part = preserve_part(host, url)
    assert part == {f"{ckpt}/state.bin": {"sha256": file_sha256(host / ckpt / "state.bin"), "size": 6}}
    with pytest.raises(PreservationError, match="ns-1: commitments.jsonl is not a checkpoint payload"):
        preserve(home, url, trial="t", host_parts={"ns-1": {"commitments.jsonl": part[f"{ckpt}/state.bin"]}})
    rec = preserve(home, url, trial="t", host_parts={"ns-1": part})
    index = json.loads((tmp_path / "store" / rec.index).read_text())
    assert index["files"][f"hosts/ns-1/{ckpt}/state.bin"]["verified_by"] == "ns-1"
    verify_index(url, rec.index, rec.index_sha256)
    (tmp_path / "store" / object_key(part[f"{ckpt}/state.bin"]["sha256"])).unlink()
    with pytest.raises(PreservationError, match=f"hosts/ns-1/{ckpt}/state.bin: object .* is missing"):
        verify_index(url, rec.index, rec.index_sha256)
