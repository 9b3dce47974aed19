"""The rolling section: one stream at a 1 s processing-time trigger, one input file per
trigger, into Spark's own file sink, eosink's file sink (every epoch publishes its files) and
eosink's file sink with rolling files (several epochs share a file).

Unpartitioned: Spark then writes one file per micro-batch (one task reads the batch's one
input file), eosink's rolling sink has one slot.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from ._common import (
    Data,
    Row,
    Size,
    failed_row,
    med,
    sample_load,
    split_data,
    visible_files,
)

MiB = 1024 * 1024
TRIGGER = "1 second"
ROLL_FIELDS = ("max_file_bytes", "rollover_seconds")


def file_sink_fields() -> set[str]:
    """The options the file sink has in this checkout (the harness runs before and after a
    sink gains an option)."""
    import eosink

    return set(eosink.get_sink("file").options_model.model_fields)


def missing_options(names: tuple[str, ...]) -> str | None:
    """Why the eosink side cannot run, or None."""
    missing = [n for n in names if n not in file_sink_fields()]
    if not missing:
        return None
    return f"the file sink has no option {', '.join(missing)} in this checkout"


def roll_configs(data: Data) -> tuple[dict[str, Any], dict[str, Any]]:
    """eosink's rolling options: the ratios' contender (a file a minute, at most 128 MiB)
    and one whose timer rolls during the run (every 10 s; 2 s for the short run of --quick),
    which checks the extrapolation's model of ``rollover_seconds``."""
    big = data.disk_bytes > 64 * MiB
    return {"max_file_bytes": 128 * MiB, "rollover_seconds": 60.0}, {
        "rollover_seconds": 10.0 if big else 2.0
    }


@dataclass
class RunStats:
    """One streaming run of one contender, checked after the run (untimed)."""

    wall: float = 0.0  # start of the query to stop() returned: every row visible
    busy: float = 0.0  # sum of the micro-batches' triggerExecution, plus stop()
    batches: int = 0  # micro-batches that read rows
    files: int = 0  # visible data files
    bytes: int = 0
    slots: int = 0  # directories holding visible files (1: unpartitioned)
    rows: int = 0
    id_sum: int = 0
    row_groups: int = 0
    codec: str = "?"
    writers: set[str] = field(default_factory=set)
    odd: list[str] = field(default_factory=list)  # staged leftovers, figures that disagree


def parquet_stats(root: Path, st: RunStats) -> None:
    """Files, bytes, slots, rows and the sum of ``id`` of the visible Parquet files."""
    files = visible_files(root)
    st.files = len(files)
    st.bytes = sum(p.stat().st_size for p in files)
    st.slots = len({p.parent for p in files})
    for p in files:
        md = pq.ParquetFile(p).metadata
        st.row_groups += md.num_row_groups
        if md.num_row_groups and st.codec == "?":
            st.codec = str(md.row_group(0).column(0).compression).lower()
        ids = pq.read_table(p, columns=["id"]).column("id")
        st.rows += len(ids)
        st.id_sum += sum(int(c.to_numpy().sum()) for c in ids.chunks)


def staged_leftovers(root: Path) -> list[str]:
    """Files left under the sink's staging directories after the final stop()."""
    left = [p for d in root.glob("_eosink_staging*") for p in d.rglob("*") if p.is_file()]
    if not left:
        return []
    return [f"{len(left)} staged file(s) left under _eosink_staging after stop()"]


def progress_busy(query: Any) -> tuple[float, int]:
    """Seconds of the micro-batches that read rows (Spark's triggerExecution) and their
    number, from the query's recent progress."""
    busy, n = 0.0, 0
    for p in query.recentProgress:
        if p.numInputRows and p.numInputRows > 0:
            busy += (p.durationMs or {}).get("triggerExecution", 0) / 1000
            n += 1
    return busy, n


@dataclass(frozen=True)
class Contender:
    name: str
    label: str
    rolling: dict[str, Any]  # eosink's rolling options ({} for default publishing)
    eosink: bool = True


