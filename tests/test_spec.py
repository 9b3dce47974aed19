"""The epoch spec (docs/plugins.md, "The epoch spec"): the core persists how each epoch was
staged (its schema and the sink's options, never a secret) with its committable, and hands it
back to ``commit`` and ``abort`` of a sink that declares ``Capabilities(epoch_spec=True)``, so
that a PENDING epoch is committed the way it was staged, whatever options its recovery run is
given. Spark-less: eosink's own task code drives the writers (tests/test_sql.py runs the same
through ``eosink.run``)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pydantic import BaseModel, Field, SecretBytes, SecretStr

import eosink
from eosink._journal import Entry, Journal
from eosink._spec import EpochSpec, persisted_options


class _Auth(BaseModel):
    user: str = "etl"
    password: SecretStr = SecretStr("nested-secret")


class _Options(BaseModel):
    table: str = "t"
    keys: list[str] = Field(default_factory=lambda: ["id"])
    key_column: str = "k"  # named like a credential, declared a plain str: kept
    token: SecretStr = SecretStr("top-secret")
    blob: SecretBytes = SecretBytes(b"bytes-secret")
    hidden: str = Field(default="repr-false-secret", repr=False)
    auth: _Auth = Field(default_factory=_Auth)
    properties: dict[str, str] = Field(
        default_factory=lambda: {"sasl.password": "dict-secret", "linger.ms": "5"}
    )
    endpoints: list[str] = Field(
        default_factory=lambda: ["http://u:url-secret@host:1/", "http://host:2/"]
    )
    maybe: SecretStr | None = SecretStr("optional-secret")


def test_what_the_spec_keeps_and_what_it_never_persists() -> None:
    """Declared secrets (SecretStr, SecretBytes, optional ones, nested ones, ``repr=False``),
    credential-named keys of a free-form mapping and URLs with a password are left out;
    everything else is kept as the options model's JSON form."""
    kept = persisted_options(_Options())
    assert kept == {
        "table": "t",
        "keys": ["id"],
        "key_column": "k",
        "auth": {"user": "etl"},
        "properties": {"linger.ms": "5"},
        "endpoints": ["http://host:2/"],
    }
    plain = {"table": "t", "password": "plain-secret", "at": Path("/data"), "n": 1}
    assert persisted_options(plain) == {"table": "t", "at": "/data", "n": 1}
    text = EpochSpec(kept, pa.schema([("id", pa.int64())])).encode()
    for secret in ("secret", "sasl.password", "password"):
        assert secret not in text


def test_the_spec_round_trips_and_a_newer_one_is_refused() -> None:
    schema = pa.schema([("id", pa.int64()), ("v", pa.string()), ("at", pa.timestamp("us", "UTC"))])
    spec = EpochSpec({"mode": "upsert", "keys": ["id"]}, schema)
    back = EpochSpec.decode(spec.encode())
    assert back.options == spec.options and back.schema is not None
    assert back.schema.equals(schema)
    assert EpochSpec.decode(EpochSpec({"a": 1}).encode()).schema is None
    newer = json.dumps({"v": 2, "options": {}, "schema": None})
    with pytest.raises(eosink.SchemaOutdatedError, match="epoch 3 was staged by a newer eosink"):
        EpochSpec.decode(newer, "epoch 3")


class _NoSpec:
    def commit(self, epoch: int, committable: Any) -> None: ...

    def abort(self, epoch: int, committable: Any) -> None: ...


class _WithSpec:
    def commit(self, epoch: int, committable: Any, spec: Any = None) -> None: ...

    def abort(self, epoch: int, committable: Any, spec: Any = None) -> None: ...


def test_a_declared_epoch_spec_is_checked_against_the_coordinator() -> None:
    """``epoch_spec=True`` promises ``commit`` and ``abort`` take ``spec``: a coordinator
    whose methods do not is refused with what to define, before any epoch."""
    caps = eosink.Capabilities(epoch_spec=True)
    with pytest.raises(eosink.ConfigError, match=r"define commit\(self, epoch, committable"):
        caps.check(_NoSpec(), "mine")
    caps.check(_WithSpec(), "mine")
    assert eosink.Capabilities.implemented_by(_WithSpec()).epoch_spec
    assert not eosink.Capabilities.implemented_by(_NoSpec()).epoch_spec


def test_a_journal_entry_carries_the_spec(tmp_path: Path) -> None:
    """A driver on another machine finishes an epoch from the journal alone: the entry keeps
    the spec; an entry written before specs existed reads back without one."""
    from eosink._checkpoint import CheckpointDir

    journal = Journal(CheckpointDir(None, str(tmp_path)), "s", prefix="")
    base = dict(
        generation=1,
        committable=b"{}",
        codec_version=1,
        rows=1,
        files=1,
        bytes=1,
        batch_end_at=0.0,
        pre_commit_ms=0.0,
        origin="batch",
    )
    text = EpochSpec({"mode": "append"}).encode()
    journal.record(Entry(epoch=1, spec=text, **base))  # type: ignore[arg-type]
    journal.record(Entry(epoch=2, **base))  # type: ignore[arg-type]
    entries = journal.entries()
    assert entries[1].spec == text and entries[2].spec is None
    (old,) = [p for p in tmp_path.rglob("*.json") if p.name.startswith("000000000002.")]
    assert "spec" not in json.loads(old.read_text())  # as an older eosink wrote it


