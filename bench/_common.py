"""What every part of the benchmark shares: the data, timing, interleaving and result rows.

Imported by the main run and by ``bench/iceberg_runtime.py`` inside the pyspark 4.0
environment, so it needs nothing but pyarrow and the standard library.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

COUNTRIES = ["fr", "de", "us", "jp", "br", "in", "ng", "au"]  # the low-cardinality column


@dataclass(frozen=True)
class Size:
    """The benchmark's size: input files, rows per file, repetitions."""

    files: int
    rows_per_file: int
    reps: int
    files_per_trigger: int = 2
    protocol_epochs: int = 10_000
    lag_triggers: int = 8
    rolling_batches: int = 48  # micro-batches of the rolling and S3 streams (the input re-split)
    rolling_reps: int = 5  # repetitions of the rolling streams (each takes ~1 s a batch)
    rolling_warmup: int = 12  # micro-batches of each contender's warm-up stream
    s3_stream_batches: int = 16  # micro-batches of the rolling S3 stream (JSON: large output)

    @property
    def rows(self) -> int:
        return self.files * self.rows_per_file

    @property
    def batches(self) -> int:
        return -(-self.files // self.files_per_trigger)


FULL = Size(files=12, rows_per_file=250_000, reps=5)
QUICK = Size(
    files=6,
    rows_per_file=25_000,
    reps=2,
    protocol_epochs=300,
    lag_triggers=4,
    rolling_batches=8,
    rolling_reps=2,
    rolling_warmup=3,
    s3_stream_batches=8,
)


@dataclass(frozen=True)
class Data:
    """The input every contender reads: Parquet files written once by pyarrow."""

    path: Path
    files: int
    rows: int
    arrow_bytes: int  # in-memory (Arrow) size: what the MB/s figures are of
    disk_bytes: int

    @property
    def mb(self) -> float:
        return self.arrow_bytes / 1e6


def to_arrow(df: Any) -> pa.Table:
    """``df.toArrow()``, which pyspark 4.0 added; on 3.5 the same collect it wraps."""
    if hasattr(df, "toArrow"):
        return df.toArrow()
    from eosink._arrow_schema import spark_to_arrow

    batches = df._collect_as_arrow()
    if not batches:
        return spark_to_arrow(df.schema).empty_table()
    return pa.Table.from_batches(batches)


def make_data(d: Path, size: Size) -> Data:
    """``size.files`` Parquet files (snappy) of long, int, double, string and timestamp
    columns; ``country`` has 8 values (the partition column of the partitioned rows)."""
    d.mkdir(parents=True, exist_ok=True)
    n = size.rows_per_file
    arrow_bytes = disk = 0
    for f in range(size.files):
        ids = pa.array(range(f * n, (f + 1) * n), pa.int64())
        t = pa.table(
            {
                "id": ids,
                "user_id": pc.cast(pc.bit_wise_and(pc.multiply(ids, 7919), 0xFFFFF), pa.int32()),
                "amount": pc.multiply(pc.cast(ids, pa.float64()), 0.37),
                "country": pc.take(
                    pa.array(COUNTRIES), pc.cast(pc.bit_wise_and(ids, 7), pa.int32())
                ),
                "note": pc.binary_join_element_wise(
                    "order-", pc.utf8_lpad(pc.cast(ids, pa.string()), 10, "0"), ""
                ),
                "ts": pc.cast(
                    pc.add(pc.multiply(ids, 1_000_003), 1_700_000_000_000_000),
                    pa.timestamp("us", tz="UTC"),
                ),
            }
        )
        p = d / f"in-{f:04d}.parquet"
        pq.write_table(t, p, compression="snappy")
        arrow_bytes += t.nbytes
        disk += p.stat().st_size
    return Data(d, size.files, size.rows, arrow_bytes, disk)


def split_data(data: Data, files: int, d: Path) -> Data:
    """The same rows as ``data`` (same generator, same ids) in ``files`` smaller files: the
    input of the streams that take one file per trigger. Generated once, reused."""
    if data.rows % files:
        raise ValueError(f"{data.rows} rows do not split into {files} files")
    if (d / f"in-{files - 1:04d}.parquet").exists():
        paths = sorted(d.glob("*.parquet"))
        return Data(d, files, data.rows, data.arrow_bytes, sum(p.stat().st_size for p in paths))
    got = make_data(d, Size(files=files, rows_per_file=data.rows // files, reps=1))
    return Data(d, files, data.rows, got.arrow_bytes, got.disk_bytes)


def is_hidden(rel: tuple[str, ...]) -> bool:
    """Whether a file, given as the parts of its path under an output root, is not a visible
    data file: under a ``_`` or ``.`` directory, or its name starts with ``_`` or ``.``
    (Spark's ``_SUCCESS``, Hadoop's ``.crc`` checksums)."""
    return any(part.startswith(("_", ".")) for part in rel)


def visible_files(root: Path) -> list[Path]:
    """The visible data files under ``root`` (see :func:`is_hidden`), sorted."""
    if not root.exists():
        return []
    return sorted(
        p for p in root.rglob("*") if p.is_file() and not is_hidden(p.relative_to(root).parts)
    )


LOAD: list[float] = []  # 1-minute load averages sampled before runs (see load_note)


def sample_load() -> None:
    try:
        LOAD.append(os.getloadavg()[0])
    except OSError:
        pass


def load_note() -> str:
    """The load averages sampled so far, for the report: other work on the machine."""
    if not LOAD:
        return "load average not sampled"
    s = sorted(LOAD)
    return (
        f"1-minute load average before each run: median {statistics.median(s):.1f} "
        f"(range {s[0]:.1f}-{s[-1]:.1f}) on {os.cpu_count()} cores"
    )


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p * len(s)))]


