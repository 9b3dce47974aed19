"""The delta sink against real Delta tables (delta-rs), without Spark: the conformance suite
on a local and on an S3 table (the moto server), and what the sink refuses.

The independent reader is delta-rs' own query engine (``QueryBuilder``, DataFusion), which
reads the table through its log exactly as any Delta reader; Delta's own Spark reader reads
what the sink writes in ``tests/test_delta_spark.py``.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pytest

from eosink.testing import SinkConformance


def delta_table(options: Any) -> Any:
    from deltalake import DeltaTable

    so = options.delta_storage_options()
    if not DeltaTable.is_deltatable(options.path, storage_options=so):
        return None
    return DeltaTable(options.path, storage_options=so)


def delta_options(path: Any) -> Any:
    """The delta sink's parsed options of the table at ``path`` (to read it back)."""
    import eosink

    return eosink.get_sink("delta").parse_options({"path": str(path)})


def delta_rows(options: Any) -> list[dict[str, Any]]:
    """Every row of the table, as delta-rs' query engine reads it."""
    from deltalake import QueryBuilder

    dt = delta_table(options)
    if dt is None:
        return []
    return pa.table(
        QueryBuilder().register("t", dt).execute("SELECT * FROM t").read_all()
    ).to_pylist()


def leftover_files(options: Any, *, eosink_only: bool = True) -> list[str]:
    """Files under the table's directory that no version of the table references and that
    are not its log: what the sink staged and left behind (``eosink_only``: the files the
    sink names, ``eosink-*/`` and ``_eosink/``; else every one, also those of a ``MERGE``
    that delta-rs wrote and never committed: ``VACUUM``'s to remove)."""
    from eosink_delta.layout import JOURNAL
    from eosink_delta.options import filesystem
    from pyarrow import fs as pafs

    dt = delta_table(options)
    fs, root = filesystem(options)
    infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    present = {
        i.path[len(root) + 1 :]
        for i in infos
        if i.type == pafs.FileType.File and not i.path[len(root) + 1 :].startswith("_delta_log/")
    }
    referenced: set[str] = set()
    if dt is not None:
        for v in range(dt.version() + 1):
            old = delta_table(options)
            old.load_as_version(v)
            # The log's paths are URIs (percent-encoded), a listing's are not.
            paths = old.get_add_actions(flatten=True).column("path").to_pylist()
            referenced |= {unquote(p) for p in paths}
    # The core's batch journal (_eosink/journal/) is its record, not staged data.
    left = sorted(
        p for p in present - referenced if "/probe-" not in p and not p.startswith(f"{JOURNAL}/")
    )
    if eosink_only:
        left = [p for p in left if p.startswith(("eosink-", "_eosink/"))]
    return left


class TestDeltaLocalConformance(SinkConformance):
    sink_name = "delta"

    def make_options(self, tmp_path: Path) -> dict[str, Any]:
        return {"path": str(tmp_path / "events")}

    def read_rows(self, options: Any) -> list[dict[str, Any]]:
        return delta_rows(options)

    def leftovers(self, options: Any) -> list[str]:
        return leftover_files(options)


class TestDeltaPartitionedConformance(TestDeltaLocalConformance):
    def make_options(self, tmp_path: Path) -> dict[str, Any]:
        return {"path": str(tmp_path / "events"), "partition_by": ["name"]}


def s3_table(endpoint: str) -> dict[str, Any]:
    """The delta sink's options of a table in a fresh bucket of the S3 server."""
    from harness import s3_client

    bucket = f"delta-{uuid.uuid4().hex[:12]}"
    s3_client(endpoint).create_bucket(Bucket=bucket)
    return {
        "path": f"s3://{bucket}/events",
        "storage_options": {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_ALLOW_HTTP": "true",
        },
    }


