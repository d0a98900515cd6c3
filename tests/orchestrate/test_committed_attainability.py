"""The gates' attainability on record before training (attainability.json, committed by `orchestrate
run`), and again in the report, the console and report.md: a gate that could not pass at the profile
is labelled so from the committed record, one that could pass and failed is not, and `python -m
evidence report` recomputes the labels from the evidence alone — refusing a record that was edited
or that disagrees with what the committed prepared.json gives."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import run_cli
from evidence.attainability import ATTAINABILITY, UNATTAINABLE
from evidence.canonical import read_json, write_json_atomic
from evidence.commitments import CommitmentLog
from orchestrate.placement import local_devices, placement_record
from training.config import resolve

BYTES = "bytes ≤ 0.125 × ddp-four"


def words(s: str) -> str:
    return " ".join(s.split())


def test_committed_once_before_the_candidates(ltw_home, tmp_path):
    from orchestrate.attainability import commit_attainability

    home = tmp_path / "home"
    shutil.copytree(ltw_home, home)
    placement = placement_record(resolve("local-training-windows", "smoke"), local_devices(None, "cpu"))
    shared = {"shared_cores": True}
    rec, now = commit_attainability(home, placement, **shared)
    assert now and read_json(home / ATTAINABILITY) == rec
    assert [e["kind"] for e in CommitmentLog(home).entries()][-1] == "attainability"
    assert CommitmentLog(home).latest("attainability")["data"] == {"unattainable": [BYTES]}
    assert rec["basis"]["cluster"]["source"] == "local" and rec["basis"]["cluster"]["cores"] >= 1
    assert commit_attainability(home, placement, **shared) == (rec, False)  # a later run keeps the home's record
    assert len([e for e in CommitmentLog(home).entries() if e["kind"] == "attainability"]) == 1
    # a home whose candidates were committed first (trained before records were kept) gets none now
    other = tmp_path / "other"
    shutil.copytree(ltw_home, other)
    (other / "candidates.json").write_text("{}")
    CommitmentLog(other).append("candidates", "candidates.json")
    assert commit_attainability(other, placement, **shared) == (None, False) and not (other / ATTAINABILITY).exists()


def test_an_unattainable_gate_is_labelled_from_the_committed_record(finished_trial):
    """diloco-four at smoke: H = 4 sends 1/4 of ddp-four's bytes by construction, so the 1/8 gate could
    not pass; it is FAILED (unattainable at this profile: …) in report.json, report.md and the console,
    and kept apart in the closing line. The accuracy gates the tiny seed failed could have passed
    (7 discordant pairs of 32): failed, not labelled unattainable."""
    home, said = finished_trial.home, words(finished_trial.first.stderr)
    assert finished_trial.first.returncode == 0, finished_trial.first.stderr
    entries = CommitmentLog(home).entries()
    kinds = [e["kind"] for e in entries]
    assert kinds.index("attainability") < kinds.index("candidates")  # on record before training
    rec = {g["gate"]: g for g in read_json(home / ATTAINABILITY)["gates"]}
    assert rec[BYTES]["attainable"] is False and rec["McNemar p ≤ 0.01"]["figures"]["min_discordant"] == 7

    rep = read_json(home / "report.json")
    gates = {g["gate"]: g for g in rep["gates"]}
    assert gates[BYTES]["passed"] is False and gates[BYTES]["attainable"] is False
    assert rep["unattainable_failed_gates"] == [BYTES] and BYTES in rep["failed_gates"]  # never hidden
    for name in rep["failed_gates"]:  # every failure labelled as the committed record says, and only so
        assert gates[name]["attainable"] is rec[name]["attainable"]
        assert (name in rep["unattainable_failed_gates"]) == (rec[name]["attainable"] is False)
    could = [n for n in rep["failed_gates"] if gates[n]["attainable"] is True]
    assert "gain ≥ 5.0 pp" in could and "McNemar p ≤ 0.01" in could  # the tiny seed learns nothing in 16 updates
    assert rep["attainability"]["source"].startswith("committed before training in attainability.json")

    md = (home / "report.md").read_text()
    assert f"| {BYTES} | 0.25 | **FAILED** ({UNATTAINABLE}: by construction (H = 4): diloco-four exchanges the model " \
           "4 times in 16 updates" in md
    assert f"- Failed, {UNATTAINABLE} (could not have passed): {BYTES}" in md
    assert "| McNemar p ≤ 0.01 | 1 | **FAILED** | 32 test cases: needs at least 7 discordant pairs" in md

    # the console: said before training, then beside the verdict, then apart in the closing line
    assert f"{BYTES}: {UNATTAINABLE}: by construction (H = 4)" in said
    assert said.index(f"{BYTES}: {UNATTAINABLE}") < said.index("train single")
    assert f"gate {BYTES}: 0.25 → FAILED ({UNATTAINABLE}: by construction" in said
    assert "gate McNemar p ≤ 0.01: 1 → FAILED (could pass at this profile: 32 test cases" in said
    closing = next(line for line in finished_trial.first.stderr.splitlines() if line.startswith("gates: "))
    failed, cannot = closing.split(f"; failed, {UNATTAINABLE} (could not have passed): ")
    assert "McNemar p ≤ 0.01" in failed and BYTES not in failed and cannot.split(";")[0] == BYTES


@pytest.fixture
def copy(finished_trial, tmp_path):
    dst = tmp_path / "home"
    shutil.copytree(finished_trial.home, dst, symlinks=True)
    return dst


def report(home, out):
    return run_cli("-m", "evidence", "report", "--home", str(home), "--output", str(out))


def test_the_labels_are_recomputed_from_the_evidence_alone(copy, tmp_path):
    out = tmp_path / "r.json"
    r = report(copy, out)
    assert r.returncode == 0, r.stderr
    again, ran = read_json(out), read_json(copy / "report.json")
    assert [(g["gate"], g["passed"], g["attainable"], g["attainability"]) for g in again["gates"]] == \
           [(g["gate"], g["passed"], g["attainable"], g["attainability"]) for g in ran["gates"]]
    assert again["unattainable_failed_gates"] == [BYTES] and again["attainability"] == ran["attainability"]


def test_an_edited_record_is_refused_by_name(copy, tmp_path):
    p = copy / ATTAINABILITY
    rec = read_json(p)
    for g in rec["gates"]:
        if g["gate"] == BYTES:
            g["attainable"] = True  # as if the bytes gate could have passed
    write_json_atomic(p, rec)
    out = tmp_path / "r.json"
    r = report(copy, out)
    assert r.returncode == 2 and not out.exists()
    assert "(attainability): committed file changed" in words(r.stderr) and ATTAINABILITY in words(r.stderr)


def test_a_record_that_disagrees_with_the_prepared_profile_is_refused(copy):
    """The hash alone proves the record unchanged since committed, not that it was right: the report
    recomputes it and refuses one that disagrees — a verdict, a figure, or the cores the ranks
    recorded sharing."""
    from evidence.report.verify import EvidenceError, _attainability

    entries, prepared = CommitmentLog(copy).entries(), read_json(copy / "prepared.json")
    ranks = {"diloco-four": [read_json(copy / "runs" / "diloco-four" / f"rank-{r}" / "result.json") for r in range(4)]}
    fresh, source = _attainability(copy, entries, prepared, ranks)
    assert source.startswith("committed before training") and fresh["basis"]["cluster"]["source"] == "local"
    p, rec = copy / ATTAINABILITY, read_json(copy / ATTAINABILITY)
    wrong = json.loads(json.dumps(rec))
    next(g for g in wrong["gates"] if g["gate"] == "McNemar p ≤ 0.01")["figures"]["min_discordant"] = 5
    write_json_atomic(p, wrong)
    with pytest.raises(EvidenceError, match=r"attainability\.json \(log entry \d+\) disagrees with what the committed "
                                            r"prepared\.json gives: gate 'McNemar p ≤ 0\.01'"):
        _attainability(copy, entries, prepared, ranks)
    cores = json.loads(json.dumps(rec))
    cores["basis"]["cluster"]["cores"] = rec["basis"]["cluster"]["cores"] + 1
    write_json_atomic(p, cores)
    with pytest.raises(EvidenceError, match=r"says the ranks shared \d+ CPU cores; diloco-four rank 0 recorded \d+"):
        _attainability(copy, entries, prepared, ranks)


def test_a_home_without_a_record_is_computed_from_prepared(copy):
    """A home trained before records were kept: the same labels, computed from prepared.json, and said so."""
    from evidence.report.verify import _attainability

    entries = [e for e in CommitmentLog(copy).entries() if e["kind"] != "attainability"]
    fresh, source = _attainability(copy, entries, read_json(copy / "prepared.json"), {})
    assert source.startswith("computed from prepared.json")
    g = {x["gate"]: x for x in fresh["gates"]}
    assert g[BYTES]["attainable"] is False and fresh["basis"]["cluster"] == {"source": "local", "cores": None}


def test_the_gates_command_says_it_before_anything_is_prepared():
    from typer.testing import CliRunner

    from orchestrate.cli import app

    r = CliRunner().invoke(app, ["gates", "diloco-four", "--profile", "cpu", "--json"])
    assert r.exit_code == 0, r.output
    gates = {g["gate"]: g for g in json.loads(r.stdout)["gates"]}
    assert gates[BYTES]["attainable"] is False and gates[BYTES]["figures"]["exchanges"] == 2
    r = CliRunner().invoke(app, ["gates", "diloco-four", "--profile", "gpu"])
    assert r.exit_code == 0 and "5 attainable, 0 unattainable at this profile, 1 decided by measurement" in r.stdout
    r = CliRunner().invoke(app, ["gates", "diloco-four", "--profile", "no-such"])
    assert r.exit_code == 2 and "no profile 'no-such'" in words(r.output)
