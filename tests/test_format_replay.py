"""``format("eosink")``: a replayed micro-batch whose epoch is already COMMITTED, and whose
write Spark then aborts (a task failed for good), leaves none of its tasks' staged output
behind (rule 4, ``_rules.discard_failed_micro_batch``). The real data source, driven as
Spark drives it (tests/lifecycle_driver.py's ``_format``), Spark-less; the file sink."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from lifecycle_driver import SCHEMA, _log_entry, batch_rows


def test_an_aborted_replay_of_a_committed_micro_batch_leaves_no_staged_output(
    tmp_path: Path,
) -> None:
    """Micro-batch 0 is committed by eosink (its epoch COMMITTED), and the driver dies
    before Spark's commit log records it: the restarted query replays it. The replay's tasks
    stage their output, one task fails for good and Spark aborts the micro-batch. Nothing of
    the replay stays staged, and the target holds micro-batch 0's rows once."""
    from pyspark.sql.pandas.types import from_arrow_schema

    from eosink._datasource import EosinkDataSource

    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    options = {
        "sink": "file",
        "path": str(out),
        "format": "parquet",
        "metastore_url": f"sqlite:///{tmp_path / 'm.db'}",
        "checkpointLocation": str(ckpt),
    }
    spark_schema = from_arrow_schema(SCHEMA)
    rows = batch_rows(0, 20)
    halves = [rows.slice(0, 10), rows.slice(10)]

    ds = EosinkDataSource(options)
    sw = ds.streamWriter(spark_schema, False)
    _log_entry(ckpt, "offsets", 0, 'v1\n{"batch": 0}\n')
    messages = [sw.write_batch(iter([p]), 0) for p in halves]
    ds.streamWriter(spark_schema, False).commit(messages, 0)
    # ... and the driver dies before Spark's commit log has batch 0: the query restarts.
    staging = out / "_eosink_staging"
    assert not [p for p in staging.rglob("*") if p.is_file()]

    ds = EosinkDataSource(options)
    sw = ds.streamWriter(spark_schema, False)
    replayed = [sw.write_batch(iter([halves[0]]), 0), None]  # the second task failed
    assert [p for p in staging.rglob("*") if p.is_file()], "the replay's task staged nothing"
    ds.streamWriter(spark_schema, False).abort(replayed, 0)

    assert not [p for p in staging.rglob("*") if p.is_file()]
    published = sorted(p for p in out.rglob("*.parquet") if "_eosink" not in p.parts[-2])
    table = pa.concat_tables([pq.read_table(p) for p in published])
    assert sorted(table.column("id").to_pylist()) == list(range(20))
    meta = json.dumps(sorted(str(p.relative_to(out)) for p in published))
    assert "_eosink_staging" not in meta
