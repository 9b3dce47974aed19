"""The protocol's cost at scale (issue 24): ``python -m bench.scale``.

* **tasks**: one batch epoch of the file sink written by 10, 100 and 1,000 Spark tasks (a
  DataFrame of that many partitions, ``writer="python"``: one staged file per task): the
  driver's ``pre_commit``, persist and commit times, and the committable's size in the meta
  store. Target: linear growth, under 1 s for 1,000 results.
* **epochs**: N empty epochs of one stream through the code a micro-batch runs (the
  ``protocol`` part's loop, SQLite meta store, checkpoint journal): p50 per window of the
  run, and the meta store's size at the end. Target: flat cost, store under 10 MB after
  100,000 epochs.
* **sinks**: 64 sinks streaming at once against one PostgreSQL meta store (embedded server, or
  ``--pg``), each in its own process as each stream has its own driver, each running an empty
  epoch through a micro-batch's code every ``--interval`` s (its phase spread over the
  interval): the protocol's cost per epoch p50/p99 and the errors, against one sink alone
  paced the same. Target: p99 within 2x of one sink's.
* **memory**: the driver's memory over 10,000 micro-batches of one stream: eosink's own
  micro-batch function (``StreamBatches``, the async committer, the handle's figures) on a
  SQLite meta store and a local checkpoint, Spark's write left out (the DataFrame is
  empty and its commit log written as Spark would). The process's RSS and Python's traced
  allocations every 1,000 micro-batches. Target: no growth.
* **iceberg**: a stream of ``--iceberg-batches`` micro-batches (default 1,000, 1,000 rows
  each) into one Iceberg table (pyiceberg SQL catalog on SQLite, local warehouse), eosink's
  iceberg sink against the naive ``foreachBatch(lambda df, _: table.append(df.toArrow()))``,
  one after the other: the time between two micro-batch ends, and eosink's commit time, over
  the first and the last tenth of the stream. Every micro-batch adds a snapshot, and the
  table's metadata grows with them. Target: flat cost (last / first tenth near 1).

Prints one table; record the figures in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ._common import failure, med, pct, to_arrow
from ._protocol import protocol_cost


def _committable_bytes(url: str, sink_id: str, epoch: int) -> int | None:
    import sqlalchemy as sa

    eng = sa.create_engine(url)
    try:
        with eng.connect() as c:
            n = c.execute(
                sa.text(
                    "select length(committable) from pending_sink_state "
                    "where sink_id = :s and epoch = :e"
                ),
                {"s": sink_id, "e": epoch},
            ).scalar()
    finally:
        eng.dispose()
    return None if n is None else int(n)


def tasks_part(tmp: Path, counts: list[int], reps: int) -> list[str]:
    import eosink

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = eosink.spark_session("local[2]")
    spark.sparkContext.setLogLevel("ERROR")
    url = f"sqlite:///{tmp / 'tasks.db'}"
    lines = [
        "| tasks (staged files) | pre_commit ms | persist ms | commit ms | committable bytes "
        "| bytes per result | write s |",
        "|---|---|---|---|---|---|---|",
    ]
    try:
        for n in counts:
            figs = []
            size = None
            for r in range(reps + 1):
                out = tmp / f"tasks-{n}-{r}"
                df = spark.range(0, n * 10, numPartitions=n)
                res = eosink.run(
                    df, sink="file", path=str(out), epoch=1, metastore_url=url, writer="python"
                )
                f = res.figures
                assert f is not None and f.files == n, (n, f)
                size = _committable_bytes(url, res.sink_id, 1) or size
                if r:  # the first run warms up
                    figs.append(f)
                shutil.rmtree(out, ignore_errors=True)
            pre = med([f.pre_commit_ms for f in figs])
            per = med([f.persist_ms for f in figs])
            com = med([f.commit_ms for f in figs])
            wr = med([f.write_s for f in figs])
            per_result = f"{size / n:.0f}" if size else "-"
            lines.append(
                f"| {n:,} | {pre:.1f} | {per:.1f} | {com:.1f} | {size or '-'} | {per_result} "
                f"| {wr:.2f} |"
            )
            print(lines[-1], flush=True)
    finally:
        spark.stop()
    return lines


def epochs_part(tmp: Path, epochs: int) -> list[str]:
    db = tmp / "epochs.db"
    url = f"sqlite:///{db}"
    t0 = time.perf_counter()
    costs = protocol_cost(url, "scale", epochs, tmp)
    took = time.perf_counter() - t0
    wal_path = db.with_name(db.name + "-wal")
    wal = wal_path.stat().st_size if wal_path.exists() else 0
    windows = 10
    size = max(1, epochs // windows)
    lines = [
        f"{epochs:,} epochs in {took:.0f} s; meta store {db.stat().st_size / 1e6:.2f} MB "
        f"(SQLite file) + {wal / 1e6:.2f} MB write-ahead log; p99 of all "
        f"{pct(costs, 0.99):.2f} ms",
        "",
        "| epochs | p50 ms | p99 ms |",
        "|---|---|---|",
    ]
    for w in range(windows):
        c = costs[w * size : (w + 1) * size]
        if c:
            lines.append(
                f"| {w * size:,}-{w * size + len(c) - 1:,} | {med(c):.2f} | {pct(c, 0.99):.2f} |"
            )
    return lines


def _sink_worker(
    url: str,
    index: int,
    n: int,
    tmp: str,
    duration: float,
    interval: float,
    ready: Any,
    out: Any,
) -> None:
    """One stream's driver of the sinks part: an empty epoch every ``interval`` s."""
    from ._protocol import empty_epoch, stream_runtime

    costs: list[float] = []
    cpu: list[float] = []
    queued: list[float] = []
    errors: list[str] = []
    try:
        with stream_runtime(url, f"s{index}", Path(tmp)) as rt:
            ready.wait(timeout=600)
            start = time.monotonic() + interval * index / n
            e = tick = 0
            failed_in_a_row = 0
            while True:
                at = start + tick * interval
                if at - start > duration:
                    break
                time.sleep(max(0.0, at - time.monotonic()))
                tick += 1
                try:
                    c0, q0 = time.process_time(), _run_queue_ms()
                    cost = empty_epoch(rt, e)
                    cpu.append((time.process_time() - c0) * 1000)
                    queued.append(_run_queue_ms() - q0)
                    costs.append(cost)
                    e += 1
                    failed_in_a_row = 0
                except Exception as exc:  # counted; the same epoch again at the next tick
                    errors.append(failure(exc, 200))
                    failed_in_a_row += 1
                    if failed_in_a_row >= 3:
                        errors.append("gave up after 3 failed epochs in a row")
                        break
    except Exception as exc:
        errors.append(failure(exc, 200))
        try:
            ready.abort()
        except Exception:
            pass
    out.put((index, costs, cpu, queued, errors))


