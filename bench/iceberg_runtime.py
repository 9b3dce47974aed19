"""Both sides of "iceberg stream / Spark's Iceberg runtime", in the pyspark 4.0 environment.

Started by ``python -m bench`` (``bench/_py40.py``) with that environment's Python; writes
its figures as JSON to ``--out``. eosink's iceberg sink (pyiceberg SQL catalog on SQLite,
local warehouse) against ``writeStream.format("iceberg")`` (Iceberg's Spark runtime, a Hadoop
catalog on a local warehouse): the same input files, ``availableNow`` with the same
``maxFilesPerTrigger``, alternating, fresh table and checkpoint for every run.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shutil
import sys
import traceback
from pathlib import Path
from typing import Any

from ._common import interleave, parquet_codec


def _error(exc: BaseException) -> str:
    """The exception's class and first meaningful lines (Spark errors are long)."""
    text = re.sub(r"/[^\s()]*/site-packages/", "", f"{type(exc).__name__}: {exc}")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    causes = [ln for ln in lines if re.search(r"(Error|Exception): ", ln)]
    picked = lines[:2] + [c for c in causes[-2:] if c not in lines[:2]]
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if "/eosink/" in f.filename.replace("\\", "/")
    ]
    where = ""
    if frames:
        f = frames[-1]
        where = f" (at eosink/{f.filename.rsplit('/eosink/', 1)[-1]}:{f.lineno} in {f.name})"
    return (" | ".join(picked)[:1200]) + where


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--reps", type=int, required=True)
    ap.add_argument("--files-per-trigger", type=int, required=True)
    ap.add_argument("--jar", required=True)
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    tmp = Path(a.tmp)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    result: dict[str, Any] = {"errors": {}, "times": {}, "writers": [], "codecs": {}}

    import pyspark

    import eosink

    conf = {"spark.jars": a.jar, "spark.driver.memory": "2g"}
    try:
        spark = eosink.spark_session(
            "local[2]",
            app_name="eosink-bench-iceberg-runtime",
            **{k.replace(".", "__"): v for k, v in conf.items()},
        )
    except Exception as exc:
        # Reported; both sides then run on a session built as eosink.spark_session builds
        # one (eosink.run needs nothing more), so the row still compares like with like.
        traceback.print_exc()
        result["errors"]["spark_session"] = _error(exc)
        print(f"    eosink.spark_session FAILED: {result['errors']['spark_session']}", flush=True)
        from pyspark.sql import SparkSession

        b = SparkSession.builder.master("local[2]").appName("eosink-bench-iceberg-runtime")
        for k, v in {
            **conf,
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.sql.execution.arrow.pyspark.enabled": "true",
            "spark.sql.session.timeZone": "UTC",
        }.items():
            b = b.config(k, v)
        spark = b.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
    result["versions"] = {
        "pyspark": pyspark.__version__,
        "spark": spark.version,
        "iceberg": Path(a.jar).name,
        "python": platform.python_version(),
    }
    print(f"  pyspark {pyspark.__version__}, {Path(a.jar).name}", flush=True)
    schema = spark.read.parquet(a.data).schema
    ms = f"sqlite:///{tmp / 'metastore.db'}"
    n = [0]

    def stream() -> Any:
        return (
            spark.readStream.schema(schema)
            .option("maxFilesPerTrigger", a.files_per_trigger)
            .parquet(a.data)
        )

    def eos(out: str) -> None:
        h = eosink.run(
            stream(),
            sink="iceberg",
            sink_id=f"bench-{Path(out).name}",  # every run has its own warehouse
            table="b.t",
            warehouse=f"{out}/wh",
            checkpoint_location=f"{out}/chk",
            trigger={"availableNow": True},
            metastore_url=ms,
        )
        h.await_termination()
        result["writers"] += [f.writer for f in h.figures]

    def iceberg(out: str) -> None:
        n[0] += 1
        cat = f"h{n[0]}"  # a catalog per run: each has its own fresh warehouse
        spark.conf.set(f"spark.sql.catalog.{cat}", "org.apache.iceberg.spark.SparkCatalog")
        spark.conf.set(f"spark.sql.catalog.{cat}.type", "hadoop")
        spark.conf.set(f"spark.sql.catalog.{cat}.warehouse", f"file://{out}/wh")
        spark.createDataFrame([], schema).writeTo(f"{cat}.b.t").using("iceberg").create()
        q = (
            stream()
            .writeStream.format("iceberg")
            .outputMode("append")
            .option("checkpointLocation", f"{out}/chk")
            .trigger(availableNow=True)
            .toTable(f"{cat}.b.t")
        )
        q.awaitTermination()

    def fresh(name: str) -> Path:
        p = tmp / name
        shutil.rmtree(p, ignore_errors=True)
        return p

    contenders = {"eosink": eos, "iceberg": iceberg}
    for name, fn in list(contenders.items()):  # warm-up; a side that fails is reported
        out = fresh(f"{name}-warmup")
        try:
            fn(str(out))
            result["codecs"][name] = parquet_codec(out)
            print(f"    warm-up {name}: ok ({result['codecs'][name]})", flush=True)
        except Exception as exc:
            traceback.print_exc()
            result["errors"][name] = _error(exc)
            print(f"    warm-up {name}: FAILED: {result['errors'][name]}", flush=True)
            del contenders[name]
        shutil.rmtree(out, ignore_errors=True)
    result["writers"] = []
    if contenders:
        result["times"] = interleave(
            contenders, a.reps, fresh, warmup=False, log=lambda s: print(s, flush=True)
        )
    spark.stop()
    Path(a.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
