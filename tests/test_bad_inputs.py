"""Bad inputs, one table: what a new user may pass, and the eosink error they get.

Every row of :data:`CASES` is run by one test, :func:`test_bad_input`, which asserts the same
things of each (issue 38's audit):

* the error's type, exactly (one hierarchy rooted at ``EosinkError``; option problems are
  ``ConfigError``);
* that its first line names the problem (``Case.first``, a regex searched in that line);
* for an option check (``Case.option_check``, the default): that no Spark job ran and that
  no meta store was created;
* whatever the check: that nothing is PENDING in the meta store.

A row adds its own assertions in ``then`` (the rest of the message, what the target holds,
that the corrected run succeeds), and sets up what it needs in ``given`` (an earlier run, a
table, an environment). A new sink adds its rows at the end of :data:`CASES`: a ``Case``
with the sink's name, the options (a dict, or a function of the :class:`Ctx`), the error and
its first line; ``needs`` names the services it uses (``kafka``, ``s3_endpoint``,
``pg_url``: the session fixtures of ``conftest.py``). The rows share the session's Spark and
services: no row starts its own.
"""

from __future__ import annotations

import os
import re
import socket
import sqlite3
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from harness import read_ids, staged_files

import eosink
from eosink import (
    ConfigError,
    EosinkError,
    MetaStoreError,
    SchemaMismatchError,
    SinkError,
    UnknownSinkError,
)


# -- the runner -------------------------------------------------------------------------------
@dataclass
class Ctx:
    """What a row's functions get: the session's Spark, the test's directory and fixtures."""

    spark: Any
    tmp_path: Path
    request: pytest.FixtureRequest
    monkeypatch: pytest.MonkeyPatch
    seconds: float = 0.0
    """How long the failing call took (set by the runner before ``then``)."""
    kept: dict[str, Any] = field(default_factory=dict)
    """What ``given`` leaves for ``options``, ``df`` or ``then`` (a bucket, a table name)."""

    @property
    def out(self) -> Path:
        return self.tmp_path / "out"

    @property
    def db(self) -> Path:
        return self.tmp_path / "metastore.db"

    @property
    def metastore_url(self) -> str:
        return f"sqlite:///{self.db}"

    def fixture(self, name: str) -> Any:
        return self.request.getfixturevalue(name)


Options = dict[str, Any] | Callable[[Ctx], dict[str, Any]]


def _default_df(c: Ctx) -> Any:
    return c.spark.range(3).selectExpr("id", "cast(id as string) as k")


@dataclass(frozen=True)
class Case:
    """One bad input.

    Attributes:
        id: the test id.
        sink: the sink's name (``sink=``, or ``.option("sink", ...)``).
        options: the sink's options and the run's arguments (``epoch``, ``trigger``...),
            or a function of the context that returns them. ``metastore_url`` defaults to
            the test's own SQLite file (``Ctx.db``).
        error: the exact class of the error.
        first: a regex the error's first line must contain (the problem, named).
        df: the DataFrame (default: ``id`` and a string ``k``, three rows).
        option_check: the check runs before anything (no Spark job, no meta store created).
        front: ``run`` (``eosink.run``), ``write`` (``df.write.format("eosink")...save()``)
            or ``stream`` (``df.writeStream.format("eosink")...start()``, then waited for).
        needs: session fixtures the row uses (started before the row's clock runs).
        given: prepares the target or the environment before the call.
        then: the row's own assertions after the common ones.
    """

    id: str
    sink: str
    options: Options
    error: type[EosinkError]
    first: str
    df: Callable[[Ctx], Any] = _default_df
    option_check: bool = True
    front: str = "run"
    needs: tuple[str, ...] = ()
    given: Callable[[Ctx], None] | None = None
    then: Callable[[Ctx, EosinkError], None] | None = None


def _jobs(spark: Any) -> list[int]:
    return sorted(spark.sparkContext.statusTracker().getJobIdsForGroup(None))


def _pending(db: Path) -> list[tuple[str, int]]:
    """The PENDING epochs of a SQLite meta store (read with sqlite3: an independent reader)."""
    if not db.exists():
        return []
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        if not con.execute(
            "SELECT 1 FROM sqlite_master WHERE name = 'pending_sink_state'"
        ).fetchone():
            return []
        rows = con.execute(
            "SELECT sink_id, epoch FROM pending_sink_state WHERE status = 'PENDING'"
        ).fetchall()
        return [(str(s), int(e)) for s, e in rows]
    finally:
        con.close()


def _act(case: Case, c: Ctx, df: Any, options: dict[str, Any]) -> None:
    if case.front == "run":
        eosink.run(df, sink=case.sink, **options)
        return
    writer: Any = (df.write if case.front == "write" else df.writeStream).format("eosink")
    writer = writer.option("sink", case.sink)
    for k, v in options.items():
        writer = writer.option(k, v)
    if case.front == "write":
        writer.mode("append").save()
        return
    query = c.kept["query"] = writer.start()
    try:
        query.awaitTermination(300)
    finally:
        query.stop()


