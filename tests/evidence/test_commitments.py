"""The commitments log: chain integrity, tamper detection, sequencing rules."""

import json

import pytest

from evidence.commitments import CommitmentError, CommitmentLog


@pytest.fixture
def log(tmp_path):
    for name in ("prepared.json", "candidates.json", "selection.json", "test.json"):
        (tmp_path / name).write_text(json.dumps({"name": name}))
    return CommitmentLog(tmp_path)


def test_chain_and_require(log):
    a = log.append("prepare", "prepared.json")
    b = log.append("candidates", "candidates.json")
    assert b["prev"] == a["hash"] and [e["seq"] for e in log.entries()] == [0, 1]
    assert log.require("prepare", "prepared.json")["hash"] == a["hash"]


def test_sequencing_rules(log):
    with pytest.raises(CommitmentError, match="needs a 'candidates' commitment"):
        log.append("selection", "selection.json")
    log.append("prepare", "prepared.json")
    with pytest.raises(CommitmentError, match="once per trial"):
        log.append("prepare", "prepared.json")
    log.append("candidates", "candidates.json")
    with pytest.raises(CommitmentError, match="needs a 'selection'"):
        log.append("test-evaluation", "test.json")
    log.append("selection", "selection.json")
    log.append("test-evaluation", "test.json")
    with pytest.raises(CommitmentError, match="once per trial|already committed"):
        log.append("selection", "selection.json")
    with pytest.raises(CommitmentError, match="'selection' was already committed"):
        log.append("candidates", "candidates.json")
    with pytest.raises(CommitmentError, match="unknown commitment kind"):
        log.append("selectoin", "selection.json")


def test_edited_entry_detected(log):
    log.append("prepare", "prepared.json")
    log.append("candidates", "candidates.json")
    lines = log.path.read_text().splitlines()
    e = json.loads(lines[0])
    e["sha256"] = "0" * 64
    lines[0] = json.dumps(e)
    log.path.write_text("\n".join(lines) + "\n")
    with pytest.raises(CommitmentError, match="line 1|:1:"):
        log.entries()


def test_deleted_entry_detected(log):
    log.append("prepare", "prepared.json")
    log.append("candidates", "candidates.json")
    log.append("selection", "selection.json")
    lines = log.path.read_text().splitlines()
    log.path.write_text("\n".join([lines[0], lines[2]]) + "\n")
    with pytest.raises(CommitmentError, match="out of order|chain broken"):
        log.entries()


def test_changed_subject_detected(log, tmp_path):
    log.append("prepare", "prepared.json")
    (tmp_path / "prepared.json").write_text("{}")
    with pytest.raises(CommitmentError, match="committed file changed"):
        log.require("prepare")
    with pytest.raises(CommitmentError, match="committed file changed"):
        log.append("candidates", "candidates.json")


def _forge(log, kind, subject):
    """Append a line with a correct hash but bypassing the rules, as a hand edit would."""
    from evidence.canonical import canonical_bytes, file_sha256
    from evidence.commitments import GENESIS, _entry_hash

    entries = log.entries()
    e = {"seq": len(entries), "kind": kind, "subject": subject,
         "sha256": file_sha256(log.home / subject), "data": {}, "at": "2026-01-01T00:00:00",
         "prev": entries[-1]["hash"] if entries else GENESIS}
    e["hash"] = _entry_hash(e)
    with open(log.path, "ab") as f:
        f.write(canonical_bytes(e) + b"\n")


def test_forged_out_of_sequence_entry_detected_on_read(log):
    log.append("prepare", "prepared.json")
    _forge(log, "test-evaluation", "test.json")
    with pytest.raises(CommitmentError, match="out of sequence.*needs a 'selection'"):
        log.entries()


def test_non_entry_line_detected(log):
    log.append("prepare", "prepared.json")
    with open(log.path, "a") as f:
        f.write("1\n")
    with pytest.raises(CommitmentError, match="not a commitment entry"):
        log.entries()


def test_head_moves_with_each_entry(log):
    from evidence.commitments import GENESIS

    assert log.head() == GENESIS
    first = log.append("prepare", "prepared.json")
    assert first["prev"] == GENESIS and log.head() == first["hash"] != GENESIS
    second = log.append("candidates", "candidates.json")
    assert second["prev"] == first["hash"] and log.head() == second["hash"]
