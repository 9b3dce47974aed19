"""The file sink's S3 side, through boto3: objects, multipart uploads, listing.

Every key the sink touches is ``<prefix>/<rel>`` where ``rel`` is the same relative path the
local layout uses. Credentials come from the sink's options (``SecretStr``, never logged) or
boto3's default chain.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eosink import ConfigError, MissingExtraError, SinkError
from eosink._s3 import local_tmp_dir as local_tmp_dir
from eosink._s3 import new_s3_client, s3_client, split_s3

if TYPE_CHECKING:
    from .options import FileSinkOptions

log = logging.getLogger("eosink.file")

MIN_PART_BYTES = 5 * 1024 * 1024
"""S3's smallest part (every part of a multipart upload but the last)."""

PROBE_CONNECT_TIMEOUT = 5.0
"""Seconds the start-up probe (:meth:`S3Store.check_bucket`) waits for a connection."""
PROBE_READ_TIMEOUT = 10.0
"""Seconds the start-up probe waits for an answer."""
PROBE_ATTEMPTS = 2
"""Attempts of the start-up probe (botocore's ``max_attempts``: the first one included)."""

DROP_LOST_HINT = (
    "stop the job and run `eosink recover --drop-lost-open-files` (docs/cli.md) to record the "
    "loss and let the sink go on"
)
"""The way out of an open rolling file whose rows were destroyed outside eosink, said by
every error that meets one (docs/cli.md, "An open rolling file destroyed behind eosink's
back")."""


@dataclass(frozen=True)
class Part:
    """One uploaded part of a multipart upload."""

    n: int
    etag: str
    bytes: int

    def as_dict(self) -> dict[str, Any]:
        return {"n": self.n, "etag": self.etag, "bytes": self.bytes}


