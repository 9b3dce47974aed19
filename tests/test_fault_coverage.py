"""The fault coverage table's static half (tests/faultmatrix.py): every fault point of the
code is declared, every declaration of an unreachable cell names cells that exist, and the
table's logic classifies cells as it says.

The table itself is built from what the crash tests killed and asserted, at the end of a
whole-suite run (conftest's ``pytest_sessionfinish``), and the run fails when a cell has no
check."""

from __future__ import annotations

import fnmatch
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import faultmatrix as fm
from faultmatrix import Record

from eosink.faults import DRIVER_FAULT_POINTS, EXECUTOR_FAULT_POINTS


def test_every_fault_point_is_declared() -> None:
    declared = set(DRIVER_FAULT_POINTS) | set(EXECUTOR_FAULT_POINTS)
    in_code = {s.point for s in fm.sites_in_code()}
    assert in_code, "no fault_point call found"
    assert in_code <= declared, f"undeclared fault points: {sorted(in_code - declared)}"
    assert declared <= in_code, f"declared points no code reaches: {sorted(declared - in_code)}"


def test_each_point_of_several_places_names_its_sites() -> None:
    """Where one owner reaches a point from several places, each has a site of its own (or
    the places are one path: a point in a loop and after it)."""
    for s in fm.sites_in_code():
        if s.site:
            assert s.owner != "core", f"{s.where}: the core's points are one place each"


def test_every_unreachable_declaration_names_cells() -> None:
    cells = fm.cells()
    for sinks, fronts, points, reason in fm.UNREACHABLE:
        assert reason, (sinks, fronts, points)
        hits = [
            c
            for c in cells
            if fnmatch.fnmatch(c[0], sinks)
            and fnmatch.fnmatch(c[1], fronts)
            and fnmatch.fnmatch(c[2], points)
        ]
        assert hits, f"({sinks}, {fronts}, {points}) names no cell"


def test_the_table_classifies_cells() -> None:
    """Pure logic over made-up records (the real records come from crash tests)."""
    recs = [
        Record("file", "run-stream", "after_persist", "t_core"),
        Record("sql-pg", "run-stream", "mid_commit:held", "t_held"),
        Record("sql-pg", "run-batch", "mid_abort", "t_abort"),
    ]
    t = fm.table(recs)
    assert t[("file", "run-stream", "after_persist")] == ("kill", "t_core")
    # The core's point, through the same front end, with another sink.
    assert t[("kafka", "run-stream", "after_persist")] == ("core", "t_core [file]")
    assert t[("kafka", "run-batch", "after_persist")][0] == "MISSING"
    # The sink's own point killed through another front end, and this front end has a kill
    # of its own at one of the sink's points.
    how, check = t[("sql-pg", "run-batch", "mid_commit:held")]
    assert how == "sink code" and "t_held [run-stream]" in check and "t_abort" in check
    assert t[("sql-pg", "format-batch", "mid_commit:held")][0] == "MISSING"
    assert t[("sql-sqlite", "run-stream", "mid_commit:held")][0] == "unreachable"
    assert ("sql-pg", "run-batch", "mid_commit:held") not in fm.missing(recs)
    assert ("kafka", "run-batch", "after_persist") in fm.missing(recs)
    assert fm.missing([]) == sorted(c for c in fm.cells() if fm.unreachable(*c) is None), (
        "no record: every reachable cell is missing"
    )


def test_spark_kills_are_counted_apart_from_the_lifecycle_drivers() -> None:
    recs = [
        Record("sql-pg", "run-stream", "mid_commit:held", "tests/test_sql_crash.py::t"),
        Record("sql-pg", "run-stream", "after_persist", "tests/test_sql_crash.py::t"),
        Record("sql-pg", "run-batch", "mid_commit:held", fm.LIFECYCLE_TESTS + "t"),
    ]
    got = fm.spark_kills(recs)
    assert got[("sql-pg", "run-stream")] == (2, ["mid_commit:held"])
    assert got[("sql-pg", "run-batch")] == (0, [])
    assert "| sql-pg | run-batch | 0 | none |" in fm.markdown(recs)


_SLOW_MARK = """
import builtins, sys, time
from eosink import faults
real_open = builtins.open
def slow_open(*a, **k):  # each file opened for writing stays empty for a moment
    fh = real_open(*a, **k)
    if len(a) > 1 and "w" in a[1]:
        time.sleep(0.5)
    return fh
builtins.open = slow_open
faults.fault_point("mid_commit", site="local")
"""


def test_a_mark_appears_with_its_site(tmp_path: Path) -> None:
    """A fault's mark file appears whole: the harness kills the driver as soon as a mark
    appears (``Job._kill_when_fired``) and then reads the site from it; a mark seen empty
    made a CI run record ``mid_commit`` without its site and fail the coverage table."""
    marks = tmp_path / "faults"
    marks.mkdir()
    env = dict(os.environ, EOSINK_FAULT="mid_commit", EOSINK_FAULT_MARK=str(marks))
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_MARK], env=env)
    while True:
        ended = proc.poll() is not None
        seen = [p.read_text() for p in marks.iterdir()]
        if seen or ended:
            assert seen == ["local"], "a mark was visible before its site was written"
            break
        time.sleep(0.005)
    assert proc.wait() == -signal.SIGKILL
    assert [p.name for p in marks.iterdir()] == [f"mid_commit.{proc.pid}"]
    assert not list(tmp_path.glob(".*mark-part")), "the mark's partial file was left"