def parquet_codec(out: Path) -> str:
    """The compression of the first Parquet data file under ``out`` (what a contender wrote),
    or ``?``."""
    for p in sorted(out.rglob("*.parquet")):
        if any(part.startswith(("_", ".")) for part in p.relative_to(out).parts[:-1]):
            continue
        try:
            md = pq.ParquetFile(p).metadata
            if md.num_row_groups:
                return str(md.row_group(0).column(0).compression).lower()
        except Exception:
            continue
    return "?"


def interleave(
    contenders: dict[str, Callable[[str], Any]],
    reps: int,
    fresh: Callable[[str], Path],
    warmup: bool = True,
    log: Callable[[str], None] = print,
    codecs: dict[str, str] | None = None,
) -> dict[str, list[float]]:
    """Time every contender ``reps`` times, interleaved, in a rotating order (so drift and
    noise hit all alike); each call gets a fresh output directory, deleted after the call.

    A warm-up call of each (untimed) comes first: Python workers, JIT, catalogs. The Parquet
    codec each contender wrote is recorded in ``codecs`` (from its first call).
    """
    names = list(contenders)
    times: dict[str, list[float]] = {n: [] for n in names}
    rounds = ([-1] if warmup else []) + list(range(reps))
    for r in rounds:
        k = max(r, 0) % len(names)
        for name in names[k:] + names[:k]:
            out = fresh(f"{name}-{r}")
            t0 = time.perf_counter()
            contenders[name](str(out))
            dt = time.perf_counter() - t0
            if codecs is not None and name not in codecs:
                codecs[name] = parquet_codec(out)
            shutil.rmtree(out, ignore_errors=True)
            if r >= 0:
                times[name].append(dt)
            log(f"    {'warm-up' if r < 0 else f'rep {r + 1}/{reps}'} {name}: {dt:.2f} s")
    return times


SAMPLES: dict[str, Any] = {"throughput": [], "lag": {}, "protocol": {}}
"""The run's raw figures, for the charts (``bench/charts.py``): every throughput row's
per-repetition times of both sides, the visibility-lag run's per-epoch lags, the protocol
cost's per-epoch milliseconds binned (p50, p99 and max per bin) by meta store."""


def protocol_bins(ms: list[float], bins: int = 200) -> dict[str, list[float]]:
    """``ms`` (one figure per epoch, in order) cut into ``bins`` runs of epochs: the first
    epoch of each, its p50, p99 and max."""
    size = max(1, len(ms) // bins)
    out: dict[str, list[float]] = {"epoch": [], "p50": [], "p99": [], "max": []}
    for i in range(0, len(ms), size):
        part = ms[i : i + size]
        out["epoch"].append(float(i))
        out["p50"].append(statistics.median(part))
        out["p99"].append(pct(part, 0.99))
        out["max"].append(max(part))
    return out


@dataclass
class Row:
    """One line of the report."""

    measure: str
    eosink: str
    peer: str
    ratio: str
    target: str = "info"
    met: str = "-"
    section: str = "ratios"  # ratios | info

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def throughput_row(
    measure: str,
    data: Data,
    t_eos: list[float],
    t_peer: list[float],
    target: float | None,
    eos_note: str = "",
    peer_note: str = "",
) -> Row:
    """Throughput eosink / peer = median peer time / median eosink time (same data), with
    the range of the per-repetition ratios."""
    ratio = med(t_peer) / med(t_eos)
    pairs = sorted(p / e for p, e in zip(t_peer, t_eos, strict=False))
    SAMPLES["throughput"].append(
        {"measure": measure, "mb": data.mb, "eosink_s": t_eos, "peer_s": t_peer, "target": target}
    )
    spread = f" ({pairs[0]:.2f}-{pairs[-1]:.2f})" if len(pairs) > 1 else ""

    def fig(ts: list[float], note: str) -> str:
        s = f"{data.mb / med(ts):.1f} MB/s, {med(ts):.2f} s"
        return f"{s} ({note})" if note else s

    return Row(
        measure,
        fig(t_eos, eos_note),
        fig(t_peer, peer_note),
        f"{ratio:.2f}{spread}",
        f">= {target:g}" if target is not None else "info",
        ("yes" if ratio >= target else "**no**") if target is not None else "-",
        "ratios" if target is not None else "info",
    )


def failure(exc: BaseException, limit: int = 300) -> str:
    """``exc`` in one line for a result table: its type and the first line of its message
    (cut at ``limit``; an exception without a message gives its type alone)."""
    lines = str(exc).splitlines()
    return f"{type(exc).__name__}: {lines[0][:limit] if lines else ''}"


def failed_row(measure: str, target: float | None, why: str) -> Row:
    return Row(
        measure,
        f"failed: {why}",
        "-",
        "n/a",
        f">= {target:g}" if target is not None else "info",
        "**not measured**" if target is not None else "-",
        "ratios" if target is not None else "info",
    )
