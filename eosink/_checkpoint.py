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

    def __init__(self, spark: Any, location: str) -> None:
        self.location = location
        local = location.removeprefix("file://") if location.startswith("file://") else location
        self._local: Path | None = None if "://" in local else Path(local).resolve()
        self._fs: Any = None
        self._spark = spark
        if self._local is None:
            if spark is None:
                from .errors import ConfigError

                raise ConfigError(
                    f"checkpoint location {location!r} is not local; format('eosink') streams "
                    "need a local one (eosink.run reads any Hadoop filesystem)"
                )
            jvm = spark.sparkContext._jvm
            conf = spark.sparkContext._jsc.hadoopConfiguration()
            self._jpath = jvm.org.apache.hadoop.fs.Path
            self._fs = self._jpath(location).getFileSystem(conf)

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

    # -- eosink's lineage marker ---------------------------------------------------------
    def read_lineage(self) -> str | None:
        if self._local is not None:
            f = self._local / LINEAGE_FILE
            return str(json.loads(f.read_text())["lineage"]) if f.exists() else None
        p = self._jpath(f"{self.location}/{LINEAGE_FILE}")
        if not self._fs.exists(p):
            return None
        stream = self._fs.open(p)
        try:
            data = bytes(
                self._spark.sparkContext._jvm.org.apache.commons.io.IOUtils.toByteArray(stream)
            )
        finally:
            stream.close()
        return str(json.loads(data)["lineage"])

    def write_lineage(self) -> str:
        """Create a new lineage id for this checkpoint and persist it durably."""
        lineage = uuid.uuid4().hex
        body = json.dumps({"lineage": lineage}).encode()
        if self._local is not None:
            self._local.mkdir(parents=True, exist_ok=True)
            tmp = self._local / f".{LINEAGE_FILE}.tmp"
            with open(tmp, "wb") as fh:
                fh.write(body)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self._local / LINEAGE_FILE)
        else:
            out = self._fs.create(self._jpath(f"{self.location}/{LINEAGE_FILE}"), True)
            try:
                out.write(bytearray(body))
            finally:
                out.close()
        return lineage
