"""The file sink's native path: Spark's ``DataFrameWriter`` stages an epoch in the sink's
staging directory, and the driver checks that the files it finds hold the rows Spark's
write counted, before anything of the epoch is persisted."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from eosink import (
    ConfigError,
    SinkError,
)

from ._rolling import fsync_path
from .committed import count_records
from .layout import (
    guard_partition_values,
    guarded_error,
    schema_id,
)
from .state import CoordinatorState

__all__ = ["SparkStaging"]

log = logging.getLogger("eosink.file")


class SparkStaging(CoordinatorState):
    """The coordinator's part that stages an epoch with Spark's writers."""

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
