"""`s3://BUCKET/PREFIX`: boto3 with s3transfer (multipart above 64 MiB, a SHA-256 checksum sent with
every upload). A stack's hosts read the trial's bucket with their instance role, so staging can
relay through it. boto3 is imported when a store is opened, never with this module: a controller
with only file stores does not need it.

Whether an object exists is asked with HeadObject, which S3 answers with 404 for a missing key only to
a caller that may list the bucket (s3:ListBucket); to anyone else it answers 403, the answer it gives
for "not yours to read" (AWS's HeadObject reference, docs/aws.md #31). The hosts' role may list only
under the trial's prefix (a condition on s3:prefix, a key that HeadObject does not carry), so a host
asking about an object not written yet gets a 403. `size` then lists under the key itself, which the
condition allows: the key in the listing is there, a key absent from it is not. A 403 on both, or on
the upload itself, is a real permission problem and is raised, naming the object."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from typing import Any, ClassVar, Iterator
from urllib.parse import urlparse

from evidence.stores.base import CHUNK, PreservationError


class S3Store:
    form: ClassVar[str] = "s3://BUCKET/PREFIX"
    staging_relay: ClassVar[bool] = True

    def __init__(self, bucket: str, prefix: str, session: Any = None, multipart_mb: int = 64):
        # start-up: boto3 ~0.2 s, paid only where an s3:// store is opened (see the module's note)
        import boto3
        from boto3.exceptions import S3UploadFailedError
        from boto3.s3.transfer import TransferConfig
        from botocore.exceptions import ClientError

        self._refused = (ClientError, S3UploadFailedError)  # an upload's refusal, from s3transfer or S3 itself
        self._client_error = ClientError
        self.bucket, self.prefix = bucket, prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.url = self.url_for(bucket, self.prefix)
        self.s3 = (session or boto3.Session()).client("s3")
        self.transfer = TransferConfig(multipart_threshold=multipart_mb << 20,
                                       multipart_chunksize=multipart_mb << 20)

    @staticmethod
    def url_for(bucket: str, prefix: str) -> str:
        """A bucket and prefix as a store URL (a stack's outputs name the two apart)."""
        return f"s3://{bucket}/{prefix}"

    @classmethod
    def from_url(cls, url: str, session: Any = None, **options: Any) -> "S3Store":
        u = urlparse(url)
        if not u.netloc:
            raise PreservationError(f"{url}: an s3 URL names a bucket ({cls.form})")
        return cls(u.netloc, u.path, session, **options)

    def _key(self, key: str) -> str:
        return self.prefix + key

    def put_file(self, key: str, path: Path, sha256: str) -> None:
        try:
            self.s3.upload_file(str(path), self.bucket, self._key(key), Config=self.transfer,
                                ExtraArgs={"ChecksumAlgorithm": "SHA256", "Metadata": {"sha256": sha256}})
        except self._refused as e:  # AccessDenied above all: never taken for success
            raise PreservationError(f"{self.url}{key}: the store refused the upload of {path}: {e}") from e

    def put_bytes(self, key: str, data: bytes) -> None:
        digest = base64.b64encode(hashlib.sha256(data).digest()).decode()
        try:
            self.s3.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, ChecksumSHA256=digest)
        except self._client_error as e:
            raise PreservationError(f"{self.url}{key}: the store refused the upload: {e}") from e

    def size(self, key: str) -> int | None:
        """The object's size, None when S3 does not hold it. A 403 to HeadObject may mean either "missing"
        or "not yours" (see the module's note): the listing under the key decides; a 403 there too raises."""
        try:
            return int(self.s3.head_object(Bucket=self.bucket, Key=self._key(key))["ContentLength"])
        except self._client_error as e:
            code = _code(e)
            if code in ("404", "NoSuchKey", "NotFound"):
                return None
            if code not in ("403", "AccessDenied", "Forbidden"):
                raise
            head = e
        try:  # the exact key sorts first among the keys it prefixes: one key answers
            listed = self.s3.list_objects_v2(Bucket=self.bucket, Prefix=self._key(key), MaxKeys=1)
        except self._client_error as e:
            raise PreservationError(
                f"{self.url}{key}: S3 refused both HeadObject ({_code(head)}) and a listing under the key "
                f"({_code(e)}): these credentials cannot tell whether the object exists; they need s3:GetObject "
                "on it and s3:ListBucket for its prefix") from e
        for o in listed.get("Contents", []):
            if o["Key"] == self._key(key):
                return int(o["Size"])
        return None

    def list(self, prefix: str) -> list[str]:
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self._key(prefix))
        return sorted(o["Key"][len(self.prefix):] for page in pages for o in page.get("Contents", []))

    def read_chunks(self, key: str) -> Iterator[bytes]:
        body = self.s3.get_object(Bucket=self.bucket, Key=self._key(key))["Body"]
        try:
            while chunk := body.read(CHUNK):
                yield chunk
        finally:
            body.close()


def _code(e: Exception) -> str:
    """A botocore ClientError's code ("403" for a HEAD, whose error has no body to name it)."""
    return str(getattr(e, "response", {}).get("Error", {}).get("Code", ""))