def run_case(case: Case, c: Ctx) -> EosinkError:
    """Run one row with the common assertions; return its error."""
    for name in case.needs:
        c.fixture(name)
    if case.given is not None:
        case.given(c)
    options = case.options(c) if callable(case.options) else dict(case.options)
    options.setdefault("metastore_url", c.metastore_url)
    df = case.df(c)
    store_existed = c.db.exists()
    jobs = _jobs(c.spark)
    t0 = time.monotonic()
    with pytest.raises(EosinkError) as exc:
        _act(case, c, df, options)
    c.seconds = time.monotonic() - t0
    err = exc.value
    assert type(err) is case.error, f"{type(err).__name__}: {err}"
    # Every message ends with its docs/errors.md entry; the rows say what comes before it.
    ref = f" (see docs/errors.md#{type(err).__name__.lower()})"
    assert str(err).endswith(ref), f"no errors.md pointer: {err}"
    said = str(err).removesuffix(ref)
    first = said.splitlines()[0] if said else ""
    assert re.search(case.first, first), f"first line: {first!r}\nfull: {err}"
    if case.option_check:
        assert _jobs(c.spark) == jobs, "a Spark job ran before the options were checked"
        assert c.db.exists() == store_existed, "the meta store was created before the check"
    assert _pending(c.db) == [], "an epoch is PENDING after the error"
    if case.then is not None:
        case.then(c, err)
    return err


# -- the file sink: options (tests/test_validation.py, tests/test_file_layout.py before) -----
def _is_not_there(c: Ctx, _: EosinkError) -> None:
    assert not c.out.exists()


def _codecs_listed(c: Ctx, err: EosinkError) -> None:
    for codec in ("none", "snappy", "gzip", "zstd"):
        assert codec in str(err)
    assert "lzo" not in str(err)  # Arrow C++ cannot write LZO
    assert not c.out.exists()


def _a_file(c: Ctx) -> None:
    (c.tmp_path / "out.parquet").write_text("not a directory")


def _file_unchanged(c: Ctx, err: EosinkError) -> None:
    f = c.tmp_path / "out.parquet"
    assert f"path: {str(f)!r} exists and is not a directory" in str(err)
    assert f.read_text() == "not a directory"


def _under_a_file(c: Ctx) -> None:
    (c.tmp_path / "file.txt").write_text("x")


def _under_a_file_named(c: Ctx, err: EosinkError) -> None:
    f = c.tmp_path / "file.txt"
    assert f"path: {str(f / 'out')!r} cannot be created: {f} is a file, not a directory" in str(err)


def _read_only_dir(c: Ctx) -> None:
    ro = c.tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() == 0:  # root writes anywhere: a path under a regular file fails for root too
        (ro / "f").write_text("x")
        c.kept["target"], c.kept["cause"] = (
            ro / "f" / "sub" / "out",
            f"{ro / 'f'} is a file, not a directory",
        )
    else:
        ro.chmod(0o500)
        c.request.addfinalizer(lambda: ro.chmod(0o700))
        c.kept["target"], c.kept["cause"] = ro / "sub" / "out", f"{ro} is not writable by this user"


def _read_only_named(c: Ctx, err: EosinkError) -> None:
    target, cause = c.kept["target"], c.kept["cause"]
    assert f"path: {str(target)!r} cannot be created: {cause}" in str(err)
    assert not (c.tmp_path / "ro" / "sub").exists()


def _layout_df(c: Ctx) -> Any:
    return c.spark.range(7).selectExpr("id", "cast(id % 3 as string) as g")


def _partitioned_by_g(c: Ctx) -> None:
    eosink.run(
        _layout_df(c),
        sink="file",
        path=str(c.out),
        partition_by=["g"],
        epoch=1,
        metastore_url=f"sqlite:///{c.tmp_path / 'first.db'}",
    )


def _layout_kept(c: Ctx, err: EosinkError) -> None:
    assert "asks for partition_by=['id']" in str(err)
    assert c.spark.read.parquet(str(c.out)).count() == 7
    # Compression and rolling options are not part of the layout.
    r = eosink.run(
        _layout_df(c),
        sink="file",
        path=str(c.out),
        partition_by="g",
        compression="zstd",
        epoch=2,
        metastore_url=f"sqlite:///{c.tmp_path / 'first.db'}",
    )
    assert isinstance(r, eosink.BatchResult) and r.committed
    assert c.spark.read.parquet(str(c.out)).count() == 14


def _s3_bucket(c: Ctx) -> tuple[Any, str]:
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=c.fixture("s3_endpoint"),
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    bucket = f"b-{uuid.uuid4().hex[:10]}"
    client.create_bucket(Bucket=bucket)
    return client, bucket


def _no_credentials(c: Ctx) -> None:
    c.kept["client"], c.kept["bucket"] = _s3_bucket(c)
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        c.monkeypatch.delenv(var, raising=False)
    c.monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(c.tmp_path / "none"))
    c.monkeypatch.setenv("AWS_CONFIG_FILE", str(c.tmp_path / "none"))
    c.monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def _no_credentials_named(c: Ctx, err: EosinkError) -> None:
    client, bucket = c.kept["client"], c.kept["bucket"]
    assert c.seconds < 30
    assert f"no S3 credentials for s3://{bucket}/out" in str(err)
    assert "s3_access_key_id" in str(err) and "AWS_ACCESS_KEY_ID" in str(err)
    assert client.list_objects_v2(Bucket=bucket).get("Contents", []) == []


