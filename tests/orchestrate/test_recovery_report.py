"""The recovery trial's report (#57): recovery-comparison.json, as `recovery_trial` writes it (the writer's own
model, sealed), read back by evidence/report/recovery.py into the verdict a reader reads — the conclusion
the control allows, the same words in the trial report's "## Recovery" lines — and refused, by name, when
the comparison or a report already on disk has been changed. A comparison written before the control
existed still verifies and renders ("control: not run")."""

from __future__ import annotations

import copy
import json

import pytest

from conftest import run_cli
from evidence.canonical import EvidenceFileError, canonical_sha256, read_json, write_json_atomic
from evidence.report.recovery import RecoveryReportDiffers, recovery_verdict, write_recovery_report
from evidence.report.render import recovery_markdown
from evidence.report.verify import EvidenceError, recovery_comparisons
from orchestrate.recovery import Control, Parting, RecoveryComparison
from test_recovery_comparison import OLD_DIGEST, RANK_0, WRITTEN

SAME = {"step": 16, "ranks": [RANK_0, {**RANK_0, "rank": 1}], "max_abs_diff": 0.0, "identical": True,
        "final_parameter_digests_equal": True}
NOT_DET = "the profile does not set deterministic = true; a run without it cannot be compared exactly"


def _write(out, **fields):
    """recovery-comparison.json as recovery_trial writes it: the sealed model's body."""
    out.mkdir(parents=True, exist_ok=True)
    rep = RecoveryComparison.sealed(**{**copy.deepcopy(WRITTEN), **fields})
    write_json_atomic(out / "recovery-comparison.json", rep.body())
    return rep


def _control(identical: bool) -> Control:
    c = SAME if identical else WRITTEN["comparison"]
    return Control(comparison=c, parting=Parting(update=None, rank=None) if identical else
                   Parting(update=10, rank=1, a=[1.5, 0.25], b=[1.5, 0.2500001]), seconds=12.5)


def test_an_old_comparison_verifies_and_renders_control_not_run(tmp_path):
    """WRITTEN has no deterministic/parting/control: its digest still checks, and the report says what
    it cannot know."""
    out = tmp_path / "old"
    out.mkdir()
    write_json_atomic(out / "recovery-comparison.json", {**WRITTEN, "digest": OLD_DIGEST})
    r = run_cli("-m", "evidence", "recovery-report", "--out", str(out))
    assert r.returncode == 0, r.stderr
    said = json.loads(r.stdout.splitlines()[-1])
    assert said["verdict"] == "DIFFERENT" and said["report"] == str(out / "recovery-report.json")
    rep = read_json(out / "recovery-report.json")
    assert rep["comparison_digest"] == OLD_DIGEST and rep["control"] is None and rep["deterministic"] is None
    rec = rep["recovered"]
    assert rec["tensors"] == 2 * (21 + 60 + 2 + 40) and rec["ranks"] == 2 and rec["max_abs_diff"] == 2.384185791015625e-07
    assert rec["differing_parts"] == ["model"] and rec["differing_ranks"] == [1] and rec["parting"] is None
    assert rep["conclusion"].startswith("different; no control was run")
    assert NOT_DET not in rep["conclusion"]  # not recorded: not said to be off
    md = (out / "recovery-report.md").read_text()
    for line in ("# Recovery trial: diloco-four (local-training-windows, smoke) — DIFFERENT",
                 "| world size, device | 2 ranks on cpu, shared on purpose: 2 ranks on 1 GPU(s) |",
                 "| deterministic | not recorded (the comparison was written before the setting existed) |",
                 "| kill | rank 1 after update 11: failure observed 0.236 s, survivors stopped 0.479 s after the kill |",
                 "| resumed from | step 8 (each rank: 8, 8) |",
                 "- DIFFERENT: max |Δ| = 2.384185791015625e-07 over 246 tensors of 2 ranks; differing: model on rank(s) 1",
                 "- first parts: not recorded (written before the per-update comparison)",
                 "- control: not run (the trial ran with --no-control, or before the control existed)"):
        assert line in md.splitlines(), (line, md)
    # run again: the same bytes, nothing written, still 0
    again = run_cli("-m", "evidence", "recovery-report", "--out", str(out))
    assert again.returncode == 0 and json.loads(again.stdout.splitlines()[-1])["written"] == []


