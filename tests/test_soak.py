"""The release soak command (``python -m tests.soak``) runs and reports per sink.

CI runs it with one kill per sink only, to keep the command working; the release check is
>= 200 kills per sink (docs/testing.md). CI runs two of its sinks: ``rolling`` (the file
sink's job and reader, with rolling options) and ``sql-cdc`` (the sql sink's job, server,
reader and the change stream's final-state check); ``file`` and ``sql`` differ from them only
by their options; ``iceberg`` and ``kafka`` by their readers (the crash tests' own).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.crash


@pytest.mark.release
def test_soak_command_kills_and_verifies_each_sink() -> None:
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.soak",
            "--sinks",
            "rolling,sql-cdc",
            "--kills",
            "1",
            "--files",
            "3",
            "--rows",
            "100",
            "--min-kill",
            "4",
            "--max-kill",
            "7",
            "--max-kills-per-run",
            "1",
            # Every kill drawn from the run's first PENDING epoch: it lands in the protocol.
            "--protocol-share",
            "1",
            "--protocol-window",
            "1",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    summary = res.stdout.split("summary\n", 1)[1]
    for sink in ("rolling", "sql-cdc"):
        m = re.search(
            rf"^{sink} +runs=(\d+) kills=(\d+) in_protocol=(\d+) moves=\d+ rows=(\d+) "
            r"lost=0 duplicated=0 misapplied=0 leftovers=0 failed=0 time=\d+m\d\ds$",
            summary,
            re.M,
        )
        assert m, summary
        runs, kills, in_protocol, rows = map(int, m.groups())
        assert kills >= 1 and in_protocol == kills and rows == runs * 300
