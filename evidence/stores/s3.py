"""`s3://BUCKET/PREFIX`: boto3 with s3transfer (multipart above 64 MiB, a SHA-256 checksum sent with
every upload). A stack's hosts read the trial's bucket with their instance role, so staging can
relay through it. boto3 is imported when a store is opened, never with this module: a controller
with only file stores does not need it."""

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
        import boto3
        from boto3.s3.transfer import TransferConfig

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
        self.s3.upload_file(str(path), self.bucket, self._key(key), Config=self.transfer,
                            ExtraArgs={"ChecksumAlgorithm": "SHA256", "Metadata": {"sha256": sha256}})

    def put_bytes(self, key: str, data: bytes) -> None:
        digest = base64.b64encode(hashlib.sha256(data).digest()).decode()
        self.s3.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, ChecksumSHA256=digest)

    def size(self, key: str) -> int | None:
        from botocore.exceptions import ClientError

        try:
            return int(self.s3.head_object(Bucket=self.bucket, Key=self._key(key))["ContentLength"])
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise

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
