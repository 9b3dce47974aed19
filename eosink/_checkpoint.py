"""Reads Spark's streaming checkpoint (which batches are committed) and eosink's lineage marker.

Local checkpoint locations are read directly; any other scheme (``hdfs://``, ``s3a://``...)
goes through Spark's own Hadoop FileSystem on the driver.
"""

from __future__ import annotations

import json
import logging
import os
import re
import uuid
from pathlib import Path
from typing import Any

from ._staging import is_connect
from .util import fsync_path as fsync_path
from .util import write_file_atomic

LINEAGE_FILE = "eosink-lineage.json"

log = logging.getLogger("eosink")

_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
# Spark's CheckpointFileManager.createAtomic writes "<dir>/.<name>.<uuid>[.TID<task>].tmp" and
# renames it to "<dir>/<name>" when complete (offsets, commits, metadata, source logs, state
# store files). Hadoop's local ChecksumFileSystem keeps the checksum of a file "f" in ".f.crc".
_TEMP = re.compile(rf"\.(?P<name>.+)\.{_UUID}(?:\.TID\d+)?\.tmp")
_TEMP_CRC = re.compile(rf"\.\.(?P<name>.+)\.{_UUID}(?:\.TID\d+)?\.tmp\.crc")
# Where Spark writes metadata logs that a restart reads, for non-local file systems (a full
# recursive listing of state stores through py4j would cost seconds on object stores).
_HADOOP_GLOBS = ("", "offsets/", "commits/", "sources/*/")


def spark_temp_file_target(name: str) -> str | None:
    """The file Spark was writing when it left the temporary file ``name``, else None.

    Matches only Spark's temporary names (and their Hadoop ``.crc`` siblings), which can never
    be valid log entries: those are named by a batch id (``offsets/0``) or a fixed name.
    """
    m = _TEMP_CRC.fullmatch(name) or _TEMP.fullmatch(name)
    return m.group("name") if m else None