class TestDeltaS3Conformance(TestDeltaLocalConformance):
    """The suite on an S3 table, but for the in-process crashes at each fault point: the
    sink's code is the local table's, and tests/test_delta_crash.py::test_s3_chain kills a
    real driver of an S3 table around and inside its commit and abort."""

    test_crash_at_fault_point = None  # type: ignore[assignment]

    @pytest.fixture(autouse=True)
    def _s3(self, s3_endpoint: str) -> None:
        self.endpoint = s3_endpoint

    def make_options(self, tmp_path: Path) -> dict[str, Any]:
        return s3_table(self.endpoint)


# -- what the sink refuses, and what it meets at its commit ---------------------------------
def _sink(tmp_path: Path, **options: Any) -> tuple[Any, Any]:
    """The delta sink's plugin and parsed options of a table under ``tmp_path``."""
    import eosink

    plugin = eosink.get_sink("delta")
    return plugin, plugin.parse_options({"path": str(tmp_path / "t"), **options})


def _batch(start: int, n: int) -> pa.RecordBatch:
    ids = list(range(start, start + n))
    return pa.record_batch({"id": pa.array(ids, pa.int64()), "name": [f"r{i}" for i in ids]})


def _stage(plugin: Any, options: Any, epoch: int, start: int, sink_id: str = "delta:t") -> Any:
    """A coordinator and the committable of ``epoch`` staged by two writers (nothing
    committed)."""
    from eosink.testing import drive_writers

    coord = plugin.coordinator_factory(options, sink_id)
    coord.init()
    setup = coord.writer_setup(_batch(0, 1).schema)
    results = drive_writers(
        plugin, options, sink_id, epoch, [[_batch(start, 5)], [_batch(start + 5, 5)]], setup
    )
    return coord, coord.pre_commit(epoch, results).committable


def _existing(tmp_path: Path, **create: Any) -> None:
    from deltalake import DeltaTable

    DeltaTable.create(str(tmp_path / "t"), _batch(0, 1).schema, **create)


@pytest.mark.parametrize(
    ("create", "alter", "options", "says"),
    [
        (
            {},
            {"add_constraint": {"id_positive": "id > 0"}},
            {},
            r"CHECK constraint\(s\) id_positive",
        ),
        (
            {"configuration": {"delta.setTransactionRetentionDuration": "interval 1 days"}},
            {},
            {},
            "setTransactionRetentionDuration",
        ),
        (
            {"configuration": {"delta.appendOnly": "true"}},
            {},
            {"mode": "upsert", "keys": ["id"]},
            "append-only",
        ),
        (
            {"configuration": {"delta.enableDeletionVectors": "true"}},
            {},
            {"mode": "upsert", "keys": ["id"]},
            "deletion vectors",
        ),
        ({}, {}, {"partition_by": ["name"]}, "keeps its partitioning"),
    ],
    ids=[
        "check-constraint",
        "txn-retention",
        "append-only-upsert",
        "deletion-vectors-upsert",
        "partitioning",
    ],
)
def test_refused_before_anything_is_staged(
    tmp_path: Path,
    create: dict[str, Any],
    alter: dict[str, Any],
    options: dict[str, Any],
    says: str,
) -> None:
    """A table the sink cannot write correctly is refused in ``writer_setup``, before any
    writer ran, naming the feature; nothing is added to the table."""
    from deltalake import DeltaTable

    import eosink

    _existing(tmp_path, **create)
    dt = DeltaTable(str(tmp_path / "t"))
    if "add_constraint" in alter:
        dt.alter.add_constraint(alter["add_constraint"])
    version = DeltaTable(str(tmp_path / "t")).version()
    plugin, opts = _sink(tmp_path, **options)
    coord = plugin.coordinator_factory(opts, "delta:t")
    coord.init()
    with pytest.raises(eosink.ConfigError, match=says):
        coord.writer_setup(_batch(0, 1).schema)
    assert DeltaTable(str(tmp_path / "t")).version() == version


def test_column_types_never_change_and_new_columns_are_added(tmp_path: Path) -> None:
    import eosink

    plugin, opts = _sink(tmp_path)
    coord, c = _stage(plugin, opts, 0, 0)
    coord.commit(0, c)
    with pytest.raises(eosink.SchemaMismatchError, match="'name' is int64 in the data but string"):
        coord.writer_setup(pa.schema([("id", pa.int64()), ("name", pa.int64())]))
    setup = coord.writer_setup(
        pa.schema([("id", pa.int32()), ("name", pa.string()), ("x", pa.float64())])
    )
    assert setup.schema.names == ["id", "name", "x"]  # int32 into a long column is fine


