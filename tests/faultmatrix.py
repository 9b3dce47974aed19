"""The fault coverage table: sink x front end x fault point, and the real kill proving each cell.

Every crash test that arms a fault point asserts that it fired through
:meth:`harness.Job.assert_fired` (or :func:`harness.crash_chain`), which records the sink,
the front end and the point that fired, with its *site* where one point has several
(``mid_commit:held``, ``mid_commit:fresh``: the sql sink's commit of the transaction phase 1
held open, or of a new one). During a whole-suite run conftest collects the records and,
at the end, builds this table and fails the run when a cell has no check (:func:`missing`).
conftest keeps the records, and the table as ``table.md``, in ``fault-coverage/`` of pytest's
base temporary directory and in ``.pytest_cache/d/fault-coverage/`` (the last whole-suite
run's); ``python -m tests.faultmatrix DIR`` prints the table of a run's records.

The cells: every sink of :data:`SINKS` with every front end of :data:`FRONTS` and every
point it can reach: the core's points and its own plugin's (each site apart). A cell is
proven by

* ``kill``: a real SIGKILL of a driver (or of a task's worker, for executor points) of that
  sink through that front end at that point, asserted to have fired: a Spark driver, or the
  Spark-less driver of the same lifecycle (tests/test_lifecycle_kills.py, which drives every
  sink and front end: the check column names the test);
* ``core``: the point is the core's (eosink/, the same code whatever the sink), killed
  through that front end with another sink;
* ``sink code``: the point is the sink's own, killed for that sink through another front
  end, and this sink and front end have a kill of their own at one of the sink's points
  (the front end's order around the sink's code is proven there);
* ``unreachable``: declared in :data:`UNREACHABLE`, with the reason.

The static part (every ``fault_point`` call of the code is declared, every declared site
exists, every unreachable declaration names cells that exist) is tests/test_fault_coverage.py.
"""

from __future__ import annotations

import ast
import fnmatch
import json
import sys
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SINKS = ("file", "rolling", "iceberg", "kafka", "sql-pg", "sql-sqlite", "delta")
"""The table's sinks: ``rolling`` is the file sink with files that span epochs; the sql
sink by its target's database (PostgreSQL holds phase 1's transaction open, SQLite does
not)."""
FRONTS = ("run-stream", "run-batch", "format-stream", "format-batch")
"""``eosink.run`` and ``format("eosink")``, streams and batches (tests/crashjob.py's modes
``stream``, ``batch``, ``ds-stream``, ``ds-batch``). Spark Connect's front ends are recorded
(``connect-run-stream``...) and shown, not required here."""

OWNERS = {
    "eosink/": "core",
    "plugins/eosink_file/_rolling.py": "rolling",
    "plugins/eosink_file/": "file",
    "plugins/eosink_iceberg/": "iceberg",
    "plugins/eosink_kafka/": "kafka",
    "plugins/eosink_sql/": "sql",
    "plugins/eosink_delta/": "delta",
}
"""Who owns a fault point's call site, by the file it is in (first match)."""
SINKS_OF = {
    "file": ("file", "rolling"),  # a rolling file sink runs the file sink's code too
    "rolling": ("rolling",),
    "iceberg": ("iceberg",),
    "kafka": ("kafka",),
    "sql": ("sql-pg", "sql-sqlite"),
    "delta": ("delta",),
}

UNREACHABLE: list[tuple[str, str, str, str]] = [
    # (sinks, fronts, points: fnmatch patterns; the reason)
    (
        "*",
        "*-batch",
        "recovery_before_*abort",
        "a batch run's PENDING epoch is complete: recovery commits it (rule 7), never aborts it",
    ),
    (
        "*",
        "format-stream",
        "recovery_before_*abort",
        'format("eosink") streams commit inline: recovery commits every PENDING epoch, never '
        "aborts one (ABORTED rows come only from a non-inline eosink.run driver of the query)",
    ),
    ("*", "*-batch", "after_lineage_written", "streams only: a fresh checkpoint's lineage file"),
    ("*", "*-batch", "stream_before_start", "eosink.run's stream start only"),
    ("*", "format-*", "stream_before_start", "eosink.run's stream start only"),
    ("*", "format-*", "after_spark_write", 'format("eosink") writes with Python writers only'),
    (
        "kafka",
        "*",
        "after_spark_write",
        "the kafka sink stages records with Python writers only",
    ),
    ("sql-*", "*", "after_spark_write", "the sql sink loads rows with Python writers only"),
    (
        "rolling",
        "*",
        "mid_commit:*",
        "a rolling file sink's commit publishes through its roller (the roll_* points)",
    ),
    (
        "*",
        "format-*",
        "*:hadoop",
        "Hadoop file systems (hdfs://, s3a://) need eosink.run on a classic driver",
    ),
    (
        "rolling",
        "*",
        "*:hadoop",
        "rolling options are refused on Hadoop file systems; on file:// the roller writes the "
        "local directory",
    ),
    (
        "sql-sqlite",
        "*",
        "mid_commit:held",
        "SQLite holds no transaction open from phase 1 (the trial is rolled back)",
    ),
]


