"""Every side of the Delta rows, in the pyspark 4.0 environment (``bench/_py40.py``: Delta
publishes its Spark connector for Spark 4.0-4.2, not the project's pyspark); started by
``python -m bench.delta``, figures as JSON to ``--out``.

* **append**: the same stream (``availableNow``, ``maxFilesPerTrigger``), fresh table and
  checkpoint each run, into eosink's delta sink (Spark's own Parquet writer stages, delta-rs
  commits), Delta's own ``writeStream.format("delta")`` (delta-spark), and a naive
  ``foreachBatch(lambda df, _: write_deltalake(path, df.toArrow(), mode="append"))`` (not
  exactly once: a replayed micro-batch is appended again);
* **upsert**: a change stream (a first file of inserts, then files of updates, inserts and
  deletes of random keys, several changes of one key in a file) into eosink's
  ``mode="upsert"`` and into ``foreachBatch`` that keeps each key's last change and runs
  delta-spark's ``MERGE`` (what users write today; not exactly once);
* **commits**: 1,000 epochs of a few rows each through the sink's coordinator without
  Spark (phase 1 and the commit, the meta store left out): the commit's cost must not grow
  with the table's log.

After the timed runs, each side's table is read back by Delta's Spark reader and compared
with the input (row count, sum of ids; the upsert's final state).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from bench._common import interleave


def make_changes(d: Path, base: int, changes: int, files: int) -> dict[int, str]:
    """The upsert stream's input files; returns the final state (id -> payload)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    d.mkdir(parents=True, exist_ok=True)
    rng = random.Random(7)
    state: dict[int, str] = {}
    seq = 0
    now = time.time()
    for f in range(files + 1):
        rows: list[tuple[int, str, str, int]] = []
        if f == 0:
            rows = [(i, f"p{i}-0", "c", i) for i in range(base)]
            seq = base
        else:
            top = base + f * changes // 10
            for _ in range(changes):
                k = rng.randrange(top)
                rows.append((k, f"p{k}-{seq}", "d" if rng.random() < 0.05 else "u", seq))
                seq += 1
        for k, p, op, _ in rows:
            if op == "d":
                state.pop(k, None)
            else:
                state[k] = p
        rng.shuffle(rows)
        t = pa.table(
            {
                "id": pa.array([r[0] for r in rows], pa.int64()),
                "payload": [r[1] for r in rows],
                "op": [r[2] for r in rows],
                "seq": pa.array([r[3] for r in rows], pa.int64()),
            }
        )
        path = d / f"changes-{f:04d}.parquet"
        pq.write_table(t, path)
        os.utime(path, (now - 1000 + f, now - 1000 + f))
    return state


