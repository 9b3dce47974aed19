"""format("eosink"): option keys back in the sink's spelling, eosink's errors seen as such."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import sinks_registered
from pydantic import AliasChoices, BaseModel, ConfigDict, Field

import eosink
from eosink import (
    ConfigError,
    MissingExtraError,
    SinkIdentityError,
    UnknownSinkError,
    _spark_version,
)
from eosink._datasource import _setup
from eosink._spark_errors import _EOSINK_STREAM, _eosink_error_in, _eosink_error_of


class _CapsOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str
    maxBytes: int = 0
    row_group: int = Field(default=0, alias="rowGroupSize")
    flushMs: int = Field(default=0, validation_alias=AliasChoices("flushMs", "flush_ms"))


class _AmbiguousOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str
    maxBytes: int = 0
    maxbytes: int = 0


@pytest.fixture
def caps_sinks() -> Iterator[None]:
    """Two sinks with capitalized option names, registered in this process."""
    base = eosink.get_sink("jsonl_dir")

    def sink(name: str, model: type[BaseModel]) -> eosink.SinkPlugin[Any, Any, Any]:
        return eosink.SinkPlugin(
            name=name,
            options_model=model,
            writer_factory=base.writer_factory,
            coordinator_factory=base.coordinator_factory,
            write_result_codec=base.write_result_codec,
            committable_codec=base.committable_codec,
            default_sink_id=lambda o: f"{name}:{o.path}",
        )

    with sinks_registered(
        "caps-provider", sink("caps", _CapsOptions), sink("ambiguous", _AmbiguousOptions)
    ):
        yield


def test_lowercased_keys_reach_the_declared_fields(caps_sinks: None, tmp_path: Path) -> None:
    # Spark hands the data source every key lowercased.
    raw = {"sink": "caps", "path": str(tmp_path), "maxbytes": "10", "rowgroupsize": "3"}
    s = _setup({**raw, "flush_ms": "7"}, None)
    assert (s.options.maxBytes, s.options.row_group, s.options.flushMs) == (10, 3, 7)
    assert _setup({**raw, "flushms": "8"}, None).options.flushMs == 8
    with pytest.raises(ConfigError) as exc:
        _setup({**raw, "maxbites": "1"}, None)
    assert "maxbites: unknown option;" in str(exc.value)
    assert "the options are: path, maxBytes, rowGroupSize, flushMs" in str(exc.value)


def test_a_key_matching_two_options_is_an_error(caps_sinks: None, tmp_path: Path) -> None:
    assert _setup({"sink": "ambiguous", "path": str(tmp_path)}, None).options.maxBytes == 0
    with pytest.raises(ConfigError) as exc:
        _setup({"sink": "ambiguous", "path": str(tmp_path), "maxbytes": "1"}, None)
    assert str(exc.value) == (
        "option 'maxbytes' of sink 'ambiguous' is ambiguous: Spark lowercases option keys, "
        "and it matches the options 'maxBytes', 'maxbytes'. format(\"eosink\") cannot tell "
        "them apart; use eosink.run() for this sink (see docs/errors.md#configerror)"
    )


_FRAME = '  File "/x/eosink/_datasource.py", line 1, in writer\n    s = _setup(opts)\n'


def test_the_eosink_error_at_the_end_of_a_worker_traceback() -> None:
    chained = (
        f"Traceback (most recent call last):\n{_FRAME}KeyError: 'x'\n\n"
        "The above exception was the direct cause of the following exception:\n\n"
        f"Traceback (most recent call last):\n{_FRAME}"
        "eosink.errors.SinkIdentityError: sink_id 'a' writes 'b'\nsecond line\n"
    )
    err = _eosink_error_in(chained)
    assert type(err) is SinkIdentityError and str(err) == (
        "sink_id 'a' writes 'b'\nsecond line (see docs/errors.md#sinkidentityerror)"
    )
    hidden = "eosink.errors.UnknownSinkError: unknown sink 'x'; installed sinks: a, b. Run ..."
    err = _eosink_error_in(hidden)  # spark.sql.execution.pyspark.udf.hideTraceback.enabled
    assert isinstance(err, UnknownSinkError) and (err.name, err.known) == ("x", ["a", "b"])
    missing = str(MissingExtraError("pyiceberg", "iceberg", "the iceberg sink"))
    err = _eosink_error_in(
        f"Traceback (most recent call last):\n{_FRAME}eosink.errors.MissingExtraError: {missing}\n"
    )
    assert isinstance(err, MissingExtraError) and isinstance(err, ConfigError)
    assert (err.name, err.extra, err.pip) == (
        "pyiceberg",
        "iceberg",
        "pip install 'eosink[iceberg]'",
    )
    for other in (
        f"Traceback (most recent call last):\n{_FRAME}ValueError: eosink.errors.ConfigError: x\n",
        f"Traceback (most recent call last):\n{_FRAME}builtins.ConfigError: no\n",
        f"Traceback (most recent call last):\n{_FRAME}os.path: not an exception\n",
        "",
    ):
        assert _eosink_error_in(other) is None


def test_a_tasks_error_is_told_apart_on_every_spark_line() -> None:
    """What Spark says of a Python error in a ``format("eosink")`` stream's task differs by
    line: pyspark 4.2 on gives the ``PythonException`` the condition ``PYTHON_EXCEPTION`` and
    names the sink in the failed stream's plan; 4.0 and 4.1 give it no condition and name a
    Python data source's table by its class, with the write's options. (The release
    matrix's first pyspark 4.1.4 run found both: the error came out as Spark's.) Pure: the
    texts are those pyspark 4.3.0 and 4.1.4 print."""

    class PythonException(Exception):  # pyspark 4.0/4.1's: no condition
        def getCondition(self) -> None:
            return None

    class UnknownException(Exception):
        def getCondition(self) -> None:
            return None

    assert _spark_version.condition(PythonException()) == "PYTHON_EXCEPTION"
    assert _spark_version.condition(UnknownException()) is None
    query = "15283e1d-7f20-4f50-8763-07f1da19f36e"
    table = "org.apache.spark.sql.execution.datasources.v2.python.PythonTable@5a199761"
    ours = [
        f"WriteToMicroBatchDataSource eosink, {query}, Append",  # 4.2 and later
        f"~WriteToMicroBatchDataSource {table}, {query}, [sink=file, path=/out], Append",
        f"~WriteToMicroBatchDataSource {table}, {query}, [path=/out, sink=kafka], Append",
    ]
    for plan in ours:
        assert _EOSINK_STREAM.search(f"terminated with exception: ...\n{plan}\n"), plan
    theirs = [
        f"~WriteToMicroBatchDataSource {table}, {query}, [path=/out], Append",
        f"~WriteToMicroBatchDataSource {table}, {query}, [path=/out, upsink=x], Append",
        f"WriteToMicroBatchDataSource parquet, {query}, Append",
    ]
    for plan in theirs:
        assert not _EOSINK_STREAM.search(f"...\n{plan}\n"), plan


# What a Spark Connect 4.1 client raises for a format("eosink") batch write with a bad option
# (the release matrix's 4.1.4 run, tests/test_connect.py::test_bad_options_write_nothing):
# the text only, the server's JVM stack trace appended, no message parameters.
_CONNECT_41 = (
    "[PYTHON_DATA_SOURCE_ERROR] Failed to initialize Python data source writer: Traceback "
    "(most recent call last):\n"
    '  File "/x/eosink/_datasource.py", line 341, in writer\n'
    "    s = _setup(dict(self.options), None, streaming=False, schema=arrow)\n"
    '  File "/x/eosink/sink.py", line 372, in parse_options\n'
    '    raise ConfigError(f"invalid options for sink {self.name!r}: {problems}") from None\n'
    "eosink.errors.ConfigError: invalid options for sink 'file': colour: unknown option; the "
    "options are: path, format (see docs/errors.md#configerror)\n"
    " SQLSTATE: 38000\n\n"
    "JVM stacktrace:\norg.apache.spark.sql.AnalysisException\n"
    "\tat org.apache.spark.sql.errors.QueryCompilationErrors$.pythonDataSourceError(Q.scala:2321)"
)


@pytest.mark.parametrize("spoken", [None, "PYTHON_DATA_SOURCE_ERROR"])
def test_a_connect_clients_data_source_error_is_eosinks(spoken: str | None) -> None:
    """A Spark Connect client's ``AnalysisException`` with no message parameters (pyspark
    4.1's), with or without its condition: the eosink error in its text, its message without
    the server's JVM stack trace. Pure: the text is the one pyspark 4.1.4's client gave."""

    class AnalysisException(Exception):
        def getCondition(self) -> str | None:
            return spoken

        def getMessageParameters(self) -> dict[str, str]:
            return {}

    err = _eosink_error_of(AnalysisException(_CONNECT_41))
    assert isinstance(err, ConfigError), err
    assert str(err).startswith("invalid options for sink 'file': colour: unknown option")
    assert str(err).endswith("(see docs/errors.md#configerror)"), str(err)
    # Not a pyspark exception, or another condition: unchanged.
    assert _eosink_error_of(Exception(_CONNECT_41)) is None
    if spoken is None:  # the condition is read from the text
        other = _CONNECT_41.replace("PYTHON_DATA_SOURCE_ERROR", "TABLE_OR_VIEW_NOT_FOUND")
        assert _eosink_error_of(AnalysisException(other)) is None


def test_other_spark_errors_pass_unchanged(spark: Any) -> None:
    from pyspark.errors import AnalysisException

    with pytest.raises(AnalysisException) as exc:
        spark.sql("select * from no_such_table_eosink").collect()
    assert not isinstance(exc.value, eosink.EosinkError)
    assert str(exc.value).startswith("[TABLE_OR_VIEW_NOT_FOUND]")
