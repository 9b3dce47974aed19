"""``eosink retire`` (issue 44): a decommissioned sink leaves nothing of eosink's behind, and a
later run under the same sink_id writes its rows, exactly once, above the retired epochs.

Each built-in sink is run for real (Spark writes; the SQL target is SQLite, Kafka a real
broker, Iceberg a SQL catalog), retired through the CLI as an operator would, and run again
on the same meta store and on a fresh one (a driver on another machine): an independent
reader checks every row, once. The Iceberg and Kafka cases are the ones a naive retirement
loses: their targets keep the retired sink's epochs (snapshot summaries, control-topic
markers) and a run starting again at epoch 0 would be skipped as "already committed".
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from harness import epoch_states, read_ids, read_topic

import eosink
from eosink import NewCheckpointError, SinkIdentityError
from eosink._cli import main as cli


def _status(capsys: pytest.CaptureFixture[str], url: str, sink_id: str) -> dict[str, Any]:
    capsys.readouterr()
    assert cli(["status", "--metastore-url", url, "--sink-id", sink_id, "--json"]) == 0
    [s] = json.loads(capsys.readouterr().out)
    return s


class _Sink:
    """One built-in sink as the scenario drives it: its options, its rows, its reader."""

    def __init__(
        self,
        name: str,
        opts: dict[str, Any],
        frame: Callable[[Any, int, int], Any],
        read: Callable[[], list[int]],
        own: str | None,
    ) -> None:
        self.name, self.opts, self.frame, self.read, self.own = name, opts, frame, read, own


def _ids(spark: Any, lo: int, hi: int) -> Any:
    return spark.range(lo, hi)


def _file(tmp_path: Path) -> _Sink:
    out = tmp_path / "out"
    return _Sink("file", {"path": str(out)}, _ids, lambda: read_ids(out), None)


def _sql(tmp_path: Path) -> _Sink:
    db = tmp_path / "target.db"
    table = f"t_{uuid.uuid4().hex[:8]}"

    def read() -> list[int]:
        con = sqlite3.connect(db)
        try:
            return sorted(r[0] for r in con.execute(f'SELECT id FROM "{table}"'))
        finally:
            con.close()

    opts = {"url": f"sqlite:///{db}", "table": table, "create_table": True}
    return _Sink("sql", opts, _ids, read, "sql_epochs")


def _iceberg(tmp_path: Path) -> _Sink:
    opts = {"table": "db.events", "warehouse": str(tmp_path / "wh")}

    def read() -> list[int]:
        from pyiceberg.catalog import load_catalog

        o = eosink.get_sink("iceberg").parse_options(opts)
        table = load_catalog(o.catalog_name, **o.catalog_properties()).load_table("db.events")
        return sorted(table.scan().to_arrow().column("id").to_pylist())

    return _Sink("iceberg", opts, _ids, read, None)


def _delta(tmp_path: Path) -> _Sink:
    opts = {"path": str(tmp_path / "table")}

    def read() -> list[int]:
        from test_delta import delta_rows

        return sorted(r["id"] for r in delta_rows(eosink.get_sink("delta").parse_options(opts)))

    return _Sink("delta", opts, _ids, read, None)


def _kafka(tmp_path: Path, kafka: Any) -> _Sink:
    topic = f"retire-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, partitions=2)

    def frame(spark: Any, lo: int, hi: int) -> Any:
        return spark.range(lo, hi).selectExpr(
            "cast(id % 4 as string) as key",
            "cast(to_json(named_struct('id', id)) as binary) as value",
        )

    def read() -> list[int]:
        records = read_topic(kafka.bootstrap, topic)
        return sorted(json.loads(r.value or b"")["id"] for r in records)

    opts = {
        "bootstrap_servers": kafka.bootstrap,
        "topic": topic,
        "staging_path": str(tmp_path / "staging"),
        "transactions": 2,
    }
    return _Sink("kafka", opts, frame, read, "marker record(s)")


@pytest.mark.parametrize("name", ["file", "sql", "iceberg", "kafka", "delta"])
def test_retire_then_run_again_every_builtin_sink(
    name: str, spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], request: Any
) -> None:
    """Two batch epochs; ``retire --dry-run`` lists and changes nothing; ``retire`` removes
    the meta-store rows, the journal and the sink's own records and says where later runs
    start; the retired epochs are refused to a batch run (not skipped); a run on the same
    meta store and one on a fresh store (the retirement read from the target's marker) write
    their rows above them: every row exactly once."""
    sink = (
        _kafka(tmp_path, request.getfixturevalue("kafka"))
        if name == "kafka"
        else {"file": _file, "sql": _sql, "iceberg": _iceberg, "delta": _delta}[name](tmp_path)
    )
    url = f"sqlite:///{tmp_path / 'm.db'}"

    def run(lo: int, hi: int, store: str = url, **kw: Any) -> eosink.BatchResult:
        r = eosink.run(
            sink.frame(spark, lo, hi), sink=sink.name, metastore_url=store, **sink.opts, **kw
        )
        assert isinstance(r, eosink.BatchResult)
        return r

    assert run(0, 10, epoch=0).committed
    r = run(10, 20)
    assert r.epoch == 1 and r.committed
    sid = r.sink_id
    full = ["retire", "--sink", name, "--metastore-url", url]
    full += ["--options-json", json.dumps(sink.opts)]
    # As `eosink status` shows it: the name and options come from the meta store (the newest
    # epoch's spec), but for secrets (the sql sink's url), given on the command line.
    args = ["retire", sid, "--metastore-url", url]
    if name == "sql":
        args += ["--option", f"url={sink.opts['url']}"]

    capsys.readouterr()
    assert cli([*args, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would remove" in out and "2 COMMITTED" in out, out
    if sink.own:
        assert sink.own in out, out
    assert epoch_states(url, sid) == {"COMMITTED": [0, 1]}  # nothing changed

    assert cli(args) == 0
    out = capsys.readouterr().out
    assert f"retired sink {sid!r} with epochs up to 1" in out and "above 1" in out, out
    assert epoch_states(url, sid) == {}
    s = _status(capsys, url, sid)
    assert s["retired"]["high"] == 1 and s["retired"]["by"], s
    assert cli(["status", "--metastore-url", url, "--sink-id", sid]) == 0
    assert "retired by `eosink retire` at " in capsys.readouterr().out
    if name == "file":  # the status page says it too
        assert cli(["status", "--metastore-url", url, "--html", str(tmp_path / "p.html")]) == 0
        [page] = list(tmp_path.glob("p*.html"))
        assert "with epochs up to 1 (later runs write above them)" in page.read_text()
    # Retired again: nothing of its own is left (the sink's records went the first time).
    # The store has no epoch to take the options from now: the command asks for them.
    assert cli([*args, "--dry-run"]) == 2
    why = "table: required, not given" if name == "sql" else "give them as the job gives them"
    assert why in capsys.readouterr().err
    assert cli([*full, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "(retired before, at " in out and "epoch records" not in out, out
    if sink.own:
        assert sink.own not in out, out
    if name == "file":
        assert not any((tmp_path / "out" / "_eosink" / "journal").rglob("*.*")), "journal left"

    # The retired epochs are not free: refused, never skipped nor written again, also by a
    # driver on another machine (a fresh meta store learns the retirement from the target).
    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    with pytest.raises(SinkIdentityError, match="retired by `eosink retire`"):
        run(0, 10, fresh, epoch=0)
    with pytest.raises(SinkIdentityError, match="retired by `eosink retire`"):
        run(0, 10, epoch=1)
    r = run(20, 30)
    assert r.epoch == 2 and r.committed and not r.skipped and r.rows == 10
    # Another machine again, after that run: a run there writes above every epoch.
    other = f"sqlite:///{tmp_path / 'other.db'}"
    with pytest.raises(SinkIdentityError, match="retired by `eosink retire`"):
        run(0, 10, other, epoch=1)
    r = run(30, 40, other, epoch=3)
    assert r.committed and not r.skipped and r.rows == 10
    assert _status(capsys, other, sid)["retired"]["high"] == 1
    assert sink.read() == list(range(40))


def test_retire_refuses_a_pending_epoch_and_a_running_job(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A PENDING epoch (complete rows, not published) is never retired away: the command
    names ``recover`` and ``abandon``; an unknown sink_id is refused, and a dry run of
    another target (the wrong options) as a retirement would be; nothing changes. An epoch
    the operator abandoned then counts as the retired sink's: its number is not reused,
    and its loss is kept on record."""
    from eosink.faults import SimulatedCrash, simulate

    out, url = tmp_path / "out", f"sqlite:///{tmp_path / 'm.db'}"
    with simulate("after_persist") as fired, pytest.raises(SimulatedCrash):
        eosink.run(spark.range(0, 10), sink="file", path=str(out), epoch=4, metastore_url=url)
    assert fired[0] == 1
    sid = f"file:{out}"
    args = ["retire", "--sink", "file", "--metastore-url", url, "--option", f"path={out}"]
    capsys.readouterr()
    assert cli(args) == 2
    err = capsys.readouterr().err
    assert "PENDING epoch(s) [4]" in err and "eosink recover" in err and "abandon" in err, err
    assert epoch_states(url, sid) == {"PENDING": [4]}
    assert cli([*args, "--sink-id", "file:nosuch"]) == 1
    assert "has no sink 'file:nosuch'" in capsys.readouterr().err
    # Given up by the operator; then the sink retires, its loss on record.
    abandon = ["abandon", "--metastore-url", url, "--sink-id", sid, "--epoch", "4"]
    assert cli([*abandon, "--reason", "test", "--accept-data-loss"]) == 0
    wrong = ["retire", sid, "--metastore-url", url, "--option", f"path={tmp_path / 'other'}"]
    assert cli([*wrong, "--dry-run"]) == 2
    assert f"is bound to {sid}" in capsys.readouterr().err
    assert epoch_states(url, sid) == {"ABORTED": [4]}
    assert (
        cli(["recover", "--sink", "file", "--metastore-url", url, "--option", f"path={out}"]) == 0
    )
    assert epoch_states(url, sid) == {}  # the abort finished: only the loss knows epoch 4
    assert cli(args) == 0
    said = capsys.readouterr().out
    assert "with epochs up to 4" in said and "1 known loss(es) (epochs [4])" in said, said
    assert epoch_states(url, sid) == {}
    assert [x["epoch"] for x in _status(capsys, url, sid)["losses"]] == [4]
    r = eosink.run(spark.range(10, 20), sink="file", path=str(out), metastore_url=url)
    assert isinstance(r, eosink.BatchResult) and r.epoch == 5 and r.committed
    assert read_ids(out) == list(range(10, 20))


@pytest.mark.parametrize("name", ["file", "sql"])
def test_a_retired_sinks_stream_restarted_on_its_old_checkpoint(
    name: str, spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The user retires a streaming sink but restarts its query on the old checkpoint (or
    starts a new query on a new one): the old query goes on from its offsets with epochs
    above the retired ones (its checkpoint's journal still holds the retired epoch 1, which
    is never applied again: the SQL sink's record of it is gone); a new checkpoint is
    refused as on any sink with history, and continues above them when asked. Every input
    row once."""
    sink = {"file": _file, "sql": _sql}[name](tmp_path)
    inp, url = tmp_path / "in", f"sqlite:///{tmp_path / 'm.db'}"
    inp.mkdir()
    retire = ["retire", "--sink", name, "--metastore-url", url]
    retire += ["--options-json", json.dumps(sink.opts)]

    def add(where: Path, ids: range) -> None:
        (where / f"{ids.start}.json").write_text("".join(json.dumps({"id": i}) + "\n" for i in ids))

    def stream(chk: str, src: Path = inp, **kw: Any) -> list[int]:
        h = eosink.run(
            spark.readStream.schema("id long").option("maxFilesPerTrigger", 1).json(str(src)),
            sink=name,
            checkpoint_location=str(tmp_path / chk),
            trigger={"availableNow": True},
            metastore_url=url,
            **sink.opts,
            **kw,
        )
        assert isinstance(h, eosink.StreamingHandle)
        h.await_termination()
        return [f.epoch for f in h.figures if not f.skipped]

    add(inp, range(0, 10))
    add(inp, range(10, 20))
    assert stream("chk") == [0, 1]
    assert cli(retire) == 0
    add(inp, range(20, 30))
    assert stream("chk") == [2]  # the old query's next file, above the retired epochs
    assert sink.read() == list(range(30))
    other = tmp_path / "in2"
    other.mkdir()
    add(other, range(100, 105))
    assert cli(retire) == 0
    # A new checkpoint re-reads its source: refused as on any sink with history (the rows
    # of the retired sink are in the target), continued above the retired epochs when asked.
    with pytest.raises(NewCheckpointError, match="was retired by `eosink retire`"):
        stream("chk-new", other)
    assert stream("chk-new", other, new_checkpoint="continue") == [3]
    assert sink.read() == list(range(30)) + list(range(100, 105))
