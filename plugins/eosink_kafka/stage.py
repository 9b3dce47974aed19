"""Where the kafka sink stages an epoch's records before the commit publishes them.

Layout under ``staging_path`` (a local or mounted directory, or ``s3://bucket/prefix`` with
the same keys)::

    <sink key>/<epoch>/<attempt>/part-*.parquet

:class:`Stage` is the staging location: :class:`LocalStage` (a directory; files fsync'd) or
:class:`S3Stage` (objects through boto3).
"""

from __future__ import annotations

import shutil
import socket
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from eosink import ConfigError, SinkError
from eosink._s3 import s3_client, split_s3

from .options import KafkaSinkOptions

__all__ = ["LocalStage", "S3Stage", "Stage", "stage_of", "staged_file_info"]


class Stage(ABC):
    """Where the staged files of every sink using one ``staging_path`` live.

    Paths are *rels*: ``<sink key>/<epoch>/<attempt>/part-*.parquet``, relative to
    :attr:`url`. Thread safety: the methods may be called from several threads.
    """

    url: str
    """The root: an absolute local directory or ``s3://bucket/prefix``."""

    @abstractmethod
    def ensure(self, key: str) -> None:
        """Make the sink's part of the location usable (or raise saying why not)."""

    @abstractmethod
    def read_table(self, rel: str) -> pa.Table | None:
        """The staged file ``rel``, or None if it is gone."""

    @abstractmethod
    def file_info(self, rel: str) -> tuple[int, int]:
        """(rows, uncompressed bytes) of the staged file ``rel``, from its footer."""

    @abstractmethod
    def epochs(self, key: str) -> list[int]:
        """The epochs with anything staged for sink ``key``."""

    @abstractmethod
    def delete_epoch(self, key: str, epoch: int, after_first: Callable[[], None] | None) -> None:
        """Delete everything staged for ``epoch`` of sink ``key``; ``after_first`` is called
        once the first file is deleted (a fault point)."""

    def check_visible(self, files: Sequence[dict[str, Any]]) -> None:
        """Raise unless this driver sees every file of ``files`` (write results), as written.

        Raises:
            SinkError: a staged file is missing or has another size (the location is not
                shared by the executors and the driver).
        """
        return None  # object stores are reached by every node


class LocalStage(Stage):
    """A local (or mounted) directory."""

    def __init__(self, root: str) -> None:
        self.root = Path(root)
        self.url = str(self.root)

    def ensure(self, key: str) -> None:
        try:
            (self.root / key).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"the kafka sink cannot stage in {self.root} ({exc.strerror}): set "
                "staging_path to a directory this user can write (on a cluster, one every "
                "node mounts) or to s3://bucket/prefix"
            ) from None

    def read_table(self, rel: str) -> pa.Table | None:
        path = self.root / rel
        if not path.exists():
            return None
        return pq.read_table(path)

    def file_info(self, rel: str) -> tuple[int, int]:
        return staged_file_info(self.root / rel)

    def epochs(self, key: str) -> list[int]:
        d = self.root / key
        if not d.is_dir():
            return []
        return [int(p.name) for p in d.iterdir() if p.name.isdigit()]

    def delete_epoch(self, key: str, epoch: int, after_first: Callable[[], None] | None) -> None:
        target = self.root / key / str(epoch)
        if after_first is not None:
            victims = sorted(p for p in target.rglob("*") if p.is_file())
            for i, p in enumerate(victims):
                p.unlink(missing_ok=True)
                if i == 0:
                    after_first()
        shutil.rmtree(target, ignore_errors=True)

    def check_visible(self, files: Sequence[dict[str, Any]]) -> None:
        for f in files:
            path = self.root / str(f["staged"])
            try:
                size: int | None = path.stat().st_size
            except FileNotFoundError:
                size = None
            if size != int(f["bytes"]):
                host = f.get("host")
                by = f" by a task on {host}" if host else ""
                seen = "is not there" if size is None else f"has {size} bytes, not {f['bytes']}"
                raise SinkError(
                    f"the kafka sink's staged file {path}, written{by}, {seen} on this driver "
                    f"({socket.gethostname()}): staging_path {self.root} is not shared by the "
                    "executors and the driver. Nothing was published; set staging_path to a "
                    "location every node reaches (a shared mount, or s3://bucket/prefix)"
                )


