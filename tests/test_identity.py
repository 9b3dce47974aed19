"""Issue 7: sink identity, exact epochs and safe defaults, as a new user meets them.

Each test is one of the silent-loss / silent-duplicate cases of issue 7, run through the public
API with defaults wherever the user would rely on them, and checked by an independent reader.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from harness import read_ids, staged_files

import eosink
from eosink import (
    BatchResult,
    ConfigError,
    MetaStoreUnavailableError,
    NewCheckpointError,
    SinkIdentityError,
    UnfinishedRunError,
)
from eosink._metastore import MetaStore


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Defaults as a new user has them: no metastore_url, the default store in EOSINK_HOME."""
    h = tmp_path / "home"
    monkeypatch.setenv("EOSINK_HOME", str(h))
    monkeypatch.delenv("EOSINK_METASTORE_URL", raising=False)
    return h


def _input(tmp_path: Path, name: str, ids: range) -> Path:
    d = tmp_path / name
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{ids.start}.json").write_text("".join(json.dumps({"id": i}) + "\n" for i in ids))
    return d


def _stream(spark: Any, inp: Path) -> Any:
    return spark.readStream.schema("id long").option("maxFilesPerTrigger", 1).json(str(inp))


def test_lower_explicit_batch_epoch_is_a_backfill(spark, tmp_path: Path, home: Path) -> None:
    """Case 1: epoch=5 then epoch=3 writes both; re-running either is a no-op."""
    out = str(tmp_path / "out")
    r5 = eosink.run(spark.range(0, 10), sink="file", path=out, epoch=5)
    r3 = eosink.run(spark.range(100, 110), sink="file", path=out, epoch=3)
    assert isinstance(r3, BatchResult) and not r3.skipped and r3.rows == 10
    again = [eosink.run(spark.range(0, 10), sink="file", path=out, epoch=e) for e in (5, 3)]
    assert all(isinstance(a, BatchResult) and a.skipped for a in again)
    assert isinstance(r5, BatchResult) and r5.rows == 10
    assert read_ids(Path(out)) == list(range(10)) + list(range(100, 110))
    # The next free epoch is above every used one.
    r = eosink.run(spark.range(200, 201), sink="file", path=out)
    assert isinstance(r, BatchResult) and r.epoch == 6


def test_backfill_commits_a_crashed_batch_runs_complete_epoch(
    spark, tmp_path: Path, home: Path
) -> None:
    """A batch run dies with epoch 10 PENDING (its data complete); a backfill at epoch 3
    commits epoch 10 (it never aborts it) and writes epoch 3; re-running epoch 10 skips."""
    from eosink.faults import SimulatedCrash, simulate

    out = str(tmp_path / "out")
    with simulate("after_persist") as fired, pytest.raises(SimulatedCrash):
        eosink.run(spark.range(0, 10), sink="file", path=out, epoch=10)
    assert fired[0] == 1
    r3 = eosink.run(spark.range(100, 110), sink="file", path=out, epoch=3)
    assert isinstance(r3, BatchResult) and not r3.skipped and r3.rows == 10
    assert read_ids(Path(out)) == list(range(10)) + list(range(100, 110))
    again = eosink.run(spark.range(0, 10), sink="file", path=out, epoch=10)
    assert isinstance(again, BatchResult) and again.skipped
    assert read_ids(Path(out)) == list(range(10)) + list(range(100, 110))
    assert staged_files(Path(out)) == []


