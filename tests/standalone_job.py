"""A streaming driver program submitted to a standalone cluster (tests/test_standalone.py).

Run by ``spark-submit --master spark://... --deploy-mode client --archives env.tar.gz#env``
(tests/standalone.py ``SubmittedJob``). It waits for the cluster's executors; with
``--probe`` it asks them which Python they run (printed as ``EXECUTOR_PYTHON {json}``
lines). Then it writes the Parquet files of ``--input`` to a sink exactly once, one
micro-batch per file, with eosink's default settings (no meta store URL), and exits 0.
The tests check the output with independent readers; the fault points (``EOSINK_FAULT``)
kill it on the way.

Unlike tests/crashjob.py it does not set ``PYSPARK_PYTHON``: the executors' Python is what
spark-submit was given (``spark.pyspark.python=./env/bin/python``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from typing import Any

SCHEMA = "id long, grp string, payload string"


def probe(_: Any) -> str:
    """Executor side: which Python runs this task, and where its packages come from."""
    import os
    import sys
    import time

    import pandas
    import pyarrow
    import pyspark

    import eosink

    time.sleep(0.3)  # let the other executor take tasks too
    return json.dumps(
        {
            "executable": sys.executable,
            "prefix": sys.prefix,
            "base_prefix": sys.base_prefix,
            "version": list(sys.version_info[:3]),
            "cwd": os.getcwd(),
            "path": sys.path,
            "eosink": eosink.__file__,
            "pyarrow": pyarrow.__file__,
            "pyarrow_version": pyarrow.__version__,
            "pandas": pandas.__file__,
            "pandas_version": pandas.__version__,
            "pyspark": pyspark.__file__,
            "virtual_env": os.environ.get("VIRTUAL_ENV"),
            "pyspark_python": os.environ.get("PYSPARK_PYTHON"),
        },
        sort_keys=True,
    )


def slow_first_attempt(batches: Any) -> Any:
    """Executor side of ``--speculate DIR``: the first attempt of partition 0 hands its first
    Arrow batch to the writer, then stalls (60 s at most), so Spark launches a speculative
    attempt of it on the other host, which runs at full speed and wins; the stalled one is
    killed. Each attempt of partition 0 leaves ``DIR/attempt-<n>`` when it starts."""
    import os

    from pyspark import TaskContext

    tc = TaskContext.get()
    slow = False
    if tc is not None and tc.partitionId() == 0:
        open(os.path.join(MARKS, f"attempt-{tc.attemptNumber()}"), "w").close()
        slow = tc.attemptNumber() == 0
    for i, b in enumerate(batches):
        yield b
        if slow and i == 0:
            time.sleep(60)


MARKS = ""


def main() -> int:
    global MARKS
    p = argparse.ArgumentParser()
    p.add_argument("--sink", choices=["file", "iceberg"], required=True)
    p.add_argument("--input", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--writer", default="", help="the sink's writer option (default: its own)")
    p.add_argument("--executors", type=int, default=2)
    p.add_argument("--probe", action="store_true", help="print the executors' Python first")
    p.add_argument(
        "--speculate",
        default="",
        help="batch runs (epoch=1, one per writer of --writer) with spark.speculation on and "
        "a stalled first attempt of one task (see slow_first_attempt), instead of the stream",
    )
    a = p.parse_args()
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stdout
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)

    import eosink

    # The master, deploy mode, archives and Pythons come from spark-submit, as in any
    # submitted application: eosink.spark_session() keeps them (MASTER is checked).
    conf = {}
    if a.speculate:
        MARKS = a.speculate
        conf = {
            "spark__speculation": "true",
            "spark__speculation__interval": "100ms",
            "spark__speculation__quantile": "0.5",
            "spark__speculation__multiplier": "2",
            "spark__speculation__minTaskRuntime": "1s",
        }
    spark = eosink.spark_session(app_name="eosink-standalone", **conf)
    sc = spark.sparkContext
    print(f"MASTER {sc.master}", flush=True)
    deadline = time.monotonic() + 60
    while True:
        executors = sc._jsc.sc().getExecutorMemoryStatus().size() - 1  # less the driver
        if executors >= a.executors or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    print(f"EXECUTORS {executors}", flush=True)
    if a.probe:
        for line in sorted(set(sc.parallelize(range(8), 8).map(probe).collect())):
            print(f"EXECUTOR_PYTHON {line}", flush=True)

    opts: dict[str, Any] = {}
    if a.sink == "file":
        opts["path"] = a.out
    else:
        opts.update(table="db.events", warehouse=a.out)
    if a.writer:
        opts["writer"] = a.writer
    if a.speculate:
        # One batch per writer of --writer (a comma-separated list), each into OUT/<writer>,
        # its attempts marked in SPECULATE/<writer>: one application (one start, one
        # unpacking of the executors' environment) for both writer paths.
        for writer in a.writer.split(","):
            MARKS = os.path.join(a.speculate, writer)
            os.makedirs(MARKS, exist_ok=True)
            df = spark.read.schema(SCHEMA).parquet(a.input).repartition(3)
            df = df.mapInArrow(slow_first_attempt, df.schema)
            run = {**opts, "path": os.path.join(a.out, writer), "writer": writer}
            r = eosink.run(df, sink=a.sink, epoch=1, partition_by=["grp"], **run)
            print("RESULT", writer, r, flush=True)
        spark.stop()
        return 0
    sdf = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(a.input)
    h = eosink.run(
        sdf,
        sink=a.sink,
        checkpoint_location=a.checkpoint,
        trigger={"availableNow": True},
        **opts,
    )
    h.await_termination()
    print("RESULT", json.dumps([f.as_dict() for f in h.figures]), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