class S3Stage(Stage):
    """An S3 prefix, through boto3 (extra ``eosink[s3]``)."""

    def __init__(self, url: str, opts: KafkaSinkOptions) -> None:
        self.url = url
        self.bucket, self.prefix = split_s3(url)
        self._args = opts.s3_args()

    @property
    def client(self) -> Any:
        return s3_client(*self._args, what="the kafka sink's staging on s3://")

    def key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def ensure(self, key: str) -> None:
        from botocore.exceptions import ClientError

        try:
            self.client.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            raise ConfigError(
                f"the kafka sink cannot stage in bucket {self.bucket!r} ({code or exc}): "
                "create it, or check staging_path, s3_endpoint_url and the credentials"
            ) from None

    def upload(self, local: Path, rel: str) -> None:
        self.client.upload_file(str(local), self.bucket, self.key(rel))

    def _get(self, rel: str) -> bytes | None:
        from botocore.exceptions import ClientError

        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self.key(rel))["Body"]
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code", "") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise
        return bytes(body.read())

    def read_table(self, rel: str) -> pa.Table | None:
        data = self._get(rel)
        return None if data is None else pq.read_table(pa.BufferReader(data))

    def file_info(self, rel: str) -> tuple[int, int]:
        data = self._get(rel)
        if data is None:
            raise SinkError(f"staged file {self.url}/{rel} is missing")
        return _info(pq.read_metadata(pa.BufferReader(data)))

    def _keys(self, rel_prefix: str) -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.key(rel_prefix)
        )
        return [o["Key"] for page in pages for o in page.get("Contents", [])]

    def epochs(self, key: str) -> list[int]:
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.key(f"{key}/"), Delimiter="/"
        )
        names = [
            p["Prefix"].rstrip("/").rsplit("/", 1)[-1]
            for page in pages
            for p in page.get("CommonPrefixes", []) or []
        ]
        return [int(n) for n in names if n.isdigit()]

    def delete(self, keys: list[str]) -> None:
        for i in range(0, len(keys), 1000):
            out = self.client.delete_objects(
                Bucket=self.bucket,
                Delete={"Objects": [{"Key": k} for k in keys[i : i + 1000]], "Quiet": True},
            )
            errors = out.get("Errors") or []
            if errors:
                raise SinkError(f"S3 refused to delete {len(errors)} object(s), e.g. {errors[0]}")

    def delete_epoch(self, key: str, epoch: int, after_first: Callable[[], None] | None) -> None:
        keys = sorted(self._keys(f"{key}/{epoch}/"))
        if keys and after_first is not None:
            self.delete(keys[:1])
            after_first()
            keys = keys[1:]
        self.delete(keys)


def stage_of(opts: KafkaSinkOptions, root: str | None = None) -> Stage:
    """The staging location ``root`` (default: the options' ``staging_path``).

    Raises:
        ConfigError: no staging location (the front end fills an unset one in).
    """
    where = root if root is not None else opts.staging_path
    if where is None:
        raise ConfigError(
            "the kafka sink has no staging_path (eosink.run and format('eosink') fill in a "
            "default; a coordinator or writer built directly needs one)"
        )
    if where.startswith("s3://"):
        return S3Stage(where, opts)
    return LocalStage(where)


def _info(md: pq.FileMetaData) -> tuple[int, int]:
    size = sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups))
    return int(md.num_rows), int(size)


def staged_file_info(path: Path) -> tuple[int, int]:
    """(rows, uncompressed bytes) of a staged Parquet file, from its footer."""
    return _info(pq.read_metadata(path))