def commit_cost(tmp: Path, epochs: int) -> dict[str, Any]:
    """Milliseconds per epoch of the sink's phase 1 + commit over ``epochs`` epochs."""
    import pickle

    import pyarrow as pa

    import eosink
    from eosink._tasks import TaskSink, run_writer

    plugin = eosink.get_sink("delta")
    opts = plugin.parse_options({"path": str(tmp / "commits")})
    coord = plugin.coordinator_factory(opts, "bench:commits")
    coord.init()
    ms = []
    for e in range(epochs):
        batch = pa.record_batch({"id": pa.array(range(e * 10, e * 10 + 10), pa.int64())})
        setup = coord.writer_setup(batch.schema)
        task = TaskSink(plugin, opts, "bench:commits", e, pickle.loads(pickle.dumps(setup)))
        encoded, _ = run_writer(task, [batch], partition=0, attempt=0)
        results = [plugin.write_result_codec.decode(encoded, plugin.write_result_codec.version)]
        t0 = time.perf_counter()
        coord.commit(e, coord.pre_commit(e, results).committable)
        ms.append((time.perf_counter() - t0) * 1000)
    first, last = ms[:100], ms[-100:]
    return {
        "epochs": epochs,
        "p50_first_100_ms": statistics.median(first),
        "p50_last_100_ms": statistics.median(last),
        "p99_ms": sorted(ms)[int(len(ms) * 0.99) - 1],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--jars", required=True)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--files-per-trigger", type=int, default=2)
    ap.add_argument("--base", type=int, default=100_000)
    ap.add_argument("--changes", type=int, default=20_000)
    ap.add_argument("--change-files", type=int, default=6)
    ap.add_argument("--epochs", type=int, default=1000)
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    tmp = Path(a.tmp)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    result: dict[str, Any] = {"times": {}, "errors": {}, "checks": {}, "writers": []}

    import pyspark
    from deltalake import write_deltalake
    from pyspark.sql import SparkSession, Window
    from pyspark.sql import functions as F

    import eosink

    b = SparkSession.builder.master("local[2]").appName("eosink-bench-delta")
    for k, v in {
        "spark.jars": a.jars,
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.databricks.delta.snapshotPartitions": "2",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.session.timeZone": "UTC",
    }.items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    result["versions"] = {
        "pyspark": pyspark.__version__,
        "delta-spark": Path(a.jars.split(",")[0]).name,
        "deltalake": __import__("deltalake").__version__,
        "python": platform.python_version(),
    }
    ms = f"sqlite:///{tmp / 'metastore.db'}"
    schema = spark.read.parquet(a.data).schema

    def stream() -> Any:
        return (
            spark.readStream.schema(schema)
            .option("maxFilesPerTrigger", a.files_per_trigger)
            .parquet(a.data)
        )

    def eos(out: str) -> None:
        h = eosink.run(
            stream(),
            sink="delta",
            path=f"{out}/t",
            checkpoint_location=f"{out}/chk",
            trigger={"availableNow": True},
            metastore_url=ms,
        )
        h.await_termination()
        result["writers"] += [f.writer for f in h.figures]

    def eos_python(out: str) -> None:
        h = eosink.run(
            stream(),
            sink="delta",
            path=f"{out}/t",
            writer="python",
            checkpoint_location=f"{out}/chk",
            trigger={"availableNow": True},
            metastore_url=ms,
        )
        h.await_termination()

    def delta(out: str) -> None:
        q = (
            stream()
            .writeStream.format("delta")
            .option("checkpointLocation", f"{out}/chk")
            .trigger(availableNow=True)
            .start(f"{out}/t")
        )
        q.awaitTermination()

    def naive(out: str) -> None:
        q = (
            stream()
            .writeStream.foreachBatch(
                lambda df, _: write_deltalake(f"{out}/t", df.toArrow(), mode="append")
            )
            .option("checkpointLocation", f"{out}/chk")
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()

    changes_dir = tmp / "changes"
    state = make_changes(changes_dir, a.base, a.changes, a.change_files)
    cschema = spark.read.parquet(str(changes_dir)).schema

    def change_stream() -> Any:
        return (
            spark.readStream.schema(cschema)
            .option("maxFilesPerTrigger", 1)
            .parquet(str(changes_dir))
        )

    def eos_upsert(out: str) -> None:
        h = eosink.run(
            change_stream(),
            sink="delta",
            path=f"{out}/t",
            mode="upsert",
            keys=["id"],
            order_by="seq",
            op_column="op",
            checkpoint_location=f"{out}/chk",
            trigger={"availableNow": True},
            metastore_url=ms,
        )
        h.await_termination()

    def spark_merge(out: str) -> None:
        path = f"{out}/t"
        spark.createDataFrame([], "id long, payload string").write.format("delta").save(path)

        def batch(df: Any, _: int) -> None:
            last = (
                df.withColumn(
                    "_r", F.row_number().over(Window.partitionBy("id").orderBy(F.desc("seq")))
                )
                .filter("_r = 1")
                .drop("_r")
            )
            last.createOrReplaceTempView("changes")
            df.sparkSession.sql(
                f"MERGE INTO delta.`{path}` t USING changes s ON t.id = s.id "
                "WHEN MATCHED AND s.op = 'd' THEN DELETE "
                "WHEN MATCHED THEN UPDATE SET payload = s.payload "
                "WHEN NOT MATCHED AND s.op != 'd' THEN "
                "INSERT (id, payload) VALUES (s.id, s.payload)"
            )

        q = (
            change_stream()
            .writeStream.foreachBatch(batch)
            .option("checkpointLocation", f"{out}/chk")
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()

    def fresh(name: str) -> Path:
        p = tmp / "out" / name
        shutil.rmtree(p, ignore_errors=True)
        return p

    rows = spark.read.parquet(a.data)
    want = rows.selectExpr("count(*) AS n", "sum(id) AS s").first()
    groups = {
        "append": {
            "eosink": eos,
            "eosink-python": eos_python,
            "delta-spark": delta,
            "naive": naive,
        },
        "upsert": {"eosink": eos_upsert, "merge": spark_merge},
    }
    for group, contenders in groups.items():
        for name, fn in list(contenders.items()):  # warm-up, checked by Delta's reader
            out = fresh(f"{group}-{name}-warmup")
            try:
                fn(str(out))
                got = spark.read.format("delta").load(f"{out}/t")
                if group == "append":
                    g = got.selectExpr("count(*) AS n", "sum(id) AS s").first()
                    ok = (g["n"], g["s"]) == (want["n"], want["s"])
                else:
                    ok = {r["id"]: r["payload"] for r in got.collect()} == state
                result["checks"][f"{group}/{name}"] = ok
                print(f"    warm-up {group}/{name}: {'ok' if ok else 'WRONG'}", flush=True)
            except Exception as exc:
                traceback.print_exc()
                result["errors"][f"{group}/{name}"] = f"{type(exc).__name__}: {exc}"[:500]
                del contenders[name]
            shutil.rmtree(out, ignore_errors=True)
        result["times"][group] = interleave(
            contenders, a.reps, lambda n, g=group: fresh(f"{g}-{n}"), warmup=False,
            log=lambda s: print(s, flush=True),
        )  # fmt: skip
    Path(a.out).write_text(json.dumps(result, indent=1))  # kept if the commit run fails
    result["commits"] = commit_cost(tmp, a.epochs)
    result["input"] = {
        "rows": want["n"],
        "upsert_base": a.base,
        "changes": a.changes,
        "change_files": a.change_files,
    }
    spark.stop()
    Path(a.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