def test_rerun_without_epoch_after_a_crash_never_duplicates(
    spark, tmp_path: Path, home: Path
) -> None:
    """A run without epoch= dies with its data complete (PENDING); the user re-runs it as it
    was: eosink commits the crashed run's epoch and refuses to write this one (it cannot
    tell a repeat from new data), saying so. Every row once. An explicit epoch equal to an
    automatic one is refused, not skipped."""
    from eosink.faults import SimulatedCrash, simulate

    out = str(tmp_path / "out")
    first = eosink.run(spark.range(0, 5), sink="file", path=out)
    assert isinstance(first, BatchResult) and first.epoch == 0
    with simulate("after_persist") as fired, pytest.raises(SimulatedCrash):
        eosink.run(spark.range(10, 20), sink="file", path=out)
    assert fired[0] == 1
    with pytest.raises(UnfinishedRunError, match=r"epoch 1 \(10 rows\).*run it again"):
        eosink.run(spark.range(10, 20), sink="file", path=out)
    assert read_ids(Path(out)) == list(range(5)) + list(range(10, 20))
    assert staged_files(Path(out)) == []
    # The next run without epoch= is new data: written.
    r = eosink.run(spark.range(30, 31), sink="file", path=out)
    assert isinstance(r, BatchResult) and r.epoch == 2 and not r.skipped
    with pytest.raises(SinkIdentityError, match="without epoch="):
        eosink.run(spark.range(40, 41), sink="file", path=out, epoch=1)
    assert read_ids(Path(out)) == list(range(5)) + list(range(10, 20)) + [30]


def test_fresh_checkpoint_is_refused_even_when_the_meta_store_is_lost(
    spark, tmp_path: Path, home: Path
) -> None:
    """Case 2: the same stream with checkpoint A, then checkpoint B, with defaults."""
    inp = _input(tmp_path, "in", range(0, 50))
    out = str(tmp_path / "out")

    def run(chk: str, **kw: Any) -> None:
        eosink.run(
            _stream(spark, inp),
            sink="file",
            path=out,
            checkpoint_location=str(tmp_path / chk),
            trigger={"availableNow": True},
            **kw,
        ).await_termination()

    run("chk-a")
    with pytest.raises(NewCheckpointError, match="new_checkpoint='continue'"):
        run("chk-b")
    # The default meta store is lost (a new machine, ~/.eosink deleted): the target's
    # marker still knows the sink's history.
    shutil.rmtree(home)
    with pytest.raises(NewCheckpointError, match="epochs up to 0"):
        run("chk-c")
    assert read_ids(Path(out)) == list(range(50))
    # Asked to continue, the new query's epochs start after the marker's last epoch.
    _input(tmp_path, "in", range(50, 60))
    shutil.rmtree(home)
    run("chk-a", new_checkpoint="continue")  # chk-a's own commits: exactly the old files
    assert read_ids(Path(out)) == list(range(60))


def test_in_memory_meta_store_is_refused(spark, tmp_path: Path) -> None:
    """Case 4: sqlite:// forgets everything at exit; re-running epoch 0 would duplicate."""
    out = tmp_path / "out"
    for url in ("sqlite://", "sqlite:///:memory:", "sqlite:///file:x?mode=memory&uri=true"):
        with pytest.raises(ConfigError, match="in-memory"):
            eosink.run(spark.range(3), sink="file", path=str(out), epoch=0, metastore_url=url)
    assert not out.exists()


