"""What the iceberg sink writes, read by Spark's own Iceberg runtime too.

The other iceberg tests read tables back with pyiceberg. Here every kind of data file the
sink writes (Spark's native append, partitioned and not; Python writers' partitioned append;
an upsert stream's copy-on-write rewrites with deletes, staged by either writer) is read by
``spark.read.format("iceberg")`` of Iceberg's Spark runtime 1.11 in the pyspark 4.0
environment the benchmarks build (``bench/_py40.py``), and compared row by row with
pyiceberg's reading and with the model.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from harness import to_arrow
from test_iceberg_cdc import CDC, _apply, _changes
from test_iceberg_native import _opts, _table

import eosink

ROOT = Path(__file__).resolve().parents[1]


def iceberg_runtime(script: str, *args: str, tag: str) -> Any:
    """Run ``tests/<script>`` with Spark's Iceberg runtime (the pyspark 4.0 environment the
    benchmarks build, ``bench/_py40.py``; the runtime jar is its first argument) and return
    the JSON it prints after ``<tag> ``."""
    sys.path.insert(0, str(ROOT))
    from bench import _py40

    py = _py40.venv(print)
    jar = _py40.jar(print)
    proc = subprocess.run(
        [str(py), str(Path(__file__).with_name(script)), str(jar), *args],
        env=_py40.child_env(py),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith(f"{tag} ")][-1]
    return json.loads(line.split(" ", 1)[1])


def _runtime_rows(locations: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Each table's rows (every column a string) as Spark's Iceberg runtime reads them."""
    return iceberg_runtime("iceberg_runtime_read.py", *locations, tag="EOSINK-ROWS")  # type: ignore[no-any-return]


def _as_strings(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """pyiceberg's rows with each value as Spark casts it to a string."""
    out = []
    for r in rows:
        s = {}
        for k, v in r.items():
            if v is None:
                s[k] = None
            elif hasattr(v, "isoformat") and hasattr(v, "hour"):
                s[k] = v.strftime("%Y-%m-%d %H:%M:%S")  # whole seconds in these tables
            else:
                s[k] = str(v)
        out.append(s)
    return out


def _key(r: dict[str, Any]) -> int:
    return int(r["id"])


def test_spark_iceberg_runtime_reads_what_the_sink_wrote(spark: Any, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}"
    df = spark.range(0, 60).selectExpr(
        "id",
        "cast(id % 4 as string) as grp",
        "timestamp_seconds(1763769600 + id * 21600) as ts",
    )
    parts = ["grp", "day(ts)"]
    writers = {}
    for name, kw in {
        "db.native_plain": {"writer": "spark"},
        "db.native_parts": {"writer": "spark", "partition_by": parts},
        "db.python_parts": {"partition_by": parts},  # auto: Python writers
    }.items():
        r = eosink.run(
            df, sink="iceberg", epoch=0, metastore_url=url, **_opts(tmp_path, name, **kw)
        )
        assert isinstance(r, eosink.BatchResult) and r.figures is not None
        writers[name] = r.figures.writer
    assert writers == {
        "db.native_plain": "spark",
        "db.native_parts": "spark",
        "db.python_parts": "python",
    }
    # Upserts and deletes, three epochs, staged by Spark's writer and by Python writers.
    state: dict[int, dict[str, Any]] = {}
    cols = ["id", "payload", "op", "seq"]
    epochs = [
        [(i, f"a{i}", "u", 1) for i in range(30)],
        [(i, f"b{i}", "u", 2) for i in range(20, 40)]
        + [(3, None, "d", 2), (5, "x", "u", 1), (5, "y", "u", 3), (99, None, "d", 2)],
        [(i, f"c{i}", "u", 3) for i in range(0, 40, 7)] + [(21, None, "d", 4)],
    ]
    for e, rows in enumerate(epochs):
        writer = "spark" if e % 2 == 0 else "python"
        r = eosink.run(
            _changes(spark, rows),
            sink="iceberg",
            epoch=e,
            metastore_url=url,
            writer=writer,
            **_opts(tmp_path, "db.changes", **CDC),
        )
        assert isinstance(r, eosink.BatchResult) and r.committed
        _apply(state, rows, cols)
    names = ["db.native_plain", "db.native_parts", "db.python_parts", "db.changes"]
    tables = {n: _table(tmp_path, n) for n in names}
    got = _runtime_rows([t.metadata_location for t in tables.values()])
    for name, table in tables.items():
        by_runtime = sorted(got[table.metadata_location], key=_key)
        by_pyiceberg = sorted(_as_strings(table.scan().to_arrow().to_pylist()), key=_key)
        assert by_runtime == by_pyiceberg, name
    model = sorted(_as_strings(list(state.values())), key=_key)
    assert sorted(got[tables["db.changes"].metadata_location], key=_key) == model
    expected = sorted(_as_strings(to_arrow(df).to_pylist()), key=_key)
    for name in names[:3]:
        assert sorted(got[tables[name].metadata_location], key=_key) == expected, name