class S3Store:
    """The bucket and prefix of one file sink."""

    def __init__(self, opts: FileSinkOptions) -> None:
        self.path = opts.path
        self.bucket, self.prefix = split_s3(opts.path)
        self.part_bytes = opts.s3_part_bytes
        self._args = (
            opts.s3_endpoint_url,
            opts.s3_region,
            opts.s3_access_key_id,
            opts.s3_secret_access_key.get_secret_value() if opts.s3_secret_access_key else None,
            opts.s3_session_token.get_secret_value() if opts.s3_session_token else None,
        )

    @property
    def client(self) -> Any:
        return s3_client(*self._args, what="the file sink on s3://")

    def key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def rel(self, key: str) -> str:
        return key[len(self.prefix) + 1 :] if self.prefix else key

    def url(self, rel: str) -> str:
        return f"s3://{self.bucket}/{self.key(rel)}"

    # -- objects -----------------------------------------------------------------------------
    def probe_client(self) -> Any:
        """A fresh client with short timeouts and few attempts, for the start-up probe: a
        refused or silent endpoint fails in seconds, not after minutes of retries."""
        try:
            import boto3  # noqa: F401
        except ImportError as exc:  # pragma: no cover - exercised without the extra
            raise MissingExtraError("boto3", "s3", "the file sink on s3://") from exc
        return new_s3_client(
            self._args,
            connect_timeout=PROBE_CONNECT_TIMEOUT,
            read_timeout=PROBE_READ_TIMEOUT,
            retries={"max_attempts": PROBE_ATTEMPTS, "mode": "standard"},
        )

    def check_bucket(self, read: str | None = None) -> bytes | None:
        """Check, in bounded time, that the bucket is reachable with the credentials, before
        anything is written; with ``read``, also return that object's bytes (None if absent).

        Raises:
            ConfigError: no credentials (options nor boto3's chain), or credentials S3
                refuses.
            SinkError: the endpoint cannot be reached (named, with what was tried), or the
                bucket cannot be used.
        """
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            NoCredentialsError,
            PartialCredentialsError,
        )
        from botocore.exceptions import ConnectionError as BotoConnectionError

        try:
            client = self.probe_client()
        except (BotoCoreError, ValueError) as exc:  # e.g. an AWS_ENDPOINT_URL it cannot parse
            raise ConfigError(
                f"the file sink cannot use {self.path}: {exc} (check s3_endpoint_url, "
                "AWS_ENDPOINT_URL and s3_region)"
            ) from None
        endpoint = client.meta.endpoint_url
        tried = (
            f"{PROBE_ATTEMPTS} attempt(s), connect timeout {PROBE_CONNECT_TIMEOUT:g} s, "
            f"read timeout {PROBE_READ_TIMEOUT:g} s"
        )
        try:
            client.head_bucket(Bucket=self.bucket)
            if read is None:
                return None
            try:
                body = client.get_object(Bucket=self.bucket, Key=self.key(read))["Body"]
                return bytes(body.read())
            except ClientError as exc:
                if self.missing(exc):
                    return None
                raise
        except (NoCredentialsError, PartialCredentialsError) as exc:
            raise ConfigError(
                f"the file sink found no S3 credentials for {self.path} ({exc}): give "
                "s3_access_key_id and s3_secret_access_key (and s3_session_token for temporary "
                "ones), or configure boto3's credential chain (AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, AWS_PROFILE and ~/.aws/credentials, an instance or pod "
                "role). Nothing was written"
            ) from None
        except BotoConnectionError as exc:
            raise SinkError(
                f"the file sink cannot reach the S3 endpoint {endpoint} for {self.path} "
                f"(HeadBucket {self.bucket!r}: {tried}): {exc}. Check s3_endpoint_url (or "
                "AWS_ENDPOINT_URL) and s3_region, and that the endpoint is up and reachable "
                "from the driver. Nothing was written"
            ) from None
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in (
                "InvalidAccessKeyId",
                "SignatureDoesNotMatch",
                "InvalidToken",
                "ExpiredToken",
                "InvalidClientTokenId",
            ):
                raise ConfigError(
                    f"S3 at {endpoint} refused the file sink's credentials for {self.path} "
                    f"({code}): check s3_access_key_id, s3_secret_access_key and "
                    "s3_session_token (or boto3's credential chain). Nothing was written"
                ) from None
            raise SinkError(
                f"the file sink cannot use bucket {self.bucket!r} at {endpoint} "
                f"({code or exc}): create it, or check s3_endpoint_url and the credentials. "
                "Nothing was written"
            ) from None
        except BotoCoreError as exc:
            raise SinkError(
                f"the file sink cannot check bucket {self.bucket!r} at {endpoint} for "
                f"{self.path} ({tried}): {exc}. Nothing was written"
            ) from None

    @staticmethod
    def missing(exc: BaseException) -> bool:
        """Whether a boto3 error says the object does not exist."""
        code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
        return code in ("404", "NoSuchKey", "NotFound")

    def size(self, rel: str) -> int | None:
        from botocore.exceptions import ClientError

        try:
            return int(
                self.client.head_object(Bucket=self.bucket, Key=self.key(rel))["ContentLength"]
            )
        except ClientError as exc:
            if self.missing(exc):
                return None
            raise

    def get(self, rel: str) -> bytes:
        body = self.client.get_object(Bucket=self.bucket, Key=self.key(rel))["Body"]
        return bytes(body.read())

    def put(self, rel: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self.key(rel), Body=data)

    def upload_file(self, local: Path, rel: str) -> None:
        self.client.upload_file(str(local), self.bucket, self.key(rel))

    def download(self, rel: str, local: Path) -> None:
        self.client.download_file(self.bucket, self.key(rel), str(local))

    def objects(self, rel_prefix: str) -> Iterator[tuple[str, int]]:
        """``(rel, size)`` of every object under ``rel_prefix``."""
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.key(rel_prefix)
        )
        for page in pages:
            for o in page.get("Contents", []):
                yield self.rel(o["Key"]), int(o["Size"])

    def delete(self, rels: Iterable[str]) -> None:
        keys = [self.key(r) for r in rels]
        for i in range(0, len(keys), 1000):
            chunk = keys[i : i + 1000]
            out = self.client.delete_objects(
                Bucket=self.bucket,
                Delete={"Objects": [{"Key": k} for k in chunk], "Quiet": True},
            )
            errors = out.get("Errors") or []
            if errors:
                raise SinkError(f"S3 refused to delete {len(errors)} object(s), e.g. {errors[0]}")

    # -- multipart uploads -------------------------------------------------------------------
    def create_upload(self, rel: str) -> str:
        return str(
            self.client.create_multipart_upload(Bucket=self.bucket, Key=self.key(rel))["UploadId"]
        )

    def upload_exists(self, rel: str, upload_id: str) -> bool:
        """Whether the multipart upload is still open (``ListParts``)."""
        from botocore.exceptions import ClientError

        try:
            self.client.list_parts(
                Bucket=self.bucket, Key=self.key(rel), UploadId=upload_id, MaxParts=1
            )
            return True
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "NoSuchUpload":
                return False
            raise

    def _gone(self, rel: str, upload_id: str, exc: Exception) -> Exception:
        code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
        # S3 says NoSuchUpload; other servers fail otherwise (moto: 500): ask with ListParts.
        if code != "NoSuchUpload" and self.upload_exists(rel, upload_id):
            return exc
        return SinkError(
            f"the multipart upload of {self.url(rel)} (upload id {upload_id[:16]}...) was "
            "aborted outside eosink (a bucket lifecycle rule for incomplete uploads?): the "
            "rows already in its parts are lost from S3 and none of them was published: "
            f"{DROP_LOST_HINT}; restore the rows from the source, and make the lifecycle "
            "rule longer than the sink's rolling interval"
        )

    def upload_part(self, rel: str, upload_id: str, n: int, data: bytes) -> Part:
        try:
            out = self.client.upload_part(
                Bucket=self.bucket, Key=self.key(rel), UploadId=upload_id, PartNumber=n, Body=data
            )
        except Exception as exc:
            raise self._gone(rel, upload_id, exc) from None
        return Part(n, str(out["ETag"]), len(data))

    def copy_part(self, rel: str, upload_id: str, n: int, source_rel: str, size: int) -> Part:
        """A part copied server-side from an object: its bytes never pass through here."""
        try:
            out = self.client.upload_part_copy(
                Bucket=self.bucket,
                Key=self.key(rel),
                UploadId=upload_id,
                PartNumber=n,
                CopySource={"Bucket": self.bucket, "Key": self.key(source_rel)},
            )
        except Exception as exc:
            raise self._gone(rel, upload_id, exc) from None
        return Part(n, str(out["CopyPartResult"]["ETag"]), size)

    def upload_file_parts(self, local: Path, rel: str, first: int = 1) -> tuple[str, list[Part]]:
        """A new multipart upload of ``local`` to ``rel``, left open (``complete`` publishes it).

        Parts of ``part_bytes`` are sent by up to 8 threads (boto3's upload_file uses 10).
        """
        upload_id = self.create_upload(rel)
        size = local.stat().st_size
        step = max(self.part_bytes, MIN_PART_BYTES)
        offsets = list(range(0, size, step)) or [0]

        def send(i_off: tuple[int, int]) -> Part:
            i, off = i_off
            with open(local, "rb") as fh:
                fh.seek(off)
                return self.upload_part(rel, upload_id, first + i, fh.read(step))

        try:
            with ThreadPoolExecutor(max_workers=min(8, len(offsets))) as pool:
                parts = list(pool.map(send, enumerate(offsets)))
        except BaseException:
            self.abort_upload(rel, upload_id)
            raise
        return upload_id, parts

    def complete(self, rel: str, upload_id: str, parts: list[dict[str, Any]], size: int) -> None:
        """Publish an upload with exactly ``parts``; idempotent.

        If the upload is gone, the object must be there with ``size`` bytes (an earlier
        attempt completed it); otherwise the data is lost and a :class:`SinkError` says so.
        """
        from botocore.exceptions import ClientError

        try:
            self.client.complete_multipart_upload(
                Bucket=self.bucket,
                Key=self.key(rel),
                UploadId=upload_id,
                MultipartUpload={
                    "Parts": [{"PartNumber": p["n"], "ETag": p["etag"]} for p in parts]
                },
            )
            return
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code != "NoSuchUpload" and self.upload_exists(rel, upload_id):
                if code in ("InvalidPart", "InvalidPartOrder", "EntityTooSmall"):
                    raise SinkError(
                        f"S3 refused to complete the upload of {self.url(rel)} ({code}): its "
                        "parts changed outside eosink; nothing was published"
                    ) from None
                raise
        have = self.size(rel)
        if have == size:
            return  # completed by an earlier attempt of this commit
        raise SinkError(
            f"the multipart upload of {self.url(rel)} (upload id {upload_id[:16]}...) is gone "
            f"and the object is {'missing' if have is None else f'{have} bytes, not {size}'}: "
            "it was aborted outside eosink (a bucket lifecycle rule for incomplete uploads?). "
            f"Its rows are lost from S3 and nothing of it was published: {DROP_LOST_HINT}; "
            "restore the rows from the source and make the lifecycle rule longer than the "
            "sink's rolling interval"
        )

    def abort_upload(self, rel: str, upload_id: str) -> None:
        from botocore.exceptions import ClientError

        try:
            self.client.abort_multipart_upload(
                Bucket=self.bucket, Key=self.key(rel), UploadId=upload_id
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "NoSuchUpload":
                raise

    def uploads(self, rel_prefix: str = "") -> list[tuple[str, str]]:
        """``(rel, upload_id)`` of every open multipart upload under ``rel_prefix``."""
        out: list[tuple[str, str]] = []
        pages = self.client.get_paginator("list_multipart_uploads").paginate(
            Bucket=self.bucket, Prefix=self.key(rel_prefix) if rel_prefix else self.prefix
        )
        for page in pages:
            for u in page.get("Uploads", []) or []:
                out.append((self.rel(u["Key"]), str(u["UploadId"])))
        return out
