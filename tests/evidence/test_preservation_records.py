"""The preservation record and index as models: each dumps to exactly the JSON written when it was a
dict, and the record's digest is the one the dict gave."""

from __future__ import annotations

import json

import pytest

from evidence.canonical import EvidenceFileError, canonical_bytes, canonical_sha256
from evidence.stores import PRESERVED, Anchors, Index, IndexEntry, Preserved, read_preserved

ANCHORS = {"count": 13, "prefix": "anchors/smoke/9d5c5933080dabb7c6a254ea96555c63a61ff602cd4ddd987f29e3667a550604/"}
RECORD = {  # the shape preserve() wrote as a dict (values from a smoke run, paths cut to three)
    "store": "file:///tmp/before/trials/store/", "index": "indexes/smoke/20261206T101102708409Z.json",
    "index_sha256": "b21771a6cfc6a39b32109371881bde9f205deba36f3516a416c4d2b68d611509", "files": 190,
    "bytes": 62275714, "uploaded_bytes": 61954919, "at": "2026-12-06T10:11:02.708409+00:00",
    "paths": ["attainability.json", "candidates.json", "commitments.jsonl"], "anchors": ANCHORS,
}
OLD_DIGEST = canonical_sha256(RECORD)  # the old computation: the dict before its digest was added


@pytest.mark.parametrize("anchors", [ANCHORS, None])
def test_a_record_dumps_and_digests_as_the_dict_did(anchors):
    fields = {**RECORD, "anchors": anchors}
    rec = Preserved.sealed(**fields)
    assert rec.digest == canonical_sha256(fields)
    assert rec.body() == {**fields, "digest": canonical_sha256(fields)}
    assert Preserved.model_validate(rec.body()) == rec


def test_read_preserved_refuses_a_sealed_record_of_another_shape(tmp_path):
    (tmp_path / PRESERVED).write_text(json.dumps({**RECORD, "digest": OLD_DIGEST}))
    assert read_preserved(tmp_path).anchors == Anchors(**ANCHORS)
    odd = {k: v for k, v in RECORD.items() if k != "paths"}  # sealed, but not what preserve writes
    (tmp_path / PRESERVED).write_text(json.dumps({**odd, "digest": canonical_sha256(odd)}))
    with pytest.raises(EvidenceFileError, match="damaged, not a preservation record .*paths"):
        read_preserved(tmp_path)


def test_an_index_leaves_out_what_it_does_not_have():
    """`verified_by`, `anchors` and `host_payloads_left` are absent, never null, as the dict wrote them."""
    files = {"a.json": IndexEntry(sha256="0" * 64, size=3),
             "hosts/ns-1/runs/x/state.bin": IndexEntry(sha256="1" * 64, size=6, verified_by="ns-1")}
    index = Index(trial="t", store="file:///s/", at="2026-12-06T10:11:02+00:00", files=files, bytes=9)
    assert canonical_bytes(index.body()) == canonical_bytes({
        "format": "trial-evidence-index-v1", "trial": "t", "store": "file:///s/", "at": "2026-12-06T10:11:02+00:00",
        "files": {"a.json": {"sha256": "0" * 64, "size": 3},
                  "hosts/ns-1/runs/x/state.bin": {"sha256": "1" * 64, "size": 6, "verified_by": "ns-1"}},
        "bytes": 9})
    with pytest.raises(ValueError):  # strict: a size of 6.0 is refused, never written as 6
        IndexEntry(sha256="1" * 64, size=6.0)
