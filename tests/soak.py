"""Soak: SIGKILL the driver at random instants, over and over, per sink; count what was lost.

Run outside CI, as the release check (>= 200 kills per sink)::

    uv run --all-extras python -m tests.soak --kills 200
    uv run --all-extras python -m tests.soak --sinks file --duration 600 --metastore postgres

Each *run* is one job of the crash-test driver (``tests/crashjob.py``: a stream of one
micro-batch per input file, or a batch job, alternating) on fresh input, output and state.
The driver is killed (SIGKILL of its whole process group: Python, JVM and Python workers) at
a random instant, restarted and killed again, up to ``--max-kills-per-run`` times, then
allowed to finish. About half of the restarts (``--move-share``) run on another machine: a
new ``HOME`` (with the SQLite meta store, the machine's default store under it: a new,
empty one), ``TMPDIR`` and working directory; only the checkpoint and the target are
shared, as on a cluster whose driver is restarted elsewhere (PostgreSQL stays shared).
Three quarters of the instants (``--protocol-share``) are drawn from the first change of the
sink's meta store rows in that run (0..``--protocol-window`` s after it;
with the instants of the other draws that land late, most kills hit the protocol), the others
from the driver's start (``--min-kill``..``--max-kill`` s), which may land in Spark's start-up.
An independent reader (pyarrow for files, a pyiceberg scan for Iceberg, a ``read_committed``
consumer for Kafka, plain SQL for the sql sink) then compares the output with the input row
by row. Sinks: ``file``, ``rolling`` (the file sink with files that span epochs: one rolls
every second micro-batch), ``iceberg``, ``kafka`` (a topic of a broker the soak starts),
``sql`` (appends to a table of a PostgreSQL server the soak starts, a new database per run),
``delta`` (appends to a Delta table partitioned by ``grp``, read by delta-rs; the table's
history must hold each epoch in one commit), ``delta-cdc`` (the delta sink upserting the
change stream ``sql-cdc`` writes, one ``MERGE`` per epoch, keyed as ``sql-cdc`` is) and
``sql-cdc`` (the sql sink upserting a change
stream, every 7th row a delete, over ``harness.make_cdc_input``'s change files: keyed by
``grp`` in half the runs, where hot keys change in every epoch and most rows insert a key of
their own, by ``id`` in the others; the table must hold the final state computed from the
input, row for row: an epoch lost leaves keys missing, an old epoch applied after a newer
one a hot key's wrong row). The sql and iceberg sinks' own records of their commits
(``sql_epochs``, snapshot summaries) must hold each epoch once, in order: an upsert epoch
applied twice leaves the table as it was, but not that record.
One line per sink sums it up::

    file     runs=61 kills=203 in_protocol=151 moves=97 rows=146400 lost=0 duplicated=0 ...

``in_protocol``: kills that landed after the sink's meta store rows changed in that run (the
others hit Spark's start-up); ``lost``: input ids missing from the output (for ``sql-cdc``
and ``delta-cdc``: rows of the expected final state missing or different); ``duplicated``:
extra copies of ids; ``misapplied``: runs whose target's record of commits does not hold
each epoch once, in order (sql, sql-cdc, iceberg, delta, delta-cdc); ``leftovers``: staged
files, orphaned data files, staging tables, and PENDING or ABORTED epochs left in the meta
store after the final run. The exit code is 1 when any of them is not 0 or a final run
failed.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))

from harness import (  # noqa: E402
    Job,
    cdc_state,
    epoch_states,
    expected_epochs,
    kafka_sink_options,
    make_cdc_input,
    make_input,
    read_ids,
    read_topic,
    staged_files,
)

SINKS = ("file", "rolling", "iceberg", "kafka", "sql", "sql-cdc", "delta", "delta-cdc")


@dataclass
class Tally:
    sink: str
    runs: int = 0
    kills: int = 0
    in_protocol: int = 0
    moves: int = 0
    rows: int = 0
    lost: int = 0
    duplicated: int = 0
    misapplied: int = 0
    leftovers: int = 0
    failed: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (
            self.lost or self.duplicated or self.misapplied or self.leftovers or self.failed
        )

    def line(self) -> str:
        m, s = divmod(int(self.seconds), 60)
        return (
            f"{self.sink:<8} runs={self.runs} kills={self.kills} in_protocol={self.in_protocol} "
            f"moves={self.moves} rows={self.rows} "
            f"lost={self.lost} duplicated={self.duplicated} misapplied={self.misapplied} "
            f"leftovers={self.leftovers} "
            f"failed={self.failed} time={m}m{s:02d}s"
        )


def _read(job: Job, sink: str) -> tuple[list[int], list[str], list[int] | None]:
    """(ids in the output, leftovers, epochs of the target's commits in order) as an
    independent reader sees them: pyarrow for files (staged files left), a pyiceberg scan
    for Iceberg (data files no snapshot references; the epochs of the snapshots), a
    ``read_committed`` consumer for Kafka (staged chunks left), plain SQL for the sql sink
    (staging tables left, ``sql_epochs``; for ``sql-cdc`` a row that differs from the
    expected final state is left out of the ids, so it counts as lost). The epochs are None
    for sinks that keep no record of each commit."""
    if sink in ("sql", "sql-cdc"):
        from test_sql_crash import _read as read_table

        rows, staged, epochs = read_table(job.sink_options["url"])
        want = set(_sql_expected(job))
        return [r[0] for r in rows if r in want], [f"staging table {t}" for t in staged], epochs
    if sink in ("file", "rolling"):
        return read_ids(job.out), staged_files(job.out), None
    if sink in ("delta", "delta-cdc"):
        from test_delta import delta_options, delta_rows, leftover_files
        from test_delta_crash import epochs_in_history

        opts = delta_options(job.out)
        table = delta_rows(opts)
        if sink == "delta":
            rows = [int(r["id"]) for r in table]
        else:  # a row that differs from the expected final state counts as lost
            want = set(_sql_expected(job))
            got = [(int(r["id"]), r["grp"], r["payload"]) for r in table]
            rows = [r[0] for r in got if r in want]
        return rows, leftover_files(opts), epochs_in_history(opts, job.sink_id)
    if sink == "kafka":
        records = read_topic(job.sink_options["bootstrap_servers"], job.sink_options["topic"])
        ids = [int(json.loads(r.value)["id"]) for r in records if r.value is not None]
        return ids, job.kafka_staged(), None
    from test_iceberg import iceberg_rows, orphan_files
    from test_iceberg_cdc import snapshot_epochs

    opts = job.iceberg_options()
    rows = [int(r["id"]) for r in iceberg_rows(opts)]
    return rows, orphan_files(opts), snapshot_epochs(opts, job.sink_id)


def _sql_expected(job: Job) -> list[tuple[int, str, str]]:
    """The rows (id, grp, payload) the sql sink's table must hold: every input row for
    appends; for a change stream the final state (keyed by ``grp``: each key's row of the
    largest id unless that id is a multiple of 7, a delete; keyed by ``id``: every row but
    the deleted ones)."""
    from test_sql_crash import _appended

    keys = job.sink_options.get("keys")
    if keys == ["grp"]:
        return cdc_state(job.input)
    rows = _appended(job)
    return [r for r in rows if r[0] % 7] if keys == ["id"] else rows


def make_job(
    tmp: Path,
    sink: str,
    mode: str,
    metastore: str,
    args: argparse.Namespace,
    kafka: Any,
    run: int = 0,
    target: str | None = None,
) -> Job:
    """The crash-test driver's job for ``sink``: ``rolling`` is the file sink with files that
    span epochs (a file rolls every second micro-batch: ``max_row_count`` = two input files'
    rows); ``kafka`` writes to a new 2-partition topic of the soak's broker; ``sql`` and
    ``sql-cdc`` to a table of ``target``, a new database of the soak's PostgreSQL server
    (default ``sink_id``, the one users get; ``sql-cdc`` keyed by ``grp`` in runs 0, 1, 4, 5... and
    by ``id`` in runs 2, 3, 6, 7..., so that both modes meet streams and batches)."""
    if sink in ("sql", "sql-cdc"):
        from test_sql_crash import SCHEMA, TABLE

        opts: dict[str, Any] = {
            "url": target,
            "table": TABLE,
            "create_table": True,
            "staging_schema": SCHEMA,
        }
        if sink == "sql-cdc":
            key = "grp" if run // 2 % 2 == 0 else "id"
            opts.update(mode="upsert", keys=[key], order_by="id", op_column="op")
        return Job(tmp, mode, metastore, sink_options=opts, sink="sql")
    if sink == "rolling":
        return Job(tmp, mode, metastore, sink_options={"max_row_count": 2 * args.rows})
    if sink == "kafka":
        opts = kafka_sink_options(kafka, tmp, "soak")
        return Job(tmp, mode, metastore, sink_options=opts, sink="kafka")
    if sink == "delta":
        return Job(tmp, mode, metastore, sink="delta", partition_by="grp")
    if sink == "delta-cdc":
        key = "grp" if run // 2 % 2 == 0 else "id"
        cdc = {"mode": "upsert", "keys": [key], "order_by": "id", "op_column": "op"}
        return Job(tmp, mode, metastore, sink_options=cdc, sink="delta")
    return Job(tmp, mode, metastore, sink=sink)


@dataclass
class Run:
    """What one run of :func:`one_run` gave."""

    kills: int
    in_protocol: int
    expected: list[int]
    got: list[int] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)
    misapplied: bool = False
    """The target's record of commits does not hold each epoch once, in order."""
    ok: bool = False
    """The final run finished (exit 0)."""
    log: str = ""
    moves: int = 0
    """Restarts on another machine."""


def one_run(
    tmp: Path,
    sink: str,
    mode: str,
    metastore: str,
    rng: random.Random,
    args: argparse.Namespace,
    kafka: Any = None,
    run: int = 0,
    target: str | None = None,
) -> Run:
    """One job killed up to N times then finished; a kill is *in protocol* when the sink's
    meta store rows had changed in that run when it landed (the others hit Spark's or
    Python's start-up, which proves less)."""
    job = make_job(tmp, sink, mode, metastore, args, kafka, run, target)
    job.on_machine("m0")
    moves = 0
    if sink in ("sql-cdc", "delta-cdc"):
        make_cdc_input(job.input, files=args.files, rows=args.rows)
        expected = [r[0] for r in _sql_expected(job)]
    else:
        expected = make_input(job.input, files=args.files, rows=args.rows)
    kills = in_protocol = 0
    for n in range(args.max_kills_per_run):
        if n and rng.random() < args.move_share:
            moves += 1  # the restart runs on another machine: new HOME, TMPDIR, cwd
            job.on_machine(f"m{moves}")
        before = job._state()
        if rng.random() < args.protocol_share:
            code = job.run(kill_in_protocol=rng.uniform(0.0, args.protocol_window))
        else:
            code = job.run(kill_after=rng.uniform(args.min_kill, args.max_kill))
        if code == 0:
            break  # it finished before the instant drawn
        if code != -9:
            return Run(kills, in_protocol, expected, log=job.last_log())
        kills += 1
        in_protocol += job._state() != before
    if kills and rng.random() < args.move_share:
        moves += 1
        job.on_machine(f"m{moves}")
    code = job.run()
    if code != 0:
        return Run(kills, in_protocol, expected, log=job.last_log(), moves=moves)
    got, files, at_target = _read(job, sink)
    states = epoch_states(job.metastore_url, job.sink_id)
    leftovers = files + [
        f"{s} epoch {e}" for s in ("PENDING", "ABORTED") for e in states.get(s, [])
    ]
    misapplied = at_target is not None and at_target != expected_epochs(job)
    return Run(kills, in_protocol, expected, sorted(got), leftovers, misapplied, True, moves=moves)


def soak(
    sink: str, metastore_url: str | None, args: argparse.Namespace, kafka: Any = None
) -> Tally:
    tally = Tally(sink)
    rng = random.Random(f"{args.seed}-{sink}")
    started = time.monotonic()
    while tally.kills < args.kills and (
        not args.duration or time.monotonic() - started < args.duration
    ):
        mode = "stream" if tally.runs % 2 == 0 else "batch"
        tmp = Path(tempfile.mkdtemp(prefix=f"eosink-soak-{sink}-"))
        # SQLite: each machine's own default store (under its HOME; a driver that moves to
        # another machine starts without it, as on a cluster); PostgreSQL: shared.
        metastore = metastore_url or "default"
        if metastore_url and "postgres" in metastore_url:
            from conftest import create_pg_database

            metastore = create_pg_database()
        target = None  # the sql sink's table: in a new database per run
        if sink in ("sql", "sql-cdc"):
            from conftest import create_pg_database

            target = create_pg_database()
            (tmp / "target-database.txt").write_text(target + "\n")
        r = one_run(tmp, sink, mode, metastore, rng, args, kafka, tally.runs, target)
        tally.runs += 1
        tally.kills += r.kills
        tally.in_protocol += r.in_protocol
        tally.moves += r.moves
        tally.rows += args.files * args.rows
        if not r.ok:
            tally.failed += 1
            tally.notes.append(f"run {tally.runs} ({mode}) failed, kept {tmp}:\n{r.log[-2000:]}")
        else:
            counts = collections.Counter(r.got)
            tally.lost += len(set(r.expected) - set(counts))
            tally.duplicated += sum(c - 1 for c in counts.values() if c > 1)
            tally.misapplied += r.misapplied
            tally.leftovers += len(r.leftovers)
            wrong = set(counts) != set(r.expected) or len(r.got) != len(r.expected)
            if wrong or r.misapplied or r.leftovers:
                tally.notes.append(f"run {tally.runs} ({mode}) wrong output, kept {tmp}")
            elif not args.keep:
                shutil.rmtree(tmp, ignore_errors=True)
                from conftest import drop_pg_database

                if metastore_url:
                    drop_pg_database(metastore)
                if target:
                    drop_pg_database(target)
        tally.seconds = time.monotonic() - started
        print(f"  {tally.line()}", flush=True)
    return tally


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__.split("\n")[0])
    p.add_argument("--sinks", default=",".join(SINKS), help="comma-separated: " + ",".join(SINKS))
    p.add_argument("--kills", type=int, default=200, help="kills per sink (default 200)")
    p.add_argument("--duration", type=float, default=0, help="max seconds per sink (0: none)")
    p.add_argument("--metastore", choices=["sqlite", "postgres"], default="sqlite")
    p.add_argument("--files", type=int, default=6, help="input files (= micro-batches) per run")
    p.add_argument("--rows", type=int, default=400, help="rows per input file")
    p.add_argument("--min-kill", type=float, default=1.0, help="earliest kill, s after start")
    p.add_argument("--max-kill", type=float, default=22.0, help="latest kill, s after start")
    p.add_argument(
        "--protocol-share",
        type=float,
        default=0.75,
        help="share of kills drawn from the first meta store change of the run (default 0.75)",
    )
    p.add_argument(
        "--protocol-window",
        type=float,
        default=3.0,
        help="those kills land 0..N s after that change (default 3)",
    )
    p.add_argument("--max-kills-per-run", type=int, default=4)
    p.add_argument(
        "--move-share",
        type=float,
        default=0.5,
        help="share of restarts on another machine: new HOME (so a new default SQLite meta "
        "store), TMPDIR and working directory; only the checkpoint and the target shared "
        "(default 0.5)",
    )
    p.add_argument("--seed", default="soak")
    p.add_argument("--keep", action="store_true", help="keep every run's directory")
    args = p.parse_args(argv)
    sinks = [s for s in args.sinks.split(",") if s]
    unknown = sorted(set(sinks) - set(SINKS))
    if unknown:
        p.error(f"unknown sink(s) {unknown}; known: {', '.join(SINKS)}")

    import os

    if os.environ.get("EOSINK_TEST_CDS", "1") != "0":
        from jvm import build_spark_cds_archive, spark_cds_archive_path

        archive = spark_cds_archive_path()
        if not archive.exists():
            print("building the Spark driver's class-data-sharing archive (once)", flush=True)
        if build_spark_cds_archive(archive, sys.executable):
            os.environ["EOSINK_TEST_CDS"] = str(archive)
    server = None
    broker = None
    broker_home: Path | None = None
    metastore_url = None
    if args.metastore == "postgres" or {"sql", "sql-cdc"} & set(sinks):
        from services import EmbeddedPostgres

        if not os.environ.get("EOSINK_TEST_PG"):
            server = EmbeddedPostgres()
            os.environ["EOSINK_TEST_PG"] = server.url
    if args.metastore == "postgres":
        metastore_url = os.environ["EOSINK_TEST_PG"]
    try:
        if "kafka" in sinks:
            from jvm import KafkaBroker

            print("starting a Kafka broker for the kafka sink", flush=True)
            broker_home = Path(tempfile.mkdtemp(prefix="eosink-soak-kafka-"))
            broker = KafkaBroker(broker_home)
        tallies = []
        for sink in sinks:
            print(f"soak {sink}: {args.kills} kills, meta store {args.metastore}", flush=True)
            tallies.append(soak(sink, metastore_url, args, broker))
    finally:
        if broker is not None:
            broker.stop()  # removes its own directory, inside broker_home
        if broker_home is not None:
            shutil.rmtree(broker_home, ignore_errors=True)
        if server is not None:
            server.stop()
    print("summary")
    for t in tallies:
        print(t.line())
        for note in t.notes:
            print("   ", note)
    return 0 if all(t.ok for t in tallies) else 1


if __name__ == "__main__":
    sys.exit(main())
