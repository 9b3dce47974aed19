"""The ``file`` sink's coordinator: Spark's native writer, the staged-rows check, the
marker, publish (local, S3, Hadoop) and abort."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

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
from eosink.util import abandon_hint, sink_key

from ._hadoop import HadoopStore, java_message, spark_session
from ._rolling import Roller, fsync_path, manifest, piece_ext
from ._s3 import S3Store
from .committed import count_records
from .layout import (
    COMMITS_DIR,
    LAYOUT_KEYS,
    LAYOUT_REL,
    MARKER_DIR,
    STAGING_DIR,
    check_layout,
    guard_partition_values,
    guarded_error,
    layout_of,
    schema_id,
    write_json_atomic,
)
from .options import FileSinkOptions

log = logging.getLogger("eosink.file")


class FileCoordinator(
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

    # -- storage ---------------------------------------------------------------------------
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

    # -- the native path -------------------------------------------------------------------
    def spark_write_unsupported(self, schema: pa.Schema) -> str | None:
        """Why Spark's writers cannot stage this sink's epochs (then Python writers do).

        Raises:
            ConfigError: ``writer='spark'`` and they cannot.
        """
        if self.opts.writer == "python":
            return "the file sink's option writer='python'"
        if self.s3 is not None:
            return "the path is on S3 (the Python writers upload through boto3)"
        why = None
        if self.opts.format == "parquet" and self.opts.codec == "brotli":
            why = "Spark ships no Brotli codec for Parquet (compression='brotli')"
        elif self.opts.max_row_count is not None and self.opts.format in ("json", "csv", "text"):
            why = (
                "max_row_count needs each file's row count, which Spark's text writers do not "
                "report"
            )
        if why and self.opts.writer == "spark":
            raise ConfigError(f"writer='spark' is not possible: {why}; use writer='auto'")
        if why and self.opts.local_path is None:
            raise ConfigError(
                f"the file sink cannot write {self.opts.path!r}: {why}, and the Python writers "
                f"do not write {self.opts.hadoop_scheme}:// paths"
            )
        return why

    def write_with_spark(
        self, df: Any, epoch: int, attempt: str, setup: Any
    ) -> list[dict[str, Any]]:
        """Spark's ``DataFrameWriter`` writes the epoch into its own staging directory.

        Spark's commit protocol moves only the files of committed tasks into it (failed and
        speculative attempts stay in its ``_temporary``, deleted with the epoch's staging).
        A local path is given to Spark as a ``file://`` URI: it is a directory on the nodes'
        own disks, whatever Spark's default filesystem is. Parquet and ORC files get their
        row counts from their footers (:meth:`check_spark_write` adds them up).
        """
        stage_rel = f"{self.staging_rel}/{epoch}/{attempt}"
        fmt = self.opts.format
        if self.opts.partition_by:
            df = guard_partition_values(df, self.opts.partition_by)
        w = df.write.format(fmt).mode("error")
        w = w.option("mapreduce.fileoutputcommitter.marksuccessfuljobs", "false")
        w = w.option("compression", self.opts.codec)
        if fmt == "csv":  # what the Python writers write: a header, RFC 4180 quoting
            w = w.option("header", "true").option("escape", '"')
        for k, v in self.opts.format_options.items():
            w = w.option(k, v)
        if self.opts.partition_by:
            w = w.partitionBy(*self.opts.partition_by)
        hadoop = self.hadoop
        try:
            w.save(hadoop.url(stage_rel) if hadoop else f"file://{self.root / stage_rel}")
        except Exception as exc:
            refused = guarded_error(exc, self.opts.partition_by)
            if refused is not None:  # a partition value the Python writers refuse too
                raise refused from None
            raise
        data_cols = [f for f in df.schema.fields if f.name not in self.opts.partition_by]
        sid = schema_id("spark", [(f.name, f.dataType.simpleString()) for f in data_cols])
        # The files of Spark's job as the driver sees them (never _temporary: the leftovers
        # of failed attempts; never Spark's "." files: Hadoop's checksums).
        if hadoop is not None:
            listed = hadoop.files(stage_rel)
        else:
            stage = self.root / stage_rel
            listed = [
                (p.relative_to(self.root).as_posix(), p.stat().st_size)
                for p in stage.rglob("*")
                if p.is_file()
            ]
        local = hadoop is None or hadoop.scheme == "file"
        files: list[dict[str, Any]] = []
        for rel, size in sorted(listed):
            parts = rel[len(stage_rel) + 1 :].split("/")
            if parts[-1].startswith(".") or any(x.startswith("_") for x in parts):
                continue
            rows: int | None = None
            if fmt in ("parquet", "orc") and size > 0:
                rows = self._footer_rows(rel, local)
            if size == 0 or rows == 0:  # Spark writes one empty file for an empty DataFrame
                if local:
                    (self.root / rel).unlink()
                else:
                    assert hadoop is not None
                    hadoop.delete(rel)
                continue
            files.append(
                {
                    "staged": rel,
                    "partition": "/".join(parts[:-1]),
                    "rows": rows,
                    "bytes": size,
                    "schema": sid,
                }
            )
        if self.opts.fsync and local:  # Spark's writers do not fsync: here, in parallel
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(max_workers=8) as pool:
                list(pool.map(fsync_path, [self.root / f["staged"] for f in files]))
            for d in {(self.root / f["staged"]).parent for f in files}:
                fsync_path(d)
        return [{"files": files, "stage": stage_rel}]

    def _footer_rows(self, rel: str, local: bool) -> int:
        """The rows of a staged Parquet or ORC file, from its footer."""
        if local:
            if self.opts.format == "parquet":
                import pyarrow.parquet as pq

                return int(pq.read_metadata(self.root / rel).num_rows)
            import pyarrow.orc as orc

            return int(orc.ORCFile(str(self.root / rel)).nrows)
        assert self.hadoop is not None
        if self.opts.format == "parquet":
            return self.hadoop.parquet_rows(rel)
        return self.hadoop.orc_rows(rel)

    def check_spark_write(self, epoch: int, results: Sequence[dict[str, Any]], rows: int) -> None:
        """Refuse an epoch whose staged files do not hold the rows Spark's write counted.

        Parquet and ORC: the rows of their footers. JSON lines, CSV and text staged on the
        driver's own filesystem (a local path, ``file://``): their records, counted in the
        files (decompressed when compressed). On other Hadoop filesystems, which every node
        and the driver see alike, JSON, CSV and text files are not read back (that would
        copy the whole epoch to the driver): only Parquet and ORC are counted there.

        Raises:
            SinkError: the files hold fewer rows than Spark wrote (or, where the count is
                exact, more), before anything of the epoch is persisted.
        """
        t0 = time.perf_counter()
        files = [f for r in results for f in r["files"]]
        stage = next((r["stage"] for r in results if r.get("stage")), None)
        fmt = self.opts.format
        counted = 0
        exact = True
        if fmt in ("parquet", "orc"):
            counted = sum(int(f["rows"]) for f in files)
        elif self.opts.local_path is None:
            log.debug("file sink epoch %d: %s files on %s are not counted", epoch, fmt, stage)
            return
        else:
            for n, is_exact in count_records(
                [self.root / f["staged"] for f in files], fmt, self.opts.format_options
            ):
                if n is None:  # a codec eosink cannot read (format_options' compression)
                    return
                counted += n
                exact = exact and is_exact
        where = f"{self.opts.path.rstrip('/')}/{stage}" if stage else self.opts.path
        log.debug(
            "file sink epoch %d: %d file(s) hold %d row(s) (Spark counted %d): %.1f ms",
            epoch,
            len(files),
            counted,
            rows,
            (time.perf_counter() - t0) * 1000,
        )
        if counted == rows or (not exact and counted > rows):
            if counted != rows:
                log.info(
                    "file sink epoch %d: %d %s records for %d rows (values that contain "
                    "line breaks); the rows of such files cannot be counted exactly",
                    epoch,
                    counted,
                    fmt,
                    rows,
                )
            return
        if counted < rows:
            raise SinkError(
                f"epoch {epoch}: Spark's write counted {rows} rows, but the {len(files)} "
                f"file(s) the driver finds in the staging directory {where} hold {counted}: "
                f"{rows - counted} rows were written where the driver does not see them. "
                f"The likely cause: the path {self.opts.path} is not the same directory on "
                "every node (a local path or file:// URI on each machine's own disk, not a "
                "mount every node shares), so the files of the tasks that ran on other "
                "machines stayed on those machines. Write to a location every node and the "
                "driver share (hdfs://, s3://, abfs://, gs://, a shared mount). (Over "
                "Spark Connect, \"the driver\" here is the client's Python, where eosink's "
                "coordinator runs: the path must be the same directory there too.) Nothing "
                "of this epoch was published or persisted."
            )
        raise SinkError(
            f"epoch {epoch}: Spark's write counted {rows} rows, but the {len(files)} file(s) "
            f"in the staging directory {where} hold {counted}: files that are not this "
            "write's are there (another writer uses this staging directory?). Nothing of "
            "this epoch was published or persisted."
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

    def _layout_where(self) -> str:
        if self.s3 is not None:
            return self.s3.url(LAYOUT_REL)
        if self.hadoop is not None:
            return self.hadoop.url(LAYOUT_REL)
        return str(self.root / LAYOUT_REL)

    def _init_layout(self) -> None:
        """Check this run's layout against the target's record (:func:`check_layout`).

        Without a record, a target that already holds committed epochs (written before
        eosink recorded layouts) adopts this run's layout now, once; an empty one records
        it with its first commit, so that a run that fails before committing anything does
        not fix a layout.
        """
        where = self._layout_where()
        try:
            raw = self._read_json(LAYOUT_REL)
        except ValueError as exc:
            raise SinkError(f"the file sink's layout record {where} is corrupt ({exc})") from None
        if raw is not None:
            check_layout(self.opts, raw, where)
            self._layout = {k: raw.get(k) for k in LAYOUT_KEYS}
            return
        self._layout = None
        if self._holds_commits():
            log.info(
                "file sink: the target %s has no layout record (written before eosink "
                "recorded one); adopting this run's format=%r, partition_by=%r in %s",
                self.opts.path,
                self.opts.format,
                list(self.opts.partition_by),
                where,
            )
            self._record_layout()

    def _holds_commits(self) -> bool:
        """Whether any sink committed an epoch to this target (a manifest exists)."""
        base = f"{MARKER_DIR}/{COMMITS_DIR}"
        if self.s3 is not None:
            return next(iter(self.s3.objects(base + "/")), None) is not None
        if self.hadoop is not None:
            return any(self.hadoop.names(f"{base}/{key}") for key in self.hadoop.names(base))
        return any(p.is_file() for p in (self.root / base).rglob("*.json"))

    def _record_layout(self, layout: Mapping[str, Any] | None = None) -> None:
        """Write the layout record (``layout``, default: this run's), unless the target has
        one already (then that one holds: :meth:`pre_commit` checks this run against it)."""
        have = self._read_json(LAYOUT_REL)
        if have is None:
            have = {k: (layout or layout_of(self.opts))[k] for k in LAYOUT_KEYS}
            self._write_json(LAYOUT_REL, {**have, "version": 1})
        self._layout = {k: have.get(k) for k in LAYOUT_KEYS}

    def target_id(self) -> str:
        return f"file:{self.opts.sink_path}"

    def journal_location(self) -> str | None:
        """The core's batch journal: ``_eosink/journal`` beside the files (local paths)."""
        local = self.opts.local_path
        return None if local is None else str(local / MARKER_DIR / "journal")

    # -- the marker ------------------------------------------------------------------------
    def read_marker(self) -> dict[str, Any] | None:
        try:
            data = self._read_json(self.marker_rel)
        except ValueError as exc:
            raise SinkError(
                f"the eosink marker {self.marker_rel} under {self.opts.path} is corrupt "
                f"({exc}); it records which epochs this directory holds. Restore it, or move "
                "the directory aside"
            ) from None
        if data is None:
            return None
        self._marker = data
        return dict(data)

    def _store_marker(self, marker: dict[str, Any]) -> None:
        self._write_json(self.marker_rel, marker)
        self._marker = marker

    def write_marker(self, marker: dict[str, Any]) -> None:
        last = self._last_epoch()
        self._store_marker({**marker, "last_epoch": last})

    def _last_epoch(self) -> int:
        if self._marker is None:
            self.read_marker()
        return int((self._marker or {}).get("last_epoch", -1))

    # -- the protocol ----------------------------------------------------------------------
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

    # -- rolling ---------------------------------------------------------------------------
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
