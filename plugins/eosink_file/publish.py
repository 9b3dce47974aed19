"""How the file sink publishes an epoch's staged files at their final names: locally (rename
into place, fsync'd) and through a Hadoop filesystem; the check that the files phase 1 is
handed are the ones staged, before the epoch is persisted."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eosink import (
    SinkError,
    fault_point,
)
from eosink.util import abandon_hint

from ._rolling import fsync_path
from .state import CoordinatorState

__all__ = ["Publishing"]


class Publishing(CoordinatorState):
    """The coordinator's part that moves staged files to their final names."""

    def _publish_local(self, epoch: int, committable: dict[str, Any]) -> None:
        dirs: set[Path] = set()
        for i, f in enumerate(committable["files"]):
            final = self.root / f["final"]
            staged = self.root / f["staged"]
            if final.exists():
                if final.stat().st_size != f["bytes"]:
                    raise SinkError(
                        f"epoch {epoch}: {final} exists with an unexpected size; "
                        "another writer uses this path"
                    )
                continue  # already published by an earlier attempt of this commit
            if not staged.exists():
                raise SinkError(
                    f"epoch {epoch}: staged file {staged} is missing and {final} was never "
                    "published (was the staging directory deleted?). "
                    + abandon_hint(self.sink_id, epoch)
                )
            final.parent.mkdir(parents=True, exist_ok=True)
            os.rename(staged, final)
            dirs.add(final.parent)
            if i == 0:
                fault_point("mid_commit", site="local")
        if self.opts.fsync:
            for d in dirs:
                fsync_path(d)

    def _check_staged(self, epoch: int, staged: Sequence[dict[str, Any]]) -> None:
        """Every file a task staged is on the driver, with the size the task wrote."""
        for f in staged:
            p = self.root / f["staged"]
            try:
                size: int | None = p.stat().st_size
            except FileNotFoundError:
                size = None
            if size == f["bytes"]:
                continue
            found = "is not there" if size is None else f"has {size} bytes"
            rows = f" ({f['rows']} rows)" if f.get("rows") is not None else ""
            raise SinkError(
                f"epoch {epoch}: a Spark task staged {p} with {f['bytes']} bytes{rows}, and "
                f"on the driver it {found}. The likely cause: the path {self.opts.path} is "
                "not the same directory on every node (a local path or file:// URI on each "
                "machine's own disk, not a mount every node shares), so the files of the "
                "tasks that ran on other machines stayed there. Write to a location every "
                "node and the driver share (a shared mount, s3://, or hdfs://, abfs://, "
                "gs:// through eosink.run). Nothing of this epoch was published or persisted."
            )

    def _publish_hadoop(self, epoch: int, committable: dict[str, Any]) -> None:
        """Publish by renames through the Hadoop FileSystem (see :mod:`eosink_file._hadoop`)."""
        fs = self.hadoop
        assert fs is not None
        made: set[str] = set()
        for i, f in enumerate(committable["files"]):
            final, staged = f["final"], f["staged"]
            have = fs.size(final)
            if have is None:
                parent = final.rpartition("/")[0]
                if parent not in made:
                    fs.mkdirs(parent)
                    made.add(parent)
                if not fs.rename(staged, final):
                    have = fs.size(final)
                    if have is None and fs.size(staged) is None:
                        raise SinkError(
                            f"epoch {epoch}: staged file {fs.url(staged)} is missing and "
                            f"{fs.url(final)} was never published (was the staging directory "
                            "deleted?). " + abandon_hint(self.sink_id, epoch)
                        )
                    if have is None:
                        raise SinkError(
                            f"epoch {epoch}: cannot rename {fs.url(staged)} to {fs.url(final)}"
                        )
            if have is not None and have != f["bytes"]:
                raise SinkError(
                    f"epoch {epoch}: {fs.url(final)} exists with an unexpected size; "
                    "another writer uses this path"
                )
            if have is None and i == 0:
                fault_point("mid_commit", site="hadoop")
        if self.opts.fsync and fs.scheme == "file":
            for d in made:
                fsync_path(self.root / d)
