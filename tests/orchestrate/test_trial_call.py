"""The trial as one typed call: `run_trial(TrialOptions) -> TrialOutcome` maps a refusal to its exit
status and message, writes the run record only where asked before anything was prepared, and raises a
contradictory option for the caller to show as a usage error — without a command line in between."""

from __future__ import annotations

import json

import pytest

from conftest import QuietProgress
from orchestrate.trial import OptionError, RunRecord, TrialOptions, run_trial


class Quiet(QuietProgress):
    """A view that keeps what it was told and what it was shown."""

    def __init__(self):
        super().__init__()
        self.shown: list[str] = []

    def trained(self, cfg, summaries) -> None:
        self.shown.append("trained")

    def reported(self, report) -> None:
        self.shown.append("reported")


def test_a_refused_arm_is_an_outcome_with_its_message_and_no_record(tmp_path):
    view = Quiet()
    out = run_trial(TrialOptions(arm="no-such-arm", profile="smoke", trials=tmp_path / "trials"), view)
    assert out.exit == 2 and "no-such-arm" in out.error and out.home is None and out.record is None
    assert not (tmp_path / "trials").exists() and view.shown == []


def test_the_record_is_written_where_asked_however_early_the_run_ends(tmp_path):
    record = tmp_path / "record.json"
    out = run_trial(TrialOptions(arm="no-such-arm", profile="smoke", trials=tmp_path / "trials", record=record),
                    Quiet())
    assert out.record == record
    rec = json.loads(record.read_text())
    RunRecord.model_validate(rec)  # the file is the model's dump: nothing more, nothing less
    assert rec["exit"] == 2 and rec["error"] == out.error and rec["format"] == "trial-run-record-v1"
    assert "home" not in rec and "report" not in rec  # fields the run never reached stay out


def test_a_contradictory_option_is_raised_and_recorded(tmp_path):
    record = tmp_path / "record.json"
    with pytest.raises(OptionError) as e:
        run_trial(TrialOptions(arm="diloco-four", profile="smoke", trials=tmp_path / "trials", record=record,
                               replay=tmp_path / "missing.jsonl"), Quiet())
    assert e.value.option == "--replay" and "is not a file" in str(e.value)
    assert json.loads(record.read_text())["exit"] == 2