def test_a_feature_enabled_while_pending_stops_the_commit(tmp_path: Path) -> None:
    """A CHECK constraint added while an epoch is PENDING: its commit refuses with the
    constraint's name (never commits rows it did not check); dropped, the epoch commits."""
    from deltalake import DeltaTable

    import eosink

    plugin, opts = _sink(tmp_path)
    coord, c = _stage(plugin, opts, 0, 0)
    DeltaTable(opts.path).alter.add_constraint({"id_small": "id < 1000"})
    with pytest.raises(eosink.ConfigError, match="id_small"):
        coord.commit(0, c)
    assert delta_rows(opts) == []
    DeltaTable(opts.path).alter.drop_constraint("id_small")
    coord.commit(0, c)
    assert sorted(r["id"] for r in delta_rows(opts)) == list(range(10))


def test_vacuum_while_pending_is_refused_at_commit(tmp_path: Path) -> None:
    """``VACUUM RETAIN 0 HOURS`` (its safety check off; delta-rs' ``full`` vacuum, which
    deletes files no version names, as Delta's Spark ``VACUUM`` does) while an epoch is
    PENDING deletes the epoch's staged data files (no version references them yet). The
    commit refuses, naming the missing files and ``eosink abandon``, and commits no dangling
    reference."""
    from deltalake import DeltaTable

    import eosink

    plugin, opts = _sink(tmp_path)
    coord, c0 = _stage(plugin, opts, 0, 0)
    coord.commit(0, c0)
    coord, c1 = _stage(plugin, opts, 1, 10)
    gone = DeltaTable(opts.path).vacuum(
        retention_hours=0, enforce_retention_duration=False, dry_run=False, full=True
    )
    assert gone, "VACUUM deleted nothing"
    with pytest.raises(
        eosink.SinkError,
        match=r"epoch 1 cannot be committed: 2 of its 2 data files are gone.*eosink abandon",
    ):
        coord.commit(1, c1)
    assert sorted(r["id"] for r in delta_rows(opts)) == list(range(10))


def test_a_concurrent_writer_keeps_its_rows_and_files(tmp_path: Path) -> None:
    """delta-rs appends to the table between the sink's phase 1 and its commit, and has
    files of its own in the table's directory that no version names yet (in flight): the
    sink's commit goes in after the other writer's (Delta's optimistic concurrency), both
    writers' rows are there once, and neither the commit's sweep nor an abort touches the
    other writer's files."""
    from deltalake import DeltaTable, write_deltalake

    plugin, opts = _sink(tmp_path)
    coord, c0 = _stage(plugin, opts, 0, 0)
    coord.commit(0, c0)
    coord, c1 = _stage(plugin, opts, 1, 10)
    stale = DeltaTable(opts.path)  # the sink's view is older than the next version
    write_deltalake(opts.path, _batch(100, 3), mode="append")
    inflight = (
        Path(opts.path) / "part-00000-11111111-2222-3333-4444-555555555555-c000.snappy.parquet"
    )
    inflight.write_bytes(b"another writer's file, not committed yet")
    coord._dt = stale
    coord.commit(1, c1)
    coord.abort(7, None)
    ids = sorted(r["id"] for r in delta_rows(opts))
    assert ids == [*range(20), 100, 101, 102]
    assert inflight.exists()


def test_an_unsafe_s3_commit_is_refused(s3_endpoint: str) -> None:
    import eosink

    raw = s3_table(s3_endpoint)
    raw["storage_options"]["AWS_S3_ALLOW_UNSAFE_RENAME"] = "true"
    plugin = eosink.get_sink("delta")
    coord = plugin.coordinator_factory(plugin.parse_options(raw), "delta:s3")
    with pytest.raises(eosink.ConfigError, match="AWS_S3_ALLOW_UNSAFE_RENAME"):
        coord.init()


