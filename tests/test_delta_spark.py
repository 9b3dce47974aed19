"""The delta sink through Spark: ``eosink.run`` (both writer paths, batch and stream) and
``format("eosink")``, read back by delta-rs and by Delta Lake's own Spark reader, and the
driver SIGKILLed where Spark is involved.

Delta's reader (``spark.read.format("delta")`` and its streaming source, delta-spark 4.4 in
the pyspark 4.0 environment the benchmarks build, ``bench/_py40.py``) reads every table the
sink wrote here in one run: partitions whose values need escaping (``de/at``, ``..``,
``x%y``, the empty string and NULL, which Delta reads alike), a column added by a later
epoch, an upsert table with updates and deletes; filtered reads at the exact minimum and
maximum of a file's timestamps (the statistics round a maximum up to the millisecond: a
maximum rounded down would make data skipping drop the file's last rows).
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_delta import delta_rows, stats_are_bounds

import eosink

ROOT = Path(__file__).resolve().parents[1]

# Every 11th row has a NULL group; the others one of the crash tests' groups, whose values
# need escaping in a directory name (harness.GROUPS). Timestamps with microseconds, one of
# them .000999 past a millisecond.
_ROWS = """
    id,
    IF(id % 11 = 0, NULL,
       element_at(array('fr', 'de/at', '..', 'x%y', ''), CAST(id % 5 + 1 AS INT))) AS grp,
    timestamp_micros(1763769600000000 + id * 1000 + IF(id = 59, 999, id % 7)) AS ts,
    concat('v', id) AS v
