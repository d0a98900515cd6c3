"""What an `up` would do to the hosts and subnets the account already holds (infra/existing.py), decided
from the lookups alone: a rank gone, a zone changed (also when the stack now writes its zones as IDs
instead of names, or back: another subnet to Pulumi), an instance type changed; and the CIDRs a zone's
subnet gets, existing ones kept. The program's use of them through the engine: tests/infra/test_failures.py."""

from __future__ import annotations

import pytest

from infra.existing import Existing, SeenHost, SeenSubnet, host_changes, subnet_cidrs
from infra.plan import TrialConfig
from test_infra import study

pytestmark = pytest.mark.unit


def cfg(zones: list[str], **changes) -> TrialConfig:
    hosts = [{"rank": r, "instance_type": "g6e.xlarge", "zone": z} for r, z in enumerate(zones)]
    return TrialConfig.model_validate(study(hosts=hosts, arms=[{"name": "single", "kind": "single", "world_size": 1,
                                                                 "updates": 128}], **changes))


def account(zones: list[tuple[str, str, str | None]], hosts: list[tuple[int | None, int]]) -> Existing:
    """`zones`: (name, id, zone tag) per subnet, numbered 0.. in that order; `hosts`: (rank, subnet index)."""
    subnets = [SeenSubnet(subnet_id=f"subnet-{i}", zone_name=n, zone_id=z, cidr=f"10.42.{i}.0/24", named=tag)
               for i, (n, z, tag) in enumerate(zones)]
    return Existing(subnets=subnets, hosts=[
        SeenHost(instance_id=f"i-{k:017x}", rank=rank, instance_type="g6e.xlarge", zone_name=zones[sub][0],
                 subnet_id=f"subnet-{sub}", bucket="b") for k, (rank, sub) in enumerate(hosts)])


C, D, A = ("us-east-1c", "use1-az6", None), ("us-east-1d", "use1-az1", None), ("us-east-1a", "use1-az4", None)


def test_the_same_hosts_change_nothing():
    seen = account([C, D], [(0, 0), (1, 0), (2, 0), (3, 1)])
    assert host_changes(cfg(["us-east-1c"] * 3 + ["us-east-1d"]), seen) == []
    # a zone-ID stack, tagged or not
    ids = account([("us-east-1c", "use1-az6", "use1-az6"), ("us-east-1d", "use1-az1", None)], [(0, 0), (3, 1)])
    assert host_changes(cfg(["use1-az6", "use1-az6", "use1-az6", "use1-az1"]), ids) == []


def test_a_dropped_a_moved_and_a_resized_host_are_named():
    seen = account([C, D], [(0, 0), (1, 0), (2, 0), (3, 1), (None, 1)])  # the last: tagged, but not ours
    said = {h.rank: what for h, what in host_changes(cfg(["us-east-1c", "us-east-1a", "us-east-1c"],
                                                         prices={"instance/g6e.2xlarge": 2.24}), seen)}
    assert said == {1: "would be replaced (terminated, a new one created): zone us-east-1c -> us-east-1a",
                    3: "would be terminated: its rank is no longer in trials:cluster.hosts"}
    c = cfg(["us-east-1c"] * 3 + ["us-east-1d"], prices={"instance/g6e.2xlarge": 2.24})
    c.hosts[2].instance_type = "g6e.2xlarge"
    assert [(h.rank, what) for h, what in host_changes(c, seen)] == [
        (2, "would be stopped and started again: instance type g6e.xlarge -> g6e.2xlarge")]


def test_writing_the_same_zone_as_an_id_instead_of_a_name_replaces_its_hosts():
    """The subnet's logical name is the zone as the stack wrote it: `use1-az6` is another subnet than
    `us-east-1c`, though the same physical zone, and its hosts would move to it. The `zone` tag says how the
    existing subnet was written."""
    seen = account([("us-east-1c", "use1-az6", "us-east-1c"), ("us-east-1d", "use1-az1", "us-east-1d")],
                   [(0, 0), (3, 1)])
    said = {h.rank: what for h, what in host_changes(cfg(["use1-az6", "use1-az6", "use1-az6", "use1-az1"]), seen)}
    assert said == {0: "would be replaced (terminated, a new one created): zone us-east-1c -> use1-az6",
                    3: "would be replaced (terminated, a new one created): zone us-east-1d -> use1-az1"}


def test_existing_subnets_keep_their_cidr_and_their_zone():
    four = cfg(["us-east-1c"] * 3 + ["us-east-1d"])
    assert subnet_cidrs(four, None) == {"us-east-1c": "10.42.0.0/24", "us-east-1d": "10.42.1.0/24"}  # as before
    seen = account([C, D], [(0, 0), (3, 1)])
    five = cfg(["us-east-1c"] * 3 + ["us-east-1d", "us-east-1a"])
    assert subnet_cidrs(five, seen) == {"us-east-1a": "10.42.2.0/24", "us-east-1c": "10.42.0.0/24",
                                        "us-east-1d": "10.42.1.0/24"}  # sorted first, numbered after
    moved = cfg(["us-east-1c"] * 3 + ["us-east-1e"])  # rank 3 moved after a capacity refusal
    assert subnet_cidrs(moved, seen) == {"us-east-1c": "10.42.0.0/24", "us-east-1d": "10.42.1.0/24",
                                         "us-east-1e": "10.42.2.0/24"}  # d's subnet stays registered
    seen_ids = account([("us-east-1c", "use1-az6", "use1-az6")], [(0, 0)])
    assert subnet_cidrs(cfg(["use1-az6", "use1-az4"]), seen_ids) == {"use1-az4": "10.42.1.0/24",
                                                                     "use1-az6": "10.42.0.0/24"}