@dataclass(frozen=True)
class Site:
    """One place the code calls ``fault_point``: its point, site label and owner."""

    point: str
    site: str
    owner: str
    where: str

    @property
    def name(self) -> str:
        return f"{self.point}:{self.site}" if self.site else self.point


def _owner(rel: str) -> str:
    for prefix, owner in OWNERS.items():
        if rel.startswith(prefix):
            return owner
    raise AssertionError(f"{rel}: a fault point outside eosink/ and plugins/")


def sites_in_code() -> list[Site]:
    """Every ``fault_point("point", site=...)`` call of eosink and the built-in plugins, and
    every constant passed as a ``fault=`` argument (a helper that calls ``fault_point`` with
    it: the iceberg sink's deletes)."""
    out: dict[str, Site] = {}
    files = [*ROOT.joinpath("eosink").rglob("*.py"), *ROOT.joinpath("plugins").rglob("*.py")]
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "id", getattr(node.func, "attr", None))
            point = site = None
            if name == "fault_point" and node.args and isinstance(node.args[0], ast.Constant):
                point = str(node.args[0].value)
                for kw in node.keywords:
                    if kw.arg == "site" and isinstance(kw.value, ast.Constant):
                        site = str(kw.value.value)
            else:
                for kw in node.keywords:
                    if kw.arg == "fault" and isinstance(kw.value, ast.Constant):
                        point = str(kw.value.value)
            if point is None:
                continue
            s = Site(point, site or "", _owner(rel), f"{rel}:{node.lineno}")
            out.setdefault(f"{s.owner} {s.name}", s)
    return sorted(out.values(), key=lambda s: (s.owner, s.name))


def cells() -> dict[tuple[str, str, str], Site]:
    """Every cell of the table: (sink, front end, point or point:site) -> its site."""
    out: dict[tuple[str, str, str], Site] = {}
    for s in sites_in_code():
        sinks = SINKS if s.owner == "core" else SINKS_OF[s.owner]
        for sink in sinks:
            for front in FRONTS:
                out[(sink, front, s.name)] = s
    return out


def unreachable(sink: str, front: str, point: str) -> str | None:
    """The declared reason why the cell cannot be reached, or None."""
    for sinks, fronts, points, reason in UNREACHABLE:
        if (
            fnmatch.fnmatch(sink, sinks)
            and fnmatch.fnmatch(front, fronts)
            and fnmatch.fnmatch(point, points)
        ):
            return reason
    return None


@dataclass(frozen=True)
class Record:
    sink: str
    front: str
    point: str
    test: str


def read_records(directory: Path) -> list[Record]:
    """The kills recorded by :func:`harness.record_coverage` in ``directory``."""
    out = []
    for f in sorted(directory.glob("*.jsonl")):
        for line in f.read_text().splitlines():
            if line.strip():
                out.append(Record(**json.loads(line)))
    return out