class RollingBench:
    """The rolling section on one Spark session."""

    def __init__(
        self, spark: Any, data: Data, size: Size, tmp: Path, ms: str, log: Callable[[str], None]
    ) -> None:
        self.spark = spark
        self.size = size
        self.tmp = tmp
        self.ms = ms
        self.log = log
        self.input = split_data(data, size.rolling_batches, tmp / f"split-{size.rolling_batches}")
        self.schema = spark.read.parquet(str(self.input.path)).schema
        self.roll, self.roll_small = roll_configs(data)
        self.runs = 0

    # -- contenders ------------------------------------------------------------------------
    def contenders(self) -> list[Contender]:
        return [
            Contender("spark", 'Spark `writeStream.format("parquet")`', {}, eosink=False),
            Contender("eosink", "eosink file sink, default (every epoch publishes its files)", {}),
            Contender("eosink-rolling", f"eosink file sink, rolling {opts(self.roll)}", self.roll),
            Contender(
                "eosink-rolling-small",
                f"eosink file sink, rolling {opts(self.roll_small)} (rolls during the run)",
                self.roll_small,
            ),
        ]

    def stream(self, inp: Path) -> Any:
        return (
            self.spark.readStream.schema(self.schema)
            .option("maxFilesPerTrigger", 1)
            .parquet(str(inp))
        )

    def run_one(self, c: Contender, inp: Path, out: Path) -> RunStats:
        import eosink

        st = RunStats()
        data, chk = out / "data", out / "chk"
        t0 = time.perf_counter()
        if c.eosink:
            h = eosink.run(
                self.stream(inp),
                sink="file",
                path=str(data),
                checkpoint_location=str(chk),
                trigger={"processingTime": TRIGGER},
                metastore_url=self.ms,
                **c.rolling,
            )
            assert isinstance(h, eosink.StreamingHandle)
            try:
                h.process_all_available()
            finally:
                t1 = time.perf_counter()
                h.stop()
            st.wall = time.perf_counter() - t0
            query = h.query
            st.writers = {f.writer or "?" for f in h.figures if not f.skipped}
        else:
            q = (
                self.stream(inp)
                .writeStream.format("parquet")
                .option("path", str(data))
                .option("checkpointLocation", str(chk))
                .trigger(processingTime=TRIGGER)
                .start()
            )
            try:
                q.processAllAvailable()
            finally:
                t1 = time.perf_counter()
                q.stop()
            st.wall = time.perf_counter() - t0
            query = q
        busy, st.batches = progress_busy(query)
        st.busy = busy + (t0 + st.wall - t1)
        parquet_stats(data, st)
        if c.eosink:
            st.odd += staged_leftovers(data)
        return st

    def fresh(self, name: str) -> Path:
        self.runs += 1
        p = self.tmp / "out" / f"roll-{self.runs:04d}-{name}"
        shutil.rmtree(p, ignore_errors=True)
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def measure(self) -> tuple[list[Row], list[str]]:
        """Warm-up (``rolling_warmup`` batches each), then ``rolling_reps`` rounds,
        contenders interleaved in a rotating order; returns the ratio rows and the
        per-contender table."""
        why = missing_options(ROLL_FIELDS)
        cs = [c for c in self.contenders() if not (c.rolling and why)]
        warm = self.tmp / "rolling-warm"
        if not warm.exists():
            warm.mkdir()
            for p in sorted(self.input.path.glob("*.parquet"))[: self.size.rolling_warmup]:
                shutil.copy(p, warm / p.name)
        stats: dict[str, list[RunStats]] = {c.name: [] for c in cs}
        reps = self.size.rolling_reps
        for r in [-1, *range(reps)]:
            k = max(r, 0) % len(cs)
            for c in cs[k:] + cs[:k]:
                out = self.fresh(f"{c.name}-{r}")
                sample_load()
                st = self.run_one(c, warm if r < 0 else self.input.path, out)
                shutil.rmtree(out, ignore_errors=True)
                tag = "warm-up" if r < 0 else f"rep {r + 1}/{reps}"
                self.log(
                    f"    {tag} {c.name}: {st.wall:.1f} s wall, {st.busy:.1f} s busy, "
                    f"{st.batches} batches, {st.files} files, {st.rows:,} rows"
                    + (f"; {'; '.join(st.odd)}" if st.odd else "")
                )
                if r >= 0:
                    stats[c.name].append(st)
        return self.rows(cs, stats, why)

    # -- report ----------------------------------------------------------------------------
    def files_per_hour(self, c: Contender, st: RunStats) -> tuple[float, str]:
        """Files an hour at one micro-batch a second, and how it was extrapolated.

        Publishing every epoch: files per micro-batch x 3600. Rolling: each slot rolls when
        the first of its conditions is met: after ``rollover_seconds``, or after the epochs
        that fill ``max_file_bytes`` at this run's bytes per epoch (the files of a short run
        are mostly rolled by the final stop(), so the run's own count would flatter it)."""
        if not c.rolling:
            return st.files / st.batches * 3600, "files per micro-batch x 3600"
        slots = max(st.slots, 1)
        per_epoch = st.bytes / st.batches / slots
        periods = []
        if c.rolling.get("rollover_seconds"):
            periods.append(float(c.rolling["rollover_seconds"]))
        if c.rolling.get("max_file_bytes"):
            periods.append(float(math.ceil(c.rolling["max_file_bytes"] / per_epoch)))
        period = max(1.0, min(periods))
        return slots * 3600 / period, f"a file per slot every {period:.0f} s"

    def rows(
        self, cs: list[Contender], stats: dict[str, list[RunStats]], why: str | None
    ) -> tuple[list[Row], list[str]]:
        n = self.input.rows
        want = n * (n - 1) // 2
        bad = {
            name: [s for s in sts if s.rows != n or s.id_sum != want] for name, sts in stats.items()
        }
        table = [
            "| contender | writer, codec | files in the run (median) | MB per file (mean), row "
            "groups per file | files per "
            "hour at the 1 s trigger | rows/s, wall (median, range) | rows/s, busy (median, "
            "range) | rows check |",
            "|---|---|---|---|---|---|---|---|",
        ]
        fph: dict[str, list[float]] = {}
        for c in cs:
            sts = stats[c.name]
            fph[c.name] = [self.files_per_hour(c, s)[0] for s in sts]
            how = self.files_per_hour(c, sts[0])[1]
            walls = sorted(n / s.wall for s in sts)
            busys = sorted(n / s.busy for s in sts)
            check = (
                f"{n:,} rows, ids exact, {med([s.batches for s in sts]):.0f} batches"
                if not bad[c.name]
                else f"**wrong**: {', '.join(f'{s.rows:,}' for s in bad[c.name])} rows"
            )
            odd = sorted({o for s in sts for o in s.odd})
            if odd:
                check += "; **" + "; ".join(odd) + "**"
            writers = "/".join(sorted({w for s in sts for w in s.writers})) or "-"
            writers += ", " + "/".join(sorted({s.codec for s in sts}))
            table.append(
                f"| {c.label} | {writers} | {med([s.files for s in sts]):.0f} | "
                f"{med([s.bytes / s.files / 1e6 for s in sts if s.files]):.2f}, "
                f"{med([s.row_groups / s.files for s in sts if s.files]):.0f} | "
                f"{med(fph[c.name]):,.0f} ({how}) | {med([n / s.wall for s in sts]):,.0f} "
                f"({walls[0]:,.0f}-{walls[-1]:,.0f}) | {med([n / s.busy for s in sts]):,.0f} "
                f"({busys[0]:,.0f}-{busys[-1]:,.0f}) | {check} |"
            )
        out: list[Row] = []
        spark = stats["spark"]
        head = f"rolling, 1 s trigger, {med([s.batches for s in spark]):.0f} micro-batches"
        for name, label, target_files in (
            ("eosink-rolling", f"eosink rolling {opts(self.roll)}", 50.0),
            ("eosink-rolling-small", f"eosink rolling {opts(self.roll_small)}", None),
            ("eosink", "eosink default", None),
        ):
            m_files = f"{head}: files per hour, Spark / {label}"
            m_wall = f"{head}: throughput (wall), {label} / Spark"
            m_busy = f"{head}: throughput (busy), {label} / Spark"
            tgt = 0.9 if target_files else None
            if name not in stats:
                out += [
                    failed_row(m, t, why or "not run")
                    for m, t in ((m_files, target_files), (m_wall, tgt), (m_busy, tgt))
                ]
                continue
            if bad[name] or bad["spark"]:
                who = name if bad[name] else "spark"
                w = f"{who} wrote {bad[who][0].rows:,} rows (ids sum {bad[who][0].id_sum}) of {n:,}"
                out += [
                    failed_row(m, t, w)
                    for m, t in ((m_files, target_files), (m_wall, tgt), (m_busy, tgt))
                ]
                continue
            eos = stats[name]
            out.append(
                ratio_row(
                    m_files,
                    fph["spark"],
                    fph[name],
                    target_files,
                    lambda xs, ss: (
                        f"{med(xs):,.0f} files/h ({med([s.files for s in ss]):.0f} in the run)"
                    ),
                    eos,
                    spark,
                )
            )
            for m, attr in ((m_wall, "wall"), (m_busy, "busy")):
                out.append(
                    ratio_row(
                        m,
                        [getattr(s, attr) for s in spark],
                        [getattr(s, attr) for s in eos],
                        tgt,
                        lambda xs, ss: f"{n / med(xs):,.0f} rows/s, {med(xs):.1f} s",
                        eos,
                        spark,
                    )
                )
        return out, table


def opts(d: dict[str, Any]) -> str:
    def v(k: str, x: Any) -> str:
        if k.endswith("_bytes"):
            return f"{x / MiB:g} MiB"
        if k.endswith("_seconds"):
            return f"{x:g} s"
        return str(x)

    return ", ".join(f"`{k}`={v(k, x)}" for k, x in d.items())


def ratio_row(
    measure: str,
    num: list[float],
    den: list[float],
    target: float | None,
    fig: Callable[[list[float], list[RunStats]], str],
    eos: list[RunStats],
    peer: list[RunStats],
) -> Row:
    """Ratio median(num) / median(den) with the range of the per-repetition ratios; for
    times, num is the peer's and den eosink's (throughput eosink / peer)."""
    ratio = med(num) / med(den)
    pairs = sorted(a / b for a, b in zip(num, den, strict=False))
    spread = f" ({pairs[0]:.2f}-{pairs[-1]:.2f})" if len(pairs) > 1 else ""
    return Row(
        measure,
        fig(den, eos),
        fig(num, peer),
        f"{ratio:.2f}{spread}",
        f">= {target:g}" if target is not None else "info",
        ("yes" if ratio >= target else "**no**") if target is not None else "-",
        "rolling",
    )
