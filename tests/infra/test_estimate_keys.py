"""The estimate is a model; what `orchestrate estimate --json` prints (and `plan --json` starts with) is its
dump. The keys below are those the dict-built estimate wrote before it became a model (#56): pinned, so a
renamed field breaks here, not in someone's script that reads the JSON."""

from __future__ import annotations

import json

from infra.plan import TrialConfig, estimate
from test_infra import NOW, study

ESTIMATE_KEYS = ["lines", "totals_usd", "total_usd", "reserved_usd", "budget_usd", "traffic", "isolated_ranks",
                 "isolated_host_bytes", "isolated_host_planned_bytes", "staging_bytes_per_host", "protocol_overhead",
                 "transfer_guard_bytes", "guard_fraction", "guard_stop_bytes", "stopped_days", "problems"]
LINE_KEYS = ["category", "item", "quantity", "unit", "unit_usd", "usd", "source"]
TRAFFIC_KEYS = ["arm", "kind", "world_size", "synchronizations", "payload_bytes_per_sync", "host_bytes_rx_plus_tx",
                "cross_zone_links", "cross_zone_bytes"]
RESERVATION_KEYS = ["compute", "transfer", "storage_other"]


def test_the_estimate_dumps_the_keys_it_always_wrote():
    est = estimate(TrialConfig.model_validate(study()), NOW)
    got = json.loads(json.dumps(est.model_dump(mode="json")))  # as `--json` prints it
    assert list(got) == ESTIMATE_KEYS
    assert {tuple(x) for x in got["lines"]} == {tuple(LINE_KEYS)}
    assert [list(t) for t in got["traffic"]] == [TRAFFIC_KEYS] * 3
    assert list(got["totals_usd"]) == list(got["reserved_usd"]) == RESERVATION_KEYS
    # by rank, as JSON writes an int key
    assert list(got["isolated_host_bytes"]) == list(got["isolated_host_planned_bytes"]) == ["3"]
    assert got["isolated_ranks"] == [3] and got["problems"] == []
    # the figures are the model's own, unchanged by the dump
    assert got["total_usd"] == est.total_usd and got["traffic"][1]["cross_zone_bytes"] == est.traffic[1].cross_zone_bytes
