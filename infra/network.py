"""The trial's network: a VPC, one public subnet per chosen zone, an internet gateway, and a security
group whose every port accepts only its own members (NCCL and rendezvous pick their ports at run time,
so the group, not a port list, is the boundary) and SSH only from the operator's CIDR."""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from infra.concern import Concern
from infra.existing import VPC_CIDR
from infra.plan import TrialConfig, is_zone_id


class Network(Concern):
    """`subnets` by zone (as the stack names it: a zone name or a zone ID) and the members' group `sg`,
    which the hosts join."""

    def __init__(self, cfg: TrialConfig, refuse: pulumi.ResourceHook, cidrs: dict[str, str],
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("Network", cfg, refuse, opts)
        name, tags = self.name, self.tags
        vpc = aws.ec2.Vpc(name("vpc"), cidr_block=VPC_CIDR, enable_dns_hostnames=True,
                          enable_dns_support=True, tags=tags, opts=self.child())
        igw = aws.ec2.InternetGateway(name("igw"), vpc_id=vpc.id, tags=tags, opts=self.child())
        routes = aws.ec2.RouteTable(name("routes"), vpc_id=vpc.id, tags=tags, opts=self.child(),
                                    routes=[aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", gateway_id=igw.id)])
        self.subnets: dict[str, aws.ec2.Subnet] = {}
        # `cidrs`: every zone of the hosts, and every zone whose subnet the account still holds (infra/existing.py):
        # a zone no host uses any more keeps its subnet while the trial lives — deleting it would be a delete
        # during a live trial, which the check refuses (infra/teardown.py); a destroy takes it with the rest
        for zone in sorted(cidrs):
            # a zone ID (use1-az4) names the same physical zone in every account; a name may not. The CIDR is
            # the one an existing subnet has: a new CIDR would replace it and its hosts. The `zone` tag says how
            # the stack named it: a name and an ID of the same zone are two subnets to Pulumi (infra/existing.py)
            where = {"availability_zone_id": zone} if is_zone_id(zone) else {"availability_zone": zone}
            self.subnets[zone] = aws.ec2.Subnet(name("subnet", zone), vpc_id=vpc.id, **where,
                                                cidr_block=cidrs[zone], map_public_ip_on_launch=True,
                                                tags={**tags, "zone": zone}, opts=self.child())
            aws.ec2.RouteTableAssociation(name("routes", zone), subnet_id=self.subnets[zone].id,
                                          route_table_id=routes.id, opts=self.child())
        sg = self.sg = aws.ec2.SecurityGroup(name("members"), vpc_id=vpc.id, tags=tags, opts=self.child(),
                                             description=f"trial {cfg.trial}: members only; SSH from the operator")
        aws.vpc.SecurityGroupIngressRule(name("members-in"), security_group_id=sg.id, ip_protocol="-1",
                                         referenced_security_group_id=sg.id, tags=tags, opts=self.child(),
                                         description="NCCL and rendezvous: members of this group only")
        aws.vpc.SecurityGroupIngressRule(name("ssh-in"), security_group_id=sg.id, ip_protocol="tcp", from_port=22,
                                         to_port=22, cidr_ipv4=cfg.operator_cidr, tags=tags, opts=self.child(),
                                         description="SSH from the operator")
        aws.vpc.SecurityGroupEgressRule(name("members-out"), security_group_id=sg.id, ip_protocol="-1",
                                        referenced_security_group_id=sg.id, tags=tags, opts=self.child(),
                                        description="to members")
        aws.vpc.SecurityGroupEgressRule(name("https-out"), security_group_id=sg.id, ip_protocol="tcp",
                                        from_port=443, to_port=443, cidr_ipv4="0.0.0.0/0", tags=tags,
                                        opts=self.child(), description="HTTPS: S3 evidence uploads, AWS APIs")
        self.register_outputs({"vpc_id": vpc.id, "security_group": sg.id,
                               "subnet_ids": {zone: s.id for zone, s in self.subnets.items()}})