_FILE_OPTIONS: list[Case] = [
    Case(
        "file-partition_by-repeats-a-column",
        "file",
        lambda c: {"path": str(c.out), "partition_by": ["k", "id", "k"]},
        ConfigError,
        r"partition_by: column 'k' appears more than once in \['k', 'id', 'k'\]",
        then=_is_not_there,
    ),
    Case(
        "file-partition_by-repeats-a-column-spark-style",
        "file",
        lambda c: {"path": str(c.out), "partition_by": "k,k"},
        ConfigError,
        r"column 'k' appears more than once",
    ),
    Case(
        "file-unknown-compression",
        "file",
        lambda c: {"path": str(c.out), "compression": "zzz"},
        ConfigError,
        r"compression: 'zzz' is not a codec",
        then=_codecs_listed,
    ),
    *(
        Case(
            f"file-compression-not-for-{fmt}",
            "file",
            lambda c, fmt=fmt: {"path": str(c.out), "format": fmt, "compression": "zstd"},
            ConfigError,
            rf"compression: 'zstd' is not a codec for format='{fmt}'; "
            r"use one of: none, gzip, bzip2",
        )
        for fmt in ("json", "csv")
    ),
    Case(
        "file-path-is-a-file",
        "file",
        lambda c: {"path": str(c.tmp_path / "out.parquet")},
        ConfigError,
        r"path: '[^']*/out\.parquet' exists and is not a directory",
        given=_a_file,
        then=_file_unchanged,
    ),
    Case(
        "file-path-under-a-file",
        "file",
        lambda c: {"path": str(c.tmp_path / "file.txt" / "out")},
        ConfigError,
        r"path: '[^']*/file\.txt/out' cannot be created: [^ ]*/file\.txt is a file, not a "
        r"directory",
        given=_under_a_file,
        then=_under_a_file_named,
    ),
    Case(
        "file-path-under-a-read-only-directory",
        "file",
        lambda c: {"path": str(c.kept["target"])},
        ConfigError,
        r"path: '[^']*/ro/[^']*' cannot be created: ",
        given=_read_only_dir,
        then=_read_only_named,
    ),
    Case(
        "file-two-columns-differ-in-case",
        "file",
        lambda c: {"path": str(c.out), "format": "json"},
        SchemaMismatchError,
        r"the DataFrame has two columns named 'id' and 'ID'",
        df=lambda c: c.spark.range(3).selectExpr("id", "id as ID", "cast(id as string) as k"),
    ),
    Case(
        "file-partition_by-changed",
        "file",
        lambda c: {"path": str(c.out), "partition_by": ["id"], "sink_id": "other", "epoch": 1},
        ConfigError,
        r"holds files written with partition_by=\['g'\] \(its layout record ",
        df=_layout_df,
        given=_partitioned_by_g,
        then=_layout_kept,
    ),
    Case(
        "s3-without-credentials",
        "file",
        lambda c: {
            "path": f"s3://{c.kept['bucket']}/out",
            "s3_endpoint_url": c.fixture("s3_endpoint"),
            "s3_region": "us-east-1",
            "epoch": 1,
        },
        ConfigError,
        r"no S3 credentials for s3://b-\w+/out",
        needs=("s3_endpoint",),
        given=_no_credentials,
        then=_no_credentials_named,
    ),
]


# -- run arguments: epochs and triggers (tests/test_validation.py before) --------------------
def _stream_df(c: Ctx) -> Any:
    return c.spark.readStream.format("rate").load()


def _no_checkpoint(c: Ctx, _: EosinkError) -> None:
    assert not (c.tmp_path / "chk").exists()


_RUN_ARGUMENTS: list[Case] = [
    *(
        Case(
            f"epoch-{name}",
            "file",
            lambda c, epoch=epoch: {"path": str(c.out), "epoch": epoch},
            ConfigError,
            r"epoch must be an integer from 0 to \d+",
        )
        for name, epoch in [
            ("str", "x"),
            ("float", 1.5),
            ("bool", True),
            ("neg", -1),
            ("big", 2**63),
            ("list", [1]),
        ]
    ),
    *(
        Case(
            f"trigger-{n}",
            "file",
            lambda c, trigger=trigger: {
                "path": str(c.out),
                "checkpoint_location": str(c.tmp_path / "chk"),
                "trigger": trigger,
            },
            ConfigError,
            r"trigger",
            df=_stream_df,
            then=_no_checkpoint,
        )
        for n, trigger in enumerate(
            [
                "banana",
                {"processingTime": "banana"},
                {"processingTime": ""},
                {"once": False},
                {"availableNow": 1},
                {"continuous": "1 second"},
                {"processingTime": "5 seconds", "once": True},
                "5",
            ]
        )
    ),
]


# -- the iceberg sink (tests/test_iceberg_checks.py before) ----------------------------------
TABLE = "db.events"


def _iceberg(c: Ctx, **kw: Any) -> dict[str, Any]:
    return {"table": TABLE, "warehouse": str(c.tmp_path / "wh"), "epoch": 0, **kw}


