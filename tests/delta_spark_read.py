"""Read Delta tables with Delta Lake's own Spark reader and print what it saw as JSON.

Run by ``tests/test_delta_spark.py`` with the Python of the pyspark 4.0 environment
(``bench/_py40.py``: Delta publishes its Spark connector for Spark 4.0-4.2, not the
project's pyspark): ``delta_spark_read.py <jars> <spec.json>``. The spec lists tables, each
with SQL filters to count rows of (``spark.read.format("delta").filter(...)``, data skipping
on the sink's statistics included) and whether to read it with Delta's streaming source
too. Every column is read as a string (the caller compares them with its model).
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    from pyspark.sql import SparkSession

    jars, spec_file = sys.argv[1:]
    spec = json.loads(open(spec_file).read())
    spark = (
        SparkSession.builder.master("local[1]")
        .appName("eosink-delta-spark-read")
        .config("spark.jars", jars)
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config(
            "spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog"
        )
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "2")
        # Delta rebuilds each table's snapshot in 50 tasks by default: 1 for these small logs.
        .config("spark.databricks.delta.snapshotPartitions", "1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    out = {}
    for t in spec["tables"]:
        df = spark.read.format("delta").load(t["path"])
        strings = df.selectExpr(*[f"cast(`{c}` as string) as `{c}`" for c in df.columns])
        got = {"rows": [r.asDict() for r in strings.collect()], "counts": {}}
        for f in t.get("filters", []):
            got["counts"][f] = df.filter(f).count()
        if t.get("stream"):
            q = (
                spark.readStream.format("delta")
                .load(t["path"])
                .writeStream.format("memory")
                .queryName("q" + str(len(out)))
                .trigger(availableNow=True)
                .start()
            )
            q.awaitTermination()
            got["streamed"] = spark.table("q" + str(len(out))).count()
        out[t["path"]] = got
    spark.stop()
    print("EOSINK-DELTA " + json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
