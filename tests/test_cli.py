"""The eosink command: demo end to end, status from the meta store."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from eosink._metastore import MetaStore


def _cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "eosink._cli", *args],
        capture_output=True,
        text=True,
        check=check,
        timeout=600,
    )


def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    res = _cli("demo", "--dir", str(tmp_path), "--rows", "3000")
    assert "verify batch: 3000 rows read back, exactly once" in res.stdout
    assert "verify stream: 3000 rows read back, exactly once" in res.stdout
    assert "staged files left behind: 0" in res.stdout
    assert "OK: every row landed exactly once" in res.stdout
    status = _cli("status", "--metastore-url", f"sqlite:///{tmp_path / 'metastore.db'}")
    assert "last committed epoch: 2" in status.stdout
    assert "pending: none" in status.stdout


def test_status_shows_pending_and_durations(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}"
    store = MetaStore(url)
    g = store.acquire("file:/data/x", "file").generation
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
        )
    store.mark_committed("file:/data/x", g, 0, commit_ms=4.25)
    store.mark_committed("file:/data/x", g, 1, commit_ms=2.0)
    store.close()
    data = json.loads(_cli("status", "--metastore-url", url, "--json").stdout)
    assert data[0]["sink_id"] == "file:/data/x"
    assert data[0]["last_committed_epoch"] == 1
    assert data[0]["pending_epochs"] == [2]
    assert [c["commit_ms"] for c in data[0]["recent_commits"]] == [2.0, 4.25]
    text = _cli("status", "--metastore-url", url).stdout
    assert "pending: [2]" in text and "sink file:/data/x" in text


def test_status_hides_passwords_and_reports_unreachable() -> None:
    res = _cli("status", "--metastore-url", "postgresql://u:hunter2@127.0.0.1:1/x", check=False)
    assert res.returncode == 2
    assert "unreachable" in res.stderr and "hunter2" not in res.stderr + res.stdout


def test_demo_iceberg(tmp_path: Path) -> None:
    res = _cli("demo", "--sink", "iceberg", "--dir", str(tmp_path), "--rows", "900")
    assert "verify batch: 900 rows read back, exactly once" in res.stdout
    assert "verify stream: 900 rows read back, exactly once" in res.stdout
    assert "unreferenced data files left behind: 0" in res.stdout
    assert "OK: every row landed exactly once" in res.stdout