def _catalog(c: Ctx) -> Any:
    from pyiceberg.catalog import load_catalog

    o = eosink.get_sink("iceberg").parse_options(
        {"table": TABLE, "warehouse": str(c.tmp_path / "wh")}
    )
    return load_catalog(o.catalog_name, **o.catalog_properties())


def _iceberg_df(c: Ctx) -> Any:
    return c.spark.range(0, 6).selectExpr(
        "id", "cast(id as string) as s", "timestamp'2024-01-02 03:04:05' as ts", "id % 2 = 0 as b"
    )


def _transform_then(
    bad: str, column: str, kind: str, allowed: str, fixed: str
) -> Callable[[Ctx, EosinkError], None]:
    def then(c: Ctx, err: EosinkError) -> None:
        from eosink_iceberg.transforms import table_terms

        msg = str(err)
        assert f"column {column!r} is {kind}" in msg
        assert f"the {bad.split('(')[0]} transform applies to {allowed}" in msg
        assert f"what can partition {column!r}: " in msg
        assert "was not created; nothing was written" in msg
        assert not (c.tmp_path / "wh").exists()  # not even the embedded catalog
        # The corrected partition_by: the table is created with it in one step, and written.
        r = eosink.run(
            _iceberg_df(c),
            sink="iceberg",
            metastore_url=c.metastore_url,
            **_iceberg(c, partition_by=[fixed]),
        )
        assert isinstance(r, eosink.BatchResult) and r.rows == 6
        table = _catalog(c).load_table(TABLE)
        assert [str(t) for _, t in table_terms(table)] == [fixed]
        assert len(table.metadata.partition_specs) == 1
        assert len(table.scan().to_arrow()) == 6

    return then


_ICEBERG: list[Case] = [
    Case(
        f"iceberg-transform-{bad.split('(')[0]}-of-{kind}",
        "iceberg",
        lambda c, bad=bad: _iceberg(c, partition_by=[bad]),
        ConfigError,
        re.escape(f"partition_by {bad!r} is not a valid Iceberg partition field"),
        df=_iceberg_df,
        then=_transform_then(bad, column, kind, allowed, fixed),
    )
    for bad, column, kind, allowed, fixed in [
        ("day(s)", "s", "string", "date, timestamp and timestamptz", "s"),
        ("hour(id)", "id", "long", "timestamp and timestamptz", "bucket(4, id)"),
        (
            "truncate(4, ts)",
            "ts",
            "timestamptz",
            "int, long, decimal, string and binary",
            "day(ts)",
        ),
        ("bucket(4, b)", "b", "boolean", "int, long, decimal, date, time", "b"),
    ]
]


# -- the kafka sink (tests/test_kafka_checks.py before) --------------------------------------
def _kafka_staged(c: Ctx) -> list[Path]:
    return [p for p in (c.tmp_path / "staging").rglob("*") if p.is_file()]


def _kafka_epochs(c: Ctx, sink_id: str) -> dict[int, str]:
    from eosink._metastore import MetaStore

    store = MetaStore(c.metastore_url)
    try:
        return {r.epoch: r.status for r in store.epochs(sink_id)}
    finally:
        store.close()


def _routed(c: Ctx, rows: list[tuple[Any, ...]]) -> Any:
    return c.spark.createDataFrame(rows, "key string, value string, topic string")


def _topics(c: Ctx) -> None:
    kafka = c.fixture("kafka")
    c.kept["good"] = f"good-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(c.kept["good"], partitions=2)
    c.kept["missing"] = f"nosuch-{uuid.uuid4().hex[:8]}"


def _kafka_routed(writer: str) -> Callable[[Ctx], dict[str, Any]]:
    def options(c: Ctx) -> dict[str, Any]:
        return {
            "bootstrap_servers": c.fixture("kafka").bootstrap,
            "sink_id": f"kafka:routed-{writer}",
            "writer": writer,
            "staging_path": str(c.tmp_path / "staging"),
        }

    return options


def _missing_topic_then(writer: str) -> Callable[[Ctx, EosinkError], None]:
    def then(c: Ctx, err: EosinkError) -> None:
        from test_kafka_sink import _ids, read_topic

        kafka, good, missing = c.fixture("kafka"), c.kept["good"], c.kept["missing"]
        opts = {**_kafka_routed(writer)(c), "metastore_url": c.metastore_url}
        sid = opts["sink_id"]
        bad = _routed(c, [("k", '{"id": 0}', good), ("k", '{"id": 1}', missing)])
        msg = str(err)
        print(f"\nrouted to a missing topic ({writer} writer): failed in {c.seconds:.1f} s")
        assert repr(missing) in msg and "epoch" in msg and "create them" in msg, msg
        assert repr(good) not in msg
        assert c.seconds < 30, c.seconds  # was ~65 s (librdkafka's message timeout at commit)
        # Nothing PENDING, nothing staged, nothing visible.
        assert "PENDING" not in _kafka_epochs(c, sid).values()
        assert _kafka_staged(c) == []
        assert read_topic(kafka.bootstrap, good) == []
        # The next run of the same sink, with good data, succeeds and is exact.
        ok = _routed(c, [("k", f'{{"id": {i}}}', good) for i in range(5)])
        t0 = time.monotonic()
        r = eosink.run(ok, sink="kafka", **opts)
        print(f"the next run, good data: committed in {time.monotonic() - t0:.1f} s")
        assert isinstance(r, eosink.BatchResult)
        assert r.committed and not r.recovered and r.rows == 5
        assert sorted(_ids(read_topic(kafka.bootstrap, good))) == list(range(5))
        assert set(_kafka_epochs(c, sid).values()) == {"COMMITTED"}
        assert _kafka_staged(c) == []
        # A started sink (control topic and transactional ids known to the broker) meets a
        # bad topic: refused as fast as a good epoch commits.
        t0 = time.monotonic()
        with pytest.raises(SinkError, match=repr(missing)):
            eosink.run(bad, sink="kafka", **opts)
        print(f"again, on a started sink: failed in {time.monotonic() - t0:.1f} s")
        assert set(_kafka_epochs(c, sid).values()) == {"COMMITTED"}
        assert _kafka_staged(c) == []
        assert sorted(_ids(read_topic(kafka.bootstrap, good))) == list(range(5))

    return then


