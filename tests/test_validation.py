"""Options: their spellings, how option errors read (field, value, never a secret), column
names with dots, and the CLI on what is not a meta store.

The bad inputs given to a run (options, epochs, triggers...) are the rows of
tests/test_bad_inputs.py."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow.csv as pcsv
import pyarrow.dataset as ds
import pytest

import eosink
from eosink import ConfigError


def test_compression_spellings() -> None:
    sink = eosink.get_sink("file")
    assert sink.parse_options({"path": "/tmp", "compression": "ZSTD"}).compression == "zstd"
    assert sink.parse_options({"path": "/tmp", "compression": "uncompressed"}).compression == (
        "none"
    )
    assert sink.parse_options({"path": "/tmp", "format": "json"}).format == "json"
    opts = sink.parse_options({"path": "/tmp", "format": "csv", "compression": "none"})
    assert opts.compression == "none"


def _write(spark: Any, df: Any, out: Path, fmt: str, partition_by: list[str]) -> None:
    r = eosink.run(
        df,
        sink="file",
        path=str(out),
        format=fmt,
        partition_by=partition_by,
        metastore_url=f"sqlite:///{out.parent / (out.name + '.db')}",
    )
    assert isinstance(r, eosink.BatchResult) and r.rows == 4


def _rows(out: Path, fmt: str) -> list[dict[str, Any]]:
    files = sorted(
        p
        for p in out.rglob("*")
        if p.is_file() and not any(x[:1] in "_." for x in p.relative_to(out).parts)
    )
    rows: list[dict[str, Any]] = []
    for p in files:
        part = {seg.split("=", 1)[0]: seg.split("=", 1)[1] for seg in p.relative_to(out).parts[:-1]}
        if fmt == "json":
            data = [json.loads(line) for line in p.read_text().splitlines()]
        elif fmt == "csv":
            data = pcsv.read_csv(p).to_pylist()
        else:
            data = ds.dataset(p, format="parquet").to_table().to_pylist()
        rows += [{**d, **part} for d in data]
    return sorted(rows, key=lambda r: r["a.b"])


@pytest.mark.parametrize("fmt", ["parquet", "json", "csv"])
def test_column_names_with_dots(spark: Any, tmp_path: Path, fmt: str) -> None:
    df = spark.range(4).selectExpr("id as `a.b`", "cast(id % 2 as string) as `k.x`")
    _write(spark, df, tmp_path / "flat", fmt, [])
    assert _rows(tmp_path / "flat", fmt) == [
        {"a.b": i, "k.x": i % 2 if fmt == "csv" else str(i % 2)} for i in range(4)
    ]
    _write(spark, df, tmp_path / "parts", fmt, ["k.x"])
    assert sorted(p.name for p in (tmp_path / "parts").iterdir() if "=" in p.name) == [
        "k.x=0",
        "k.x=1",
    ]
    assert _rows(tmp_path / "parts", fmt) == [{"a.b": i, "k.x": str(i % 2)} for i in range(4)]
    back = spark.read.format(fmt)
    if fmt == "csv":
        back = back.option("header", "true").option("escape", '"')
    back = back.schema("`a.b` long, `k.x` string")  # partition values are strings
    got = sorted((r["a.b"], r["k.x"]) for r in back.load(str(tmp_path / "parts")).collect())
    assert got == [(i, str(i % 2)) for i in range(4)]


# -- eosink status / eosink db current on something that is not a meta store ---------------
def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    from eosink._cli import main

    rc = main(list(args))
    out = capsys.readouterr()
    return rc, out.out + out.err


def _one_error_line(rc: int, out: str) -> str:
    assert rc != 0
    lines = out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("eosink: error: "), out
    assert "Traceback" not in out
    return lines[0]


@pytest.mark.parametrize("cmd", [["status", "--metastore-url"], ["db", "current", "--url"]])
def test_cli_on_a_missing_sqlite_file_creates_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, cmd: list[str]
) -> None:
    db = tmp_path / "sub" / "metastore.db"
    line = _one_error_line(*_cli(capsys, *cmd, f"sqlite:///{db}"))
    assert f"there is no eosink meta store at {db}" in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("cmd", [["status", "--metastore-url"], ["db", "current", "--url"]])
@pytest.mark.parametrize("content", ["random", "header"])
def test_cli_on_a_corrupt_sqlite_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, cmd: list[str], content: str
) -> None:
    db = tmp_path / "metastore.db"
    body = os.urandom(5000) if content == "random" else b"SQLite format 3\0" + b"\x07" * 4000
    db.write_bytes(body)
    line = _one_error_line(*_cli(capsys, *cmd, f"sqlite:///{db}"))
    assert f"sqlite:///{db} is not an eosink meta store: " in line
    assert db.read_bytes() == body
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metastore.db"]


def test_status_on_another_applications_sqlite_database(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import sqlite3

    db = tmp_path / "app.db"
    con = sqlite3.connect(db)
    con.execute("create table users (name text)")
    con.commit()
    con.close()
    body = db.read_bytes()
    line = _one_error_line(*_cli(capsys, "status", "--metastore-url", f"sqlite:///{db}"))
    assert "is not an eosink meta store: it has no pending_sink_state table" in line
    assert "users" in line
    assert db.read_bytes() == body  # not even switched to WAL mode
    (tmp_path / "empty.db").write_bytes(b"")
    line = _one_error_line(
        *_cli(capsys, "status", "--metastore-url", f"sqlite:///{tmp_path / 'empty.db'}")
    )
    assert "is not an eosink meta store: the database is empty" in line
    assert "eosink db upgrade" in line


@pytest.mark.parametrize(
    "url",
    [
        "nonsense://",
        "postgresql://a:hunter2@:x/",
        "notaurl",
        "postgresql://u:hunter2@127.0.0.1:1/x",
    ],
)
@pytest.mark.parametrize("cmd", [["status", "--metastore-url"], ["db", "current", "--url"]])
def test_cli_on_a_bad_url(capsys: pytest.CaptureFixture[str], cmd: list[str], url: str) -> None:
    line = _one_error_line(*_cli(capsys, *cmd, url))
    assert "hunter2" not in line
    assert "meta store" in line


def test_db_upgrade_creates_a_store_that_status_reads(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'new' / 'metastore.db'}"
    rc, out = _cli(capsys, "db", "upgrade", "--url", url)
    assert rc == 0 and "schema (empty) -> " in out
    rc, out = _cli(capsys, "status", "--metastore-url", url)
    assert rc == 0 and "no sinks recorded yet" in out


# --- option errors: field, value given (secrets never), what is allowed; no pydantic text ---
_PYDANTIC_BOILERPLATE = ("Value error,", "errors.pydantic.dev", "For further information")


def _option_error(sink: Any, options: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as exc:
        sink.parse_options(options)
    text = str(exc.value)
    for boilerplate in _PYDANTIC_BOILERPLATE:
        assert boilerplate not in text, text
    # Every message ends with its docs/errors.md entry (test_docs checks it): the rest here.
    return text.removesuffix(" (see docs/errors.md#configerror)")


def test_option_errors_say_field_value_and_what_is_allowed(tmp_path: Path) -> None:
    sink = eosink.get_sink("file")
    path = str(tmp_path / "out")
    assert _option_error(sink, {"path": path, "format": "xml"}) == (
        "invalid options for sink 'file': "
        "format: input should be 'parquet', 'orc', 'json', 'csv' or 'text' (given: 'xml')"
    )
    text = _option_error(sink, {"path": path, "fsync": "maybe", "colour": "red"})
    assert "fsync: input should be a valid boolean" in text and "(given: 'maybe')" in text
    # An unknown key's value is never shown: a misspelt credential key is still a credential.
    assert "colour: unknown option;" in text and "red" not in text
    assert (
        "the options are: path, format, partition_by, compression, writer, format_options, fsync"
        in text
    )
    assert _option_error(sink, {"format": "json"}) == (
        "invalid options for sink 'file': path: required, not given"
    )
    # A validator's own message already shows the value: it is not repeated.
    text = _option_error(sink, {"path": path, "compression": "zzz"})
    assert text.count("'zzz'") == 1
    assert "compression: 'zzz' is not a codec for format='parquet'" in text
    # A model validator (no single field) keeps its message.
    text = _option_error(sink, {"path": path, "writer": "python", "format_options": {"a": "b"}})
    assert text.endswith(
        ": format_options are options of Spark's writers; writer='python' does not use "
        "them (drop them, or use writer='auto')"
    )


def test_option_errors_never_show_secrets() -> None:
    from pydantic import BaseModel, ConfigDict, Field, SecretStr

    from eosink import JsonCodec, SinkPlugin

    class Auth(BaseModel):
        user: str
        pin: SecretStr = Field(min_length=6)

    class Options(BaseModel):
        model_config = ConfigDict(extra="forbid")
        url: str = Field(pattern=r"^https://")
        token: SecretStr = Field(min_length=20)
        password: int = 0
        conn: dict[str, str] = Field(default_factory=dict, repr=False)
        props: dict[str, int] = Field(default_factory=dict)
        auth: Auth | None = None

    sink: SinkPlugin[Any, Any, Any] = SinkPlugin(
        name="secretive",
        options_model=Options,
        writer_factory=lambda o, c: None,  # type: ignore[arg-type,return-value]
        coordinator_factory=lambda o, s: None,  # type: ignore[arg-type,return-value]
        write_result_codec=JsonCodec(),
        committable_codec=JsonCodec(),
        default_sink_id=lambda o: "x",
    )
    text = _option_error(
        sink,
        {
            "url": "ftp://alice:hunter2-url@host/x",  # a URL with a password: masked
            "token": "tok-hunter2",  # SecretStr
            "password": "hunter2-pw",  # named like a credential
            "conn": "s3.secret=hunter2-conn",  # repr=False: the whole value is hidden
            "props": {"api_key": "hunter2-key", "n": "x"},  # credential-named key
            "auth": {"user": "bob", "pin": "hunter2"[:5]},  # a nested SecretStr
            "private_key": "hunter2-extra",  # an unknown option named like a credential
        },
    )
    assert "hunter" not in text, text
    for field in (
        "url:",
        "token:",
        "password:",
        "conn:",
        "props.api_key:",
        "props.n:",
        "auth.pin:",
        "private_key: unknown option",
    ):
        assert field in text, (field, text)
    assert "ftp://alice:***@host/x" in text  # the rest of a URL is shown
    assert "props.n: input should be a valid integer" in text and "(given: 'x')" in text
    assert "token: value should have at least 20 items" in text
    # token password conn api_key pin; the unknown key's value is not shown at all
    assert text.count("(given: *** (hidden))") == 5


def test_iceberg_catalog_secrets_never_shown() -> None:
    sink = eosink.get_sink("iceberg")
    text = _option_error(
        sink, {"table": "db.t", "catalog": {"uri": "sqlite://", "s3.secret-access-key": 7}}
    )
    assert "catalog.s3.secret-access-key: input should be a valid string" in text
    assert "(given: *** (hidden))" in text
    text = _option_error(sink, {"table": "db.t", "catalog": "s3.secret-access-key=hunter2"})
    assert "hunter2" not in text and "catalog:" in text


def test_epoch_spellings() -> None:
    from eosink._setup import MAX_EPOCH, check_epoch

    assert [check_epoch(v) for v in (None, 0, 7, "12", " 3 ", MAX_EPOCH)] == [
        None,
        0,
        7,
        12,
        3,
        MAX_EPOCH,
    ]


def test_trigger_spellings() -> None:
    from eosink._run import _trigger

    assert _trigger("5 seconds") == {"processingTime": "5 seconds"}
    assert _trigger("1 minute 30 seconds") == {"processingTime": "1 minute 30 seconds"}
    assert _trigger({"processingTime": "interval 2 hours"}) == {
        "processingTime": "interval 2 hours"
    }
    assert _trigger("availableNow") == {"availableNow": True}
    assert _trigger("once") == {"once": True}


def test_spark_session_refuses_a_connect_url_as_master() -> None:
    with pytest.raises(ConfigError, match=r"remote='sc://h:15002'"):
        eosink.spark_session(master="sc://h:15002")
    with pytest.raises(ConfigError, match="drop master="):
        eosink.spark_session(master="local[1]", remote="sc://h:15002")


def test_one_redaction_helper_for_core_and_plugins() -> None:
    """eosink.util.redact (pure logic): values of credential-named settings, passwords of
    URLs among the settings (as written and percent-decoded) and of URLs in the text. The
    kafka and iceberg sinks redact through it; names like ``keys`` or ``order_by``
    are not taken for credentials, ``key``, ``ssl.key.pem`` and ``s3.access-key-id`` are."""
    from eosink_iceberg.options import IcebergSinkOptions
    from eosink_iceberg.options import redact as iceberg_redact
    from eosink_kafka.options import KafkaSinkOptions
    from eosink_kafka.options import redact as kafka_redact

    from eosink.util import is_secret_name, redact

    for name in (
        "password",
        "sasl.password",
        "s3.secret-access-key",
        "s3.access-key-id",
        "token",
        "key",
        "ssl.key.pem",
        "api_key",
        "sasl.jaas.config",
        "credential",
    ):
        assert is_secret_name(name), name
    for name in ("keys", "path", "topic", "compression.type", "bootstrap_servers", "order_by"):
        assert not is_secret_name(name), name
    settings = {"sasl.password": "hunter22", "uri": "postgresql://u:p%40ss@db/x", "abc": "lz4"}
    text = "auth failed for hunter22 at postgresql://u:p%40ss@db/x (p@ss) with lz4"
    out = redact(text, settings)
    assert "hunter22" not in out and "p%40ss" not in out and "p@ss" not in out
    assert "lz4" in out and "postgresql://u:***@db/x" in out
    assert redact("see https://me:topsecret@host/p") == "see https://me:***@host/p"
    k = KafkaSinkOptions(
        bootstrap_servers="b:9092", topic="t", producer_config={"sasl.password": "hunter22"}
    )
    assert kafka_redact("no hunter22 here", k) == "no *** here"
    i = IcebergSinkOptions(
        table="db.t",
        catalog={"type": "sql", "uri": "postgresql://u:pw1234@h/x", "token": "tok-en-1"},
    )
    assert iceberg_redact("pw1234 tok-en-1", i) == "*** ***"
