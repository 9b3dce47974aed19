"""The rows measured in the main environment (the project's pyspark): file sink batch and
stream, the Python writer path, Arrow batch sizes, the naive Iceberg peer, visibility lag."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from ._common import (
    SAMPLES,
    Data,
    Row,
    Size,
    failed_row,
    interleave,
    med,
    throughput_row,
    to_arrow,
)

MRPB = "spark.sql.execution.arrow.maxRecordsPerBatch"
MRPB_VALUES = (10_000, 100_000, 1_000_000)  # Spark's default first


def sink_options(sink: str, writer: str | None) -> dict[str, Any]:
    """``writer=`` for the sink if its options have that field (the native path's switch),
    else nothing: the harness runs before and after the sinks gain the option."""
    import eosink

    if writer is None:
        return {}
    fields = eosink.get_sink(sink).options_model.model_fields
    return {"writer": writer} if "writer" in fields else {}


def has_writer_option(sink: str) -> bool:
    import eosink

    return "writer" in eosink.get_sink(sink).options_model.model_fields


def raw_pyarrow(inp: Path, out: Path) -> None:
    """Read each input file and write it as Parquet (snappy, fsync'd), 2 threads: no Spark."""
    from concurrent.futures import ThreadPoolExecutor

    out.mkdir(parents=True, exist_ok=True)

    def one(p: Path) -> None:
        t = pq.read_table(p)
        with open(out / p.name, "wb") as fh:
            pq.write_table(t, fh, compression="snappy")
            fh.flush()
            os.fsync(fh.fileno())

    with ThreadPoolExecutor(2) as ex:
        list(ex.map(one, sorted(inp.glob("*.parquet"))))


def bare_map_in_arrow_writer(out: str) -> Callable[[Any], Any]:
    """A mapInArrow function writing each partition's rows to one Parquet file the way the
    file sink's Python writer does (pyarrow ParquetWriter, snappy, fsync), returning nothing.
    Self-contained (imports inside), so that cloudpickle ships it by value."""

    def write(batches: Any) -> Any:
        import os as _os
        import uuid as _uuid

        import pyarrow.parquet as _pq
        from pyspark import TaskContext

        _os.makedirs(out, exist_ok=True)
        tc = TaskContext.get()
        path = f"{out}/part-{tc.partitionId():05d}-{_uuid.uuid4().hex}.parquet"
        w = None
        with open(path, "wb") as fh:
            for b in batches:
                if b.num_rows == 0:
                    continue
                if w is None:
                    w = _pq.ParquetWriter(fh, b.schema, compression="snappy")
                w.write_batch(b)
            if w is not None:
                w.close()
            fh.flush()
            _os.fsync(fh.fileno())
        if w is None:
            _os.remove(path)
        return iter(())

    return write


class MainBench:
    """Runs the main environment's rows on one Spark session."""

    def __init__(self, spark: Any, data: Data, size: Size, tmp: Path, log: Any) -> None:
        self.spark = spark
        self.data = data
        self.size = size
        self.tmp = tmp
        self.log = log
        self.ms = f"sqlite:///{tmp / 'bench-metastore.db'}"
        self.schema = spark.read.parquet(str(data.path)).schema
        self.writers: dict[str, set[str]] = {}  # contender -> writer paths eosink took
        self.best_mrpb: int | None = None
        self.runs = 0

    def fresh(self, name: str) -> Path:
        """A new output directory (never reused: a path is a sink's identity)."""
        self.runs += 1
        p = self.tmp / "out" / f"{self.runs:04d}-{name}"
        shutil.rmtree(p, ignore_errors=True)
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def _took(self, contender: str, writer: str | None) -> None:
        self.writers.setdefault(contender, set()).add(writer or "?")

    def took(self, key: str, contender: str = "eosink") -> str:
        """Which writer path eosink took for ``key``'s runs, and the codec it wrote."""
        writers = "/".join(sorted(self.writers.get(key, {"?"})))
        return f"writer: {writers}, {self.codec(contender)}"

    def codec(self, contender: str) -> str:
        return self.codecs.get(contender, "?")

    def _times(self, contenders: dict[str, Callable[[str], Any]]) -> dict[str, list[float]]:
        self.codecs: dict[str, str] = {}
        return interleave(contenders, self.size.reps, self.fresh, log=self.log, codecs=self.codecs)

    # -- contenders ------------------------------------------------------------------------
    def eosink_batch(
        self, name: str, writer: str | None = None, **opts: Any
    ) -> Callable[[str], Any]:
        import eosink

        def run(out: str) -> None:
            res = eosink.run(
                self.spark.read.parquet(str(self.data.path)),
                sink="file",
                path=out,
                epoch=1,
                metastore_url=self.ms,
                **sink_options("file", writer),
                **opts,
            )
            self._took(name, res.figures.writer if res.figures else None)

        return run

    def stream(self) -> Any:
        return (
            self.spark.readStream.schema(self.schema)
            .option("maxFilesPerTrigger", self.size.files_per_trigger)
            .parquet(str(self.data.path))
        )

    # -- rows ------------------------------------------------------------------------------
    def file_batch(self) -> list[Row]:
        inp = str(self.data.path)
        rows = []
        for part in ((), ("country",)):
            label = "partitioned by country (8 values)" if part else "unpartitioned"
            self.log(f"  file sink batch, {label}")

            def spark_write(out: str, part: tuple[str, ...] = part) -> None:
                w = self.spark.read.parquet(inp).write
                (w.partitionBy(*part) if part else w).parquet(out)

            contenders: dict[str, Callable[[str], Any]] = {
                "eosink": self.eosink_batch(f"batch{part}", partition_by=part),
                "spark": spark_write,
            }
            if not part:
                contenders["pyarrow"] = lambda out: raw_pyarrow(self.data.path, Path(out))
            t = self._times(contenders)
            rows.append(
                throughput_row(
                    f"file sink batch / `df.write.parquet`, {label}",
                    self.data,
                    t["eosink"],
                    t["spark"],
                    0.95,
                    self.took(f"batch{part}"),
                    self.codec("spark"),
                )
            )
            if not part:
                rows.append(
                    throughput_row(
                        "file sink batch / raw pyarrow `read_table` + `write_table` per file "
                        "(2 threads, fsync; never goes through Spark)",
                        self.data,
                        t["eosink"],
                        t["pyarrow"],
                        None,
                        self.took(f"batch{part}"),
                        self.codec("pyarrow"),
                    )
                )
        return rows

    def python_path(self) -> list[Row]:
        """The Python writer path against a bare mapInArrow writing the same files, and the
        same Python path at each Arrow batch size."""
        self.log("  Python writer path / bare mapInArrow; Arrow batch sizes")
        inp = str(self.data.path)
        spark = self.spark
        default = spark.conf.get(MRPB, None)

        def at(n: int, fn: Callable[[str], Any]) -> Callable[[str], Any]:
            def run(out: str) -> None:
                spark.conf.set(MRPB, str(n))
                try:
                    fn(out)
                finally:
                    if default is None:
                        spark.conf.unset(MRPB)
                    else:
                        spark.conf.set(MRPB, default)

            return run

        def bare(out: str) -> None:
            spark.read.parquet(inp).mapInArrow(bare_map_in_arrow_writer(out), "x long").collect()

        contenders: dict[str, Callable[[str], Any]] = {
            "eosink-python": at(MRPB_VALUES[0], self.eosink_batch("python", "python")),
            "mapInArrow": at(MRPB_VALUES[0], bare),
        }
        for n in MRPB_VALUES[1:]:
            contenders[f"eosink-python-{n}"] = at(n, self.eosink_batch(f"python{n}", "python"))
        t = self._times(contenders)
        took = self.took("python", "eosink-python")
        rows = []
        if "writer: python" not in took:
            why = (
                f"the file sink took the native path ({took}) and has no writer= option "
                "to force its Python writers"
            )
            rows.append(failed_row("Python writer path / bare `mapInArrow`", 0.95, why))
        else:
            rows.append(
                throughput_row(
                    'Python writer path (file sink, `writer="python"`) / bare `mapInArrow` '
                    "writing the same Parquet files (pyarrow, snappy, fsync), returning nothing",
                    self.data,
                    t["eosink-python"],
                    t["mapInArrow"],
                    0.95,
                    took,
                    self.codec("mapInArrow"),
                )
            )
        base = t["eosink-python"]
        meds = {
            n: med(t[f"eosink-python-{n}"] if n != MRPB_VALUES[0] else base) for n in MRPB_VALUES
        }
        best = min(meds, key=lambda n: meds[n])
        for n in MRPB_VALUES[1:]:
            rows.append(
                throughput_row(
                    f"Python writer path, `{MRPB}` = {n:,} / {MRPB_VALUES[0]:,} (Spark's default)"
                    + (" **best**" if n == best else ""),
                    self.data,
                    t[f"eosink-python-{n}"],
                    base,
                    None,
                    self.took(f"python{n}", f"eosink-python-{n}"),
                    took,
                )
            )
        self.best_mrpb = best
        rows.append(
            Row(
                f"`{MRPB}` for the Python writer path: the best of "
                + " / ".join(f"{n:,}" for n in MRPB_VALUES),
                f"{best:,}" + (" (Spark's default)" if best == MRPB_VALUES[0] else ""),
                "-",
                f"{meds[MRPB_VALUES[0]] / meds[best]:.2f} x the default's throughput",
                "info (eosink's defaults unchanged)",
                "-",
                "info",
            )
        )
        return rows

    def file_stream(self) -> list[Row]:
        self.log("  file sink stream")
        import eosink

        def eos(out: str) -> None:
            h = eosink.run(
                self.stream(),
                sink="file",
                path=f"{out}/data",
                checkpoint_location=f"{out}/chk",
                trigger={"availableNow": True},
                metastore_url=self.ms,
            )
            h.await_termination()
            for f in h.figures:
                self._took("stream", f.writer)

        def spark(out: str) -> None:
            q = (
                self.stream()
                .writeStream.format("parquet")
                .option("path", f"{out}/data")
                .option("checkpointLocation", f"{out}/chk")
                .trigger(availableNow=True)
                .start()
            )
            q.awaitTermination()

        t = self._times({"eosink": eos, "spark": spark})
        return [
            throughput_row(
                'file sink stream / `writeStream.format("parquet")` (availableNow, '
                f"maxFilesPerTrigger={self.size.files_per_trigger}: "
                f"{self.size.batches} micro-batches)",
                self.data,
                t["eosink"],
                t["spark"],
                1.0,
                self.took("stream"),
                self.codec("spark"),
            )
        ]

    def iceberg_naive(self) -> list[Row]:
        return self._iceberg_naive(partitioned=False) + self._iceberg_naive(partitioned=True)

    def _iceberg_naive(self, partitioned: bool) -> list[Row]:
        """eosink's iceberg stream against the naive append; ``partitioned``: both tables
        partitioned by ``day(ts)`` and ``country`` (a string column)."""
        self.log(
            "  iceberg stream / naive foreachBatch append"
            + (", partitioned by day(ts), country" if partitioned else "")
        )
        from pyiceberg.catalog import load_catalog
        from pyiceberg.transforms import DayTransform, IdentityTransform

        import eosink

        arrow_schema = to_arrow(self.spark.read.parquet(str(self.data.path)).limit(0)).schema
        partition_by = ["day(ts)", "country"] if partitioned else []
        key = "iceberg-partitioned" if partitioned else "iceberg"

        def eos(out: str) -> None:
            h = eosink.run(
                self.stream(),
                sink="iceberg",
                sink_id=f"bench-{Path(out).name}",  # the default names the table, not the
                table="b.t",  # warehouse: every run has its own
                warehouse=f"{out}/wh",
                checkpoint_location=f"{out}/chk",
                trigger={"availableNow": True},
                metastore_url=self.ms,
                partition_by=partition_by,
            )
            h.await_termination()
            for f in h.figures:
                self._took(key, f.writer)

        def naive(out: str) -> None:
            wh = Path(out) / "wh"
            wh.mkdir(parents=True)
            cat = load_catalog(
                "b", type="sql", uri=f"sqlite:///{wh / 'catalog.db'}", warehouse=f"file://{wh}"
            )
            cat.create_namespace_if_not_exists("b")
            table = cat.create_table("b.t", schema=arrow_schema)
            if partitioned:
                with table.update_spec() as u:
                    u.add_field("ts", DayTransform(), "ts_day")
                    u.add_field("country", IdentityTransform(), "country")
            q = (
                self.stream()
                .writeStream.foreachBatch(lambda df, _: table.append(to_arrow(df)))
                .option("checkpointLocation", f"{out}/chk")
                .trigger(availableNow=True)
                .start()
            )
            q.awaitTermination()

        t = self._times({"eosink": eos, "naive": naive})
        return [
            throughput_row(
                "iceberg stream / naive `foreachBatch(lambda df, _: "
                "table.append(df.toArrow()))` (pyiceberg SQL catalog on SQLite)"
                + (", both tables partitioned by `day(ts)`, `country`" if partitioned else ""),
                self.data,
                t["eosink"],
                t["naive"],
                1.5 if partitioned else 2.0,
                self.took(key),
                f"{self.codec('naive')}; not exactly once",
            )
        ]

    def visibility_lag(self) -> list[Row]:
        self.log("  visibility lag at a 1 s processing-time trigger")
        import eosink

        base = self.fresh("lag")
        lag_in = base / "in"
        lag_in.mkdir(parents=True)
        sdf = (
            self.spark.readStream.schema(self.schema)
            .option("maxFilesPerTrigger", 1)
            .parquet(str(lag_in))
        )
        h = eosink.run(
            sdf,
            sink="file",
            path=str(base / "data"),
            checkpoint_location=str(base / "chk"),
            trigger={"processingTime": "1 second"},
            metastore_url=self.ms,
        )
        try:
            src = sorted(self.data.path.glob("*.parquet"))
            for i in range(self.size.lag_triggers):
                shutil.copy(src[i % len(src)], lag_in / f"x-{i:03d}.parquet")
                time.sleep(1.0)
            h.process_all_available()
        finally:
            h.stop()
        shutil.rmtree(base, ignore_errors=True)
        done = [f for f in h.figures if f.committed_at]
        if not done:
            return [failed_row("visibility lag / trigger interval", None, "no epoch committed")]
        lag = med([f.visibility_lag_s for f in done])
        commit = med([f.commit_ms for f in done])
        SAMPLES["lag"] = {
            "trigger_ms": 1000.0,
            "lag_ms": [f.visibility_lag_s * 1000 for f in done],
            "commit_ms": [f.commit_ms for f in done],
        }
        return [
            Row(
                f"visibility lag / trigger interval (1 s processingTime trigger, {len(done)} "
                "epochs, commit after Spark's checkpoint)",
                f"lag p50 {lag * 1000:.0f} ms, commit p50 {commit:.1f} ms",
                "trigger 1000 ms",
                f"{lag / 1.0:.3f}",
                "info (lower is better)",
                "-",
                "info",
            )
        ]