_KAFKA: list[Case] = [
    Case(
        f"kafka-record-routed-to-a-missing-topic-{writer}-writer",
        "kafka",
        _kafka_routed(writer),
        SinkError,
        r"kafka sink kafka:routed-\w+ epoch \d+ cannot be published: topic\(s\) 'nosuch-\w+' "
        r"do not exist on ",
        df=lambda c: _routed(
            c, [("k", '{"id": 0}', c.kept["good"]), ("k", '{"id": 1}', c.kept["missing"])]
        ),
        option_check=False,
        needs=("kafka",),
        given=_topics,
        then=_missing_topic_then(writer),
    )
    for writer in ("spark", "python")
]


# -- plugins and the meta store (tests/test_plugins.py, tests/test_metastore.py before) ------
def _broken_plugin(c: Ctx) -> None:
    """An installed entry point whose module fails to import (a real distribution on
    ``sys.path``, found by importlib.metadata as pip would install it)."""
    from eosink import registry

    dist = c.tmp_path / "eosink_broken-1.2.3.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: eosink-broken\nVersion: 1.2.3\n")
    (dist / "entry_points.txt").write_text("[eosink]\nbroken = eosink_broken_no_such_module\n")
    c.monkeypatch.syspath_prepend(str(c.tmp_path))
    registry.plugin_manager.cache_clear()

    def forget() -> None:  # after monkeypatch restored sys.path (finalizers run in reverse)
        registry.plugin_manager.cache_clear()
        registry._broken[:] = [b for b in registry._broken if b.package != "eosink-broken"]

    c.request.addfinalizer(forget)


def _other_sinks_listed(c: Ctx, err: EosinkError) -> None:
    assert str(err).startswith("unknown sink 'broken'; installed sinks: ")
    assert isinstance(err, UnknownSinkError) and "file" in err.known
    assert eosink.get_sink("file").name == "file"  # every other sink works


def _store_exists(c: Ctx) -> None:
    from eosink._metastore import MetaStore

    MetaStore(c.metastore_url).close()


def _read_only_named_at_once(c: Ctx, err: EosinkError) -> None:
    from eosink import MetaStoreUnavailableError

    assert c.seconds < 5  # not retried for metastore_retry_s as an unreachable one is
    assert not isinstance(err, MetaStoreUnavailableError)
    assert "give eosink a meta store it may write (metastore_url=)" in str(err)


_CORE: list[Case] = [
    Case(
        "plugin-broken",
        "broken",
        lambda c: {"path": str(c.out)},
        UnknownSinkError,
        re.escape(
            "Installed plugins that failed to load (the sink may be one of theirs): broken of "
            "eosink-broken 1.2.3 (ModuleNotFoundError: No module named "
            "'eosink_broken_no_such_module')."
        ),
        given=_broken_plugin,
        then=_other_sinks_listed,
    ),
    Case(
        "metastore-read-only",
        "file",
        lambda c: {
            "path": str(c.out),
            "metastore_url": f"sqlite:///file:{c.db}?mode=ro&uri=true",
            "metastore_retry_s": 60,
        },
        MetaStoreError,
        r"the database is read-only",
        given=_store_exists,
        then=_read_only_named_at_once,
    ),
]


# -- errors of the DataFrame's own tasks (tests/test_run.py, tests/test_sql.py before) -------
def _says_no(c: Ctx, frm: int = 0, to: int = 4) -> Any:
    """A DataFrame whose Python UDF raises on the row 2 (a user's function failing)."""
    from pyspark.sql.functions import udf

    @udf("string")
    def check(x):  # type: ignore[no-untyped-def]  # hints would make pyspark warn
        if x == 2:
            raise ValueError("user function says no to 2")
        return str(x)

    return c.spark.range(frm, to).select("id", check("id").alias("k"))


def _nothing_written(c: Ctx, _: EosinkError) -> None:
    assert [p for p in c.out.rglob("*") if p.is_file() and "_eosink" not in p.parts] == []
    assert staged_files(c.out) == []