class CheckpointDir:
    """A streaming query's checkpoint location, as eosink needs it."""

    def __init__(self, spark: Any, location: str, *, via_hadoop: bool = False) -> None:
        """``spark``: the driver's session, or None (a local location only).

        With a session, the location is qualified as Spark qualifies it (Hadoop's
        ``makeQualified``): a path without a scheme is on the cluster's default file system
        (``fs.defaultFS``: HDFS on most YARN clusters, ``dbfs:`` on Databricks), not
        necessarily on this driver's disk, and ``file:/x`` is the local ``/x``. A local result
        is read directly; anything else through Spark's Hadoop FileSystem. ``via_hadoop``:
        go through Hadoop even for a local location.
        """
        self._spark = spark
        self._fs: Any = None
        self.connect = is_connect(spark)
        """A Spark Connect client's checkpoint: local to this machine and the server's."""
        if self.connect:
            spark = self._spark = None
            local = re.sub(r"^file:(//)?", "", location)
            if "://" in local or ":" in local.split("/", 1)[0]:
                from .errors import ConfigError

                raise ConfigError(
                    f"checkpoint location {location!r}: over Spark Connect, eosink reads and "
                    "writes the checkpoint from this client and from the server's Python "
                    "worker, so it must be a file system path both can open: a local path "
                    "when they share a machine, else a mounted one (NFS, /dbfs/..., "
                    "/Volumes/...). Object stores and HDFS are for classic sessions"
                )
        if spark is not None:
            jvm = spark.sparkContext._jvm
            conf = spark.sparkContext._jsc.hadoopConfiguration()
            self._jpath = jvm.org.apache.hadoop.fs.Path
            try:
                fs = self._jpath(location).getFileSystem(conf)
                uri = fs.makeQualified(self._jpath(location)).toUri()
            except Exception as exc:
                from .errors import ConfigError

                first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
                raise ConfigError(
                    f"checkpoint location {location!r}: Spark cannot reach it ({first}). Use a "
                    "location of a file system Spark is configured for (HDFS, s3a:// with "
                    "hadoop-aws, abfs://, gs://, a local or mounted path)"
                ) from None
            if uri.getScheme() == "file" and not via_hadoop:
                location = str(uri.getPath())
            else:
                location = str(uri.toString())
                self._fs = fs
        self.location = location
        self._local: Path | None = None
        if self._fs is None:
            local = re.sub(r"^file:(//)?", "", location)
            if "://" in local or ":" in local.split("/", 1)[0]:
                from .errors import ConfigError

                raise ConfigError(
                    f"checkpoint location {location!r} is not local; format('eosink') streams "
                    "need a local one (eosink.run reads any Hadoop filesystem)"
                )
            self._local = Path(local).expanduser().resolve()
            if self.connect:
                self.location = str(self._local)

    @property
    def is_local(self) -> bool:
        """Whether this checkpoint is on the local file system (not read through Hadoop)."""
        return self._local is not None

    @property
    def spark_location(self) -> str:
        """The location as Spark's ``checkpointLocation`` option: a Spark Connect client
        gives the server a ``file:`` URI (a bare path is on the server's ``fs.defaultFS``)."""
        if self.connect and self._local is not None:
            return self._local.as_uri()
        return self.location

    # -- Spark's commit log ------------------------------------------------------------
    def has_commit(self, batch_id: int) -> bool:
        """True once Spark has checkpointed ``batch_id`` (``commits/<batch_id>`` exists)."""
        if self._local is not None:
            return (self._local / "commits" / str(batch_id)).exists()
        return bool(self._fs.exists(self._jpath(f"{self.location}/commits/{batch_id}")))

    def last_committed_batch(self) -> int | None:
        """The newest checkpointed batch id, or None if none."""
        names: list[str]
        if self._local is not None:
            d = self._local / "commits"
            names = [p.name for p in d.iterdir()] if d.is_dir() else []
        else:
            p = self._jpath(f"{self.location}/commits")
            names = (
                [s.getPath().getName() for s in self._fs.listStatus(p)]
                if self._fs.exists(p)
                else []
            )
        ids = [int(n) for n in names if n.isdigit()]
        return max(ids) if ids else None

    # -- leftovers of a crash ------------------------------------------------------------
    def repair(self) -> list[str]:
        """Remove the temporary files a crash left while Spark wrote the checkpoint.

        A driver killed while Spark writes a log entry leaves ``offsets/.0.<uuid>.tmp`` (and,
        on local disks, its checksum ``offsets/..0.<uuid>.tmp.crc``); Spark never cleans it
        up, and at batch 0 every later start fails with
        ``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY``. Only files named like Spark's
        temporary files are removed, never a log entry. Call it before the query starts:
        Spark refuses two live queries on one checkpoint, and a zombie driver's in-flight
        temporary file would only make that zombie fail.

        Local checkpoints are searched entirely; other file systems (best effort) in the
        checkpoint's root, ``offsets/``, ``commits/`` and ``sources/*/``.

        Returns:
            The removed files.
        """
        removed: list[str] = []
        if self._local is not None:
            if not self._local.is_dir():
                return removed
            for d, _dirs, files in os.walk(self._local):
                for name in sorted(files):
                    target = spark_temp_file_target(name)
                    if target is None:
                        continue
                    f = Path(d) / name
                    try:
                        f.unlink()
                    except FileNotFoundError:
                        continue
                    removed.append(str(f))
                    self._log_removed(str(f), Path(d).relative_to(self._local) / target)
            return removed
        for sub in _HADOOP_GLOBS:
            try:
                found = self._fs.globStatus(self._jpath(f"{self.location.rstrip('/')}/{sub}.*"))
            except Exception as exc:  # best effort: the query start reports real problems
                log.debug("checkpoint %s: cannot list %s: %s", self.location, sub, exc)
                continue
            for st in found or []:
                path = st.getPath()
                target = spark_temp_file_target(str(path.getName()))
                if target is None or not st.isFile():
                    continue
                if self._fs.delete(path, False):
                    removed.append(str(path.toString()))
                    self._log_removed(removed[-1], f"{path.getParent().toString()}/{target}")
        return removed

    def _log_removed(self, path: str, target: str | Path) -> None:
        log.warning(
            "checkpoint %s: removed %s, left by a crash while Spark wrote %s (an incomplete "
            "temporary file that Spark never cleans up and that would fail every restart)",
            self.location,
            path,
            target,
        )

    # -- small files of eosink's own (lineage, journal) -------------------------------------
    def _jp(self, rel: str) -> Any:
        return self._jpath(f"{self.location.rstrip('/')}/{rel}")

    def read_bytes(self, rel: str) -> bytes | None:
        """The content of ``<checkpoint>/<rel>``, or None if there is no such file."""
        if self._local is not None:
            try:
                return (self._local / rel).read_bytes()
            except (FileNotFoundError, NotADirectoryError):
                return None
        p = self._jp(rel)
        if not self._fs.exists(p):
            return None
        stream = self._fs.open(p)
        try:
            return bytes(
                self._spark.sparkContext._jvm.org.apache.commons.io.IOUtils.toByteArray(stream)
            )
        finally:
            stream.close()

    def write_bytes(self, rel: str, data: bytes, *, exclusive: bool = False) -> bool:
        """Write ``<checkpoint>/<rel>`` durably; False if ``exclusive`` and it exists.

        ``exclusive`` is an atomic create: of two drivers creating one name, exactly one
        succeeds (``O_EXCL`` locally; Hadoop's ``create(path, overwrite=false)``, atomic on
        HDFS and the other file systems whose create is). Otherwise the file is replaced
        atomically where the file system renames atomically (locally: a temporary file,
        fsync, rename), else written in place. A reader never sees a torn local file; on
        other file systems a torn file is possible after a crash mid-write: readers of
        eosink's files ignore one that does not parse.
        """
        if self._local is not None:
            path = self._local / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if exclusive:
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                except FileExistsError:
                    return False
                try:
                    os.write(fd, data)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                fsync_path(path.parent)
            else:
                write_file_atomic(path, data, suffix=".eosink-tmp")
            return True
        p = self._jp(rel)
        try:
            out = self._fs.create(p, not exclusive)
        except Exception as exc:
            if exclusive and "FileAlreadyExists" in f"{type(exc).__name__} {exc}":
                return False
            if exclusive and self._fs.exists(p):
                return False
            raise
        try:
            out.write(bytearray(data))
            try:
                out.hsync()  # durable before it is relied on (HDFS: on the datanodes' disks)
            except Exception:  # a file system without Syncable streams (object stores)
                log.debug("checkpoint %s: hsync not supported", self.location)
        finally:
            out.close()
        return True

    def list_names(self, rel: str) -> list[str]:
        """The names of the files in ``<checkpoint>/<rel>`` (empty if it does not exist)."""
        if self._local is not None:
            d = self._local / rel
            try:
                return [p.name for p in d.iterdir()]
            except (FileNotFoundError, NotADirectoryError):
                return []
        p = self._jp(rel)
        if not self._fs.exists(p):
            return []
        return [str(s.getPath().getName()) for s in self._fs.listStatus(p)]

    def exists(self, rel: str) -> bool:
        if self._local is not None:
            return (self._local / rel).exists()
        return bool(self._fs.exists(self._jp(rel)))

    def delete(self, rel: str) -> None:
        """Delete ``<checkpoint>/<rel>`` if it exists."""
        if self._local is not None:
            (self._local / rel).unlink(missing_ok=True)
            return
        self._fs.delete(self._jp(rel), False)

    # -- eosink's lineage marker ---------------------------------------------------------
    def read_lineage(self) -> str | None:
        data = self.read_bytes(LINEAGE_FILE)
        return None if data is None else str(json.loads(data)["lineage"])

    def write_lineage(self) -> str:
        """Create a new lineage id for this checkpoint and persist it durably."""
        lineage = uuid.uuid4().hex
        self.write_bytes(LINEAGE_FILE, json.dumps({"lineage": lineage}).encode())
        return lineage
