"""The kafka sink's native path: Spark's Parquet writer stages an epoch's records (one file
per partition) in the staging location, observed for its largest record; the driver checks
that it sees every row Spark wrote."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from eosink import SinkError
from eosink.util import fsync_path

from .checks import TargetChecks
from .records import largest_record
from .stage import LocalStage, S3Stage, staged_file_info

__all__ = ["SparkStaging"]

log = logging.getLogger("eosink.kafka")


def _observe_largest(df: Any) -> tuple[Any, Any]:
    """``df`` observed for its largest record (key, value and headers bytes, as librdkafka
    counts them), and a function that returns it once the write ran (None: not observed)."""
    try:
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        names = set(df.columns)
        parts = [
            F.coalesce(F.octet_length(F.col(c)), F.lit(0)) for c in ("value", "key") if c in names
        ]
        if "headers" in names:
            parts.append(
                F.coalesce(
                    F.expr(
                        "aggregate(headers, 0L, (acc, h) -> acc + "
                        "coalesce(octet_length(h.key), 0) + coalesce(octet_length(h.value), 0))"
                    ),
                    F.lit(0),
                )
            )
        size = parts[0]
        for more in parts[1:]:
            size = size + more
        obs = Observation(f"eosink_largest_{uuid.uuid4().hex[:8]}")
        observed = df.observe(obs, F.max(size.cast("long")).alias("largest"))
    except Exception as exc:  # a front end without observe(): the files are read instead
        log.debug("kafka sink: records not observed (%s)", exc)
        return df, lambda: None

    def largest() -> int | None:
        try:
            value = obs.get.get("largest")
        except Exception as exc:
            log.debug("kafka sink: no observed record size (%s)", exc)
            return None
        return int(value or 0)

    return observed, largest


def _largest_of_file(path: Any) -> int:
    """:func:`largest_record` of a staged file (its key, value and headers columns)."""
    import pyarrow.parquet as pq

    names = pq.read_schema(path).names
    cols = [c for c in ("value", "key", "headers") if c in names]
    return largest_record(pq.read_table(path, columns=cols)) if cols else 0


class SparkStaging(TargetChecks):
    """The coordinator's part that stages an epoch with Spark's writer."""

    def spark_write_unsupported(self, schema: pa.Schema) -> str | None:
        if self.opts.writer == "python":
            return "the kafka sink's option writer='python'"
        if isinstance(self.stage, S3Stage):
            return (
                "the kafka sink stages on S3 (Spark has no s3:// file system without "
                "hadoop-aws): the Python writers upload through boto3"
            )
        return None

    def write_with_spark(
        self, df: Any, epoch: int, attempt: str, setup: Any
    ) -> list[dict[str, Any]]:
        """Spark's Parquet writer stages the epoch's records (one file per partition)."""
        assert isinstance(self.stage, LocalStage)
        root = self.stage.root
        stage = root / self.key / str(epoch) / attempt
        df, largest = _observe_largest(df)
        df.write.mode("error").option(
            "mapreduce.fileoutputcommitter.marksuccessfuljobs", "false"
        ).parquet(str(stage))
        biggest = largest()
        files: list[dict[str, Any]] = []
        for p in sorted(stage.glob("part-*")) if stage.is_dir() else []:
            if not p.is_file():
                continue
            rows, size = staged_file_info(p)
            if rows == 0:
                p.unlink()
                continue
            rel = p.relative_to(root).as_posix()
            f = {"staged": rel, "rows": rows, "bytes": p.stat().st_size, "raw": size}
            f["targets"] = [[t, n] for t, n in self._targets_of_file(p).items()]
            f["largest"] = biggest if biggest is not None else _largest_of_file(p)
            files.append(f)
        if self.opts.fsync:
            with ThreadPoolExecutor(max_workers=8) as pool:
                list(pool.map(fsync_path, [root / str(f["staged"]) for f in files]))
            if stage.is_dir():
                fsync_path(stage)
        return [{"files": files}]

    def check_spark_write(self, epoch: int, results: Sequence[dict[str, Any]], rows: int) -> None:
        """The rows of the staged files this driver found must be the rows Spark wrote: on a
        cluster whose ``staging_path`` is not shared, the executors' files are elsewhere,
        and the epoch is refused before it is persisted."""
        seen = sum(int(f["rows"]) for r in results for f in r["files"])
        if seen != rows:
            raise SinkError(
                f"kafka sink epoch {epoch}: Spark staged {rows} rows under {self.stage.url}, "
                f"but this driver finds {seen} there: staging_path is not shared by the "
                "executors and the driver. Nothing was published; set staging_path to a "
                "location every node reaches (a shared mount, or s3://bucket/prefix)"
            )