def table(records: Iterable[Record]) -> dict[tuple[str, str, str], tuple[str, str]]:
    """Each cell -> (how it is proven: kill, core, sink code, unreachable or MISSING; the
    check: the tests, or the reason)."""
    recs = list(records)
    killed: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    for r in recs:
        killed[(r.sink, r.front, r.point)].add(r.test)
    by_front: dict[tuple[str, str], set[str]] = defaultdict(set)  # (front, point) -> tests
    by_sink: dict[tuple[str, str], set[str]] = defaultdict(set)  # (sink, point) -> tests
    own_kill: dict[tuple[str, str], set[str]] = defaultdict(set)  # (sink, front) -> tests
    every = cells()
    for (sink, front, point), tests in killed.items():
        by_front[(front, point)] |= {f"{t} [{sink}]" for t in tests}
        by_sink[(sink, point)] |= {f"{t} [{front}]" for t in tests}
        site = every.get((sink, front, point))
        if site is not None and site.owner != "core":
            own_kill[(sink, front)] |= tests
    out: dict[tuple[str, str, str], tuple[str, str]] = {}
    for (sink, front, point), site in every.items():
        reason = unreachable(sink, front, point)
        if killed.get((sink, front, point)):
            out[(sink, front, point)] = ("kill", ", ".join(sorted(killed[(sink, front, point)])))
        elif reason:
            out[(sink, front, point)] = ("unreachable", reason)
        elif site.owner == "core" and by_front.get((front, point)):
            out[(sink, front, point)] = ("core", sorted(by_front[(front, point)])[0])
        elif site.owner != "core" and by_sink.get((sink, point)) and own_kill.get((sink, front)):
            first = sorted(by_sink[(sink, point)])[0]
            out[(sink, front, point)] = (
                "sink code",
                f"{first}; this front end: {sorted(own_kill[(sink, front)])[0]}",
            )
        else:
            out[(sink, front, point)] = ("MISSING", "")
    return out


def missing(records: Iterable[Record]) -> list[tuple[str, str, str]]:
    """The cells no check proves."""
    return sorted(c for c, (how, _) in table(records).items() if how == "MISSING")


def markdown(records: Iterable[Record]) -> str:
    """The table as Markdown: one row per cell."""
    recs = list(records)
    rows = table(recs)
    lines = [
        "| sink | front end | fault point | proven by | check |",
        "|---|---|---|---|---|",
    ]
    for (sink, front, point), (how, check) in sorted(rows.items()):
        lines.append(f"| {sink} | {front} | `{point}` | {how} | {check} |")
    extra = sorted({(r.sink, r.front, r.point) for r in recs} - set(rows))
    if extra:
        lines += ["", "Also killed (front ends and sinks outside the table):", ""]
        lines += [f"* {s} {f} `{p}`" for s, f, p in extra]
    counts: dict[str, int] = defaultdict(int)
    for how, _ in rows.values():
        counts[how] += 1
    summary = ", ".join(f"{how} {n}" for how, n in sorted(counts.items()))
    spark = [
        "",
        "Spark-driver kills by sink and front end (the Spark-less lifecycle driver's apart):",
        "",
        "| sink | front end | Spark kills | at the sink's own points |",
        "|---|---|---|---|",
    ]
    for (sink, front), (n, own) in sorted(spark_kills(recs).items()):
        spark.append(f"| {sink} | {front} | {n} | {', '.join(f'`{p}`' for p in own) or 'none'} |")
    return "\n".join([f"{len(rows)} cells: {summary}", "", *lines, *spark])


LIFECYCLE_TESTS = "tests/test_lifecycle_kills.py::"
"""The Spark-less driver's tests: their kills prove cells, and are counted apart from Spark
drivers' in :func:`spark_kills`."""


def spark_kills(records: Iterable[Record]) -> dict[tuple[str, str], tuple[int, list[str]]]:
    """Each (sink, front end) of the table -> how many kills of a Spark driver (or of a
    task's worker) it had, and at which of the sink's own points (not the core's). Issue
    40 keeps Spark kills at each sink's own points through each front end; a row with none
    is where only the lifecycle driver kills the sink's code through that front end."""
    every = cells()
    out: dict[tuple[str, str], tuple[int, list[str]]] = {}
    for sink in SINKS:
        for front in FRONTS:
            mine = [
                r
                for r in records
                if r.sink == sink and r.front == front and not r.test.startswith(LIFECYCLE_TESTS)
            ]
            own = sorted(
                {
                    r.point
                    for r in mine
                    if (site := every.get((sink, front, r.point))) is not None
                    and site.owner != "core"
                }
            )
            out[(sink, front)] = (len(mine), own)
    return out


if __name__ == "__main__":
    print(markdown(read_records(Path(sys.argv[1]))))
