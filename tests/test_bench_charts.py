"""``python -m bench``'s charts, drawn from a run's raw figures (bench/charts.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_charts_from_a_runs_figures(tmp_path: Path) -> None:
    """Every chart is drawn from ``bench-results.json`` as ``python -m bench`` saves it (here
    a small made-up run): the ratios with their ranges and targets, the lag distribution,
    the protocol cost per meta store; the SVGs name what they show."""
    results = {
        "throughput": [
            {"measure": "file sink batch / `df.write.parquet`", "mb": 100.0,
             "eosink_s": [1.0, 1.1, 0.9], "peer_s": [1.0, 1.0, 1.0], "target": 0.95},
            {"measure": "file sink batch / raw pyarrow", "mb": 100.0,
             "eosink_s": [2.0, 2.0], "peer_s": [0.5, 0.6], "target": None},
        ],
        "lag": {"trigger_ms": 1000.0, "lag_ms": [40.0, 55.0, 61.0, 48.0],
                "commit_ms": [2.1, 2.5, 3.0, 2.2]},
        "protocol": {
            "SQLite": {"epoch": [0.0, 50.0], "p50": [2.0, 2.1], "p99": [4.0, 4.4],
                       "max": [9.0, 8.0]},
            "PostgreSQL": {"epoch": [0.0, 50.0], "p50": [6.0, 6.5], "p99": [9.0, 9.1],
                           "max": [12.0, 13.0]},
        },
        "protocol_targets_ms": {"SQLite": 5.0, "PostgreSQL": 15.0},
    }  # fmt: skip
    src = tmp_path / "bench-results.json"
    src.write_text(json.dumps(results))
    res = subprocess.run(
        [sys.executable, "-m", "bench.charts", str(src), str(tmp_path / "img")],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    names = ["bench-throughput.svg", "bench-lag.svg", "bench-protocol.svg"]
    assert res.stdout.split() == [w for n in names for w in ("wrote", str(tmp_path / "img" / n))]
    svg = {n: (tmp_path / "img" / n).read_text() for n in names}
    assert all(s.lstrip().startswith("<?xml") and "<svg" in s for s in svg.values())
    assert "df.write.parquet" in svg[names[0]] and "raw pyarrow" in svg[names[0]]
    assert "visibility lag per epoch (ms; trigger every 1000 ms)" in svg[names[1]]
    assert "4 epochs" in svg[names[1]]
    assert "SQLite meta store" in svg[names[2]] and "PostgreSQL meta store" in svg[names[2]]
