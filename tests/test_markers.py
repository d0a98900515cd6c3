"""Every test gets its markers from what it reaches (tests/conftest.py, `markers_of`): `pytest -m unit`
is the quick loop only while the tests that start ranks, sshd, moto or a trial are never `unit`.
The suite is collected again here, in this process (its modules are already imported)."""

from __future__ import annotations

import fnmatch
import gc

import pytest

from conftest import EXPLICIT, GROUP_PATTERNS, MARKERS, ROOT, TESTS


@pytest.fixture(scope="module")
def collected() -> dict[str, tuple[set[str], str | None]]:
    """node id → (its markers among MARKERS, its xdist group or None), for every test of tests/."""
    got: dict[str, tuple[set[str], str | None]] = {}

    class Record:
        @pytest.hookimpl(trylast=True)
        def pytest_collection_modifyitems(self, items):
            for i in items:
                group = i.get_closest_marker("xdist_group")
                got[i.nodeid] = ({m.name for m in i.iter_markers() if m.name in MARKERS}, group and group.args[0])

    code = pytest.main(["--collect-only", "-qq", "-p", "no:cacheprovider", "--rootdir", str(ROOT), str(TESTS)],
                       plugins=[Record()])
    assert code == pytest.ExitCode.OK and got
    return got


@pytest.fixture
def marks(collected) -> dict[str, set[str]]:
    return {n: m for n, (m, _) in collected.items()}


def test_tests_that_share_what_a_worker_builds_share_that_worker(collected):
    """`--dist loadgroup` runs a group whole on one worker (tests/conftest.py, `group_of`): a module's
    namespace hosts, the finished trial, the compile tests, and a fixture a module builds for several of its
    tests — but not one `built_once`, which every worker reads."""
    group = {n: g for n, (_, g) in collected.items()}
    assert group["tests/orchestrate/test_ssh.py::test_host_keys_are_pinned"] == "netns-hosts:test_ssh"
    assert group["tests/orchestrate/test_cli.py::test_orchestrate_run_smoke"] == "finished-trial"
    assert group["tests/training/test_arms.py::test_compiled_step_matches_eager"] == "inductor"
    assert group["tests/orchestrate/test_serving.py::test_probe_three_phases"] == "module-fixtures:test_serving"
    assert group["tests/evidence/test_report.py::test_full_trial_report"] == "module-fixtures:test_report"
    assert group["tests/training/test_arms.py::test_ddp_four_ranks_equals_single"] is None  # `four` is built_once
    assert group["tests/evidence/test_checker.py::test_deep_nesting_is_malformed_not_a_crash"] is None
    stale = [p for p in GROUP_PATTERNS if not any(fnmatch.fnmatchcase(n, p) for n in group)]
    assert not stale, stale


def test_known_tests_get_their_markers(marks):
    assert marks["tests/evidence/test_checker.py::test_deep_nesting_is_malformed_not_a_crash"] == {"unit"}
    assert marks["tests/evidence/test_commitments.py::test_edited_entry_detected"] == {"unit"}
    assert "ssh" in marks["tests/orchestrate/test_ssh.py::test_host_keys_are_pinned"]  # the module-scoped NetnsHosts fixture
    assert "ssh" in marks["tests/orchestrate/test_netns_hosts.py::test_a_second_set_in_the_same_process_is_refused_at_once"]
    assert {"dist", "cuda"} <= marks["tests/training/test_arms.py::test_ddp_four_ranks_equals_single"]  # run_worker
    assert "dist" in marks["tests/evidence/test_report.py::test_full_trial_report"]  # the `trained` fixture's ranks
    assert "dist" in marks["tests/orchestrate/test_cli.py::test_orchestrate_run_smoke"]  # finished_trial
    assert marks["tests/orchestrate/test_cloud.py::test_reconcile_reports_what_still_bills"] >= {"aws"}  # moto
    assert "aws" in marks["tests/infra/test_infra.py::test_hosts"]  # the Pulumi program under mocks
    assert {"aws", "ssh"} <= marks["tests/orchestrate/test_aws_loop.py::test_the_aws_loop_in_emulation"]
    anchors = "tests/evidence/test_anchors.py::test_a_cut_log_and_an_unanchored_tail"
    assert marks[f"{anchors}[file]"] == {"unit"} and "aws" in marks[f"{anchors}[s3]"]  # EXPLICIT
    assert "slow" in marks["tests/training/test_scoring.py::test_batched_answers_equal_one_at_a_time_token_for_token"]
    assert marks["tests/training/test_powersgd.py::test_cholesky_qr2_falls_back_where_cholesky_cannot"] == {"unit", "cuda"}


def test_every_test_is_unit_or_marked_otherwise(marks):
    """`pytest -m unit` plus `pytest -m "not unit"` is the whole suite; `cuda` says only where a test runs."""
    assert all(m - {"cuda"} for m in marks.values())
    both = [n for n, m in marks.items() if "unit" in m and m - {"unit", "cuda"}]
    assert not both, both


def test_every_explicit_entry_still_names_a_test(marks):
    import fnmatch

    stale = [p for p in EXPLICIT if not any(fnmatch.fnmatchcase(n, p) for n in marks)]
    assert not stale, stale


def test_the_collector_is_on_while_tests_run():
    """conftest collects the suite with the cyclic collector paused (`long_lived`) and resumes it when
    collection ends: a test run with it paused would keep every cycle it made."""
    assert gc.isenabled()
