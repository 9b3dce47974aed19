"""The S3 section: eosink's file sink writing to a real S3 API (moto's standalone server,
started for the run on 127.0.0.1) against a plain boto3 ``upload_file`` of the same bytes.

* batch: ``eosink.run(spark.read.parquet(input), sink="file", path="s3://bench/<new>")``
  against ``upload_file`` (default ``TransferConfig``) of the Parquet files eosink wrote in
  its warm-up run (downloaded once), one after the other, to a new prefix.
* rolling stream: availableNow, one input file per trigger, into the file sink with
  ``format="json"`` and ``max_file_bytes`` (multipart uploads), against ``upload_file`` of
  the JSON files it rolled in its warm-up run.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._common import Data, Row, Size, failed_row, is_hidden, med, sample_load, split_data
from ._rolling import MiB, missing_options

BUCKET = "bench"
KEY = "testing"  # moto accepts any credentials
REGION = "us-east-1"
S3_FIELDS = ("s3_endpoint_url", "s3_access_key_id", "s3_secret_access_key", "s3_region")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def moto_server(tmp: Path, log: Callable[[str], None]) -> Iterator[str]:
    """moto's standalone S3 server of this environment on a free port; its endpoint URL.
    Stopped (SIGTERM, then SIGKILL) when the block ends."""
    exe = Path(sys.executable).parent / "moto_server"
    if not exe.exists():
        found = shutil.which("moto_server")
        if not found:
            raise RuntimeError("moto_server not found (pip install 'moto[server]')")
        exe = Path(found)
    port = free_port()
    out = open(tmp / "moto.log", "w")  # closed below
    proc = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=out)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(endpoint, timeout=1)
                break
            except Exception:
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"moto_server exited with {proc.returncode}; see {out.name}"
                    ) from None
                time.sleep(0.1)
        else:
            raise RuntimeError("moto_server did not answer within 20 s")
        log(f"  moto_server pid {proc.pid} at {endpoint}")
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        out.close()


def json_roll(data: Data) -> dict[str, Any]:
    """The rolling S3 stream's options: 64 MiB JSON files (8 MiB for --quick's data)."""
    return {"max_file_bytes": (64 if data.disk_bytes > 64 * MiB else 8) * MiB}


@dataclass
class S3Stats:
    seconds: float = 0.0
    files: int = 0
    bytes: int = 0
    rows: int = 0
    writers: set[str] = field(default_factory=set)
    odd: list[str] = field(default_factory=list)


class S3Bench:
    """The S3 section on one Spark session and one moto server."""

    def __init__(
        self,
        spark: Any,
        data: Data,
        size: Size,
        tmp: Path,
        ms: str,
        endpoint: str,
        log: Callable[[str], None],
    ) -> None:
        import boto3

        self.spark = spark
        self.data = data
        self.size = size
        self.tmp = tmp
        self.ms = ms
        self.endpoint = endpoint
        self.log = log
        self.s3 = boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id=KEY,
            aws_secret_access_key=KEY,
            region_name=REGION,
        )
        self.s3.create_bucket(Bucket=BUCKET)
        self.runs = 0

    def s3_options(self) -> dict[str, Any]:
        return {
            "s3_endpoint_url": self.endpoint,
            "s3_access_key_id": KEY,
            "s3_secret_access_key": KEY,
            "s3_region": REGION,
        }

    def prefix(self, name: str) -> str:
        self.runs += 1
        return f"run-{self.runs:04d}-{name}"

    # -- S3 helpers ------------------------------------------------------------------------
    def keys(self, prefix: str) -> list[tuple[str, int]]:
        got: list[tuple[str, int]] = []
        for page in self.s3.get_paginator("list_objects_v2").paginate(
            Bucket=BUCKET, Prefix=prefix + "/"
        ):
            got += [(o["Key"], o["Size"]) for o in page.get("Contents", [])]
        return got

    def visible(self, prefix: str) -> list[tuple[str, int]]:
        return [
            (k, n)
            for k, n in self.keys(prefix)
            if not is_hidden(tuple(k[len(prefix) + 1 :].split("/")))
        ]

    def leftovers(self, prefix: str) -> list[str]:
        """What the spec says must be gone after the final roll / batch end."""
        odd = []
        staged = [k for k, _ in self.keys(prefix) if "/_eosink_staging/" in k]
        if staged:
            odd.append(f"{len(staged)} object(s) left under _eosink_staging/")
        ups = self.s3.list_multipart_uploads(Bucket=BUCKET, Prefix=prefix).get("Uploads", [])
        if ups:
            odd.append(f"{len(ups)} multipart upload(s) left open")
        return odd

    def drop(self, prefix: str) -> None:
        """Delete a run's objects and open uploads (moto keeps them in memory)."""
        for u in self.s3.list_multipart_uploads(Bucket=BUCKET, Prefix=prefix).get("Uploads", []):
            self.s3.abort_multipart_upload(Bucket=BUCKET, Key=u["Key"], UploadId=u["UploadId"])
        keys = [k for k, _ in self.keys(prefix)]
        for i in range(0, len(keys), 1000):
            self.s3.delete_objects(
                Bucket=BUCKET, Delete={"Objects": [{"Key": k} for k in keys[i : i + 1000]]}
            )

    def download(self, prefix: str, d: Path) -> list[Path]:
        """The visible files of a run, to a local directory (the peer's bytes)."""
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        paths = []
        for i, (k, _) in enumerate(self.visible(prefix)):
            p = d / f"{i:05d}-{k.rsplit('/', 1)[-1]}"
            self.s3.download_file(BUCKET, k, str(p))
            paths.append(p)
        return paths

    def count_rows(self, files: list[Path], fmt: str) -> int:
        import pyarrow.parquet as pq

        if fmt == "parquet":
            return sum(pq.ParquetFile(p).metadata.num_rows for p in files)
        n = 0
        for p in files:
            with open(p, "rb") as fh:
                n += sum(1 for line in fh if line.strip())
        return n

    # -- contenders ------------------------------------------------------------------------
    def boto3_upload(self, files: list[Path], prefix: str) -> S3Stats:
        """``upload_file`` of each file, one after the other, default TransferConfig."""
        t0 = time.perf_counter()
        for p in files:
            self.s3.upload_file(str(p), BUCKET, f"{prefix}/{p.name}")
        st = S3Stats(time.perf_counter() - t0)
        vis = self.visible(prefix)
        st.files, st.bytes = len(vis), sum(n for _, n in vis)
        return st

    def interleave(
        self,
        eos: Callable[[str], S3Stats] | None,
        fmt: str,
        reps: int,
        peer_dir: Path,
        fallback: Callable[[], list[Path]],
        local: Callable[[], float] | None = None,
    ) -> tuple[list[S3Stats], list[S3Stats], list[float]]:
        """eosink's warm-up run first (its files become the peer's bytes), then the peer's,
        then ``reps`` rounds in a rotating order. Every eosink run is checked: rows of its
        visible files (downloaded, untimed), staging and multipart leftovers. Without an
        eosink side (``eos`` None) the peer uploads ``fallback()``'s files. ``local``: a
        third contender (seconds of a call), interleaved too."""
        e_stats: list[S3Stats] = []
        p_stats: list[S3Stats] = []
        l_times: list[float] = []
        files: list[Path] = []

        def run_eos(tag: str) -> None:
            nonlocal files
            assert eos is not None
            keep = tag == "warm-up"
            pre = self.prefix("eosink")
            sample_load()
            try:
                st = eos(pre)
                vis = self.visible(pre)
                st.files, st.bytes = len(vis), sum(n for _, n in vis)
                got = self.download(pre, peer_dir if keep else self.tmp / "s3-check")
                st.rows = self.count_rows(got, fmt)
                st.odd += self.leftovers(pre)
            finally:
                self.drop(pre)
            if keep:
                files = got
            else:
                shutil.rmtree(self.tmp / "s3-check", ignore_errors=True)
            self.log(
                f"    {tag} eosink: {st.seconds:.2f} s, {st.files} files, "
                f"{st.bytes / 1e6:.1f} MB, {st.rows:,} rows" + "".join(f"; {o}" for o in st.odd)
            )
            if not keep:
                e_stats.append(st)

        def run_peer(tag: str) -> None:
            pre = self.prefix("boto3")
            sample_load()
            try:
                st = self.boto3_upload(files, pre)
            finally:
                self.drop(pre)
            self.log(
                f"    {tag} boto3: {st.seconds:.2f} s, {st.files} files, {st.bytes / 1e6:.1f} MB"
            )
            if tag != "warm-up":
                p_stats.append(st)

        def run_local(tag: str) -> None:
            assert local is not None
            sample_load()
            dt = local()
            self.log(f"    {tag} eosink-local: {dt:.2f} s")
            if tag != "warm-up":
                l_times.append(dt)

        if eos is not None:
            run_eos("warm-up")
        else:
            files = fallback()
        run_peer("warm-up")
        runs = [run_eos] if eos is not None else []
        runs.append(run_peer)
        if local is not None and eos is not None:
            run_local("warm-up")
            runs.append(run_local)
        for r in range(reps):
            k = r % len(runs)
            for fn in runs[k:] + runs[:k]:
                fn(f"rep {r + 1}/{reps}")
        return e_stats, p_stats, l_times

    def spark_files(self, inp: Path, d: Path, fmt: str = "parquet") -> list[Path]:
        """The peer's bytes when eosink cannot write to S3: Spark's files of the same input."""
        from ._common import visible_files

        shutil.rmtree(d, ignore_errors=True)
        self.spark.read.parquet(str(inp)).write.format(fmt).save(str(d))
        return visible_files(d)

    def batch(self, run_eosink: bool) -> tuple[list[S3Stats], list[S3Stats], list[float]]:
        import eosink

        def eos(prefix: str) -> S3Stats:
            t0 = time.perf_counter()
            res = eosink.run(
                self.spark.read.parquet(str(self.data.path)),
                sink="file",
                path=f"s3://{BUCKET}/{prefix}",
                epoch=1,
                metastore_url=self.ms,
                **self.s3_options(),
            )
            st = S3Stats(time.perf_counter() - t0)
            assert isinstance(res, eosink.BatchResult)
            st.writers = {res.figures.writer if res.figures else "?"}
            return st

        def local() -> float:
            """The same batch to a local directory with the Python writers (the writers
            eosink takes on S3): what the S3 path adds to eosink's own cost."""
            self.runs += 1
            out = self.tmp / "out" / f"s3-local-{self.runs:04d}"
            t0 = time.perf_counter()
            eosink.run(
                self.spark.read.parquet(str(self.data.path)),
                sink="file",
                path=str(out),
                epoch=1,
                metastore_url=self.ms,
                writer="python",
            )
            dt = time.perf_counter() - t0
            shutil.rmtree(out, ignore_errors=True)
            return dt

        return self.interleave(
            eos if run_eosink else None,
            "parquet",
            self.size.reps,
            self.tmp / "s3-peer-batch",
            lambda: self.spark_files(self.data.path, self.tmp / "s3-peer-spark"),
            local,
        )

    def rolling_stream(
        self, run_eosink: bool
    ) -> tuple[list[S3Stats], list[S3Stats], list[float], dict[str, Any], Data]:
        import eosink

        split = split_data(
            self.data, self.size.rolling_batches, self.tmp / f"split-{self.size.rolling_batches}"
        )
        inp = self.tmp / "s3-stream-in"
        n_files = min(self.size.s3_stream_batches, split.files)
        if not inp.exists():
            inp.mkdir()
            for p in sorted(split.path.glob("*.parquet"))[:n_files]:
                shutil.copy(p, inp / p.name)
        rows = split.rows // split.files * n_files
        sub = Data(inp, n_files, rows, split.arrow_bytes * n_files // split.files, 0)
        schema = self.spark.read.parquet(str(inp)).schema
        roll = json_roll(self.data)

        def stream(path: str, **extra: Any) -> S3Stats:
            sdf = (
                self.spark.readStream.schema(schema)
                .option("maxFilesPerTrigger", 1)
                .parquet(str(inp))
            )
            self.runs += 1
            chk = self.tmp / "s3-chk" / f"{self.runs:04d}"
            t0 = time.perf_counter()
            h = eosink.run(
                sdf,
                sink="file",
                format="json",
                path=path,
                checkpoint_location=str(chk),
                trigger={"availableNow": True},
                metastore_url=self.ms,
                **roll,
                **extra,
            )
            assert isinstance(h, eosink.StreamingHandle)
            h.await_termination()
            st = S3Stats(time.perf_counter() - t0)
            st.writers = {f.writer or "?" for f in h.figures if not f.skipped}
            shutil.rmtree(chk, ignore_errors=True)
            return st

        def local() -> float:
            """The same stream into a local directory (the Python writers, as on S3)."""
            out = self.tmp / "out" / f"s3-json-local-{self.runs + 1:04d}"
            dt = stream(str(out), writer="python").seconds
            shutil.rmtree(out, ignore_errors=True)
            return dt

        e, peer, loc = self.interleave(
            (lambda prefix: stream(f"s3://{BUCKET}/{prefix}", **self.s3_options()))
            if run_eosink
            else None,
            "json",
            self.size.reps,
            self.tmp / "s3-peer-json",
            lambda: self.spark_files(inp, self.tmp / "s3-peer-spark-json", "json"),
            local,
        )
        return e, peer, loc, roll, sub


def s3_rows(bench: S3Bench, log: Callable[[str], None]) -> list[Row]:
    """The batch row (target 0.8) and the rolling stream row (information). Without S3 in
    the file sink the peer still runs (on Spark's files of the same input) and the rows say
    what is missing."""
    from ._rolling import opts

    rows: list[Row] = []
    why = missing_options(S3_FIELDS)
    m_batch = (
        "S3 batch: eosink file sink to `s3://` (Parquet) / boto3 `upload_file` of the same "
        "bytes (default TransferConfig)"
    )
    log("  S3 batch: eosink file sink / boto3 upload_file")
    try:
        e, p, loc = bench.batch(run_eosink=why is None)
        rows.append(s3_row(m_batch, e, p, bench.data.rows, 0.8, why))
        if e and loc:
            rows.append(local_row("S3 batch", e, loc))
    except Exception as exc:
        rows.append(failed_row(m_batch, 0.8, short(exc)))
    why_roll = why or missing_options(("max_file_bytes",))
    log("  S3 rolling stream (JSON, max_file_bytes) / boto3 upload_file")
    m_roll = "S3 rolling stream: eosink file sink to `s3://`, JSON, rolling"
    try:
        e, p, loc, roll, sub = bench.rolling_stream(run_eosink=why_roll is None)
        m_roll = (
            f"S3 rolling stream: eosink file sink to `s3://`, JSON, {opts(roll)}, availableNow, "
            f"{sub.files} micro-batches / boto3 `upload_file` of the same bytes"
        )
        rows.append(s3_row(m_roll, e, p, sub.rows, None, why_roll))
        if e and loc:
            rows.append(local_row("S3 rolling stream", e, loc))
    except Exception as exc:
        rows.append(failed_row(m_roll, None, short(exc)))
    return rows


def local_row(what: str, e: list[S3Stats], loc: list[float]) -> Row:
    """eosink to S3 against eosink to a local directory with the same (Python) writers:
    what the S3 path adds to eosink's own cost."""
    te = [s.seconds for s in e]
    pairs = sorted(a / b for a, b in zip(loc, te, strict=False))
    return Row(
        f"{what}: eosink file sink to `s3://` / the same to a local directory "
        '(`writer="python"`, the writers it takes on S3)',
        f"{med(te):.2f} s",
        f"{med(loc):.2f} s (local, fsync)",
        f"{med(loc) / med(te):.2f} ({pairs[0]:.2f}-{pairs[-1]:.2f})",
        "info",
        "-",
        "s3",
    )


def short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:300]}"


