"""Read Iceberg tables with Spark's own Iceberg runtime and print their rows as JSON.

Run by ``tests/test_iceberg_spark_reader.py`` with the Python of the pyspark 4.0 environment
(``bench/_py40.py``: Iceberg ships no runtime for the project's pyspark):
``iceberg_runtime_read.py <runtime jar> <metadata file>...``. Every column is read as a
string (the caller compares them with pyiceberg's reading).
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    from pyspark.sql import SparkSession

    jar, *locations = sys.argv[1:]
    spark = (
        SparkSession.builder.master("local[1]")
        .appName("eosink-iceberg-runtime-read")
        .config("spark.jars", jar)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    out = {}
    for location in locations:
        df = spark.read.format("iceberg").load(location)
        strings = df.selectExpr(*[f"cast(`{c}` as string) as `{c}`" for c in df.columns])
        out[location] = [r.asDict() for r in strings.collect()]
    spark.stop()
    print("EOSINK-ROWS " + json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