def _run_queue_ms() -> float:
    """Milliseconds this thread has spent runnable but waiting for a CPU (Linux schedstat):
    the part of an epoch's time that is the machine's CPU scheduling, not the meta store."""
    try:
        return int(Path("/proc/thread-self/schedstat").read_text().split()[1]) / 1e6
    except (OSError, IndexError, ValueError):
        return 0.0


def _run_sinks(url: str, n: int, tmp: Path, duration: float, interval: float) -> dict[str, Any]:
    import multiprocessing as mp
    import queue as queue_mod

    import sqlalchemy as sa

    ctx = mp.get_context("spawn")
    ready = ctx.Barrier(n + 1)
    out = ctx.Queue()
    procs = [
        ctx.Process(
            target=_sink_worker,
            args=(url, i, n, str(tmp / f"sinks-{n}"), duration, interval, ready, out),
            daemon=True,
        )
        for i in range(n)
    ]
    for p in procs:
        p.start()
    eng = sa.create_engine(url, poolclass=sa.pool.NullPool)
    db = sa.engine.make_url(url).database
    peak = 0
    results: dict[int, tuple[list[float], list[float], list[float], list[str]]] = {}
    try:
        ready.wait(timeout=900)
        store_cpu0 = _postgres_cpu_s()
        deadline = time.monotonic() + duration + 120
        while len(results) < n and time.monotonic() < deadline:
            with eng.connect() as c:
                peak = max(
                    peak,
                    int(
                        c.execute(
                            sa.text("select count(*) from pg_stat_activity where datname = :d"),
                            {"d": db},
                        ).scalar()
                        or 0
                    )
                    - 1,  # this sampler's own connection
                )
            try:
                while True:
                    i, *result = out.get(timeout=0.5)
                    results[i] = tuple(result)  # type: ignore[assignment]
            except queue_mod.Empty:
                pass
        store_cpu = _postgres_cpu_s() - store_cpu0
    except threading.BrokenBarrierError:
        store_cpu = float("nan")
    finally:
        eng.dispose()
    try:
        while len(results) < n:
            i, *result = out.get(timeout=60)
            results[i] = tuple(result)  # type: ignore[assignment]
    except queue_mod.Empty:
        pass
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
    costs = [c for cs, _, _, _ in results.values() for c in cs]
    cpu = [c for _, cs, _, _ in results.values() for c in cs]
    queued = [q for _, _, qs, _ in results.values() for q in qs]
    errors = [e for _, _, _, es in results.values() for e in es]
    errors += [f"sink {i}: no result (its process died)" for i in range(n) if i not in results]
    return {
        "costs": costs,
        "cpu": cpu,
        "queued": queued,
        "errors": errors,
        "peak": peak,
        "store_cpu": store_cpu,
    }