@pytest.mark.parametrize("deterministic, control, parting, verdict, conclusion", [
    (True, True, None, "IDENTICAL", "identical: every rank's final state equals the uninterrupted run's, tensor for tensor"),
    (False, False, Parting(update=10, rank=1), "DIFFERENT", f"not reproducible here: the control differs too; {NOT_DET}"),
    (True, False, Parting(update=10, rank=1), "DIFFERENT", "not reproducible here: the control differs too"),
    (True, True, Parting(update=12, rank=1), "DIFFERENT",
     "the restart does not restore every state: the control is identical"),
])
def test_the_conclusion_follows_the_control(tmp_path, deterministic, control, parting, verdict, conclusion):
    identical = verdict == "IDENTICAL"
    rep = _write(tmp_path, comparison=SAME if identical else WRITTEN["comparison"], deterministic=deterministic,
                 parting=parting or Parting(update=None, rank=None), control=_control(control))
    v, written = write_recovery_report(tmp_path)
    assert sorted(p.name for p in written) == ["recovery-report.json", "recovery-report.md"]
    assert v.verdict == verdict and v.conclusion == conclusion and v.comparison_digest == rep.digest
    md = (tmp_path / "recovery-report.md").read_text()
    assert f"**{conclusion[0].upper()}{conclusion[1:]}.**" in md
    c = "IDENTICAL: max |Δ| = 0.0 over 246 tensors of 2 ranks; no part differs" if control else \
        "DIFFERENT: max |Δ| = 2.384185791015625e-07 over 246 tensors of 2 ranks; differing: model on rank(s) 1"
    assert f"- {c}" in md.splitlines()
    first = ("never: every update's loss and gradient norm equal the uninterrupted run's on every rank"
             if parting is None else f"update {parting.update} (rank 1), the first whose loss or gradient norm differs")
    assert f"- first parts: {first}" in md.splitlines()[md.splitlines().index("## Recovered run vs the uninterrupted run"):]
    assert ("| deterministic | yes" if deterministic else f"| deterministic | no — {NOT_DET} |") in md


def test_the_trial_report_says_the_same_words(tmp_path):
    """A home holding recovery trials (one old, one with a control): the "## Recovery" lines carry each
    comparison's own verdict and conclusion."""
    home = tmp_path / "home"
    _write(home / "recovery" / "new", deterministic=False, parting=Parting(update=10, rank=1),
           control=_control(False))
    (home / "recovery" / "old").mkdir()
    write_json_atomic(home / "recovery" / "old" / "recovery-comparison.json", {**WRITTEN, "digest": OLD_DIGEST})
    found = recovery_comparisons(home)
    assert [(r["file"], r["identical"], r["max_abs_diff"]) for r in found] == [
        ("recovery/new/recovery-comparison.json", False, 2.384185791015625e-07),
        ("recovery/old/recovery-comparison.json", False, 2.384185791015625e-07)]
    lines = recovery_markdown(found)
    assert lines[0] == "## Recovery"
    assert ("- recovery/new/recovery-comparison.json: DIFFERENT, max |Δ| = 2.384185791015625e-07 over 246 tensors "
            "of 2 ranks; control DIFFERENT (max |Δ| = 2.384185791015625e-07) → not reproducible here: the control "
            f"differs too; {NOT_DET}") in lines
    assert any(x.startswith("- recovery/old/recovery-comparison.json: DIFFERENT") and "control: not run" in x
               for x in lines), lines
    assert recovery_markdown([]) == []


def test_a_damaged_comparison_or_report_is_refused_by_name(tmp_path):
    out = tmp_path / "t"
    _write(out, deterministic=True, parting=Parting(update=None, rank=None), control=_control(True))
    path = out / "recovery-comparison.json"
    good = path.read_bytes()
    doc = json.loads(good)
    doc["comparison"]["identical"] = True  # a verdict edited to look better
    path.write_text(json.dumps(doc))
    with pytest.raises(EvidenceFileError, match=f"{path}: damaged, contents differ from its digest"):
        recovery_verdict(path)
    with pytest.raises(EvidenceError, match="contents differ from its digest"):
        recovery_comparisons(tmp_path)  # the trial report refuses it too
    r = run_cli("-m", "evidence", "recovery-report", "--out", str(out))
    assert r.returncode == 2 and f"{path}: damaged, contents differ from its digest" in " ".join(r.stderr.split())
    assert not (out / "recovery-report.json").exists()
    path.write_bytes(good[:-20])  # cut short
    with pytest.raises(EvidenceFileError, match=f"{path}: damaged, not valid JSON"):
        recovery_verdict(path)
    # sealed but not a comparison: refused naming the field
    bad = {k: v for k, v in WRITTEN.items() if k != "kill"}
    path.write_text(json.dumps({**bad, "digest": canonical_sha256(bad)}))
    with pytest.raises(EvidenceFileError, match=f"{path}: damaged, kill: Field required"):
        recovery_verdict(path)

    # a report on disk that its comparison no longer gives: exit 2, left as it was
    path.write_bytes(good)
    write_recovery_report(out)
    md = out / "recovery-report.md"
    md.write_text(md.read_text().replace("IDENTICAL", "identical-ish"))
    edited = md.read_bytes()
    with pytest.raises(RecoveryReportDiffers, match=f"{md}: differs from what {path} gives now"):
        write_recovery_report(out)
    r = run_cli("-m", "evidence", "recovery-report", "--out", str(out))
    assert r.returncode == 2 and "differs from what" in r.stderr and md.read_bytes() == edited