"""


def delta_spark(spec: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """Run tests/delta_spark_read.py with ``spec`` in the pyspark 4.0 environment."""
    sys.path.insert(0, str(ROOT))
    from bench import _py40

    py = _py40.venv(print)
    jars = ",".join(str(j) for j in _py40.delta_jars(print))
    spec_file = tmp / "spec.json"
    spec_file.write_text(json.dumps(spec))
    proc = subprocess.run(
        [str(py), str(ROOT / "tests" / "delta_spark_read.py"), jars, str(spec_file)],
        env=_py40.child_env(py),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("EOSINK-DELTA ")][-1]
    return json.loads(line.split(" ", 1)[1])  # type: ignore[no-any-return]


def _strings(df: Any) -> list[dict[str, Any]]:
    rows = df.selectExpr(*[f"cast(`{c}` as string) as `{c}`" for c in df.columns]).collect()
    return sorted((r.asDict() for r in rows), key=lambda r: int(r["id"]))


def _by_id(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: int(r["id"]))


def test_delta_spark_reads_what_the_sink_wrote(spark: Any, tmp_path: Path) -> None:
    store = {"metastore_url": f"sqlite:///{tmp_path / 'm.db'}"}
    df = spark.range(0, 60).selectExpr(*[c.strip() for c in _split(_ROWS)])
    # NULL and the empty string are one partition value in Delta (its protocol reads "" as
    # NULL, and so does Spark's partitioned writer).
    want = [{**r, "grp": r["grp"] or None} for r in _strings(df)]
    tables: dict[str, list[dict[str, Any]]] = {}
    for writer in ("spark", "python"):
        path = str(tmp_path / f"parts-{writer}")
        r = eosink.run(df, sink="delta", path=path, partition_by=["grp"], writer=writer, **store)
        assert r.committed and r.figures.writer == writer
        tables[path] = want

    # A later epoch adds a column: the table gains it, older rows read it as NULL.
    evolved = str(tmp_path / "evolved")
    eosink.run(df.selectExpr("id", "v"), sink="delta", path=evolved, **store)
    eosink.run(
        spark.range(60, 70).selectExpr("id", "concat('v', id) AS v", "id * 2 AS extra"),
        sink="delta",
        path=evolved,
        **store,
    )
    # An INT column into the table's BIGINT (integer widening): Spark's writer casts it.
    narrow = spark.range(70, 75).selectExpr("CAST(id AS INT) AS id", "concat('v', id) AS v")
    assert eosink.run(narrow, sink="delta", path=evolved, **store).figures.writer == "spark"
    tables[evolved] = [
        {"id": str(i), "v": f"v{i}", "extra": str(i * 2) if 60 <= i < 70 else None}
        for i in range(75)
    ]
    files = sorted(Path(evolved).rglob("*.parquet"))
    assert len(files) >= 3 and all(pq.read_schema(f).field("id").type == pa.int64() for f in files)

    # Upserts and deletes, the last change of a key within an epoch winning.
    upserts = str(tmp_path / "upserts")
    up = {"mode": "upsert", "keys": ["k"], "order_by": "seq", "op_column": "op"}
    changes = [
        [(k, f"a{k}", 1, "c") for k in range(10)],
        [(k, f"b{k}", 2, "u") for k in range(5)]
        + [(k, f"c{k}", 3, "u") for k in range(3)]
        + [(5, None, 4, "d"), (6, None, 5, "d"), (10, "a10", 6, "c")],
    ]
    model: dict[int, str] = {}
    for epoch_changes in changes:
        cdf = spark.createDataFrame(epoch_changes, "k long, v string, seq long, op string")
        eosink.run(cdf, sink="delta", path=upserts, **up, **store)
        last: dict[int, tuple[Any, ...]] = {}
        for row in epoch_changes:
            if row[0] not in last or row[2] > last[row[0]][2]:
                last[row[0]] = row
        for k, row in last.items():
            if row[3] == "d":
                model.pop(k, None)
            else:
                model[k] = row[1]

    # delta-rs' reader agrees with the model...
    opts = eosink.get_sink("delta").parse_options
    for path, rows in tables.items():
        got = [{k: _text(v) for k, v in r.items()} for r in delta_rows(opts({"path": path}))]
        assert _by_id(got) == _by_id(rows), path
    for writer in ("spark", "python"):  # both writers' statistics are true bounds
        assert stats_are_bounds(opts({"path": str(tmp_path / f"parts-{writer}")})) >= 40
    got_up = {int(r["k"]): r["v"] for r in delta_rows(opts({"path": upserts}))}
    assert got_up == model
    # ... so does Polars, as docs/delta.md says to read it ...
    for path, rows in tables.items():
        got = [
            {k: _text(v) for k, v in r.items()} for r in pl.scan_delta(path).collect().to_dicts()
        ]
        assert _by_id(got) == _by_id(rows), path
    assert {r["k"]: r["v"] for r in pl.scan_delta(upserts).collect().to_dicts()} == model

    # ... and so does Delta's own Spark reader, filtered reads included.
    parts = str(tmp_path / "parts-spark")
    ts = sorted(r["ts"] for r in want)
    filters = {
        f"ts = TIMESTAMP'{ts[-1]}'": 1,
        f"ts >= TIMESTAMP'{ts[-1]}'": 1,
        f"ts <= TIMESTAMP'{ts[0]}'": 1,
        "grp = 'de/at'": sum(r["grp"] == "de/at" for r in want),
        "grp IS NULL": sum(r["grp"] is None for r in want),
        "grp = 'x%y' AND id >= 30": sum(r["grp"] == "x%y" and int(r["id"]) >= 30 for r in want),
    }
    spec = {
        "tables": [
            {
                "path": p,
                "filters": list(filters) if p in (parts, str(tmp_path / "parts-python")) else [],
                "stream": p == parts,
            }
            for p in tables
        ]
        + [{"path": upserts}]
    }
    seen = delta_spark(spec, tmp_path)
    for path, rows in tables.items():
        assert _by_id(seen[path]["rows"]) == _by_id(rows), path
    for path in (parts, str(tmp_path / "parts-python")):
        assert seen[path]["counts"] == filters, path
    assert seen[parts]["streamed"] == 60
    assert {int(r["k"]): r["v"] for r in seen[upserts]["rows"]} == model


def _text(v: Any) -> str | None:
    """A value as Spark casts it to a string (timestamps in UTC, trailing zeros dropped)."""
    if v is None:
        return None
    if hasattr(v, "hour"):
        text = v.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f").rstrip("0")
        return text.rstrip(".")
    return str(v)


def _split(select: str) -> list[str]:
    """The columns of a SELECT list written one per line (commas inside calls kept)."""
    out, depth, cur = [], 0, ""
    for ch in select:
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
            continue
        depth += ch == "("
        depth -= ch == ")"
        cur += ch
    return [c for c in (*out, cur) if c.strip()]


def test_format_eosink_writes_delta(spark: Any, tmp_path: Path) -> None:
    """``df.write.format("eosink")`` and ``writeStream.format("eosink")`` (Python writers in
    Spark's data source tasks) into one table: every row once."""
    path = str(tmp_path / "t")
    meta = f"sqlite:///{tmp_path / 'm.db'}"
    df = spark.range(0, 50).selectExpr("id", "concat('v', id) AS v")
    (
        df.write.format("eosink")
        .option("sink", "delta")
        .option("path", path)
        .option("metastore_url", meta)
        .mode("append")
        .save()
    )
    src = tmp_path / "src"
    spark.range(50, 80).selectExpr("id", "concat('v', id) AS v").write.parquet(str(src))
    q = (
        spark.readStream.schema("id long, v string")
        .parquet(str(src))
        .writeStream.format("eosink")
        .option("sink", "delta")
        .option("path", path)
        .option("metastore_url", meta)
        .option("checkpointLocation", str(tmp_path / "chk"))
        # The batch write took epoch 0: a new query continues after it (the default refuses
        # a new checkpoint on a sink with history: docs/errors.md#newcheckpointerror).
        .option("new_checkpoint", "continue")
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    ids = sorted(
        int(r["id"]) for r in delta_rows(eosink.get_sink("delta").parse_options({"path": path}))
    )
    assert ids == list(range(80))


@pytest.mark.crash
@pytest.mark.parametrize(
    ("mode", "faults"),
    [
        ("stream", ["after_spark_write@2", "mid_commit@2"]),
        pytest.param("ds-stream", ["mid_commit@2"], marks=pytest.mark.release),
    ],
    ids=["run-stream", "format-stream"],
)
def test_spark_driver_killed(tmp_path: Path, mode: str, faults: list[str]) -> None:
    """A Spark driver of the sink killed at its own commit's point (and, on the native
    path, right after Spark's writer staged an epoch), then run to the end: every row once,
    each epoch in one commit of the table's history, nothing left staged.

    ``format("eosink")``'s whole driver killed inside the sink's commit runs in the release
    tier: what differs from the lifecycle driver's ``format("eosink")`` chains
    (tests/test_delta_crash.py) is Spark's Python data source worker around the commit,
    which is the same code for every sink and is killed with the other sinks in CI."""
    from harness import Job, crash_chain, make_input
    from test_delta_crash import check_job

    job = Job(tmp_path, mode, f"sqlite:///{tmp_path / 'm.db'}", sink="delta", partition_by="grp")
    ids = make_input(job.input, files=4, rows=40)
    crash_chain(job, faults)
    check_job(job, ids)