@pytest.mark.parametrize(
    "url", ["nonsense", "postgresql://a:b@:x/", "sqlite:////nonexistent/\0/m.db"]
)
def test_malformed_meta_store_url_is_a_config_error(url: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        MetaStore(url)
    assert "b@" not in str(exc.value)  # the password is never shown


def test_same_sink_id_for_another_target_is_refused(spark, tmp_path: Path, home: Path) -> None:
    """Case 5: one sink_id, two paths: refused before anything is written to the second."""
    a, b = tmp_path / "a", tmp_path / "b"
    eosink.run(spark.range(5), sink="file", path=str(a), sink_id="events", epoch=0)
    with pytest.raises(SinkIdentityError, match="is bound to file:") as exc:
        eosink.run(spark.range(5, 10), sink="file", path=str(b), sink_id="events", epoch=1)
    assert str(a) in str(exc.value) and str(b) in str(exc.value)
    assert read_ids(b) == [] and staged_files(b) == []
    assert read_ids(a) == list(range(5))


def test_lost_meta_store_batch_epochs(spark, tmp_path: Path) -> None:
    """A batch sink whose meta store is replaced: the target's marker is adopted; a re-run of
    a committed epoch is a no-op (the file sink's batch journal records it); an epoch it
    cannot tell about is refused; the next free epoch is above the marker."""
    out = str(tmp_path / "out")
    m1, m2 = f"sqlite:///{tmp_path / 'm1.db'}", f"sqlite:///{tmp_path / 'm2.db'}"
    eosink.run(spark.range(0, 5), sink="file", path=out, epoch=7, metastore_url=m1)
    again = eosink.run(spark.range(0, 5), sink="file", path=out, epoch=7, metastore_url=m2)
    assert isinstance(again, BatchResult) and again.skipped and again.rows == 0
    # The way out never says "another epoch" alone: for a re-run that writes it twice.
    with pytest.raises(SinkIdentityError, match=r"cannot tell.*do not give it another epoch"):
        eosink.run(spark.range(0, 5), sink="file", path=out, epoch=6, metastore_url=m2)
    r = eosink.run(spark.range(5, 8), sink="file", path=out, metastore_url=m2)
    assert isinstance(r, BatchResult) and r.epoch == 8
    # m1 is now behind the target: refused, it is not the store the sink was written with.
    with pytest.raises(SinkIdentityError, match="knows only up to 7"):
        eosink.run(spark.range(9, 10), sink="file", path=out, metastore_url=m1)
    assert read_ids(Path(out)) == list(range(8))


def test_batch_between_stream_runs_moves_the_stream_on(spark, tmp_path: Path, home: Path) -> None:
    """Case 3: a batch job between two runs of a stream on one target, defaults only: the
    stream's later epochs never collide with the batch's (nothing skipped or doubled)."""
    inp = _input(tmp_path, "in", range(0, 20))
    out, chk = str(tmp_path / "out"), str(tmp_path / "chk")

    def stream() -> eosink.StreamingHandle:
        h = eosink.run(
            _stream(spark, inp),
            sink="file",
            path=out,
            checkpoint_location=chk,
            trigger={"availableNow": True},
        )
        assert isinstance(h, eosink.StreamingHandle)
        h.await_termination()
        return h

    stream()
    r = eosink.run(spark.range(1000, 1005), sink="file", path=out)
    assert isinstance(r, BatchResult) and r.epoch == 1
    # The batch job's explicit epoch may not take a stream epoch either.
    with pytest.raises(SinkIdentityError, match="streaming query"):
        eosink.run(spark.range(1000, 1005), sink="file", path=out, epoch=0)
    _input(tmp_path, "in", range(20, 30))
    h = stream()
    assert [f.epoch for f in h.figures if not f.skipped] == [2]
    assert read_ids(Path(out)) == list(range(30)) + list(range(1000, 1005))


def test_gc_through_the_runtime_then_replay(tmp_path: Path) -> None:
    """> 100 epochs through the runtime garbage-collect old rows; a replay of a collected
    epoch is still detected, a batch epoch among them is refused, and new ones are written."""
    from eosink._protocol import SinkRuntime
    from eosink._rules import SKIP, WRITE

    plugin = eosink.get_sink("file")
    opts = plugin.parse_options({"path": str(tmp_path / "out")})
    store = MetaStore(f"sqlite:///{tmp_path / 'm.db'}")
    rt = SinkRuntime(plugin, opts, "gc", store, gc_keep=10)
    rt.start()
    rt.lineage = "L1"
    for e in range(130):
        c, fig = rt.pre_commit(e, [], rows=0, write_s=0.0)
        rt.commit_epoch(e, c, fig)
    assert store.count_rows("gc") == 40  # epochs <= 89 collected at the 100th commit
    assert store.epoch("gc", 5) is None
    assert rt.stream_decision(5) == SKIP  # a replay of a collected epoch
    assert rt.stream_decision(129) == SKIP
    assert rt.stream_decision(130) == WRITE
    with pytest.raises(SinkIdentityError, match="cannot tell"):
        rt.batch_decision(5)
    rt.close()
    store.close()


def test_hook_error_never_fails_a_committed_epoch(
    spark, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Case 8: a plugin's eosink_epoch_committed hook that raises is logged, not fatal."""
    from eosink.registry import plugin_manager

    class Broken:
        @eosink.hookimpl
        def eosink_epoch_committed(self, sink_id: str, epoch: int, figures: Any) -> None:
            raise RuntimeError("listener is down")

    pm = plugin_manager()
    broken = Broken()
    pm.register(broken)
    try:
        with caplog.at_level(logging.ERROR, logger="eosink"):
            r = eosink.run(
                spark.range(4),
                sink="file",
                path=str(tmp_path / "out"),
                epoch=0,
                metastore_url=f"sqlite:///{tmp_path / 'm.db'}",
            )
    finally:
        pm.unregister(broken)
    assert isinstance(r, BatchResult) and r.committed and r.rows == 4
    assert "hook raised" in caplog.text and "listener is down" in caplog.text
    assert read_ids(tmp_path / "out") == [0, 1, 2, 3]


def test_meta_store_outage_mid_stream(
    spark, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A real PostgreSQL stopped and restarted while a stream runs: the stream rides it out
    (a micro-batch meets the outage and retries with backoff) and the output is exact; with
    a shorter bound it stops cleanly and a restart finishes exactly; with the restart policy
    the handle makes that restart itself."""
    from services import EmbeddedPostgres

    pg = EmbeddedPostgres()  # its own server: stopped and restarted below
    try:
        inp = tmp_path / "in"
        inp.mkdir()
        out = tmp_path / "out"

        def feed(lo: int, hi: int) -> None:
            tmp = tmp_path / f".{lo}.json"
            tmp.write_text("".join(json.dumps({"id": i}) + "\n" for i in range(lo, hi)))
            os.replace(tmp, inp / f"{lo}.json")

        def start(
            chk: str, retry_s: float, restart: eosink.RestartPolicy | None = None
        ) -> eosink.StreamingHandle:
            h = eosink.run(
                _stream(spark, inp),
                sink="file",
                path=str(out),
                checkpoint_location=str(tmp_path / chk),
                metastore_url=pg.url,
                trigger={"processingTime": "200 milliseconds"},
                metastore_retry_s=retry_s,
                restart=restart,
            )
            assert isinstance(h, eosink.StreamingHandle)
            return h

        h = start("chk", retry_s=60)
        feed(0, 10)
        h.process_all_available()
        with caplog.at_level(logging.WARNING, logger="eosink"):
            pg.pause()
            feed(10, 20)
            feed(20, 30)
            time.sleep(3)  # micro-batches run into the outage
            pg.resume()
            h.process_all_available()
        assert h.is_active
        # A micro-batch met the outage and retried (the meta store's backoff), not waited.
        retries = [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]
        assert retries and all("unavailable during" in m for m in retries), caplog.text
        h.stop()
        assert read_ids(out) == list(range(30))

        # A bound shorter than the outage: the stream fails with the transient error...
        h = start("chk", retry_s=1)
        pg.pause()
        feed(30, 40)
        back = threading.Timer(6, pg.resume)
        back.start()
        with pytest.raises(Exception) as exc:
            h.await_termination(timeout=120)
        assert isinstance(exc.value, MetaStoreUnavailableError) or (
            "MetaStoreUnavailableError" in str(exc.value)
        )
        back.join()
        # ... and a restart finishes exactly.
        h = start("chk", retry_s=60)
        h.process_all_available()
        h.stop()
        assert read_ids(out) == list(range(40))
        assert staged_files(out) == []

        # The default restart policy does that restart itself: the handle the user waits on
        # starts the query again (its first restarts meet the outage too: retried with
        # growing delays), and the stream goes on exactly once.
        h = start("chk", retry_s=1, restart=eosink.RestartPolicy(delay_s=1.0))
        pg.pause()
        feed(40, 50)
        back = threading.Timer(5, pg.resume)
        back.start()
        h.process_all_available()
        back.join()
        assert h.restarts >= 1 and h.is_active
        feed(50, 60)
        h.process_all_available()
        h.stop()
        assert read_ids(out) == list(range(60))
        assert staged_files(out) == []
    finally:
        pg.stop()


def test_runbook_two_jobs_share_one_sink_id(
    spark, tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/cli.md's runbook "two jobs write under one sink_id", as written: a running stream
    and a second query on the same target (its own checkpoint and source, the default
    sink_id). The second is refused, then told to continue; the first stops at its next
    micro-batch. The runbook's ``eosink status`` shows two stream lineages taking turns; the
    second query gets its own sink_id, the first is restarted as it was, both run side by
    side, and every row of both sources is in the target once."""
    import shlex

    from harness import runbook_blocks

    from eosink import FencedError
    from eosink._cli import main as cli

    [(_, status_cmd)] = runbook_blocks("cli.md", "Runbook: two jobs write under one sink_id")
    out, url = tmp_path / "out", f"sqlite:///{tmp_path / 'm.db'}"
    a = _input(tmp_path, "a", range(0, 10))
    b = _input(tmp_path, "b", range(100, 110))

    def run(src: Path, chk: str, trigger: dict[str, Any], **kw: Any) -> eosink.StreamingHandle:
        h = eosink.run(
            _stream(spark, src),
            sink="file",
            path=str(out),
            checkpoint_location=str(tmp_path / chk),
            trigger=trigger,
            metastore_url=url,
            **kw,
        )
        assert isinstance(h, eosink.StreamingHandle)
        return h

    def wait_for(ids: list[int]) -> None:
        deadline = time.monotonic() + 120
        while read_ids(out) != ids:
            assert time.monotonic() < deadline, read_ids(out)
            time.sleep(0.3)

    every = {"processingTime": "0.5 seconds"}
    first = run(a, "chk-a", every)
    try:
        wait_for(list(range(10)))
        with pytest.raises(NewCheckpointError, match="is new to it"):
            run(b, "chk-b", {"availableNow": True})
        run(b, "chk-b", {"availableNow": True}, new_checkpoint="continue").await_termination()
        _input(tmp_path, "a", range(10, 20))
        with pytest.raises((SinkIdentityError, FencedError)):
            first.await_termination(120)
    finally:
        first.stop()
    sid = f"file:{out}"
    argv = shlex.split(status_cmd.replace("URL", url).replace("ID", sid))
    assert argv[0] == "eosink"
    capsys.readouterr()
    assert cli(argv[1:]) == 0
    runs = {w for w in capsys.readouterr().out.split() if len(w) == 8 and w.isalnum()}
    # Two stream lineages (8-hex labels) in the recent commits: two queries.
    assert len([r for r in runs if all(c in "0123456789abcdef" for c in r)]) >= 2, runs
    # The fix: the second query under its own sink_id, the first restarted as it was.
    second = run(b, "chk-b", every, sink_id="orders-b")
    first = run(a, "chk-a", every)
    try:
        _input(tmp_path, "b", range(110, 120))
        _input(tmp_path, "a", range(20, 30))
        wait_for(list(range(30)) + list(range(100, 120)))
    finally:
        first.stop()
        second.stop()
    assert read_ids(out) == list(range(30)) + list(range(100, 120))
    # Each wrote its new rows under its own sink: orders-b's epochs start at 0.
    assert [f.epoch for f in second.figures if f.rows] == [0]
    assert [f.epoch for f in first.figures if f.rows] == [2, 3]
