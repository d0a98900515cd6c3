"""The trial's evidence bucket: versioned, encrypted by default, public access blocked, owner-enforced,
TLS only, with optional object lock; and what a host may do in it, which is narrower than what the
operator may (the hosts' role attaches it: infra/hosts.py).

The evidence outlives the stack: the bucket and every setting that keeps it safe are
`retain_on_delete`, so `pulumi destroy` drops them from the stack's state and deletes nothing of them
(pulumi/pulumi `pkg/resource/deploy/step.go`, `DeleteStep.Apply`: a retained resource's delete is a
no-op). Without that, the destroy of a preserved trial would delete the public-access block, the TLS
policy and the encryption default and then fail on the bucket (`BucketNotEmpty`: it is versioned and
`force_destroy` is off); with `force_destroy` it would delete the evidence. Deleting the evidence is a
separate, deliberate act (docs/evidence.md says how and what keeping it costs). A later `pulumi up` of
the same stack creates a new bucket (`bucket_prefix` draws a new name) beside the kept one.

The module is not named `evidence`: the engine runs the program with infra/ first on `sys.path`, where
such a module would hide the `evidence` package (infra/__main__.py)."""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from infra.concern import Concern
from infra.plan import TrialConfig


def host_access(arn: str, prefix: str) -> str:
    """The policy of a host's role on the bucket `arn`, for the trial's `prefix`."""
    return json.dumps({
        "Version": "2012-10-17", "Statement": [
            # a host writes only content-addressed objects (its checkpoint payloads, named by their
            # sha256): the indexes and the log's anchors, which the destroy hook trusts, are the
            # operator's alone
            {"Sid": "TrialPrefixObjects", "Effect": "Allow",
             "Action": ["s3:PutObject", "s3:GetObject", "s3:GetObjectAttributes", "s3:AbortMultipartUpload",
                        "s3:ListMultipartUploadParts"],
             "Resource": f"{arn}/{prefix}objects/*"},
            # staging's relay: the controller puts the wheels and the seed here once, each host reads
            # them in region (evidence/relay.py); a host never writes what another host will install
            {"Sid": "TrialStagingRead", "Effect": "Allow", "Action": "s3:GetObject",
             "Resource": f"{arn}/{prefix}staging/*"},
            {"Sid": "TrialPrefixList", "Effect": "Allow", "Action": "s3:ListBucket", "Resource": arn,
             "Condition": {"StringLike": {"s3:prefix": [f"{prefix}*"]}}}]})


KEEP = {"retain_on_delete": True}
"""The options of everything in this concern: kept in the account when the stack is destroyed."""


class Evidence(Concern):
    """`bucket`, the trial's `prefix` in it (trials/<trial>/), and `host_policy`: the document a host's
    role carries."""

    def __init__(self, cfg: TrialConfig, refuse: pulumi.ResourceHook, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("Evidence", cfg, refuse, opts)
        name = self.name
        bucket = self.bucket = aws.s3.Bucket(
            name("evidence"), bucket_prefix=name("evidence-")[:37], tags=self.tags,
            object_lock_enabled=cfg.object_lock_days is not None, force_destroy=False, opts=self.child(**KEEP))
        aws.s3.BucketVersioning(
            name("evidence-versioning"), bucket=bucket.id, opts=self.child(**KEEP),
            versioning_configuration=aws.s3.BucketVersioningVersioningConfigurationArgs(status="Enabled"))
        aws.s3.BucketServerSideEncryptionConfiguration(
            name("evidence-sse"), bucket=bucket.id, opts=self.child(**KEEP),
            rules=[aws.s3.BucketServerSideEncryptionConfigurationRuleArgs(
                apply_server_side_encryption_by_default=aws.s3.
                BucketServerSideEncryptionConfigurationRuleApplyServerSideEncryptionByDefaultArgs(sse_algorithm="AES256"),
                bucket_key_enabled=True)])
        aws.s3.BucketPublicAccessBlock(name("evidence-private"), bucket=bucket.id, block_public_acls=True,
                                       block_public_policy=True, ignore_public_acls=True, restrict_public_buckets=True,
                                       opts=self.child(**KEEP))
        aws.s3.BucketOwnershipControls(
            name("evidence-owner"), bucket=bucket.id, opts=self.child(**KEEP),
            rule=aws.s3.BucketOwnershipControlsRuleArgs(object_ownership="BucketOwnerEnforced"))
        aws.s3.BucketPolicy(name("evidence-tls"), bucket=bucket.id, opts=self.child(**KEEP),
                            policy=bucket.arn.apply(lambda arn: json.dumps({
                                "Version": "2012-10-17", "Statement": [{
                                    "Sid": "TLSOnly", "Effect": "Deny", "Principal": "*", "Action": "s3:*",
                                    "Resource": [arn, f"{arn}/*"],
                                    "Condition": {"Bool": {"aws:SecureTransport": "false"}}}]})))
        if cfg.object_lock_days:
            aws.s3.BucketObjectLockConfiguration(
                name("evidence-lock"), bucket=bucket.id, opts=self.child(**KEEP),
                rule=aws.s3.BucketObjectLockConfigurationRuleArgs(
                    default_retention=aws.s3.BucketObjectLockConfigurationRuleDefaultRetentionArgs(
                        mode="GOVERNANCE", days=cfg.object_lock_days)))
        self.prefix = prefix = f"trials/{cfg.trial}/"
        self.host_policy: pulumi.Output[str] = bucket.arn.apply(lambda arn: host_access(arn, prefix))
        self.register_outputs({"bucket": bucket.bucket, "prefix": prefix})
