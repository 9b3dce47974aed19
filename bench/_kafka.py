"""The Kafka section: Kafka -> Spark -> Kafka at a 1 s trigger, three sinks.

The users' pipeline: Spark's Kafka source (``spark.readStream.format("kafka")``, the
connector ``tests/jvm.py: spark_kafka_coordinates()`` from Maven Central, ``read_committed``) into

* ``spark``: Spark's built-in at-least-once sink, ``writeStream.format("kafka")``;
* ``naive``: ``foreachBatch`` in which ``df.foreachPartition`` sends each partition's rows
  with a plain confluent-kafka ``Producer`` (what users write; at-least-once);
* ``eosink``: ``eosink.run(sdf, sink="kafka", ...)``, exactly once (transactions).

Two measures, on a real single-node Apache Kafka started for the part (``KafkaBroker``):

* **throughput**: a source topic filled once with the same records (1 KB values, a key),
  read from the earliest offset by every run, ``maxOffsetsPerTrigger`` per micro-batch; wall
  time from the start of the query until every record is visible (``processAllAvailable``;
  eosink's handle waits for the epochs' commits); a fresh output topic and checkpoint each
  run, every run's output read back afterwards (untimed) with a ``read_committed``
  consumer: records, distinct records, duplicates.
* **end-to-end latency**: a load process produces records at a steady rate into a fresh
  source topic while the query runs, the production time in each value; its
  ``read_committed`` consumer on the output topic records arrival minus production.

The parent (``kafka_rows``, in the ``python -m bench`` process) starts the broker and runs
the Spark side in a driver subprocess (``python -m bench._kafka driver ...``): the
connector's jars must be on a new SparkContext's classpath. The load process is a third
process (``python -m bench._kafka load ...``), so its producer and consumer share no
interpreter with the sinks.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ._common import LOAD, Row, failed_row, failure, load_note, pct, sample_load

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Kafka"
TRIGGER = "1 second"
VALUE_BYTES = 1024
PARTITIONS = 2
LEGS = ("spark", "naive", "eosink")
LABELS = {
    "spark": 'Spark `writeStream.format("kafka")` (at-least-once)',
    "naive": "naive `foreachBatch` + confluent-kafka `Producer` (at-least-once)",
    "eosink": 'eosink `sink="kafka"` (exactly once)',
}
RATIO = 'Kafka -> Kafka stream, 1 s trigger: eosink / max(Spark `format("kafka")`, naive)'
TARGET = 0.7


@dataclass(frozen=True)
class KafkaSize:
    records: int  # the throughput source topic
    per_trigger: int  # maxOffsetsPerTrigger of the throughput runs
    warmup: int  # records of the warm-up topic
    reps: int
    rate: int  # records/s the latency load produces
    seconds: float  # how long it produces (measured)
    warm: float  # how long it produces before (not measured)
    timeout: float  # the driver subprocess's limit


FULL = KafkaSize(200_000, 50_000, 20_000, 5, 1_000, 20.0, 5.0, 900.0)
QUICK = KafkaSize(20_000, 5_000, 5_000, 1, 500, 6.0, 3.0, 300.0)


def log_default(msg: str) -> None:
    print(msg, flush=True)


def make_value(seq: int, t_ns: int = 0) -> bytes:
    """A 1 KB value: production time (ns, 19 digits), sequence number, padding."""
    head = f"{t_ns:019d}|{seq:010d}|".encode()
    return head + b"x" * (VALUE_BYTES - len(head))


def parse_value(v: bytes) -> tuple[int, int]:  # a ValueError for a foreign value
    """(production time ns, sequence number) of a :func:`make_value` value."""
    return int(v[:19]), int(v[20:30])


# ---------------------------------------------------------------------------------------
# Kafka helpers (confluent-kafka)
# ---------------------------------------------------------------------------------------
def create_topics(bootstrap: str, *names: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    fs = admin.create_topics(
        [NewTopic(n, num_partitions=PARTITIONS, replication_factor=1) for n in names]
    )
    for f in fs.values():
        f.result(timeout=60)


def delete_topics(bootstrap: str, prefix: str) -> None:
    """Delete the topics whose name starts with ``prefix`` (frees the broker's disk)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    names = [t for t in admin.list_topics(timeout=30).topics if t.startswith(prefix)]
    if names:
        for f in admin.delete_topics(names, operation_timeout=30).values():
            try:
                f.result(timeout=60)
            except Exception:
                pass


def fill(bootstrap: str, topic: str, n: int) -> None:
    """``n`` records into ``topic`` (keys ``k0``..``k99``, values numbered 0..n-1)."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "acks": "all"})
    for i in range(n):
        while True:
            try:
                p.produce(topic, make_value(i), key=f"k{i % 100}".encode())
                break
            except BufferError:
                p.poll(0.05)
    if p.flush(120):
        raise RuntimeError(f"could not fill {topic}")


def read_back(bootstrap: str, topic: str, timeout: float = 120) -> dict[str, int]:
    """Read ``topic`` to its end with ``read_committed``: records, distinct sequence
    numbers."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    seen: set[int] = set()
    records = 0
    done: set[int] = set()
    deadline = time.monotonic() + timeout
    try:
        while len(done) < PARTITIONS and time.monotonic() < deadline:
            for m in c.consume(10_000, 1.0):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        done.add(m.partition() or 0)
                        continue
                    raise RuntimeError(str(err))
                records += 1
                seen.add(parse_value(m.value() or b"")[1])
    finally:
        c.close()
    return {"records": records, "distinct": len(seen), "complete": int(len(done) == PARTITIONS)}


# ---------------------------------------------------------------------------------------
# The load process: steady production into the source, read_committed arrival times
# ---------------------------------------------------------------------------------------
def load(
    bootstrap: str, src: str, dst: str, rate: int, seconds: float, warm: float, result: Path
) -> None:
    """Produce ``rate`` records/s into ``src`` for ``warm + seconds``; record the
    ``read_committed`` arrival in ``dst`` of those produced after the first ``warm``
    seconds (the query's first batches with data compile and connect)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"lat-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 20,
        }
    )
    c.assign([TopicPartition(dst, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    c.consume(1, 0.5)  # connected
    total = int(rate * (seconds + warm))
    first = int(rate * warm)
    lat: dict[int, float] = {}
    dups = 0

    def produce() -> None:
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1})
        tick = 0.01
        per_tick = rate * tick
        start = time.monotonic()
        sent = 0
        while sent < total:
            due = min(total, int((time.monotonic() - start) / tick * per_tick) + 1)
            while sent < due:
                p.produce(src, make_value(sent, time.time_ns()), key=f"k{sent % 100}".encode())
                sent += 1
            p.poll(0)
            time.sleep(tick / 2)
        p.flush(60)

    t = threading.Thread(target=produce)
    t.start()
    deadline = time.monotonic() + seconds + 60
    while len(lat) < total and time.monotonic() < deadline + warm:
        for m in c.consume(10_000, 0.02):
            now = time.time_ns()
            if m.error() is not None:
                continue
            t_ns, seq = parse_value(m.value() or b"")
            if seq in lat:
                dups += 1
            elif seq >= first:
                lat[seq] = (now - t_ns) / 1e6
            else:
                lat[seq] = -1.0  # warm-up
    t.join()
    c.close()
    ms = sorted(v for v in lat.values() if v >= 0)
    result.write_text(json.dumps({"ms": ms, "sent": total - first, "dups": dups}))


# ---------------------------------------------------------------------------------------
# The driver subprocess: the three sinks on one Spark session with the connector
# ---------------------------------------------------------------------------------------
@dataclass
class Run:
    wall: float = 0.0
    batches: int = 0
    records: int = 0
    distinct: int = 0


class Driver:
    def __init__(self, bootstrap: str, tmp: Path, size: KafkaSize, conf: dict[str, str]) -> None:
        import eosink

        self.bootstrap = bootstrap
        self.tmp = tmp
        self.size = size
        self.ms = f"sqlite:///{tmp / 'metastore.db'}"
        self.spark = eosink.spark_session(
            "local[2]",
            app_name="eosink-bench-kafka",
            spark__driver__memory="2g",
            **{k.replace(".", "__"): v for k, v in conf.items()},
        )
        self.n = 0

    def source(self, topic: str, per_trigger: int | None) -> Any:
        r = (
            self.spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", self.bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("kafka.isolation.level", "read_committed")
        )
        if per_trigger:
            r = r.option("maxOffsetsPerTrigger", per_trigger)
        return r.load().select("key", "value")

    def start(self, leg: str, sdf: Any, out: str, chk: Path) -> tuple[Any, Callable[[], None]]:
        """Start ``leg`` writing ``sdf`` to topic ``out``: (the Spark query, the call that
        returns once everything available is processed and visible)."""
        bootstrap = self.bootstrap
        if leg == "eosink":
            import eosink

            h = eosink.run(
                sdf,
                sink="kafka",
                bootstrap_servers=bootstrap,
                topic=out,
                checkpoint_location=str(chk),
                trigger={"processingTime": TRIGGER},
                metastore_url=self.ms,
                staging_path=str(chk.parent / "staging"),
            )
            assert isinstance(h, eosink.StreamingHandle)
            return h, h.process_all_available
        if leg == "spark":
            q = (
                sdf.writeStream.format("kafka")
                .option("kafka.bootstrap.servers", bootstrap)
                .option("topic", out)
                .option("checkpointLocation", str(chk))
                .trigger(processingTime=TRIGGER)
                .start()
            )
            return q, q.processAllAvailable

        def send(rows: Any) -> None:
            from confluent_kafka import Producer

            p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
            for r in rows:
                while True:
                    try:
                        p.produce(out, r.value, key=r.key)
                        break
                    except BufferError:
                        p.poll(0.05)
            if p.flush(120):
                raise RuntimeError("records not delivered")

        q = (
            sdf.writeStream.foreachBatch(lambda df, _: df.foreachPartition(send))
            .option("checkpointLocation", str(chk))
            .trigger(processingTime=TRIGGER)
            .start()
        )
        return q, q.processAllAvailable

    def fresh(self, name: str) -> tuple[str, Path]:
        self.n += 1
        chk = self.tmp / f"run-{self.n:03d}-{name}" / "chk"
        chk.parent.mkdir(parents=True)
        return f"out-{self.n:03d}-{name}", chk

    def throughput(self, leg: str, src: str, per_trigger: int) -> Run:
        out, chk = self.fresh(leg)
        create_topics(self.bootstrap, out)
        sample_load()
        t0 = time.perf_counter()
        q, drain = self.start(leg, self.source(src, per_trigger), out, chk)
        try:
            drain()
            wall = time.perf_counter() - t0
        finally:
            q.stop()
        query = getattr(q, "query", q)
        run = Run(wall=wall)
        run.batches = sum(1 for p in query.recentProgress if p.numInputRows)
        got = read_back(self.bootstrap, out)
        run.records, run.distinct = got["records"], got["distinct"]
        delete_topics(self.bootstrap, out)
        shutil.rmtree(chk.parent, ignore_errors=True)
        return run

    def latency(self, leg: str) -> dict[str, Any]:
        out, chk = self.fresh(f"lat-{leg}")
        src = f"lat-src-{self.n:03d}"
        create_topics(self.bootstrap, src, out)
        q, _ = self.start(leg, self.source(src, None), out, chk)
        query = getattr(q, "query", q)
        try:
            deadline = time.monotonic() + 60
            while query.lastProgress is None and time.monotonic() < deadline:
                time.sleep(0.1)  # the first (empty) micro-batch ran: the query is up
            result = chk.parent / "latency.json"
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "bench._kafka",
                    "load",
                    self.bootstrap,
                    src,
                    out,
                    str(self.size.rate),
                    str(self.size.seconds),
                    str(self.size.warm),
                    str(result),
                ],
                cwd=ROOT,
                timeout=self.size.seconds + self.size.warm + 180,
                capture_output=True,
                text=True,
            )
            if proc.returncode != 0:
                raise RuntimeError(f"load process exited {proc.returncode}: {proc.stderr[-500:]}")
            got = json.loads(result.read_text())
        finally:
            q.stop()
        ms = got["ms"]
        delete_topics(self.bootstrap, src)
        delete_topics(self.bootstrap, out)
        shutil.rmtree(chk.parent, ignore_errors=True)
        return {
            "n": len(ms),
            "sent": got["sent"],
            "dups": got["dups"],
            "p50": pct(ms, 0.5) if ms else None,
            "p99": pct(ms, 0.99) if ms else None,
            "max": ms[-1] if ms else None,
        }


def driver_main(bootstrap: str, tmp: Path, quick: bool, conf: dict[str, str], out: Path) -> None:
    size = QUICK if quick else FULL
    res: dict[str, Any] = {"throughput": {}, "latency": {}, "errors": {}}

    def say(msg: str) -> None:
        print(msg, flush=True)

    def save() -> None:
        res["load"] = load_note()
        res["load_median"] = statistics.median(LOAD) if LOAD else 0.0
        out.write_text(json.dumps(res))

    t0 = time.perf_counter()
    src, warm = "src", "warm"
    create_topics(bootstrap, src, warm)
    fill(bootstrap, src, size.records)
    fill(bootstrap, warm, size.warmup)
    say(
        f"  filled topic {src} with {size.records:,} records of {VALUE_BYTES} B in "
        f"{time.perf_counter() - t0:.1f} s"
    )
    d = Driver(bootstrap, tmp, size, conf)
    import pyspark

    res["versions"] = {"pyspark": pyspark.__version__}
    legs = list(LEGS)
    runs: dict[str, list[dict[str, Any]]] = {leg: [] for leg in legs}
    res["throughput"] = runs
    for r in [-1, *range(size.reps)]:
        k = max(r, 0) % len(legs)
        for leg in legs[k:] + legs[:k]:
            if leg in res["errors"]:
                continue
            tag = "warm-up" if r < 0 else f"rep {r + 1}/{size.reps}"
            try:
                if r < 0:
                    run = d.throughput(leg, warm, size.warmup // 2)
                else:
                    run = d.throughput(leg, src, size.per_trigger)
                    runs[leg].append(asdict(run))
            except Exception as exc:
                res["errors"][leg] = failure(exc)
                say(f"    {tag} {leg}: FAILED {res['errors'][leg]}")
                continue
            say(
                f"    {tag} {leg}: {run.wall:.2f} s, {run.batches} batches, "
                f"{run.records:,} records read back ({run.distinct:,} distinct)"
            )
            save()
    for leg in legs:
        if leg in res["errors"]:
            continue
        try:
            lat = d.latency(leg)
        except Exception as exc:
            res["errors"][f"latency-{leg}"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            say(f"    latency {leg}: FAILED {res['errors'][f'latency-{leg}']}")
            continue
        res["latency"][leg] = lat
        say(
            f"    latency {leg}: p50 {lat['p50']:.0f} ms, p99 {lat['p99']:.0f} ms, "
            f"max {lat['max']:.0f} ms ({lat['n']:,} of {lat['sent']:,} records, "
            f"{lat['dups']} duplicates)"
        )
        save()
    d.spark.stop()
    save()


# ---------------------------------------------------------------------------------------
# The parent: broker, driver subprocess, rows and the report's section
# ---------------------------------------------------------------------------------------
def versions() -> dict[str, str]:
    sys.path.insert(0, str(ROOT / "tests"))
    import importlib.metadata as md

    import confluent_kafka
    from jvm import KAFKA_VERSION, spark_kafka_coordinates

    return {
        "broker": f"Apache Kafka {KAFKA_VERSION} (KRaft, one node)",
        "connector": spark_kafka_coordinates(),
        "confluent-kafka": f"{md.version('confluent-kafka')} (librdkafka "
        f"{confluent_kafka.libversion()[0]})",
    }


def run_driver(quick: bool, tmp: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """Start the broker, run the driver subprocess, return its JSON result."""
    sys.path.insert(0, str(ROOT / "tests"))
    from jvm import KafkaBroker, spark_kafka_conf

    size = QUICK if quick else FULL
    t0 = time.perf_counter()
    conf = spark_kafka_conf()
    log(f"  connector jars ready in {time.perf_counter() - t0:.1f} s")
    work = tmp / "kafka"
    work.mkdir(parents=True, exist_ok=True)
    broker = KafkaBroker(work, heap="1g")
    # The test broker fsyncs every append (log.flush.interval.messages=1): a producer
    # sending small batches (Spark's Java producer: linger.ms=0) then waits for the disk at
    # every one of them. Production brokers leave flushing to the OS (Kafka's default):
    # restart this one so.
    broker.kill()
    conf_text = broker.config.read_text()
    broker.config.write_text(conf_text.replace("log.flush.interval.messages=1\n", ""))
    broker.start()
    log(f"  broker at {broker.bootstrap} (flushing left to the OS)")
    out = work / "result.json"
    logfile = work / "driver.log"
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_SUBMIT_ARGS"}
    env.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    env["PYTHONUNBUFFERED"] = "1"
    cmd = [
        sys.executable,
        "-m",
        "bench._kafka",
        "driver",
        broker.bootstrap,
        str(work / "driver"),
        "quick" if quick else "full",
        json.dumps(conf),
        str(out),
    ]
    try:
        with open(logfile, "w") as lf:
            proc = subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=lf, text=True
            )
            watchdog = threading.Timer(size.timeout, proc.kill)
            watchdog.start()
            try:
                assert proc.stdout is not None
                for line in proc.stdout:
                    log(line.rstrip())
                rc = proc.wait()
            finally:
                watchdog.cancel()
    finally:
        broker.stop()
    res: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    if rc != 0:
        tail = " | ".join(logfile.read_text().strip().splitlines()[-8:])
        why = "took too long" if rc == -9 else f"exited {rc}"
        res.setdefault("errors", {})["driver"] = f"the driver subprocess {why}: {tail[-600:]}"
    res["versions"] = {**res.get("versions", {}), **versions()}
    return res


def _rate(run_walls: list[float], records: int) -> str:
    w = statistics.median(run_walls)
    mb = records * VALUE_BYTES / w / 1e6
    return f"{records / w / 1000:.1f}k records/s, {mb:.1f} MB/s, {w:.2f} s"


def kafka_rows(
    quick: bool, tmp: Path, log: Callable[[str], None]
) -> tuple[list[Row], list[str], dict[str, Any]]:
    """The section's rows (section ``kafka``), its per-leg table, the raw result."""
    size = QUICK if quick else FULL
    res = run_driver(quick, tmp, log)
    errors: dict[str, str] = res.get("errors", {})
    tp: dict[str, list[dict[str, Any]]] = res.get("throughput", {})
    walls = {leg: [r["wall"] for r in tp.get(leg, [])] for leg in LEGS}
    rows: list[Row] = []
    peers = [leg for leg in ("spark", "naive") if walls[leg]]
    if walls["eosink"] and peers:
        best = min(peers, key=lambda leg: statistics.median(walls[leg]))
        ratio = statistics.median(walls[best]) / statistics.median(walls["eosink"])
        pairs = sorted(p / e for p, e in zip(walls[best], walls["eosink"], strict=False))
        spread = f" ({pairs[0]:.2f}-{pairs[-1]:.2f})" if len(pairs) > 1 else ""
        rows.append(
            Row(
                RATIO,
                _rate(walls["eosink"], size.records),
                f"{_rate(walls[best], size.records)} ({best}: {LABELS[best]})",
                f"{ratio:.2f}{spread}",
                f">= {TARGET:g}",
                "yes" if ratio >= TARGET else "**no**",
                "kafka",
            )
        )
    else:
        why = "; ".join(f"{k}: {v}" for k, v in errors.items()) or "no measurement"
        row = failed_row(RATIO, TARGET, why)
        row.section = "kafka"
        rows.append(row)
    lat = res.get("latency", {})
    for leg in LEGS:
        if leg in lat and lat[leg]["p50"] is not None:
            x = lat[leg]
            rows.append(
                Row(
                    f"end-to-end latency p50 / p99, {LABELS[leg]}",
                    f"{x['p50']:.0f} ms / {x['p99']:.0f} ms",
                    "-",
                    f"max {x['max']:.0f} ms; {x['n']:,} of {x['sent']:,} records",
                    section="kafka",
                )
            )
    table = [
        "| sink | throughput (median) | runs (s) | records read back per run | "
        "latency p50 | p99 | max |",
        "|---|---|---|---|---|---|---|",
    ]
    for leg in LEGS:
        runs = tp.get(leg, [])
        err = errors.get(leg) or errors.get(f"latency-{leg}")
        x = lat.get(leg)
        back = ", ".join(
            f"{r['records']:,}"
            + (f" ({r['records'] - r['distinct']:,} dup.)" if r["records"] != r["distinct"] else "")
            for r in runs
        )
        tput = _rate(walls[leg], size.records) if runs else f"failed: {err}"
        secs = ", ".join(f"{r['wall']:.2f}" for r in runs) or "-"
        if x and x["p50"] is not None:
            lat_cells = f"{x['p50']:.0f} ms | {x['p99']:.0f} ms | {x['max']:.0f} ms"
        else:
            lat_cells = f"{'failed: ' + str(err) if err else '-'} | - | -"
        table.append(f"| {LABELS[leg]} | {tput} | {secs} | {back or '-'} | {lat_cells} |")
    return rows, table, res


def section_lines(
    rows: list[Row],
    table: list[str],
    res: dict[str, Any],
    quick: bool,
    took: float | None,
    facts: dict[str, str] | None,
    table_line: Callable[[Row], str],
) -> list[str]:
    size = QUICK if quick else FULL
    v = res.get("versions", {})
    mine = [r for r in rows if r.section == "kafka"]
    busy = res.get("load_median", 0.0) > (os.cpu_count() or 1)
    lines = [SECTION, ""]
    if took is not None and facts is not None:
        lines += [
            f"Measured on {time.strftime('%Y-%m-%d %H:%M %Z')} by `.venv/bin/python -m bench "
            f"--only kafka{' --quick' if quick else ''} --splice` (this section alone, "
            f"{took / 60:.1f} min; same machine as above), eosink {facts['eosink']}, pyspark "
            f"{facts['pyspark']}"
            + (" (`--quick`: a smoke run, not figures to quote)" if quick else "")
            + f"; {res.get('load', 'load not sampled')}"
            + (" (above the core count: other work shared the machine)." if busy else "."),
            "",
        ]
    lines += [
        f"{v.get('broker', 'Apache Kafka')} on 127.0.0.1, Spark's Kafka connector "
        f"`{v.get('connector', '?')}` (Maven Central has none for pyspark "
        f"{v.get('pyspark', '?')}; 4.2's works with it), confluent-kafka "
        f"{v.get('confluent-kafka', '?')}.",
        "",
        "| measure | eosink | peer | ratio | target | met |",
        "|---|---|---|---|---|---|",
        *[table_line(r) for r in mine],
        "",
        *table,
        "",
        "What these rows measure:",
        "",
        "* **the pipeline**: Kafka -> Spark -> Kafka. The source is Spark's Kafka source, "
        '`spark.readStream.format("kafka")` (`subscribe`, `startingOffsets=earliest`, '
        "`kafka.isolation.level=read_committed`), selecting `key` and `value`, at a "
        f'`processingTime="{TRIGGER}"` trigger, `local[2]`, driver memory 2g. Topics have '
        f"{PARTITIONS} partitions. Records: {VALUE_BYTES} B values (production time, "
        "sequence number, padding), string keys `k0`..`k99`. The three sinks: Spark's "
        'built-in `writeStream.format("kafka")` (`kafka.bootstrap.servers`, `topic`; Java '
        "producer defaults), a naive `foreachBatch(lambda df, _: df.foreachPartition(send))` "
        "where `send` produces each row with a confluent-kafka `Producer` (`linger.ms=5`) "
        "and flushes (both at-least-once: a crash between the write and Spark's checkpoint "
        'writes the batch again), and `eosink.run(sdf, sink="kafka", bootstrap_servers=..., '
        "topic=..., checkpoint_location=..., trigger=...)` with default options (staged "
        "epochs published by transactions after the checkpoint; a SQLite meta store).",
        f"* **throughput**: a topic filled once with {size.records:,} records, read from "
        f"its start by every run with `maxOffsetsPerTrigger={size.per_trigger:,}`; wall "
        "time from the start of the query to `processAllAvailable` returning (eosink's "
        "handle: every epoch committed, so every record visible), a fresh output topic and "
        f"checkpoint each run; {size.reps} repetitions after a warm-up run of each sink "
        f"({size.warmup:,} records), sinks interleaved in a rotating order; ratio: median "
        "wall of the faster peer / median wall of eosink. Every run's output is read back "
        "afterwards (untimed) by a `read_committed` consumer (records and distinct "
        "sequence numbers).",
        f"* **end-to-end latency**: per sink, a fresh source topic; once the query runs, a "
        f"separate process produces {size.rate:,} records/s for {size.seconds:.0f} s, each "
        "value carrying its production time (`time.time_ns()` just before `produce`), and "
        "its `read_committed` consumer (`fetch.wait.max.ms=20`) of the output topic records "
        "arrival minus production per record: what a downstream exactly-once reader sees. "
        f"Records of the first {size.warm:.0f} s are produced but not measured (the "
        "query's first batches with data compile and connect). Includes waiting for the "
        "next trigger (up to 1 s).",
        "* **the broker**: `tests/jvm.py` `KafkaBroker` (heap 1 GiB), restarted without the "
        "test setting `log.flush.interval.messages=1` (an fsync at every append, which "
        "makes Spark's Java producer, `linger.ms=0` by default, wait for the disk at every "
        "small batch: a median of 43 s against 6 s a run in a trial) so that flushing is "
        "left to the OS, as in Kafka's defaults. It shares the 2 cores with Spark and the "
        "load process.",
        "",
    ]
    return lines


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench._kafka")
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("driver")
    d.add_argument("bootstrap")
    d.add_argument("tmp")
    d.add_argument("size", choices=["quick", "full"])
    d.add_argument("conf")
    d.add_argument("out")
    ld = sub.add_parser("load")
    ld.add_argument("bootstrap")
    ld.add_argument("src")
    ld.add_argument("dst")
    ld.add_argument("rate", type=int)
    ld.add_argument("seconds", type=float)
    ld.add_argument("warm", type=float)
    ld.add_argument("result")
    a = ap.parse_args(argv)
    if a.cmd == "driver":
        tmp = Path(a.tmp)
        tmp.mkdir(parents=True, exist_ok=True)
        driver_main(a.bootstrap, tmp, a.size == "quick", json.loads(a.conf), Path(a.out))
    else:
        load(a.bootstrap, a.src, a.dst, a.rate, a.seconds, a.warm, Path(a.result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
