"""The eosink command: demo end to end, status from the meta store."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from eosink._metastore import MetaStore
from eosink.errors import ConfigError


def _cli(
    *args: str, check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "eosink._cli", *args],
        capture_output=True,
        text=True,
        check=check,
        timeout=600,
        env=env,
    )


# What Spark 4 prints at its default level (WARN in pyspark) around a demo run.
SPARK_CHATTER = re.compile(
    r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (WARN|INFO) "  # Spark's log4j pattern
    r"|Using Spark's default log4j profile|Setting default log level to"
    r"|To adjust logging level use sc.setLogLevel",
    re.M,
)


def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "EOSINK_SPARK_LOG_LEVEL"}
    res = _cli("demo", "--dir", str(tmp_path), "--rows", "3000", env=env)
    # eosink's progress lines, and none of Spark's start-up and streaming warnings (the
    # JVM's own "WARNING: Using incubator modules" line is not Spark's and cannot be silenced)
    assert "[eosink demo] Spark " in res.stdout and "Spark's own log level ERROR" in res.stdout
    assert SPARK_CHATTER.search(res.stdout + res.stderr) is None, res.stderr
    assert "resolves to a loopback" not in res.stderr and "NativeCodeLoader" not in res.stderr
    assert "verify batch: 3000 rows read back, exactly once" in res.stdout
    assert "verify stream: 3000 rows read back, exactly once" in res.stdout
    assert "staged files left behind: 0" in res.stdout
    assert "OK: every row landed exactly once" in res.stdout
    status = _cli("status", "--metastore-url", f"sqlite:///{tmp_path / 'metastore.db'}")
    assert "last committed epoch: 2" in status.stdout
    assert "pending: none" in status.stdout


def test_spark_log_level_default_env_and_parameter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark's level: ERROR by default, EOSINK_SPARK_LOG_LEVEL, then log_level=; the log4j2
    file the JVM starts with carries it (a second demo run at WARN would cost ~30-60 s: the
    WARN lines coming back is checked by hand)."""
    from eosink._session import _log4j2_file, _spark_log_level

    monkeypatch.setenv("EOSINK_HOME", str(tmp_path))
    monkeypatch.delenv("EOSINK_SPARK_LOG_LEVEL", raising=False)
    assert _spark_log_level(None) == ("ERROR", False)
    monkeypatch.setenv("EOSINK_SPARK_LOG_LEVEL", "warn")
    assert _spark_log_level(None) == ("WARN", True)
    assert _spark_log_level("Info") == ("INFO", True)
    monkeypatch.setenv("EOSINK_SPARK_LOG_LEVEL", "loud")
    with pytest.raises(ConfigError, match="EOSINK_SPARK_LOG_LEVEL='loud'"):
        _spark_log_level(None)
    with pytest.raises(ConfigError, match="log_level='verbose'"):
        _spark_log_level("verbose")
    for level, jetty in (("ERROR", "ERROR"), ("WARN", "WARN"), ("DEBUG", "WARN")):
        path = _log4j2_file(level)
        assert path is not None and path.startswith(str(tmp_path))
        text = Path(path).read_text()
        assert f"rootLogger.level = {level}\n" in text
        # the logger Spark reads the pyspark shell's level from: no "Setting default log level"
        assert f"logger.gateway.level = {level}\n" in text
        assert f"logger.jetty.level = {jetty}\n" in text
    assert _log4j2_file("WARN") == path.replace("debug", "warn")  # rewritten only on change


def test_status_shows_pending_and_durations(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}"
    store = MetaStore(url)
    g = store.acquire("file:/data/x", "file").generation
    store.set_target("file:/data/x", g, "file:/data/x")
    for e in range(3):
        store.persist_pending(
            "file:/data/x",
            g,
            e,
            b"{}",
            1,
            rows=10 * e,
            files=1,
            nbytes=5,
            batch_end_at=100.0,
            pre_commit_ms=1.5,
            origin=("batch", "batch-auto", "0123456789abcdef")[e],
        )
    store.mark_committed("file:/data/x", g, 0, commit_ms=4.25)
    store.mark_committed("file:/data/x", g, 1, commit_ms=2.0)
    store.close()
    data = json.loads(_cli("status", "--metastore-url", url, "--json").stdout)
    assert data[0]["sink_id"] == "file:/data/x"
    assert data[0]["last_committed_epoch"] == 1
    assert data[0]["pending_epochs"] == [2]
    assert [c["commit_ms"] for c in data[0]["recent_commits"]] == [2.0, 4.25]
    assert [c["run"] for c in data[0]["recent_commits"]] == ["batch-auto", "batch"]
    assert data[0]["target"] == "file:/data/x" and data[0]["gc_floor"] is None
    text = _cli("status", "--metastore-url", url).stdout
    assert "pending: [2]" in text and "sink file:/data/x" in text
    assert "target: file:/data/x" in text and "batch (auto epoch)" in text
    one = json.loads(
        _cli("status", "--metastore-url", url, "--sink-id", "file:/data/x", "--json").stdout
    )
    assert [s["sink_id"] for s in one] == ["file:/data/x"]
    for fmt in ([], ["--json"]):
        res = _cli("status", "--metastore-url", url, "--sink-id", "nosuch", *fmt, check=False)
        assert res.returncode == 1 and res.stdout == ""
        assert "has no sink 'nosuch'" in res.stderr


def test_status_hides_passwords_and_reports_unreachable() -> None:
    res = _cli("status", "--metastore-url", "postgresql://u:hunter2@127.0.0.1:1/x", check=False)
    assert res.returncode == 2
    assert "unreachable" in res.stderr and "hunter2" not in res.stderr + res.stdout