def _postgres_cpu_s() -> float:
    """CPU seconds used so far by this machine's PostgreSQL server processes (/proc), ended
    backends included."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        if name.startswith("postgres"):
            fields = text[text.rindex(")") + 2 :].split()
            # utime + stime, and cutime + cstime: backends that ended, reaped by the postmaster
            total += sum(int(f) for f in fields[11:15]) / tick
    return total


def sinks_part(
    tmp: Path,
    counts: list[int],
    duration: float,
    interval: float,
    pg_admin: str | None,
    same_rate: bool = True,
) -> list[str]:
    """One row per sink count (each sink an epoch every ``interval`` s), and with
    ``same_rate`` a row of one sink at the largest count's total rate (as many epochs)."""
    from ._protocol import postgres

    lines = [
        "| sinks | an epoch every | epochs | epochs/s | p50 ms | p99 ms | max ms "
        "| p99 / one sink's | run-queue wait ms p99 | p99 ms without it | its ratio "
        "| driver CPU ms p50 / p99 | server CPU ms per epoch | errors | peak connections |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    runs = [(n, interval) for n in counts]
    if same_rate and max(counts) > 1:
        runs.insert(1, (1, interval / max(counts)))
    errors_seen: list[str] = []
    with postgres(pg_admin, lambda m: print(m, flush=True)) as url:
        if url is None:
            return ["PostgreSQL unavailable: the sinks part needs it (--pg or the dev deps)"]
        base: tuple[float, float] | None = None
        for n, every in runs:
            print(f"  {n} sink(s), {duration:g} s, an epoch every {every:g} s each", flush=True)
            r = _run_sinks(url, n, tmp / f"i{every:g}", duration, every)
            c = r["costs"]
            if not c:
                lines.append(
                    f"| {n} | {every:g} s | 0 | - | - | - | - | - | - | - | - | - | - "
                    f"| {len(r['errors'])} | {r['peak']} |"
                )
                errors_seen += r["errors"]
                continue
            p99 = pct(c, 0.99)
            # Each epoch's time less the time its thread waited for a CPU: the store's and
            # the disk's part (on a cluster each driver has its own cores).
            off_queue = [cost - q for cost, q in zip(c, r["queued"], strict=True)]
            p99_off = pct(off_queue, 0.99)
            base = base or (p99, p99_off)
            lines.append(
                f"| {n} | {every:g} s | {len(c):,} | {len(c) / duration:.1f} | {med(c):.2f} "
                f"| {p99:.2f} | {max(c):.2f} | {p99 / base[0]:.2f} "
                f"| {pct(r['queued'], 0.99):.2f} | {p99_off:.2f} | {p99_off / base[1]:.2f} "
                f"| {med(r['cpu']):.2f} / {pct(r['cpu'], 0.99):.2f} "
                f"| {r['store_cpu'] * 1000 / len(c):.2f} | {len(r['errors'])} | {r['peak']} |"
            )
            print(lines[-1], flush=True)
            errors_seen += r["errors"]
    if errors_seen:
        counted = collections.Counter(errors_seen)
        lines += ["", "Errors:"] + [f"* {k} ({v}x)" for k, v in counted.most_common(10)]
    return lines


class _NoSpark:
    """A micro-batch's DataFrame for the memory part: empty; Spark is left out."""


def memory_part(tmp: Path, batches: int, every: int) -> list[str]:
    import gc
    import tracemalloc
    from unittest import mock

    import eosink._write as write_mod
    from eosink._checkpoint import CheckpointDir
    from eosink._handles import StreamingHandle
    from eosink._write import Written

    from ._protocol import SCHEMA, stream_runtime

    def rss_mb() -> float:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    ckpt_path = tmp / "memory-ckpt"
    ckpt = CheckpointDir(None, str(ckpt_path))
    commits = ckpt_path / "commits"
    lines = [
        "| micro-batches | RSS MB | traced Python MB | handle figures | runtime figures "
        "| ms per micro-batch (p50 of the last 1,000) |",
        "|---|---|---|---|---|---|",
    ]
    with stream_runtime(f"sqlite:///{tmp / 'memory.db'}", "memory", tmp) as rt:
        from eosink._protocol import AsyncCommitter
        from eosink._stream import StreamBatches, _Live

        committer = AsyncCommitter(rt, lambda e: ckpt.has_commit(e))
        fn = StreamBatches.__new__(StreamBatches)
        fn.settings = mock.Mock(epoch_base=0, inline=False, max_pending_epochs=8)
        fn.figures = []
        fn.live = _Live(rt, committer, fn.figures, None, resumed=True)
        handle = StreamingHandle(mock.Mock(), rt.sink_id, 0, fn)
        empty = Written([], 0, 0.0, "python")
        costs: list[float] = []
        tracemalloc.start()
        with (
            mock.patch.object(write_mod, "write_or_discard", lambda df, ep, schema: empty),
            mock.patch.object(write_mod, "arrow_schema", lambda df: SCHEMA),
        ):
            for b in range(batches):
                t0 = time.perf_counter()
                fn(_NoSpark(), b)  # type: ignore[arg-type]
                # Spark's commit log: the micro-batch returned (Spark keeps the newest 100)
                commits.mkdir(parents=True, exist_ok=True)
                (commits / str(b)).write_text('v1\n{"nextBatchWatermarkMs":0}')
                (commits / str(b - 200)).unlink(missing_ok=True)
                costs.append((time.perf_counter() - t0) * 1000)
                if (b + 1) % every == 0 or b + 1 == batches:
                    gc.collect()
                    traced = tracemalloc.get_traced_memory()[0] / 1e6
                    lines.append(
                        f"| {b + 1:,} | {rss_mb():.1f} | {traced:.2f} | {len(handle.figures):,} "
                        f"| {len(rt.figures):,} | {med(costs[-every:]):.2f} |"
                    )
                    print(lines[-1], flush=True)
        committer.drain(until_checkpointed=True)
        snapshot = tracemalloc.take_snapshot()
        tracemalloc.stop()
    top = snapshot.statistics("lineno")[:5]
    lines += ["", "Largest traced allocations at the end:"] + [
        f"* {st.traceback[0].filename.split('site-packages/')[-1]}:{st.traceback[0].lineno}: "
        f"{st.size / 1e3:.0f} KB in {st.count:,} blocks"
        for st in top
    ]
    return lines


def _iceberg_stream(tmp: Path, n: int, who: str) -> tuple[list[float], list[float], int]:
    """Stream ``n`` one-file micro-batches into a new table; return the seconds between
    micro-batch ends, eosink's commit ms per epoch (empty for the naive peer) and the size
    of the table's newest metadata file."""
    import pyarrow.parquet as pq

    import eosink

    inp = tmp / "iceberg-in"
    if not inp.exists():
        import pyarrow as pa

        inp.mkdir()
        for i in range(n):
            pq.write_table(
                pa.table(
                    {
                        "id": pa.array(range(i * 1000, (i + 1) * 1000), pa.int64()),
                        "s": pa.array([f"v{j % 7}" for j in range(1000)]),
                    }
                ),
                inp / f"f{i:06d}.parquet",
            )
    out = tmp / f"iceberg-{who}"
    spark = eosink.spark_session("local[2]", app_name="eosink-scale")
    spark.sparkContext.setLogLevel("ERROR")
    schema = spark.read.parquet(str(inp)).schema
    stream = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(inp))
    ends: list[float] = []
    commits: list[float] = []
    from pyiceberg.catalog import load_catalog

    wh = out / "wh"
    wh.mkdir(parents=True)
    cat = load_catalog(
        "b", type="sql", uri=f"sqlite:///{wh / 'catalog.db'}", warehouse=f"file://{wh}"
    )
    if who == "eosink":
        h = eosink.run(
            stream,
            sink="iceberg",
            sink_id="scale-iceberg",
            table="b.t",
            warehouse=str(wh),
            catalog_name="b",
            checkpoint_location=str(out / "chk"),
            trigger={"availableNow": True},
            metastore_url=f"sqlite:///{out / 'metastore.db'}",
        )
        h.await_termination()
        figs = sorted(h.figures, key=lambda f: f.epoch)
        ends = [f.committed_at for f in figs]
        commits = [f.commit_ms for f in figs]
    else:
        cat.create_namespace_if_not_exists("b")
        table = cat.create_table(
            "b.t", schema=to_arrow(spark.read.parquet(str(inp)).limit(0)).schema
        )

        def append(df: Any, _: int) -> None:
            table.append(to_arrow(df))
            ends.append(time.time())

        q = (
            stream.writeStream.foreachBatch(append)
            .option("checkpointLocation", str(out / "chk"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()
    table = cat.load_table("b.t")
    assert table.scan().count() == n * 1000, f"{who}: rows missing"
    meta = Path(table.metadata_location.removeprefix("file://")).stat().st_size
    gaps = [b - a for a, b in itertools.pairwise(ends)]
    return gaps, commits, meta


def iceberg_part(tmp: Path, n: int) -> list[str]:
    import eosink

    eosink.spark_session("local[2]", app_name="eosink-scale")
    tenth = max(1, n // 10)
    rows = []
    for who in ("eosink", "naive"):
        t0 = time.perf_counter()
        gaps, commits, meta = _iceberg_stream(tmp, n, who)
        took = time.perf_counter() - t0
        first, last = gaps[:tenth], gaps[-tenth:]
        cell = "-"
        if commits:
            cf, cl = med(commits[:tenth]), med(commits[-tenth:])
            cell = f"{cf:.1f} / {cl:.1f} ({cl / cf:.2f})"
        rows.append(
            f"| {who} | {n:,} | {took:.0f} | {med(first) * 1000:.0f} / {med(last) * 1000:.0f} "
            f"| {med(last) / med(first):.2f} | {cell} | {meta / 1e6:.2f} |"
        )
        print(rows[-1], flush=True)
    return [
        "| writer | micro-batches | s | ms per micro-batch, p50 first / last tenth | "
        "last / first | eosink commit ms p50, first / last tenth (ratio) | metadata file MB |",
        "|---|---|---|---|---|---|---|",
        *rows,
    ]


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n")[0])
    ap.add_argument(
        "--only",
        choices=["tasks", "epochs", "sinks", "memory", "iceberg"],
        action="append",
        help="a part to run (repeatable; default all)",
    )
    ap.add_argument("--tasks", default="10,100,1000", help="task counts of the tasks part")
    ap.add_argument("--reps", type=int, default=3, help="runs per task count (after a warm-up)")
    ap.add_argument("--epochs", type=int, default=100_000, help="epochs of the epochs part")
    ap.add_argument("--sinks", default="1,64", help="sink counts of the sinks part")
    ap.add_argument("--duration", type=float, default=240.0, help="seconds of each sinks run")
    ap.add_argument("--interval", type=float, default=4.0, help="s between a sink's epochs")
    ap.add_argument(
        "--no-same-rate",
        action="store_true",
        help="sinks part: leave out the row of one sink at the largest count's total rate",
    )
    ap.add_argument("--pg", help="a PostgreSQL admin URL (default: an embedded server)")
    ap.add_argument("--batches", type=int, default=10_000, help="micro-batches, memory part")
    ap.add_argument("--iceberg-batches", type=int, default=1000, help="micro-batches, iceberg part")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="eosink-scale-"))
    try:
        parts = a.only or ["tasks", "epochs", "sinks", "memory", "iceberg"]
        if "tasks" in parts:
            print("## One epoch written by many tasks (file sink, Python writers)\n", flush=True)
            lines = tasks_part(tmp, [int(x) for x in a.tasks.split(",")], a.reps)
            print("\n" + "\n".join(lines) + "\n", flush=True)
        if "epochs" in parts:
            print(f"## {a.epochs:,} epochs of one sink (SQLite meta store)\n", flush=True)
            print("\n".join(epochs_part(tmp, a.epochs)) + "\n", flush=True)
        if "sinks" in parts:
            print("## Many sinks on one PostgreSQL meta store\n", flush=True)
            lines = sinks_part(
                tmp,
                [int(x) for x in a.sinks.split(",")],
                a.duration,
                a.interval,
                a.pg,
                same_rate=not a.no_same_rate,
            )
            print("\n" + "\n".join(lines) + "\n", flush=True)
        if "memory" in parts:
            print(f"## The driver's memory over {a.batches:,} micro-batches\n", flush=True)
            lines = memory_part(tmp, a.batches, max(1, a.batches // 10))
            print("\n" + "\n".join(lines) + "\n", flush=True)
        if "iceberg" in parts:
            n = a.iceberg_batches
            print(f"## {n:,} micro-batches into one Iceberg table\n", flush=True)
            print("\n" + "\n".join(iceberg_part(tmp, n)) + "\n", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
