"""The protocol's cost at scale (issue 24): ``python -m bench.scale``.

* **tasks**: one batch epoch of the file sink written by 10, 100 and 1,000 Spark tasks (a
  DataFrame of that many partitions, ``writer="python"``: one staged file per task): the
  driver's ``pre_commit``, persist and commit times, and the committable's size in the meta
  store. Target: linear growth, under 1 s for 1,000 results.
* **epochs**: N empty epochs of one stream through the code a micro-batch runs (the
  ``protocol`` part's loop, SQLite meta store, checkpoint journal): p50 per window of the
  run, and the meta store's size at the end. Target: flat cost, store under 10 MB after
  100,000 epochs.

Prints one table; record the figures in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from ._common import med, pct
from ._protocol import protocol_cost


def _committable_bytes(url: str, sink_id: str, epoch: int) -> int | None:
    import sqlalchemy as sa

    eng = sa.create_engine(url)
    try:
        with eng.connect() as c:
            n = c.execute(
                sa.text(
                    "select length(committable) from pending_sink_state "
                    "where sink_id = :s and epoch = :e"
                ),
                {"s": sink_id, "e": epoch},
            ).scalar()
    finally:
        eng.dispose()
    return None if n is None else int(n)


def tasks_part(tmp: Path, counts: list[int], reps: int) -> list[str]:
    import eosink

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = eosink.spark_session("local[2]")
    spark.sparkContext.setLogLevel("ERROR")
    url = f"sqlite:///{tmp / 'tasks.db'}"
    lines = [
        "| tasks (staged files) | pre_commit ms | persist ms | commit ms | committable bytes "
        "| bytes per result | write s |",
        "|---|---|---|---|---|---|---|",
    ]
    try:
        for n in counts:
            figs = []
            size = None
            for r in range(reps + 1):
                out = tmp / f"tasks-{n}-{r}"
                df = spark.range(0, n * 10, numPartitions=n)
                res = eosink.run(
                    df, sink="file", path=str(out), epoch=1, metastore_url=url, writer="python"
                )
                f = res.figures
                assert f is not None and f.files == n, (n, f)
                size = _committable_bytes(url, res.sink_id, 1) or size
                if r:  # the first run warms up
                    figs.append(f)
                shutil.rmtree(out, ignore_errors=True)
            pre = med([f.pre_commit_ms for f in figs])
            per = med([f.persist_ms for f in figs])
            com = med([f.commit_ms for f in figs])
            wr = med([f.write_s for f in figs])
            per_result = f"{size / n:.0f}" if size else "-"
            lines.append(
                f"| {n:,} | {pre:.1f} | {per:.1f} | {com:.1f} | {size or '-'} | {per_result} "
                f"| {wr:.2f} |"
            )
            print(lines[-1], flush=True)
    finally:
        spark.stop()
    return lines


def epochs_part(tmp: Path, epochs: int) -> list[str]:
    db = tmp / "epochs.db"
    url = f"sqlite:///{db}"
    t0 = time.perf_counter()
    costs = protocol_cost(url, "scale", epochs, tmp)
    took = time.perf_counter() - t0
    wal_path = db.with_name(db.name + "-wal")
    wal = wal_path.stat().st_size if wal_path.exists() else 0
    windows = 10
    size = max(1, epochs // windows)
    lines = [
        f"{epochs:,} epochs in {took:.0f} s; meta store {db.stat().st_size / 1e6:.2f} MB "
        f"(SQLite file) + {wal / 1e6:.2f} MB write-ahead log; p99 of all "
        f"{pct(costs, 0.99):.2f} ms",
        "",
        "| epochs | p50 ms | p99 ms |",
        "|---|---|---|",
    ]
    for w in range(windows):
        c = costs[w * size : (w + 1) * size]
        if c:
            lines.append(
                f"| {w * size:,}-{w * size + len(c) - 1:,} | {med(c):.2f} | {pct(c, 0.99):.2f} |"
            )
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=["tasks", "epochs"], help="one part (default both)")
    ap.add_argument("--tasks", default="10,100,1000", help="task counts of the tasks part")
    ap.add_argument("--reps", type=int, default=3, help="runs per task count (after a warm-up)")
    ap.add_argument("--epochs", type=int, default=100_000, help="epochs of the epochs part")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="eosink-scale-"))
    try:
        if a.only in (None, "tasks"):
            print("## One epoch written by many tasks (file sink, Python writers)\n", flush=True)
            lines = tasks_part(tmp, [int(x) for x in a.tasks.split(",")], a.reps)
            print("\n" + "\n".join(lines) + "\n", flush=True)
        if a.only in (None, "epochs"):
            print(f"## {a.epochs:,} epochs of one sink (SQLite meta store)\n", flush=True)
            print("\n".join(epochs_part(tmp, a.epochs)) + "\n", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