@pytest.mark.release  # the demo's own path is test_demo_runs_end_to_end's; this adds Iceberg
def test_demo_iceberg(tmp_path: Path) -> None:
    res = _cli("demo", "--sink", "iceberg", "--dir", str(tmp_path), "--rows", "900")
    assert "verify batch: 900 rows read back, exactly once" in res.stdout
    assert "verify stream: 900 rows read back, exactly once" in res.stdout
    assert "unreferenced data files left behind: 0" in res.stdout
    assert "OK: every row landed exactly once" in res.stdout


def test_owner_liveness_and_option_parsing() -> None:
    """``eosink status``'s owner check (a live process here, a dead one, another host, a
    non-process owner) and ``eosink recover``'s ``--option`` / ``--options-json`` parsing."""
    import argparse
    import socket
    import time

    from eosink._cli.owners import owner_alive
    from eosink._cli.recover import sink_options
    from eosink._metastore import HEARTBEAT_STALE_SECONDS

    host = socket.gethostname()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert owner_alive(f"{host}:{child.pid}") is True
    finally:
        child.kill()
        child.wait()
    assert owner_alive(f"{host}:{child.pid}") is False
    assert owner_alive(f"{host}:{os.getpid()}") is False  # this command itself
    assert owner_alive(f"another-{host}:1") is None
    assert owner_alive("me@host (eosink abandon)") is None
    # A format("eosink") stream's micro-batch coordinator has exited; its heartbeat tells.
    fmt = f"{host}:{child.pid} (format stream)"
    assert owner_alive(fmt, time.time()) is True
    assert owner_alive(fmt, time.time() - HEARTBEAT_STALE_SECONDS - 1) is False
    assert owner_alive(fmt, None) is None

    def ns(option: list[str] | None, js: str | None = None) -> argparse.Namespace:
        return argparse.Namespace(option=option, options_json=js)

    got = sink_options(ns(["path=/data/out", "transactions=4", 'partition_by=["g"]'], '{"a": 1}'))
    assert got == {"a": 1, "path": "/data/out", "transactions": 4, "partition_by": ["g"]}
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        sink_options(ns(["novalue"]))
    with pytest.raises(ConfigError, match="JSON object"):
        sink_options(ns(None, "[1]"))


def test_heartbeat_tells_a_live_owner_on_another_host(tmp_path: Path) -> None:
    """A coordinator on another host cannot be asked for its process: its heartbeat in the
    sink's row tells. Fresh: ``status`` says running and ``abandon`` refuses; stale (a job
    killed there): not running, and ``abandon`` proceeds. Cleared by a clean stop; a
    fenced coordinator's heartbeat is not taken."""
    import time

    from sqlalchemy import update

    from eosink._cli.owners import owner_alive
    from eosink._metastore import HEARTBEAT_STALE_SECONDS
    from eosink._metastore.models import SinkRow

    now = time.time()
    assert owner_alive("elsewhere.example:1", now) is True
    assert owner_alive("elsewhere.example:1", now - HEARTBEAT_STALE_SECONDS - 1) is False
    assert owner_alive("elsewhere.example:1", None) is None

    url = f"sqlite:///{tmp_path / 'm.db'}"
    sid = "file:/data/hb"
    store = MetaStore(url)
    rec = store.acquire(sid, "file")
    assert rec.heartbeat_at is not None and abs(rec.heartbeat_at - time.time()) < 60
    g = rec.generation
    store.persist_pending(
        sid, g, 0, b"{}", 1, rows=3, files=1, nbytes=5, batch_end_at=1.0, pre_commit_ms=1.0
    )

    def set_row(**values: object) -> None:
        with store._tx() as conn:
            conn.execute(update(SinkRow).where(SinkRow.sink_id == sid).values(**values))

    set_row(owner="elsewhere.example:4242")  # as if the job ran on another machine
    assert store.heartbeat(sid, g) is True
    [s] = json.loads(_cli("status", "--metastore-url", url, "--json").stdout)
    assert s["owner_alive"] is True and s["heartbeat_at"]
    assert "last heartbeat of its coordinator" in _cli("status", "--metastore-url", url).stdout
    abandon = ["abandon", "--metastore-url", url, "--sink-id", sid, "--epoch", "0"]
    abandon += ["--reason", "test", "--accept-data-loss"]
    res = _cli(*abandon, check=False)
    assert res.returncode == 2, res
    assert (
        "elsewhere.example recorded its heartbeat" in res.stderr and "stop that job" in res.stderr
    )
    assert {r.epoch: r.status for r in store.epochs(sid)} == {0: "PENDING"}

    set_row(heartbeat_at=time.time() - HEARTBEAT_STALE_SECONDS - 5)  # killed over there
    [s] = json.loads(_cli("status", "--metastore-url", url, "--json").stdout)
    assert s["owner_alive"] is False
    assert "elsewhere.example:4242: not running" in _cli("status", "--metastore-url", url).stdout

    assert store.heartbeat(sid, g, stopped=True) is True  # a clean stop clears it
    assert store.sink(sid).heartbeat_at is None  # type: ignore[union-attr]
    g2 = store.acquire(sid, "file").generation  # a new coordinator fences the old one
    assert store.heartbeat(sid, g) is False
    assert store.heartbeat(sid, g2) is True
    set_row(owner="elsewhere.example:4242", heartbeat_at=time.time() - HEARTBEAT_STALE_SECONDS - 5)
    store.close()
    res = _cli(*abandon, check=False)
    assert res.returncode == 0, res.stderr