def _nothing_visible_then_swept(c: Ctx, _: EosinkError) -> None:
    """format("eosink"): nothing visible, and the next write of the sink publishes exactly its
    own rows. Spark calls the writer's abort as soon as one task fails, and a task it killed
    may go on in its Python worker after the JVM counted it ended: what that straggler stages
    (under _eosink_staging/, which no reader looks at, never named by a committable) can land
    after the abort, even after the next write (CI saw both): it is never published; the
    staged data of an epoch that is not COMMITTED is deleted at the sink's next start
    (rule 4)."""
    visible = [
        p
        for p in c.out.rglob("*")
        if p.is_file() and not any(d.startswith("_eosink") for d in p.relative_to(c.out).parts)
    ]
    assert visible == []  # (a straggler's files under _eosink_staging/ are not visible)
    df = _partition_df("fine")(c).where("id != 2")
    w = df.write.format("eosink").option("sink", "file").option("path", str(c.out))
    w.option("partition_by", "k").option("metastore_url", c.metastore_url).mode("append").save()
    assert read_ids(c.out) == [1, 3, 4]  # the straggler's rows (3, 4 again) never published


def _written_without_the_row(c: Ctx, err: EosinkError) -> None:
    """Nothing of the failed epoch is left: the same epoch without the failing row is
    written (by the other writers)."""
    _nothing_written(c, err)
    ok = _says_no(c).where("id != 2")
    r = eosink.run(
        ok, sink="file", path=str(c.out), epoch=0, writer="python", metastore_url=c.metastore_url
    )
    assert isinstance(r, eosink.BatchResult) and r.rows == 3
    assert r.figures is not None and r.figures.writer == "python"
    assert read_ids(c.out) == [0, 1, 3]


def _pg_table(c: Ctx) -> None:
    from test_sql import _exec

    c.kept["table"] = f"v_{uuid.uuid4().hex[:8]}"
    _exec(c.fixture("pg_url"), f'CREATE TABLE "{c.kept["table"]}" (id INTEGER, v VARCHAR(3))')


def _pg_empty(c: Ctx, err: EosinkError) -> None:
    from test_sql import _rows

    assert _rows(c.fixture("pg_url"), c.kept["table"]) == []


_TASKS: list[Case] = [
    *(
        Case(
            f"run-user-function-raises-{writer}-writer",
            "file",
            lambda c, writer=writer: {"path": str(c.out), "epoch": 0, "writer": writer},
            SinkError,
            rf"sink file:\S+ epoch 0: writing failed in {where}: "
            r"ValueError: user function says no to 2$",
            df=_says_no,
            option_check=False,
            then=then,
        )
        for writer, where, then in [
            ("spark", "Spark's writer", _written_without_the_row),
            ("python", "a Spark task", _nothing_written),
        ]
    ),
    Case(
        "sql-value-the-column-cannot-hold",
        "sql",
        lambda c: {
            "url": c.fixture("pg_url"),
            "table": c.kept["table"],
            "staging_schema": f"eo_{uuid.uuid4().hex[:8]}",
            "epoch": 1,
        },
        SinkError,
        # the Arrow cast before binary COPY (ADBC), or PostgreSQL's own check (CSV)
        r"column 'id' .*not in range|out of range for type integer",
        df=lambda c: c.spark.createDataFrame([(3_000_000_000, "a")], "id long, v string"),
        option_check=False,
        needs=("pg_url",),
        given=_pg_table,
        then=_pg_empty,
    ),
]


# -- format("eosink") (tests/test_format_errors.py before) -----------------------------------
_BAD_CODEC = (
    "invalid options for sink 'file': compression: 'zzz' is not a codec for format='parquet'; "
    "use one of: "
)


def _notes(err: BaseException) -> list[str]:
    return list(getattr(err, "__notes__", []))


def _batch_note(c: Ctx, err: EosinkError) -> None:
    note = '(raised in Spark by format("eosink"), initialize writer: PYTHON_DATA_SOURCE_ERROR)'
    if sys.version_info >= (3, 11):  # exception notes
        assert _notes(err)[-1] == note
    assert not c.out.exists()


def _stream_note(c: Ctx, err: EosinkError) -> None:
    query = c.kept["query"]
    if sys.version_info >= (3, 11):  # exception notes
        assert _notes(err)[-1] == (
            f"(the streaming query id={query.id} runId={query.runId} stopped: STREAM_FAILED)"
        )
    assert not c.db.exists()


def _rate(c: Ctx) -> Any:
    return c.spark.readStream.format("rate").option("rowsPerSecond", 1).load()


