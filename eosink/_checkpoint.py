"""Reads Spark's streaming checkpoint (which batches are committed) and eosink's lineage marker.

Local checkpoint locations are read directly; any other scheme (``hdfs://``, ``s3a://``...)
goes through Spark's own Hadoop FileSystem on the driver.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

LINEAGE_FILE = "eosink-lineage.json"


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
