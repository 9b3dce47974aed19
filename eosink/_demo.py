"""``eosink demo``: an end-to-end run on embedded defaults that verifies what it wrote."""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["demo"]


def _say(msg: str) -> None:
    print(f"[eosink demo] {msg}", flush=True)


def _target(sink: str, out: Path, name: str) -> dict[str, Any]:
    if sink == "iceberg":
        return {"table": f"demo.{name}", "warehouse": str(out / "warehouse")}
    return {"path": str(out / name)}


def _read_ids(sink: str, out: Path, name: str) -> tuple[list[int], list[str]]:
    """Ids read back by an independent reader, and data files no reader should see."""
    if sink == "iceberg":
        from pyiceberg.catalog import load_catalog

        from .registry import get_sink

        opts = get_sink("iceberg").parse_options(_target(sink, out, name))
        table = load_catalog(opts.catalog_name, **opts.catalog_properties()).load_table(
            f"demo.{name}"
        )
        ids = table.scan().to_arrow().column("id").to_pylist()
        live = {f["file_path"].split("://")[-1] for f in table.inspect.files().to_pylist()}
        data = Path(table.location().split("://")[-1]) / "data"
        orphans = [str(p) for p in data.rglob("*.parquet") if str(p) not in live]
        return sorted(ids), orphans
    import pyarrow.dataset as ds

    t = ds.dataset(out / name, format="parquet", partitioning="hive").to_table()
    staged = [str(p) for p in (out / name).rglob("_eosink_staging/**/*") if p.is_file()]
    return sorted(t.column("id").to_pylist()), staged


def _spark_log_level(spark: Any) -> str:
    """The root level of Spark's log4j, as the JVM has it (``?`` if it cannot be read)."""
    try:
        jvm = spark.sparkContext._jvm
        return str(jvm.org.apache.logging.log4j.LogManager.getRootLogger().getLevel())
    except Exception:
        return "?"


def demo(sink: str, workdir: str | None, *, rows: int, batches: int) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from . import BatchResult, StreamingHandle, run, spark_session

    base = Path(workdir or tempfile.mkdtemp(prefix="eosink-demo-")).resolve()
    base.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{base / 'metastore.db'}"
    inp, out, chk = base / "input", base / "output", base / "checkpoint"
    inp.mkdir(exist_ok=True)
    _say(f"working directory {base}; meta store {url}")
    per = max(1, rows // batches)
    for i in range(batches):
        ids = list(range(i * per, (i + 1) * per))
        pq.write_table(
            pa.table(
                {
                    "id": ids,
                    "country": [("fr", "de", "us/ca")[j % 3] for j in ids],
                    "amount": [j * 0.5 for j in ids],
                }
            ),
            inp / f"part-{i:03d}.parquet",
        )
    total = per * batches
    _say(f"input: {batches} Parquet files, {total} rows")
    t0 = time.time()
    spark = spark_session(app_name="eosink-demo")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    _say(
        f"Spark {spark.version} started in {time.time() - t0:.1f}s ({spark.sparkContext.master}); "
        f"Spark's own log level {_spark_log_level(spark)} (EOSINK_SPARK_LOG_LEVEL=WARN or INFO "
        "shows more)"
    )

    # 1. Batch: an explicit epoch makes the job idempotent.
    df = spark.read.parquet(str(inp))
    batch_target = _target(sink, out, "batch")
    r = run(df, sink=sink, partition_by=["country"], epoch=1, metastore_url=url, **batch_target)
    assert isinstance(r, BatchResult)
    _say(f"batch: epoch {r.epoch} committed, {r.rows} rows in {r.files} files")
    r2 = run(df, sink=sink, partition_by=["country"], epoch=1, metastore_url=url, **batch_target)
    assert isinstance(r2, BatchResult)
    _say(f"batch re-run of epoch {r2.epoch}: skipped={r2.skipped} (nothing written twice)")

    # 2. Streaming: one micro-batch per input file, phase 2 after Spark's checkpoint.
    sdf = spark.readStream.schema(df.schema).option("maxFilesPerTrigger", 1).parquet(str(inp))
    h = run(
        sdf,
        sink=sink,
        checkpoint_location=str(chk),
        trigger={"availableNow": True},
        metastore_url=url,
        **_target(sink, out, "stream"),
    )
    assert isinstance(h, StreamingHandle)
    h.await_termination()
    for f in h.figures:
        _say(
            f"stream epoch {f.epoch}: {f.rows} rows, pre_commit {f.pre_commit_ms:.1f} ms, "
            f"commit {f.commit_ms:.1f} ms, visible {f.visibility_lag_s * 1000:.0f} ms after "
            "the batch"
        )

    # 3. Verify with an independent reader (pyarrow, or a pyiceberg scan).
    ok = True
    leftovers: list[str] = []
    for name in ("batch", "stream"):
        ids, left = _read_ids(sink, out, name)
        leftovers += left
        good = ids == list(range(total))
        ok &= good
        _say(f"verify {name}: {len(ids)} rows read back, {'exactly once' if good else 'MISMATCH'}")
    what = "unreferenced data files" if sink == "iceberg" else "staged files"
    _say(f"{what} left behind: {len(leftovers)}")
    ok &= not leftovers
    spark.stop()
    _say("OK: every row landed exactly once" if ok else "FAILED")
    _say(f"inspect the meta store with: eosink status --metastore-url '{url}'")
    return 0 if ok else 1