@pytest.mark.parametrize("strip", [True, False], ids=["ignores-conditions", "honours-them"])
def test_a_store_that_ignores_conditional_puts_is_refused(s3_endpoint: str, strip: bool) -> None:
    """Before its first commit to a bucket the sink PUTs an object twice with
    ``If-None-Match: *``: a store that lets the second overwrite the first would let two
    commits of one table version both succeed, so it is refused with an error that says so.
    The same proxy passing the header on lets the sink start and commit (the control: the
    refusal is the store's doing, not the proxy's)."""
    import subprocess
    import sys

    import eosink

    raw = s3_table(s3_endpoint)
    script = str(Path(__file__).parent / "s3_strip_proxy.py")
    proxy = subprocess.Popen(
        [sys.executable, script, s3_endpoint, *([] if strip else ["--keep"])],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proxy.stdout is not None
        raw["storage_options"]["AWS_ENDPOINT_URL"] = proxy.stdout.readline().strip()
        plugin = eosink.get_sink("delta")
        opts = plugin.parse_options({**raw, "create_table": True})
        coord = plugin.coordinator_factory(opts, "delta:probe")
        if strip:
            with pytest.raises(
                eosink.ConfigError,
                match=r"overwrote an object that a conditional PUT \(If-None-Match: \*\) "
                r"must not overwrite.*AWS_S3_LOCKING_PROVIDER=dynamodb",
            ):
                coord.init()
            assert delta_table(opts) is None, "a table was created on an unsafe store"
        else:
            coord, c = _stage(plugin, opts, 0, 0, "delta:probe")
            coord.commit(0, c)
            assert sorted(r["id"] for r in delta_rows(opts)) == list(range(10))
    finally:
        proxy.kill()
        proxy.wait()


def test_status_describes_pending_epochs(tmp_path: Path) -> None:
    from eosink_delta.coordinator import describe_open

    plugin, opts = _sink(tmp_path)
    _, c = _stage(plugin, opts, 3, 0)
    [open_] = describe_open("delta:t", None, {3: c})
    assert open_["kind"] == "staged data files"
    assert open_["what"].startswith("epoch 3: 2 file(s)") and "eosink-" in open_["what"]


def test_vacuum_spares_staged_changes(tmp_path: Path) -> None:
    """An upsert epoch's staged changes live in a hidden directory (``_eosink/``), which
    ``VACUUM`` never lists: the PENDING epoch survives a full ``VACUUM RETAIN 0 HOURS`` and
    commits."""
    from deltalake import DeltaTable

    plugin, opts = _sink(tmp_path, mode="upsert", keys=["id"])
    coord, c0 = _stage(plugin, opts, 0, 0)
    coord.commit(0, c0)
    coord, c1 = _stage(plugin, opts, 1, 5)
    DeltaTable(opts.path).vacuum(
        retention_hours=0, enforce_retention_duration=False, dry_run=False, full=True
    )
    coord.commit(1, c1)
    assert sorted(r["id"] for r in delta_rows(opts)) == list(range(15))
    assert leftover_files(opts) == []


def stats_are_bounds(options: Any) -> int:
    """Check every data file's statistics, as delta-rs parses them from the log, against the
    file's own rows (read with pyarrow): ``numRecords`` and ``nullCount`` exact, every
    minimum and maximum a true bound (a reader that skips files by them must never skip a
    matching row; Delta spells timestamps to the millisecond). Returns how many bounds were
    checked."""
    import pyarrow.parquet as pq

    table = delta_table(options)
    checked = 0
    for add in pa.table(table.get_add_actions(flatten=False)).to_pylist():
        rows = pq.read_table(f"{options.path}/{unquote(add['path'])}")
        assert add["num_records"] == rows.num_rows, add["path"]
        for col, n in (add.get("null_count") or {}).items():
            if n is not None and col in rows.column_names:
                assert rows.column(col).null_count == n, (add["path"], col)
        for which, ok in (("min", lambda b, v: b <= v), ("max", lambda b, v: b >= v)):
            for col, bound in (add.get(which) or {}).items():
                if bound is None or col not in rows.column_names:
                    continue
                values = [v for v in rows.column(col).to_pylist() if v is not None]
                assert all(ok(bound, v) for v in values), f"{add['path']}: {which}[{col}]={bound}"
                checked += 1
    return checked


def test_statistics_are_true_bounds(tmp_path: Path) -> None:
    """Integers, strings (one longer than the statistics keep), dates and timestamps a few
    microseconds either side of a millisecond, written by the Python writers."""
    import datetime as dt

    from eosink.testing import drive_writers

    plugin, opts = _sink(tmp_path)
    base = dt.datetime(2026, 12, 1, tzinfo=dt.timezone.utc)
    batch = pa.record_batch(
        {
            "id": pa.array([3, -7, 12], pa.int64()),
            "name": ["b", "z" * 40, None],
            "day": pa.array([dt.date(2026, 1, 2), dt.date(2025, 12, 31), None]),
            "ts": pa.array(
                [base + dt.timedelta(microseconds=us) for us in (1, 999, 1999)],
                pa.timestamp("us", tz="UTC"),
            ),
        }
    )
    coord = plugin.coordinator_factory(opts, "delta:t")
    coord.init()
    setup = coord.writer_setup(batch.schema)
    results = drive_writers(plugin, opts, "delta:t", 0, [[batch]], setup)
    coord.commit(0, coord.pre_commit(0, results).committable)
    assert stats_are_bounds(opts) == 7  # 2 a column, but no maximum for a string too long


def test_winners_take_the_largest_order_by_whatever_the_row_order() -> None:
    """The last change of a key is the one with the largest ``order_by``, not the last row
    (a task's rows come in any order); a NULL never wins; a delete wins like any change."""
    from eosink_delta.changes import DELETE, winners

    _, opts = _sink(Path("/nonexistent"), mode="upsert", keys=["k"], order_by="seq", op_column="op")
    data = pa.table(
        {
            "k": [1, 1, 1, 2, 2, 3],
            "seq": [9, 3, None, 1, 2, 5],
            "v": ["nine", "three", "null", "one", "two", "five"],
            "op": ["u", "u", "u", "u", "d", "u"],
        }
    )
    won = {r["k"]: (r["v"], r[DELETE]) for r in winners(opts, data).to_pylist()}
    assert won == {1: ("nine", False), 2: ("two", True), 3: ("five", False)}


def test_a_pending_upsert_is_applied_as_it_was_staged(tmp_path: Path) -> None:
    """A PENDING upsert epoch committed by a run given other options (a new ``order_by``,
    other ``delete_ops``) is applied with those it was staged with: its epoch spec."""
    import eosink
    from eosink import EpochSpec
    from eosink._spec import persisted_options
    from eosink.testing import drive_writers

    plugin = eosink.get_sink("delta")
    staged = plugin.parse_options(
        {
            "path": str(tmp_path / "t"),
            "mode": "upsert",
            "keys": ["k"],
            "order_by": "seq",
            "op_column": "op",
        }
    )
    batch = pa.record_batch(
        {
            "k": [1, 1, 2, 3],
            "seq": [2, 1, 1, 1],
            "v": ["new", "old", "gone", "kept"],
            "op": ["u", "u", "d", "u"],
        }
    )
    coord = plugin.coordinator_factory(staged, "delta:t")
    coord.init()
    results = drive_writers(
        plugin, staged, "delta:t", 0, [[batch]], coord.writer_setup(batch.schema)
    )
    committable = coord.pre_commit(0, results).committable
    later = plugin.parse_options({**staged.model_dump(), "order_by": "v", "delete_ops": ["x"]})
    finisher = plugin.coordinator_factory(later, "delta:t")
    finisher.init()
    finisher.commit(0, committable, spec=EpochSpec(persisted_options(staged), batch.schema))
    assert sorted((r["k"], r["v"]) for r in delta_rows(staged)) == [(1, "new"), (3, "kept")]
