"""The trial's hosts: one g6e instance per rank in its zone (a name, or a zone ID: the same physical
zone in every account), logged in to with the operator's key (a key pair from the stack's
ssh_public_key); the deep-learning AMI pinned (ami_id) or looked up once and then kept; IMDSv2
required; shutdown = stop; a 300 GiB encrypted gp3 root volume with the same throughput, IOPS and
read-ahead everywhere (so no arm is slowed by its disk); an instance role that may write only the
trial's evidence objects and read only those and the trial's staging relay (infra/bucket.py)."""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from infra.concern import Concern
from infra.bucket import Evidence
from infra.guards import Guards
from infra.network import Network
from infra.plan import Host, TrialConfig
from infra.teardown import BUCKET_TAG, STACK_TAG
from infra.sweep import utc_text
from infra.userdata import user_data


TEARDOWN_AMI = "ami-teardown-never-launched"
"""The hosts' image as a teardown registers it: in destroy mode the engine keeps each host's stored inputs
(`step_generator.go`: a same step with the old inputs), and `ignore_changes` keeps the stored image anyway."""


class Hosts(Concern):
    """`instances`: (host, instance) in rank order, which the guards stop and the outputs list.
    `teardown`: registered for `pulumi destroy --run-program` (infra/__main__.py), when the operator's
    key may be gone: the key pair then keeps the public key the stack holds. `creating`: each instance's
    before-create hook (an operation that lost the trial's lease creates no host)."""

    def __init__(self, cfg: TrialConfig, refuse: pulumi.ResourceHook, network: Network, evidence: Evidence,
                 guards: Guards, *, stack: str, teardown: bool = False, creating: pulumi.ResourceHook | None = None,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("Hosts", cfg, refuse, opts)
        name, tags = self.name, self.tags
        assert cfg.deadline is not None  # the plan refuses a stack without one before anything exists
        # instance role: write (and read back) only the trial's evidence objects; read its staging relay
        role = aws.iam.Role(name("host"), tags=tags, opts=self.child(), assume_role_policy=json.dumps({
            "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                    "Principal": {"Service": "ec2.amazonaws.com"}}]}))
        aws.iam.RolePolicy(name("host-evidence"), role=role.id, policy=evidence.host_policy, opts=self.child())
        profile = aws.iam.InstanceProfile(name("host"), role=role.name, tags=tags, opts=self.child())

        # the image: pinned in the stack (ami_id), or the newest match at the first `pulumi up`. Either way a
        # host keeps the image it was created with (ignore_changes below): a new AMI release must never
        # replace a host, whose disk holds unpreserved evidence. The id is exported to be pinned. A teardown
        # looks nothing up (the lookup can fail once the image is gone, and a destroy reads the hosts from
        # the stack's state): the placeholder is never launched, and is refused by EC2 if it ever were
        ami_id = cfg.ami_id or (TEARDOWN_AMI if teardown else aws.ec2.get_ami(
            most_recent=True, owners=["amazon"],
            filters=[aws.ec2.GetAmiFilterArgs(name="name", values=[cfg.ami_name]),
                     aws.ec2.GetAmiFilterArgs(name="architecture", values=["x86_64"])]).id)
        isolated = set(cfg.isolated_ranks())
        assert cfg.ssh_public_key is not None or teardown  # a missing one is among the plan's problems
        key = aws.ec2.KeyPair(name("operator"), key_name=name("operator"), public_key=cfg.ssh_public_key or "",
                              tags=tags, opts=self.child(ignore_changes=["publicKey"] if teardown else None))
        # a host's volume goes with it: like every child, an instance refuses its delete until the trial is
        # preserved (infra/concern.py). It exists only once the stops that need no id exist (`depends_on`), and
        # the ones that need its id follow it at once (guards.cover), waiting for no other host
        self.instances: list[tuple[Host, aws.ec2.Instance]] = []
        for h in cfg.by_rank:
            inst = aws.ec2.Instance(
                name("rank", h.rank), ami=ami_id, instance_type=h.instance_type,
                subnet_id=network.subnets[h.zone].id, availability_zone=None if h.zone_is_id else h.zone,
                vpc_security_group_ids=[network.sg.id], iam_instance_profile=profile.name,
                key_name=key.key_name, instance_initiated_shutdown_behavior="stop",
                # instance tags in the metadata: the host's deadline check reads its grace there (infra/userdata.py)
                metadata_options=aws.ec2.InstanceMetadataOptionsArgs(http_tokens="required", http_endpoint="enabled",
                                                                     http_put_response_hop_limit=1,
                                                                     instance_metadata_tags="enabled"),
                root_block_device=aws.ec2.InstanceRootBlockDeviceArgs(
                    volume_type="gp3", volume_size=cfg.volume.size_gib, encrypted=True, iops=cfg.volume.iops,
                    throughput=cfg.volume.throughput_mb_s, delete_on_termination=True,
                    tags={**tags, "rank": str(h.rank)}),
                user_data=user_data(trial=cfg.trial, rank=h.rank, deadline=cfg.deadline,
                                    read_ahead_kib=cfg.volume.read_ahead_kib, login_user=cfg.ssh_user,
                                    transfer_guard_bytes=cfg.transfer_guard_bytes if h.rank in isolated else None,
                                    guard_fraction=cfg.guard_fraction, grace_cap_minutes=cfg.grace_cap_minutes),
                # a changed boot script must never replace a host: its disk holds unpreserved evidence
                user_data_replace_on_change=False,
                # the deadline and the grace cap as the stack has them now: the host's own check reads these
                # (infra/userdata.py), so a moved deadline reaches a host whose boot script is never re-run
                # `pulumi-stack`: whose instance it is, where two stacks use one trial name (infra/held.py)
                tags={**tags, "rank": str(h.rank), "Name": name("rank", h.rank), BUCKET_TAG: evidence.bucket.bucket,
                      STACK_TAG: stack,
                      "trial-deadline": utc_text(cfg.deadline),
                      "trial-grace-cap-seconds": str(int(cfg.grace_cap_minutes * 60))},
                # `creating`: no host is created by an operation that no longer holds the trial's lease (infra/lease.py)
                opts=self.child(ignore_changes=["userData", "ami"], depends_on=guards.before_hosts,
                                before_create=[creating] if creating is not None else None))
            self.instances.append((h, inst))
            guards.cover(h, inst)
        # the image the hosts run (their stored state, kept by ignore_changes), not this run's lookup:
        # after a new release the two differ, and this is the id to pin
        self.ami: pulumi.Output[str] = self.instances[0][1].ami
        self.register_outputs({"instance_ids": [i.id for _, i in self.instances], "ami": self.ami})
