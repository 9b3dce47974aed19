"""The meta store on SQLite and PostgreSQL: transitions, fencing, GC, schema checks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from eosink import (
    FencedError,
    InvalidTransitionError,
    MetaStoreError,
    MetaStoreUnavailableError,
    MissingExtraError,
    SchemaOutdatedError,
)
from eosink._metastore import COMMITTED, PENDING, MetaStore
from eosink._metastore.migrations import head_revision


def _pending(store: MetaStore, gen: int, epoch: int, sink: str = "s") -> None:
    store.persist_pending(
        sink, gen, epoch, b"c", 1, rows=3, files=1, nbytes=10, batch_end_at=1.0, pre_commit_ms=0.5
    )


def test_allowed_transitions(metastore_url: str, tmp_path: Path) -> None:
    sink = f"s-{tmp_path.name}"
    store = MetaStore(metastore_url)
    g = store.acquire(sink, "file").generation
    _pending(store, g, 0, sink)
    assert store.epoch(sink, 0).status == PENDING  # type: ignore[union-attr]
    store.mark_committed(sink, g, 0, commit_ms=1.0)
    rec = store.epoch(sink, 0)
    assert rec is not None and rec.status == COMMITTED and rec.commit_ms == 1.0
    assert store.sink(sink).high_water == 0  # type: ignore[union-attr]
    _pending(store, g, 1, sink)
    store.mark_aborted(sink, g, 1)
    store.finish_abort(sink, g, 1)
    assert store.epoch(sink, 1) is None
    _pending(store, g, 1, sink)  # an aborted epoch is written again
    store.close()


@pytest.mark.parametrize(
    "step",
    [
        "pending_twice",
        "commit_committed",
        "abort_committed",
        "finish_pending",
        "commit_missing",
        "repend_committed",
    ],
)
def test_rejected_transitions(metastore_url: str, tmp_path: Path, step: str) -> None:
    sink = f"s-{tmp_path.name}"
    store = MetaStore(metastore_url)
    g = store.acquire(sink, "file").generation
    _pending(store, g, 0, sink)
    with pytest.raises(InvalidTransitionError):
        if step == "pending_twice":
            _pending(store, g, 0, sink)
        elif step == "commit_committed":
            store.mark_committed(sink, g, 0, commit_ms=1)
            store.mark_committed(sink, g, 0, commit_ms=1)
        elif step == "abort_committed":
            store.mark_committed(sink, g, 0, commit_ms=1)
            store.mark_aborted(sink, g, 0)
        elif step == "finish_pending":
            store.finish_abort(sink, g, 0)
        elif step == "commit_missing":
            store.mark_committed(sink, g, 5, commit_ms=1)
        else:
            store.mark_committed(sink, g, 0, commit_ms=1)
            _pending(store, g, 0, sink)
    store.close()


def test_second_driver_fences_the_first(metastore_url: str, tmp_path: Path) -> None:
    sink = f"s-{tmp_path.name}"
    zombie, live = MetaStore(metastore_url), MetaStore(metastore_url)
    g1 = zombie.acquire(sink, "file").generation
    _pending(zombie, g1, 0, sink)
    g2 = live.acquire(sink, "file").generation
    assert g2 == g1 + 1
    for change in (
        lambda: zombie.mark_committed(sink, g1, 0, commit_ms=1),
        lambda: zombie.mark_aborted(sink, g1, 0),
        lambda: _pending(zombie, g1, 1, sink),
        lambda: zombie.set_lineage(sink, g1, "x", 0),
        lambda: zombie.gc(sink, g1, 1),
        lambda: zombie.assert_live(sink, g1),  # the check before a plugin's commit or abort
    ):
        with pytest.raises(FencedError):
            change()
    assert zombie.epoch(sink, 0).status == PENDING  # type: ignore[union-attr]
    live.mark_committed(sink, g2, 0, commit_ms=1)
    zombie.close()
    live.close()


def test_gc_keeps_store_small(metastore_url: str, tmp_path: Path) -> None:
    sink = f"s-{tmp_path.name}"
    store = MetaStore(metastore_url)
    g = store.acquire(sink, "file").generation
    for e in range(250):
        _pending(store, g, e, sink)
        store.mark_committed(sink, g, e, commit_ms=1)
    assert store.gc(sink, g, keep_last=50) == 200
    assert store.count_rows(sink) == 50
    rec = store.sink(sink)
    assert rec is not None and rec.high_water == 249 and rec.committed_epochs == 250
    store.close()


def test_outdated_schema_is_a_clear_error(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    eng = sa.create_engine(url)
    with eng.begin() as c:  # a database from an older eosink: tables, but an old revision
        c.execute(sa.text("create table alembic_version (version_num varchar(32) not null)"))
        c.execute(sa.text("insert into alembic_version values ('0000')"))
        c.execute(sa.text("create table pending_sink_state (sink_id varchar(10))"))
    eng.dispose()
    with pytest.raises(SchemaOutdatedError, match="eosink db upgrade"):
        MetaStore(url)


def test_db_upgrade_cli_and_current(fresh_pg_url: str, tmp_path: Path) -> None:
    missing = tmp_path / "m.db"
    with pytest.raises(MetaStoreError, match="no eosink meta store at"):
        MetaStore(f"sqlite:///{missing}", create=False)
    assert not missing.exists()  # a read-only open creates nothing
    missing.touch()  # an empty database: schema missing
    for url in (f"sqlite:///{missing}", fresh_pg_url):
        with pytest.raises(SchemaOutdatedError):
            MetaStore(url, create=False)
        out = subprocess.run(
            [sys.executable, "-m", "eosink._cli", "db", "upgrade", "--url", url],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert f"-> {head_revision()}" in out
        out = subprocess.run(
            [sys.executable, "-m", "eosink._cli", "db", "current", "--url", url],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert f"schema {head_revision()}" in out
        MetaStore(url, create=False).close()


def test_unreachable_metastore() -> None:
    with pytest.raises(MetaStoreUnavailableError, match="unreachable") as exc:
        MetaStore("postgresql://nobody:secret@127.0.0.1:1/none")
    assert "secret" not in str(exc.value)
    assert exc.value.transient


def test_missing_driver_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['psycopg'] = None; sys.modules['psycopg2'] = None\n"
        "from eosink._metastore import MetaStore\n"
        "from eosink import MissingExtraError\n"
        "try:\n"
        "    MetaStore('postgresql://postgres@127.0.0.1/test')\n"
        "except MissingExtraError as e:\n"
        "    assert isinstance(e, ImportError); print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install 'eosink[postgres]'" in out.stdout
    assert issubclass(MissingExtraError, ImportError)


def test_errors_pickle() -> None:
    import pickle

    from eosink import UnknownSinkError

    e = pickle.loads(pickle.dumps(UnknownSinkError("x", ["file"])))
    assert e.known == ["file"] and "installed sinks: file" in str(e)
    m = pickle.loads(pickle.dumps(MissingExtraError("boto3", "s3")))
    assert m.extra == "s3" and "eosink[s3]" in str(m)


_OPENER = """
import sys
from eosink._metastore import MetaStore
print("ready", flush=True)
sys.stdin.readline()  # the barrier: every process is imported and waiting
store = MetaStore(sys.argv[1])
store.acquire(sys.argv[2], "file", None)
store.close()
print("opened", flush=True)
"""


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
@pytest.mark.parametrize("how", ["processes", "threads"])
def test_drivers_opening_a_new_store_at_once_all_start(
    store: str, how: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Six drivers that open one new, empty meta store at the same instant all start: one
    creates the schema, the others wait for it (before, all but one failed with "table
    alembic_version already exists"; six threads of one process broke Alembic's global
    context)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    url = (
        f"sqlite:///{tmp_path / 'new.db'}"
        if store == "sqlite"
        else str(request.getfixturevalue("fresh_pg_url"))
    )
    n = 6
    if how == "processes":
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _OPENER, url, f"sink-{i}"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for i in range(n)
        ]
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        results = [p.communicate(timeout=120) for p in procs]
        failed = [
            err
            for (out, err), p in zip(results, procs, strict=True)
            if p.returncode or "opened" not in out
        ]
        assert not failed, failed[0][-3000:]
    else:
        barrier = threading.Barrier(n)

        def open_one(i: int) -> str:
            barrier.wait()
            s = MetaStore(url)
            s.acquire(f"sink-{i}", "file", None)
            s.close()
            return f"sink-{i}"

        with ThreadPoolExecutor(n) as pool:
            assert sorted(pool.map(open_one, range(n))) == [f"sink-{i}" for i in range(n)]
    final = MetaStore(url, create=False)
    assert sorted(r.sink_id for r in final.sinks()) == [f"sink-{i}" for i in range(n)]
    final.close()


def test_new_sqlite_store_opened_by_threads_at_once_is_never_locked(tmp_path: Path) -> None:
    """Many rounds of six threads opening one new SQLite store at the same instant: none
    fails. Switching the new file to WAL takes a lock for which SQLite calls no busy handler;
    unretried, ~2 % of the opens failed with "database is locked" (a CI run met it once)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    n = 6
    for round_ in range(40):
        url = f"sqlite:///{tmp_path / f'new-{round_}.db'}"
        barrier = threading.Barrier(n)

        def open_one(i: int, url: str = url, barrier: threading.Barrier = barrier) -> int:
            barrier.wait()
            MetaStore(url).close()
            return i

        with ThreadPoolExecutor(n) as pool:
            assert sorted(pool.map(open_one, range(n))) == list(range(n)), round_


def test_schema_revisions_read_without_alembic_agree_with_alembic(tmp_path: Path) -> None:
    """A current store is checked without importing Alembic: the head read from the scripts
    and the revision read from ``alembic_version`` are Alembic's own answers."""
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory
    from sqlalchemy import create_engine

    from eosink._metastore import migrations

    migrations._HEAD = None
    assert migrations.head_revision() == (
        ScriptDirectory.from_config(migrations._config()).get_current_head()
    )
    engine = create_engine(f"sqlite:///{tmp_path / 'm.db'}")
    with engine.begin() as conn:
        assert migrations.current_revision(conn) is None
        migrations.upgrade(conn, "0002")
    with engine.begin() as conn:
        assert migrations.current_revision(conn) == "0002"
        assert MigrationContext.configure(conn).get_current_revision() == "0002"
        migrations.upgrade(conn)
    with engine.begin() as conn:
        assert migrations.current_revision(conn) == migrations.head_revision()
    engine.dispose()
