"""Both sides of "iceberg upsert stream / Spark's Iceberg runtime ``foreachBatch`` + ``MERGE
INTO``", in the pyspark 4.0 environment (``bench/_py40.py``; started by ``python -m
bench.upsert``, figures as JSON to ``--out``).

The same change stream (a first file of inserts, then files of updates, inserts and deletes of
random keys, several changes of a key in a file, ``seq`` ordering them) goes, with
``availableNow`` and one file per micro-batch, fresh table and checkpoint each run, into:

* ``eosink``: eosink's iceberg sink, ``mode="upsert"`` (pyiceberg SQL catalog on SQLite);
* ``merge-cow`` / ``merge-mor``: ``foreachBatch`` that keeps each key's last change (a window)
  and runs ``MERGE INTO`` on an Iceberg table of the runtime's Hadoop catalog, with
  ``write.merge.mode`` / ``write.delete.mode`` copy-on-write (Iceberg's default) or
  merge-on-read. Not exactly once: a replayed micro-batch merges again.

After the first timed run of each side (untimed): its table is checked against the state the
changes leave (ids, payload checksum), eosink's by pyiceberg *and* by Spark's Iceberg runtime
(``spark.read.format("iceberg").load(<metadata file>)``), and the full-scan cost of the table
it leaves is measured (Spark's runtime, and pyiceberg for eosink's), the runtime's tables
also after ``rewrite_data_files``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any

SCHEMA = "id long, payload string, amount double, op string, seq long"
COLS = ["id", "payload", "amount", "seq"]


def make_changes(d: Path, base: int, changes: int, files: int) -> dict[int, tuple[str, float]]:
    """The input files; returns the final state (id -> (payload, amount))."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    d.mkdir(parents=True, exist_ok=True)
    rng = random.Random(7)
    state: dict[int, tuple[str, float]] = {}
    seq = 0
    now = time.time()
    for f in range(files + 1):
        rows: list[tuple[int, str, float, str, int]] = []
        if f == 0:
            for i in range(base):
                rows.append((i, f"p{i}-0", float(i), "c", seq))
                seq += 1
        else:
            top = base + f * changes // 10
            for _ in range(changes):
                k = rng.randrange(top)
                op = "d" if rng.random() < 0.05 else "u"
                rows.append((k, f"p{k}-{f}-{seq}", rng.random() * 1000, op, seq))
                seq += 1
        for k, p, a, op, _ in rows:  # in seq order: the last change of a key wins
            if op == "d":
                state.pop(k, None)
            else:
                state[k] = (p, a)
        rng.shuffle(rows)
        t = pa.table(
            {
                "id": pa.array([r[0] for r in rows], pa.int64()),
                "payload": [r[1] for r in rows],
                "amount": pa.array([r[2] for r in rows], pa.float64()),
                "op": [r[3] for r in rows],
                "seq": pa.array([r[4] for r in rows], pa.int64()),
            }
        )
        path = d / f"changes-{f:04d}.parquet"
        pq.write_table(t, path)
        os.utime(path, (now - 1000 + f, now - 1000 + f))
    return state


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--base", type=int, default=200_000)
    ap.add_argument("--changes", type=int, default=20_000)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--jar", required=True)
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    tmp = Path(a.tmp)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    data = tmp / "changes"
    state = make_changes(data, a.base, a.changes, a.files)
    want = (len(state), sum(hash(p) % 1_000_003 for p, _ in state.values()) % (1 << 61))
    result: dict[str, Any] = {"times": {}, "errors": {}, "reads": {}, "checks": {}}
    result["input"] = {
        "base_rows": a.base,
        "changes_per_file": a.changes,
        "files": a.files,
        "final_rows": len(state),
    }

    import pyspark
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    import eosink

    spark = eosink.spark_session(
        "local[2]",
        app_name="eosink-bench-iceberg-upsert",
        spark__jars=a.jar,
        spark__driver__memory="3g",
        spark__sql__extensions="org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
    )
    spark.sparkContext.setLogLevel("ERROR")
    result["versions"] = {
        "pyspark": pyspark.__version__,
        "iceberg": Path(a.jar).name,
        "python": platform.python_version(),
    }
    print(f"  pyspark {pyspark.__version__}, {Path(a.jar).name}", flush=True)
    ms = f"sqlite:///{tmp / 'metastore.db'}"
    n = [0]

    def stream() -> Any:
        return spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(data))

    def checksum(rows: list[tuple[int, str]]) -> tuple[int, int]:
        return len(rows), sum(hash(p) % 1_000_003 for _, p in rows) % (1 << 61)

    def eos(out: Path) -> dict[str, Any]:
        h = eosink.run(
            stream(),
            sink="iceberg",
            sink_id=f"bench-{out.name}",
            table="b.t",
            warehouse=f"{out}/wh",
            checkpoint_location=f"{out}/chk",
            trigger={"availableNow": True},
            metastore_url=ms,
            mode="upsert",
            keys=["id"],
            order_by="seq",
            op_column="op",
        )
        h.await_termination()
        return {"warehouse": f"{out}/wh"}

    def merge(out: Path, mor: bool) -> dict[str, Any]:
        n[0] += 1
        cat = f"h{n[0]}"
        spark.conf.set(f"spark.sql.catalog.{cat}", "org.apache.iceberg.spark.SparkCatalog")
        spark.conf.set(f"spark.sql.catalog.{cat}.type", "hadoop")
        spark.conf.set(f"spark.sql.catalog.{cat}.warehouse", f"file://{out}/wh")
        # The stream's foreachBatch commits through its own session: no stale cached table.
        spark.conf.set(f"spark.sql.catalog.{cat}.cache-enabled", "false")
        mode = "merge-on-read" if mor else "copy-on-write"
        spark.sql(
            f"CREATE TABLE {cat}.b.t (id bigint, payload string, amount double, seq bigint) "
            f"USING iceberg TBLPROPERTIES ('format-version'='2', 'write.merge.mode'='{mode}', "
            f"'write.delete.mode'='{mode}', 'write.update.mode'='{mode}')"
        )

        def batch(df: Any, _id: int) -> None:
            w = Window.partitionBy("id").orderBy(F.col("seq").desc())
            last = df.withColumn("_rn", F.row_number().over(w)).where("_rn = 1").drop("_rn")
            last.createOrReplaceTempView("changes")
            df.sparkSession.sql(
                f"MERGE INTO {cat}.b.t t USING changes s ON t.id = s.id "
                "WHEN MATCHED AND s.op = 'd' THEN DELETE "
                "WHEN MATCHED THEN UPDATE SET t.payload = s.payload, t.amount = s.amount, "
                "t.seq = s.seq "
                "WHEN NOT MATCHED AND s.op != 'd' THEN INSERT (id, payload, amount, seq) "
                "VALUES (s.id, s.payload, s.amount, s.seq)"
            )

        q = (
            stream()
            .writeStream.foreachBatch(batch)
            .option("checkpointLocation", f"{out}/chk")
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()
        if os.environ.get("BENCH_DEBUG"):
            print("    debug", q.lastProgress, spark.table(f"{cat}.b.t").count(), flush=True)
        return {"table": f"{cat}.b.t"}

    def spark_scan(df: Any) -> tuple[float, tuple[int, int]]:
        """A full scan in Spark (every column read and hashed; the second of two, the first
        warms the reader up): its seconds; and the rows' checksum (collected, untimed)."""
        whole = df.selectExpr("count(*)", "bit_xor(xxhash64(*))")
        whole.collect()
        t0 = time.perf_counter()
        whole.collect()
        took = time.perf_counter() - t0
        return took, checksum([(r[0], r[1]) for r in df.select("id", "payload").collect()])

    def inspect(name: str, out: Path, where: dict[str, Any]) -> None:
        reads: dict[str, Any] = {}
        if name == "eosink":
            from pyiceberg.catalog import load_catalog

            wh = where["warehouse"]
            cat = load_catalog(
                "eosink", type="sql", uri=f"sqlite:///{wh}/catalog.db", warehouse=f"file://{wh}"
            )
            table = cat.load_table("b.t")
            t0 = time.perf_counter()
            arrow = table.scan().to_arrow()
            reads["pyiceberg_scan_s"] = time.perf_counter() - t0
            got = checksum(
                list(zip(arrow["id"].to_pylist(), arrow["payload"].to_pylist(), strict=True))
            )
            result["checks"]["eosink, read by pyiceberg"] = got == want
            df = spark.read.format("iceberg").load(table.metadata_location)
            reads["spark_scan_s"], got2 = spark_scan(df)
            result["checks"]["eosink, read by Spark's Iceberg runtime"] = got2 == want
            reads["data_files"] = len(list(table.scan().plan_files()))
            reads["delete_files"] = 0
            reads["snapshots"] = len(table.snapshots())
        else:
            t = where["table"]
            reads["spark_scan_s"], got = spark_scan(spark.table(t))
            result["checks"][f"{name}, read by Spark's Iceberg runtime"] = got == want
            files = spark.sql(f"SELECT content, count(*) FROM {t}.files GROUP BY content").collect()
            by = {int(r[0]): int(r[1]) for r in files}
            reads["data_files"], reads["delete_files"] = by.get(0, 0), by.get(1, 0) + by.get(2, 0)
            spark.sql(
                f"CALL {t.split('.')[0]}.system.rewrite_data_files(table => 'b.t', "
                "options => map('delete-file-threshold', '1'))"
            ).collect()
            spark.catalog.clearCache()
            reads["spark_scan_after_compaction_s"], got3 = spark_scan(spark.table(t))
            result["checks"][f"{name}, after compaction"] = got3 == want
        result["reads"][name] = reads
        print(f"    {name}: {reads} checks {result['checks']}", flush=True)

    contenders = {
        "eosink": eos,
        "merge-cow": lambda out: merge(out, mor=False),
        "merge-mor": lambda out: merge(out, mor=True),
    }
    names = list(contenders)
    for r in range(-1, a.reps):  # -1: warm-up, untimed
        k = max(r, 0) % len(names)
        for name in names[k:] + names[:k]:
            if name in result["errors"]:
                continue
            out = tmp / f"{name}-{r}"
            shutil.rmtree(out, ignore_errors=True)
            try:
                t0 = time.perf_counter()
                where = contenders[name](out)
                dt = time.perf_counter() - t0
                if r == 0:
                    inspect(name, out, where)
            except Exception as exc:
                traceback.print_exc()
                result["errors"][name] = f"{type(exc).__name__}: {str(exc)[:500]}"
                print(f"    {name}: FAILED {result['errors'][name]}", flush=True)
                continue
            finally:
                shutil.rmtree(out, ignore_errors=True)
            if r >= 0:
                result["times"].setdefault(name, []).append(dt)
            print(
                f"    {'warm-up' if r < 0 else f'rep {r + 1}/{a.reps}'} {name}: {dt:.2f} s",
                flush=True,
            )
    spark.stop()
    Path(a.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