def _sql_epoch(
    store: str, url: str, epoch: int, rows: list[tuple[int, str]], *, commit: bool, **opts: Any
) -> None:
    """One batch epoch of the sql sink (``commit=False``: the driver dies after PENDING)."""
    from eosink._setup import open_runtime, prepare_sink
    from eosink.testing import drive_writers

    schema = pa.schema([("id", pa.int64()), ("v", pa.string())])
    setup = prepare_sink(
        "sql", {"url": url, "table": "t", **opts}, streaming=False, metastore_url=store
    )
    rt = open_runtime(setup)
    try:
        ep = rt.batch_epoch(epoch)
        batch = pa.record_batch(
            [pa.array([r[0] for r in rows]), pa.array([r[1] for r in rows])], schema=schema
        )
        results = drive_writers(
            rt.plugin, rt.options, rt.sink_id, epoch, [[batch]], ep.setup(schema)
        )
        ep.prepare(results, len(rows), 0.0)
        if commit:
            ep.commit()
    finally:
        rt.close()
        rt.store.close()


def test_a_pending_epoch_is_committed_with_the_spec_it_was_staged_with(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An upsert epoch left PENDING (its run died), then a run of the same sink as an append:
    its recovery commits epoch 1 as the upsert it was staged as (the spec the core persisted,
    not this run's options), then appends epoch 2. The stored spec has the options without the
    database URL (a ``SecretStr``: it may hold a password) and the staged schema; ``eosink
    status --json`` shows it (``staged_with``)."""
    from harness import status_json

    url = f"sqlite:///{tmp_path / 'target.db'}"
    store = f"sqlite:///{tmp_path / 'meta.db'}"
    con = sqlite3.connect(tmp_path / "target.db")
    con.execute('CREATE TABLE "t" (id BIGINT PRIMARY KEY, v TEXT)')
    con.execute("INSERT INTO t VALUES (1, 'old')")
    con.commit()
    con.close()
    _sql_epoch(store, url, 1, [(1, "a"), (2, "b")], commit=False, mode="upsert", keys=["id"])
    meta = sqlite3.connect(tmp_path / "meta.db")
    status, stored = meta.execute(
        "SELECT status, spec FROM pending_sink_state WHERE epoch = 1"
    ).fetchone()
    meta.close()
    assert status == "PENDING"
    spec = EpochSpec.decode(stored)
    assert spec.options["mode"] == "upsert" and spec.options["keys"] == ["id"]
    assert spec.options["table"] == "t" and "url" not in spec.options
    assert "target.db" not in stored
    assert spec.schema is not None and spec.schema.names == ["id", "v"]
    [pending] = status_json(store, capsys)["pending"]
    shown = pending["staged_with"]
    assert shown["options"]["mode"] == "upsert" and "url" not in shown["options"]
    assert shown["schema"] == ["id: int64", "v: string"]
    _sql_epoch(store, url, 2, [(3, "c")], commit=True)  # mode append (the default)
    con = sqlite3.connect(tmp_path / "target.db")
    assert con.execute("SELECT id, v FROM t ORDER BY id").fetchall() == [
        (1, "a"),
        (2, "b"),
        (3, "c"),
    ]
    con.close()


class _Opaque:
    """A value JSON cannot hold (an options model with ``arbitrary_types_allowed``)."""


class _OpaqueOptions(BaseModel):
    model_config = {"arbitrary_types_allowed": True}
    path: str = "/data"
    handle: _Opaque = Field(default_factory=_Opaque)


def test_options_that_cannot_be_persisted(caplog: pytest.LogCaptureFixture) -> None:
    """A sink that does not read the spec is never failed by it: options JSON cannot hold
    leave the spec with the schema only (and a warning); a sink that declares
    ``epoch_spec`` is refused in phase 1, before anything is persisted, naming the cause."""
    from types import SimpleNamespace

    from eosink._protocol import SinkRuntime

    schema = pa.schema([("id", pa.int64())])

    def runtime(epoch_spec: bool) -> Any:
        return SimpleNamespace(
            options=_OpaqueOptions(),
            caps=eosink.Capabilities(epoch_spec=epoch_spec),
            sink_id="s",
            plugin=SimpleNamespace(name="opaque"),
            _spec=None,
        )

    spec, text = SinkRuntime.epoch_spec(runtime(False), schema)  # type: ignore[arg-type]
    assert spec.options == {} and spec.schema is not None and "cannot be persisted" in caplog.text
    assert EpochSpec.decode(text).schema == schema
    with pytest.raises(eosink.ConfigError, match="declares epoch_spec, but its options cannot"):
        SinkRuntime.epoch_spec(runtime(True), schema)  # type: ignore[arg-type]
