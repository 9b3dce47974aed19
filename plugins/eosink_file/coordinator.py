"""The ``file`` sink's coordinator: publish (local, S3, Hadoop) and abort, made of its parts:

* ``native.py``: Spark's native writer and the staged-rows check;
* ``marker.py``: the layout record and the marker in the target;
* ``publish.py``: staged files moved to their final names (local, Hadoop);
* ``state.py``: the shared attributes and the target's JSON records.
"""

from __future__ import annotations

import logging
import re
import shutil
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from eosink import (
    ConfigError,
    JournalHome,
    Prepared,
    Rolling,
    SinkCommitCoordinator,
    SinkError,
    SparkWriter,
    StagedEpochs,
    TargetMarker,
    fault_point,
)
from eosink.util import sink_key

from ._hadoop import HadoopStore, java_message, spark_session
from ._rolling import Roller, manifest, piece_ext
from ._s3 import S3Store
from .layout import (
    COMMITS_DIR,
    MARKER_DIR,
    STAGING_DIR,
    check_layout,
    layout_of,
)
from .marker import TargetRecords
from .native import SparkStaging
from .options import FileSinkOptions
from .publish import Publishing

__all__ = ["FileCoordinator", "make_coordinator"]

log = logging.getLogger("eosink.file")


class FileCoordinator(
    SparkStaging,
    TargetRecords,
    Publishing,
    SinkCommitCoordinator[dict[str, Any], dict[str, Any]],
    SparkWriter[dict[str, Any]],
    StagedEpochs,
    TargetMarker,
    Rolling,
    JournalHome,
):
    """Publishes an epoch's staged files atomically; deletes them on abort.

    The sink's marker is ``_eosink/<sink key>.json`` under ``path``: the core's marker plus
    ``last_epoch``, rewritten atomically (fsync'd) by ``commit`` before it publishes files.
    Each committed epoch's manifest is ``_eosink/commits/<sink key>/<epoch>.json``, written
    (atomically, fsync'd) once all its files are published: readers that go by the
    manifests (:func:`committed_files`) see whole epochs only. With rolling options the
    files span epochs (:mod:`eosink_file._rolling`).
    """

    def __init__(self, opts: FileSinkOptions, sink_id: str) -> None:
        self.opts = opts
        self.key = sink_key(sink_id)
        self.sink_id = sink_id
        self.s3: S3Store | None = S3Store(opts) if opts.is_s3 else None
        local = opts.local_path
        self.root = local if local is not None else Path("/nonexistent")
        # A Hadoop filesystem URI goes through Spark's own FileSystem on the driver. A
        # file:// URI too, where Spark's writers may stage its epochs (per-epoch files under
        # eosink.run); else (rolling, Python writers, no JVM here) it is the local directory
        # it names, with the same layout.
        self.hadoop: HadoopStore | None = None
        scheme = opts.hadoop_scheme
        if scheme is not None and (
            scheme != "file" or (not opts.rolling and opts.writer != "python")
        ):
            spark = spark_session()
            if spark is not None:
                self.hadoop = HadoopStore(spark, opts.path)
            elif scheme != "file":
                raise ConfigError(
                    f"the file sink writes {scheme}:// paths through Spark's own writers and "
                    "Hadoop FileSystem, which need eosink.run() on a classic Spark driver "
                    '(not format("eosink"), whose writers are Python writers, nor Spark '
                    "Connect); write to a local path or s3:// there"
                )
        self.staging_rel = f"{STAGING_DIR}/{self.key}"
        self.staging = self.root / self.staging_rel
        self.marker_rel = f"{MARKER_DIR}/{self.key}.json"
        self.marker_path = self.root / self.marker_rel
        self.commits_rel = f"{MARKER_DIR}/{COMMITS_DIR}/{self.key}"
        self.commits = self.root / self.commits_rel
        self._marker: dict[str, Any] | None = None
        # The target's layout record (None until recorded: at the first commit).
        self._layout: dict[str, Any] | None = None
        # Also without rolling options: files left open by an earlier run that had them are
        # published at this run's end, never forgotten.
        self.roller = Roller(
            opts,
            self.key,
            local,
            self.s3,
            self._write_json,
            self._read_json,
        )

    def init(self) -> None:
        if self.s3 is not None:
            self.s3.check_bucket()
        elif self.hadoop is not None:
            try:
                self.hadoop.mkdirs(MARKER_DIR)
            except Exception as exc:
                raise SinkError(
                    f"the file sink cannot create {self.hadoop.url(MARKER_DIR)}: "
                    f"{java_message(exc)}"
                ) from None
        else:
            self.root.mkdir(parents=True, exist_ok=True)
        self._init_layout()
        self.roller.load()
        if self.roller.committed["slots"] and not self.opts.rolling:
            log.warning(
                "file sink: %d file(s) left open by an earlier run with rolling options; "
                "they are published at the end of this run",
                len(self.roller.committed["slots"]),
            )

    def target_id(self) -> str:
        return f"file:{self.opts.sink_path}"

    def journal_location(self) -> str | None:
        """The core's batch journal: ``_eosink/journal`` beside the files (local paths)."""
        local = self.opts.local_path
        return None if local is None else str(local / MARKER_DIR / "journal")

    def pre_commit(self, epoch: int, results: Sequence[dict[str, Any]]) -> Prepared[dict[str, Any]]:
        # A layout recorded since init (an older run's epoch recovered at this start).
        check_layout(self.opts, self._layout, self._layout_where())
        staged = [f for r in results for f in r["files"]]
        if self.s3 is None and self.opts.local_path is not None:
            self._check_staged(epoch, staged)
        if self.opts.rolling:
            c = {**self.roller.prepare(epoch, staged), "layout": layout_of(self.opts)}
            held_rows, held_bytes = self.roller.held(c["state"])
            return Prepared(
                c,
                files=len(c["rolled"]),
                bytes=sum(int(r["bytes"]) for r in c["rolled"]),
                held_rows=held_rows,
                held_bytes=held_bytes,
            )
        if self.s3 is not None:  # the writers' uploads are open at their final names
            files = sorted(staged, key=lambda f: str(f["final"]))
            for f in files:
                f["start_epoch"] = f["end_epoch"] = epoch
            return Prepared(
                {"files": files, "layout": layout_of(self.opts)},
                files=len(files),
                bytes=sum(int(f["bytes"]) for f in files),
            )
        token = uuid.uuid4().hex[:12]
        files = []
        for n, f in enumerate(sorted(staged, key=lambda f: str(f["staged"]))):
            # "parquet", "jsonl.gz"; Spark's "c000.snappy.parquet" loses its "c000".
            ext = piece_ext(f["staged"])
            name = f"part-{epoch:010d}-{n:05d}-{token}.{ext}"
            final = f"{f['partition']}/{name}" if f["partition"] else name
            files.append(
                {
                    "staged": f["staged"],
                    "final": final,
                    "rows": f["rows"],
                    "bytes": f["bytes"],
                    "start_epoch": epoch,
                    "end_epoch": epoch,
                }
            )
        return Prepared(
            {"files": files, "token": token, "layout": layout_of(self.opts)},
            files=len(files),
            bytes=sum(int(f["bytes"]) for f in files),
        )

    def commit(self, epoch: int, committable: dict[str, Any]) -> None:
        if self._layout is None:  # the target's first commit records its layout: the
            self._record_layout(committable.get("layout"))  # one its files were staged in
        if epoch > self._last_epoch():
            # Before anything is visible: the marker never says less than the target holds.
            self._store_marker({**(self._marker or {}), "last_epoch": epoch})
        if committable.get("mode") == "rolling":
            rolled = self.roller.commit(epoch, committable)
            self._write_manifest(epoch, manifest(epoch, rolled)["files"])
            self.roller.after_commit(epoch, committable)
            self._clean_epoch(epoch, keep=self.roller.referenced())
            return
        if self.s3 is not None:
            for i, f in enumerate(committable["files"]):
                self.s3.complete(
                    f["final"], f["upload"]["id"], f["upload"]["parts"], int(f["bytes"])
                )
                if i == 0:
                    fault_point("mid_commit", site="s3")
            # Uploads of failed or speculative task attempts of this epoch.
            mine = f"part-{epoch:010d}-s{self.key[:8]}-"
            for rel, uid in self.s3.uploads():
                if rel.rsplit("/", 1)[-1].startswith(mine):
                    self.s3.abort_upload(rel, uid)
        elif self.hadoop is not None:
            self._publish_hadoop(epoch, committable)
        else:
            self._publish_local(epoch, committable)
        self._write_manifest(
            epoch, [{"path": f["final"], "bytes": f["bytes"]} for f in committable["files"]]
        )
        # Leftovers of failed or speculative task attempts of this epoch.
        self._clean_epoch(epoch, keep=self.roller.referenced())

    def _clean_epoch(self, epoch: int, keep: set[str]) -> None:
        """Delete what is staged for ``epoch`` except ``keep`` (pieces of open slots)."""
        prefix = f"{self.staging_rel}/{epoch}/"
        if self.s3 is not None:
            self.s3.delete([r for r, _ in self.s3.objects(prefix) if r not in keep])
            return
        if self.hadoop is not None and not keep:
            self.hadoop.delete(prefix.rstrip("/"), recursive=True)
            return
        target = self.staging / str(epoch)
        if not keep:
            shutil.rmtree(target, ignore_errors=True)
            return
        if not target.is_dir():
            return
        for p in sorted(target.rglob("*"), reverse=True):
            if p.is_file():
                if p.relative_to(self.root).as_posix() not in keep:
                    p.unlink(missing_ok=True)
            elif p.is_dir():
                try:
                    p.rmdir()  # only when empty
                except OSError:
                    pass

    def _write_manifest(self, epoch: int, files: list[dict[str, Any]]) -> None:
        """The epoch's manifest, once every file of it is published (atomic, fsync'd)."""
        rel = f"{self.commits_rel}/{epoch}.json"
        if self.hadoop is not None:
            if self.hadoop.exists(rel):
                return
        elif self.s3 is None and (self.root / rel).exists():
            return
        self._write_json(rel, {"epoch": epoch, "files": files})

    def abort(self, epoch: int, committable: dict[str, Any] | None) -> None:
        self.roller.abort(epoch, committable)
        keep = self.roller.referenced()
        try:
            if self.s3 is not None and not self.opts.rolling:
                if committable is not None and committable.get("mode") != "rolling":
                    for f in committable["files"]:
                        self.s3.abort_upload(f["final"], f["upload"]["id"])
                else:
                    mine = f"part-{epoch:010d}-s{self.key[:8]}-"
                    for rel, uid in self.s3.uploads():
                        if rel.rsplit("/", 1)[-1].startswith(mine):
                            self.s3.abort_upload(rel, uid)
            if self.hadoop is not None and not keep:
                rel = f"{self.staging_rel}/{epoch}"
                first = next(iter(self.hadoop.files(rel)), None)
                if first is not None:
                    self.hadoop.delete(first[0])
                    fault_point("mid_abort", site="hadoop")
                self.hadoop.delete(rel, recursive=True)
            elif self.s3 is None and not keep:
                target = self.staging / str(epoch)
                victims = sorted(p for p in target.rglob("*") if p.is_file())
                for i, p in enumerate(victims):
                    p.unlink(missing_ok=True)
                    if i == 0:
                        fault_point("mid_abort", site="local")
                shutil.rmtree(target, ignore_errors=True)
            else:
                self._clean_epoch(epoch, keep)
        except Exception:
            log.exception("file sink: abort of epoch %d could not delete its staged data", epoch)

    def staged_epochs(self) -> Iterable[int]:
        if self.s3 is not None:
            epochs = {
                int(r[len(self.staging_rel) + 1 :].split("/", 1)[0])
                for r, _ in self.s3.objects(f"{self.staging_rel}/")
                if r[len(self.staging_rel) + 1 :].split("/", 1)[0].isdigit()
            }
            if not self.opts.rolling:
                mine = re.compile(rf"^part-(\d{{10}})-s{self.key[:8]}-")
                for rel, _ in self.s3.uploads():
                    m = mine.match(rel.rsplit("/", 1)[-1])
                    if m:
                        epochs.add(int(m.group(1)))
            return sorted(epochs)
        if self.hadoop is not None:
            return [int(n) for n in self.hadoop.names(self.staging_rel) if n.isdigit()]
        if not self.staging.is_dir():
            return []
        return [int(p.name) for p in self.staging.iterdir() if p.name.isdigit()]

    def roll(self, everything: bool) -> int:
        """Publish the open files that are due (every one with ``everything``)."""
        return len(self.roller.roll(everything, max(self._last_epoch(), 0)))

    def next_roll_in(self) -> float | None:
        return self.roller.next_roll_in()

    def drop_lost_open_files(self) -> list[dict[str, Any]]:
        """``eosink recover --drop-lost-open-files``: drop the open rolling files whose
        committed rows can no longer be published (:meth:`Roller.drop_lost`)."""
        return self.roller.drop_lost()


def make_coordinator(opts: FileSinkOptions, sink_id: str) -> FileCoordinator:
    return FileCoordinator(opts, sink_id)
