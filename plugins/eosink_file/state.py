"""The attributes the file coordinator's parts share, and the target's small JSON records
read and written where the target is (local, S3, a Hadoop filesystem)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ._hadoop import HadoopStore
from ._rolling import Roller, fsync_path
from ._s3 import S3Store
from .layout import (
    write_json_atomic,
)
from .options import FileSinkOptions

__all__ = ["CoordinatorState"]


class CoordinatorState:
    """What the parts of :class:`~eosink_file.coordinator.FileCoordinator` share: its
    attributes (set by its ``__init__``) and the target's JSON records."""

    opts: FileSinkOptions
    key: str  # the sink's sink_key
    sink_id: str
    s3: S3Store | None  # the target on S3
    hadoop: HadoopStore | None  # the target through Spark's Hadoop FileSystem
    root: Path  # the local directory (a placeholder when the target is not local)
    staging_rel: str
    staging: Path
    marker_rel: str
    marker_path: Path
    commits_rel: str
    commits: Path
    _marker: dict[str, Any] | None
    # The target's layout record (None until recorded: at the first commit).
    _layout: dict[str, Any] | None
    roller: Roller

    def _read_json(self, rel: str) -> dict[str, Any] | None:
        if self.hadoop is not None:
            got = self.hadoop.read(rel)
            return None if got is None else dict(json.loads(got))
        try:
            raw = self.s3.get(rel) if self.s3 is not None else (self.root / rel).read_bytes()
        except FileNotFoundError:
            return None
        except Exception as exc:
            if self.s3 is not None and S3Store.missing(exc):
                return None
            raise
        data: dict[str, Any] = json.loads(raw)
        return data

    def _write_json(self, rel: str, data: dict[str, Any]) -> None:
        if self.s3 is not None:  # a PUT replaces the object atomically
            self.s3.put(rel, json.dumps(data, sort_keys=True).encode())
        elif self.hadoop is not None:
            self.hadoop.write_atomic(
                rel, json.dumps(data, sort_keys=True).encode(), self.opts.fsync
            )
            if self.opts.fsync and self.hadoop.scheme == "file":
                fsync_path((self.root / rel).parent)
        else:
            write_json_atomic(self.root / rel, data, self.opts.fsync)
