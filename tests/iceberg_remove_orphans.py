"""Run Iceberg's own orphan-file cleanup on a table, as a maintenance job would.

Run by ``tests/test_iceberg_crash.py`` with the Python of the pyspark 4.0 environment
(``bench/_py40.py``; Iceberg ships no runtime for the project's pyspark):
``iceberg_remove_orphans.py <runtime jar> <metadata file> <older than, epoch ms>``. Spark's
``DeleteOrphanFiles`` action (what ``CALL system.remove_orphan_files`` runs) on the table of
that metadata file: every file under the table's location that no snapshot references and
that is older than the given instant is deleted. Prints ``EOSINK-ORPHANS <json list>``.
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    from pyspark.sql import SparkSession

    jar, location, older_than = sys.argv[1:]
    spark = (
        SparkSession.builder.master("local[1]")
        .appName("eosink-iceberg-remove-orphans")
        .config("spark.jars", jar)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    jvm = spark._jvm
    io = jvm.org.apache.iceberg.hadoop.HadoopFileIO(spark._jsc.hadoopConfiguration())
    ops = jvm.org.apache.iceberg.StaticTableOperations(location, io)
    table = jvm.org.apache.iceberg.BaseTable(ops, "eosink.orphans")
    actions = jvm.org.apache.iceberg.spark.actions.SparkActions.get(spark._jsparkSession)
    result = actions.deleteOrphanFiles(table).olderThan(int(older_than)).execute()
    deleted = [str(p) for p in result.orphanFileLocations()]
    spark.stop()
    print("EOSINK-ORPHANS " + json.dumps(deleted))
    return 0


if __name__ == "__main__":
    sys.exit(main())
