"""`orchestrate plan --json` and `orchestrate status --json` print dumps of models (PlanOutcome,
TrialStatus); the keys below are those the dict-built records had before they became models (#56),
including the ones a record leaves out when it did not learn them (zones not checked, an idle rank, a
host that did not answer)."""

from __future__ import annotations

import datetime as dt
import json

from conftest import example_stack
from orchestrate.cli.plan import _stack_config
from orchestrate.cluster import Cluster, local_cluster
from orchestrate.stages.plan import plan_arm
from orchestrate.status import trial_status

PLAN_KEYS = ["lines", "totals_usd", "total_usd", "reserved_usd", "budget_usd", "traffic", "isolated_ranks",
             "isolated_host_bytes", "isolated_host_planned_bytes", "staging_bytes_per_host", "protocol_overhead",
             "transfer_guard_bytes", "guard_fraction", "guard_stop_bytes", "stopped_days", "problems",
             "arm", "experiment", "profile", "hours", "deadline", "vcpu", "placement", "staging", "zones",
             "attainability", "scaled"]
STAGING_KEYS = ["hosts", "seed_bytes", "wheelhouse_bytes", "uplink_mbps", "bytes", "hours", "ssh_only_bytes",
                "ssh_only_hours"]
STATUS_KEYS = ["source", "trial", "at", "hosts", "transfer_guard_bytes", "deadline", "seconds_to_deadline", "spend",
               "addresses", "outside", "alerts"]
FACTS = ["rank", "host", "zone", "guarded", "reachable"]


def test_the_plan_dumps_the_keys_it_always_wrote(tmp_path):
    stack = example_stack(tmp_path)
    got = plan_arm(_stack_config(stack), stack, "diloco-four", wheelhouse=None, uplink_mbps=100, quota=False,
                   now=dt.datetime.now(dt.timezone.utc)).model_dump(mode="json")
    assert list(got) == PLAN_KEYS
    assert list(got["vcpu"]) == ["hosts_vcpus", "quota", "note"]
    assert list(got["staging"]) == STAGING_KEYS
    assert got["zones"] == {"checked": False, "note": "not checked (--no-quota: no AWS reads)"}
    assert list(got["placement"]) == ["cluster", "arms", "serving"]
    assert list(got["placement"]["cluster"]) == ["source", "hosts", "gpus_per_host", "controller_gpus", "gpus_from"]
    assert [list(a) for a in got["placement"]["arms"]] == \
        [["arm", "kind", "world_size", "runs", "reason", "gpus_known"]] * 3
    assert list(got["placement"]["serving"]) == ["arm", "replicas", "runs", "reason"]
    assert got["problems"] == [] and got["scaled"] == []


def test_status_dumps_what_it_learned_and_nothing_else(tmp_path, monkeypatch):
    """Rank 0 finished an arm, rank 1 has none (idle), rank 2's host does not answer."""
    beat = tmp_path / "home" / "runs" / "clean-pair" / "rank-0" / "heartbeat.json"
    beat.parent.mkdir(parents=True)
    beat.write_text(json.dumps({"pid": 2**22 + 1, "time": 0, "update": 16}))
    (beat.parent / "result.json").write_text("{}")
    reach = Cluster.transport

    def transport(self, h, **kw):
        if h.rank == 2:
            raise OSError("no route to host")
        return reach(self, h, **kw)

    monkeypatch.setattr(Cluster, "transport", transport)
    c = local_cluster(3, tmp_path, "file:///unused")
    got = json.loads(json.dumps(trial_status(c, tmp_path / "home").dump()))  # as `status --json` prints it
    assert list(got) == STATUS_KEYS
    finished, idle, gone = got["hosts"]
    assert list(finished) == FACTS + ["arm", "finished", "alive", "update", "heartbeat_age_s", "state", "bytes_rx_tx"]
    assert (finished["state"], finished["arm"], finished["update"]) == ("finished", "clean-pair", 16)
    assert list(idle) == FACTS + ["arm", "state", "bytes_rx_tx"] and (idle["arm"], idle["state"]) == (None, "idle")
    # (a host that does not answer had its error before its state: the order was the failure's path)
    assert sorted(gone) == sorted(FACTS + ["error", "state"]) and (gone["reachable"], gone["state"]) == \
        (False, "unreachable")
    assert got["spend"] is None and got["addresses"] is None and got["outside"] is None and got["alerts"] is None