def s3_row(
    measure: str,
    e: list[S3Stats],
    p: list[S3Stats],
    rows: int,
    target: float | None,
    why: str | None = None,
) -> Row:
    tp = [s.seconds for s in p]
    peer = f"{med([s.bytes for s in p]) / 1e6 / med(tp):.1f} MB/s, {med(tp):.2f} s " + (
        f"({med([s.files for s in p]):.0f} files, {med([s.bytes for s in p]) / 1e6:.0f} MB)"
    )
    if why or not e:
        row = failed_row(measure, target, why or "eosink not run")
        row.peer = peer + (" (Spark's files of the same input)" if why else "")
        return row
    bad = [s for s in e if s.rows != rows]
    if bad:
        return failed_row(
            measure,
            target,
            f"eosink wrote {', '.join(f'{s.rows:,}' for s in bad)} of {rows:,} rows",
        )
    te = [s.seconds for s in e]
    ratio = med(tp) / med(te)
    pairs = sorted(b / a for a, b in zip(te, tp, strict=False))
    spread = f" ({pairs[0]:.2f}-{pairs[-1]:.2f})" if len(pairs) > 1 else ""
    mb = med([s.bytes for s in e]) / 1e6
    odd = sorted({o for s in e for o in s.odd})
    writers = "/".join(sorted({w for s in e for w in s.writers}))
    return Row(
        measure,
        f"{mb / med(te):.1f} MB/s, {med(te):.2f} s ({med([s.files for s in e]):.0f} files, "
        f"{mb:.0f} MB, {rows:,} rows checked, writer: {writers}"
        + "".join(f"; **{o}**" for o in odd)
        + ")",
        peer,
        f"{ratio:.2f}{spread}",
        f">= {target:g}" if target is not None else "info",
        ("yes" if ratio >= target else "**no**") if target is not None else "-",
        "s3",
    )