def _says_no_stream(c: Ctx) -> Any:
    """A stream whose first micro-batch holds the row the UDF raises on."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql.functions import udf

    @udf("long")
    def check(x):  # type: ignore[no-untyped-def]  # hints would make pyspark warn
        if x == 2:
            raise ValueError("user function says no to 2")
        return x

    (c.tmp_path / "in").mkdir()
    pq.write_table(pa.table({"id": [0, 1, 2, 3]}), c.tmp_path / "in" / "part.parquet")
    source = c.spark.readStream.schema("id long").parquet(str(c.tmp_path / "in"))
    return source.select(check("id").alias("id"))


def _user_frames_shown(c: Ctx, err: EosinkError) -> None:
    """The UDF's frames are the error's traceback; nothing was committed."""
    import traceback

    shown = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    assert ', in check\n    raise ValueError("user function says no to 2")' in shown, shown
    _nothing_written(c, err)


_FORMAT: list[Case] = [
    Case(
        "format-batch-bad-option",
        "file",
        lambda c: {"path": str(c.out), "Compression": "zzz"},
        ConfigError,
        "^" + re.escape(_BAD_CODEC),
        df=lambda c: c.spark.range(3),
        front="write",
        then=_batch_note,
    ),
    Case(
        "format-stream-bad-option",
        "file",
        lambda c: {
            "path": str(c.out),
            "compression": "zzz",
            "checkpointLocation": str(c.tmp_path / "chk"),
        },
        ConfigError,
        "^" + re.escape(_BAD_CODEC),
        df=_rate,
        front="stream",
        option_check=False,  # the query starts (its jobs run in the query's job group)
        then=_stream_note,
    ),
    Case(
        "format-batch-user-function-raises",
        "file",
        lambda c: {"path": str(c.out)},
        SinkError,
        r'^format\("eosink"\): writing failed in a Spark task: '
        r"ValueError: user function says no to 2 ",
        df=_says_no,
        front="write",
        option_check=False,
        then=_user_frames_shown,
    ),
    Case(
        "format-stream-user-function-raises",
        "file",
        lambda c: {"path": str(c.out), "checkpointLocation": str(c.tmp_path / "chk")},
        SinkError,
        r'^format\("eosink"\) stream: writing failed in a Spark task: '
        r"ValueError: user function says no to 2 ",
        df=_says_no_stream,
        front="stream",
        option_check=False,
        then=_user_frames_shown,
    ),
]


# -- partition values both writers refuse (issue 38: items 3 and 4) --------------------------
def _partition_df(value: str) -> Callable[[Ctx], Any]:
    def df(c: Ctx) -> Any:
        rows = [(1, None), (2, value), (3, "ok"), (4, "")]
        return c.spark.createDataFrame(rows, "id long, k string")

    return df


_HIVE = "__HIVE_DEFAULT_PARTITION__"
_VALUES = {
    "hive-default-partition-name": (
        _HIVE,
        r"^partition_by column 'k' holds '__HIVE_DEFAULT_PARTITION__', the name of the "
        r"directory Hive and Spark write NULL \(and ''\) into: every reader would read these "
        r"rows back as NULL\. ",
    ),
    "nul-character": (
        "nul\x00x",
        r"^partition_by column 'k' holds 'nul\\x00x', a value with a NUL character, which no "
        r"directory name can hold ",
    ),
    # k= and 254 characters, '/' escaped as %2F: 2 + 127 * 4 = 510 bytes
    "directory-name-too-long": (
        "a/" * 127,
        r"^partition_by column 'k' holds 'a/a/[a/]+' \(the first 60 characters\), a value whose "
        r"directory name \(k=\.\.\.\) is 510 bytes once escaped, over the 255 bytes ",
    ),
}

_PARTITION_VALUES: list[Case] = [
    *(
        Case(
            f"file-partition-value-{name}-{fmt}-{writer}-writer",
            "file",
            lambda c, fmt=fmt, writer=writer: {
                "path": str(c.out),
                "format": fmt,
                "writer": writer,
                "partition_by": ["k"],
                "epoch": 0,
            },
            SchemaMismatchError,
            first,
            df=_partition_df(value),
            option_check=False,
            then=_nothing_written,
        )
        for name, (value, first) in _VALUES.items()
        # One format: Spark's writer gets the checked DataFrame whatever the format (JSON and
        # CSV failed as Parquet did).
        for fmt, writer in [("parquet", "spark"), ("parquet", "python")]
    ),
    Case(
        "format-partition-value-hive-default-partition-name",
        "file",
        lambda c: {"path": str(c.out), "partition_by": "k"},
        SchemaMismatchError,
        _VALUES["hive-default-partition-name"][1],
        df=_partition_df(_HIVE),
        front="write",
        option_check=False,
        then=_nothing_visible_then_swept,
    ),
]


# -- options that named nothing (issue 38: item 5) -------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _quick(c: Ctx, _: EosinkError) -> None:
    assert c.seconds < 30, c.seconds


def _quick_and_nothing_staged(c: Ctx, err: EosinkError) -> None:
    _quick(c, err)
    assert _kafka_staged(c) == []


_ENDPOINT = (
    r"s3_endpoint_url: not an S3 endpoint URL \(it does not start with http:// or https://\); "
    r"give the endpoint as http\(s\)://host\[:port\]"
)

_OPTIONS_NAMED: list[Case] = [
    Case(
        "file-hdfs-host-that-does-not-resolve",
        "file",
        {"path": "hdfs://nn.invalid/data/out", "epoch": 0},
        ConfigError,
        r"^the file sink's path 'hdfs://nn\.invalid/data/out' names the host 'nn\.invalid', "
        r"which does not resolve \(java\.net\.UnknownHostException\): check the host in path",
    ),
    Case(
        "file-s3-endpoint-not-a-url",
        "file",
        {"path": "s3://bucket/out", "s3_endpoint_url": "not a url", "epoch": 0},
        ConfigError,
        "^invalid options for sink 'file': " + _ENDPOINT,
    ),
    Case(
        "kafka-s3-staging-endpoint-not-a-url",
        "kafka",
        {
            "bootstrap_servers": "127.0.0.1:9",
            "topic": "t",
            "staging_path": "s3://bucket/staging",
            "s3_endpoint_url": "not a url",
        },
        ConfigError,
        "^invalid options for sink 'kafka': " + _ENDPOINT,
        df=lambda c: c.spark.range(3).selectExpr("cast(id as string) as value"),
    ),
    *(
        Case(
            f"kafka-topic-option-{name}",
            "kafka",
            {"bootstrap_servers": "127.0.0.1:9", "topic": topic},
            ConfigError,
            f"^invalid options for sink 'kafka': topic: {shown} is not a valid Kafka topic name "
            + re.escape(why),
            df=lambda c: c.spark.range(3).selectExpr("cast(id as string) as value"),
        )
        for name, topic, shown, why in [
            (
                "with-a-space",
                "bad topic!",
                "'bad topic!'",
                "(it has ' !'; Kafka allows ASCII letters, digits, '.', '_' and '-')",
            ),
            ("300-characters", "t" * 300, r"'t{40}'\.\.\. \(300 characters\)", "(at most 249"),
            ("dot-dot", "..", r"'\.\.'", "('.' and '..' are refused)"),
        ]
    ),
    Case(
        "kafka-topic-column-invalid-name",
        "kafka",
        lambda c: {
            "bootstrap_servers": c.fixture("kafka").bootstrap,
            "staging_path": str(c.tmp_path / "staging"),
        },
        SinkError,
        r"cannot be published: the topic column holds names Kafka refuses: 'bad topic!' is not "
        r"a valid Kafka topic name ",
        df=lambda c: _routed(c, [("k", "v", "bad topic!")]),
        option_check=False,
        needs=("kafka",),
        then=_quick_and_nothing_staged,
    ),
    Case(
        "iceberg-rest-catalog-uri-is-another-service",
        "iceberg",
        lambda c: {"table": TABLE, "catalog": {"type": "rest", "uri": c.fixture("s3_endpoint")}},
        ConfigError,
        r"^cannot open Iceberg catalog 'eosink' \(type 'rest', uri 'http://127\.0\.0\.1:\d+'\): "
        r"the server answered HTTP 404 Not Found to http://127\.0\.0\.1:\d+/v1/config, so there "
        r"is no Iceberg REST catalog at that URI\. Check catalog\['uri'\]",
        needs=("s3_endpoint",),
    ),
    Case(
        "iceberg-rest-catalog-unreachable",
        "iceberg",
        lambda c: {
            "table": TABLE,
            "catalog": {"type": "rest", "uri": f"http://127.0.0.1:{_free_port()}"},
        },
        SinkError,
        r"^cannot reach Iceberg catalog 'eosink' \(type 'rest', uri 'http://127\.0\.0\.1:\d+'\): "
        r"ConnectionError: .*Check catalog\['uri'\] and that the catalog is up",
        then=_quick,
    ),
]


CASES: list[Case] = [
    *_FILE_OPTIONS,
    *_RUN_ARGUMENTS,
    *_ICEBERG,
    *_KAFKA,
    *_CORE,
    *_TASKS,
    *_FORMAT,
    *_PARTITION_VALUES,
    *_OPTIONS_NAMED,
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(
    case: Case,
    spark: Any,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run_case(case, Ctx(spark, tmp_path, request, monkeypatch))


def test_case_ids_are_unique() -> None:
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


@pytest.mark.parametrize("writer", ["spark", "python"])
def test_partition_values_at_the_limit_and_empty_ones(
    spark: Any, tmp_path: Path, writer: str
) -> None:
    """Both writers write a directory name of exactly 255 bytes once escaped (the rule
    refuses 256); NULL and '' both go to k=__HIVE_DEFAULT_PARTITION__ and read back as NULL
    (docs/file-sink.md, "Partition values")."""
    at_limit = ["x" * 253, "%" * 84 + "x", "é" * 126 + "x"]  # "k=" + 253 bytes
    rows = [(i, v) for i, v in enumerate(at_limit)] + [(10, ""), (11, None)]
    df = spark.createDataFrame(rows, "id long, k string")
    out = tmp_path / "out"
    r = eosink.run(
        df,
        sink="file",
        path=str(out),
        partition_by=["k"],
        writer=writer,
        epoch=0,
        metastore_url=f"sqlite:///{tmp_path / 'm.db'}",
    )
    assert isinstance(r, eosink.BatchResult) and r.figures is not None
    assert r.figures.writer == writer
    names = sorted(p.name for p in out.iterdir() if p.name.startswith("k="))
    assert sorted(len(n.encode()) for n in names) == [28, 255, 255, 255]
    assert "k=__HIVE_DEFAULT_PARTITION__" in names
    back = {x.id: x.k for x in spark.read.parquet(str(out)).collect()}
    assert back == {0: at_limit[0], 1: at_limit[1], 2: at_limit[2], 10: None, 11: None}
