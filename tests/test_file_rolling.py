"""Files that span epochs (rolling) on local files and on S3 (a real moto_server), in process.

The crash matrix of the same feature is tests/test_file_rolling_crash.py.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from harness import make_input, status_json

import eosink


def _visible(root: Path) -> list[Path]:
    return sorted(
        p
        for p in root.rglob("*")
        if p.is_file()
        and not any(part.startswith(("_", ".")) for part in p.relative_to(root).parts)
    )


def _wait_visible(root: Path, seconds: float) -> list[Path]:
    """The visible files under ``root`` once there are any (at most ``seconds`` of waiting:
    then whatever is there, maybe nothing)."""
    deadline = time.monotonic() + seconds
    while not _visible(root) and time.monotonic() < deadline:
        time.sleep(0.2)
    return _visible(root)


def _read_ids(files: list[Path], fmt: str) -> list[int]:
    ids: list[int] = []
    for f in files:
        if fmt == "parquet":
            ids += pq.read_table(f, columns=["id"]).column("id").to_pylist()
        elif fmt == "json":
            ids += [json.loads(line)["id"] for line in f.read_text().splitlines() if line]
        elif fmt == "csv":
            import pyarrow.csv as pcsv

            ids += pcsv.read_csv(f).column("id").to_pylist()
    return sorted(ids)


def _stream(spark: Any, src: Path, **kw: Any) -> Any:
    df = spark.readStream.schema("id long, grp string, payload string").option(
        "maxFilesPerTrigger", 1
    )
    return df.parquet(str(src))


def _staged(root: Path) -> list[Path]:
    st = root / "_eosink_staging"
    return sorted(p for p in st.rglob("*") if p.is_file()) if st.exists() else []


@pytest.mark.parametrize("fmt", ["parquet", "json", "csv"])
def test_stream_rolls_by_rows_fewer_files_every_row_once(
    spark: Any, tmp_path: Path, fmt: str
) -> None:
    """12 micro-batches of 100 rows, rolling at 300 rows: 4 files, not 12; each valid; every
    row once; nothing left staged after the stream ends; the figures say what is held."""
    ids = make_input(tmp_path / "in", 12, 100)
    out = tmp_path / "out"
    h = eosink.run(
        _stream(spark, tmp_path / "in"),
        "file",
        path=str(out),
        format=fmt,
        max_row_count=300,
        writer="python" if fmt != "parquet" else "auto",
        checkpoint_location=str(tmp_path / "ck"),
        metastore_url=f"sqlite:///{tmp_path}/m.db",
        trigger={"availableNow": True},
    )
    assert isinstance(h, eosink.StreamingHandle)
    h.await_termination()
    files = _visible(out)
    assert len(files) == 4, files
    assert all(f.name.startswith("part-") for f in files)
    assert _read_ids(files, fmt) == ids
    assert _staged(out) == []
    held = [f.held_rows for f in h.figures if not f.skipped]
    assert max(held) >= 200 and held[-1] < 300  # rows waited in the open file
    # the manifests list exactly the visible files
    from eosink_file.plugin import committed_files

    assert sorted(committed_files(out)) == [str(f) for f in files]


def test_batch_run_rolls_everything_at_its_end(spark: Any, tmp_path: Path) -> None:
    """A batch run with rolling options leaves nothing open: one file per partition."""
    ids = make_input(tmp_path / "in", 3, 200)
    out = tmp_path / "out"
    df = spark.read.parquet(str(tmp_path / "in")).repartition(4)
    kw: dict[str, Any] = dict(
        path=str(out),
        partition_by="grp",
        max_file_bytes=1 << 30,
        metastore_url=f"sqlite:///{tmp_path}/m.db",
    )
    r = eosink.run(df, "file", epoch=1, **kw)
    assert isinstance(r, eosink.BatchResult) and r.committed
    files = _visible(out)
    assert len(files) == 5  # one per partition directory, 4 tasks merged
    assert r.files == 5  # published by the roll at the run's end
    assert sorted(f.parent.name for f in files) == [
        "grp=..",
        "grp=__HIVE_DEFAULT_PARTITION__",
        "grp=de%2Fat",
        "grp=fr",
        "grp=x%25y",
    ]
    assert _read_ids(files, "parquet") == ids
    assert _staged(out) == []
    # a re-run is a no-op; a second epoch appends new files, never rewrites old ones
    before = {f: f.stat().st_mtime_ns for f in files}
    eosink.run(df, "file", epoch=1, **kw)
    assert {f: f.stat().st_mtime_ns for f in _visible(out)} == before
    eosink.run(df, "file", epoch=2, **kw)
    assert len(_visible(out)) == 10
    assert _read_ids(_visible(out), "parquet") == sorted(ids + ids)


def test_inactivity_rolls_a_quiet_stream(spark: Any, tmp_path: Path) -> None:
    """A running stream whose source went quiet publishes its open file after
    inactivity_seconds, without a new micro-batch and before stop()."""
    src = tmp_path / "in"
    ids = make_input(src, 2, 50)
    out = tmp_path / "out"
    h = eosink.run(
        _stream(spark, src),
        "file",
        path=str(out),
        max_file_bytes=1 << 30,
        inactivity_seconds=1.0,
        checkpoint_location=str(tmp_path / "ck"),
        metastore_url=f"sqlite:///{tmp_path}/m.db",
        trigger={"processingTime": "500 milliseconds"},
    )
    assert isinstance(h, eosink.StreamingHandle)
    try:
        h.process_all_available()
        # Every row becomes visible by the timer alone: no input is left. (One file, or two
        # when the machine took over a second between the two micro-batches: then the first
        # one's file rolled by inactivity before the second came.)
        deadline = time.monotonic() + 60
        files = _wait_visible(out, 20)
        while sorted(_read_ids(files, "parquet")) != ids and time.monotonic() < deadline:
            time.sleep(0.2)
            files = _visible(out)
        assert h.is_active
        assert len(files) in (1, 2), files
        assert sorted(_read_ids(files, "parquet")) == ids
    finally:
        h.stop()
    assert _staged(out) == []


def test_rollover_seconds_rolls_a_held_orc_file_by_its_age(spark: Any, tmp_path: Path) -> None:
    """``rollover_seconds``: the open file collects several epochs (ORC pieces merged into
    one file), the figures say what it holds (``held_rows``, ``held_bytes``), and once its
    first epoch is that old the timer publishes it, without a new micro-batch and before
    stop(); every row once, readable by pyarrow's ORC reader."""
    import pyarrow.orc as orc

    src = tmp_path / "in"
    ids = make_input(src, 3, 50)
    out = tmp_path / "out"
    h = eosink.run(
        _stream(spark, src),
        "file",
        path=str(out),
        format="orc",
        rollover_seconds=4.0,
        checkpoint_location=str(tmp_path / "ck"),
        metastore_url=f"sqlite:///{tmp_path}/m.db",
        trigger={"processingTime": "300 milliseconds"},
    )
    assert isinstance(h, eosink.StreamingHandle)
    try:
        h.process_all_available()
        held = [(f.held_rows, f.held_bytes) for f in h.figures if not f.skipped]
        assert held[0][0] == 50 and held[0][1] > 0, held  # the first epoch waits in the file
        files = _wait_visible(out, 30)
        assert h.is_active
        assert files and all(f.suffix == ".orc" for f in files), files
        rows = [orc.read_table(f).column("id").to_pylist() for f in files]
        assert max(len(r) for r in rows) > 50, [len(r) for r in rows]  # epochs merged
        assert sorted(i for r in rows for i in r) == ids
    finally:
        h.stop()
    assert _staged(out) == []


def test_options_refused_with_a_reason(tmp_path: Path) -> None:
    from eosink_file.plugin import FileSinkOptions

    with pytest.raises(ValueError, match="only apply to s3://"):
        FileSinkOptions(path=str(tmp_path), s3_endpoint_url="http://x")
    with pytest.raises(ValueError, match="writer='spark' cannot write s3://"):
        FileSinkOptions(path="s3://b/p", writer="spark")
    with pytest.raises(ValueError, match="greater than or equal to 5242880"):
        FileSinkOptions(path="s3://b/p", s3_part_bytes=1024)
    with pytest.raises(ValueError, match="greater than 0"):
        FileSinkOptions(path=str(tmp_path), rollover_seconds=0)
    o = FileSinkOptions(path="s3://b/p/", s3_secret_access_key="hunter2")
    assert "hunter2" not in repr(o) and o.path == "s3://b/p"


# -- S3 --------------------------------------------------------------------------------------
def _bucket(endpoint: str) -> tuple[Any, str]:
    import boto3

    c = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    b = f"b-{uuid.uuid4().hex[:10]}"
    c.create_bucket(Bucket=b)
    return c, b


def _s3_opts(endpoint: str, bucket: str) -> dict[str, Any]:
    return dict(
        path=f"s3://{bucket}/out",
        s3_endpoint_url=endpoint,
        s3_region="us-east-1",
        s3_access_key_id="testing",
        s3_secret_access_key="testing",
    )


def _s3_keys(c: Any, bucket: str) -> list[tuple[str, int]]:
    out = []
    for page in c.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        out += [(o["Key"], int(o["Size"])) for o in page.get("Contents", [])]
    return sorted(out)


def _s3_visible(c: Any, bucket: str) -> list[str]:
    return [
        k
        for k, _ in _s3_keys(c, bucket)
        if not any(p.startswith(("_", ".")) for p in k.split("/")[1:])
    ]


def _s3_ids(c: Any, bucket: str, keys: list[str], fmt: str, tmp: Path) -> list[int]:
    ids: list[int] = []
    for i, k in enumerate(keys):
        local = tmp / f"dl-{i}"
        c.download_file(bucket, k, str(local))
        ids += _read_ids([local], fmt)
    return sorted(ids)


def test_s3_batch_publishes_with_multipart_uploads(
    spark: Any, tmp_path: Path, s3_endpoint: str
) -> None:
    """A partitioned batch on S3: every row once, no open upload, nothing staged; the secret
    never reaches the log or the meta store."""
    c, b = _bucket(s3_endpoint)
    ids = make_input(tmp_path / "in", 2, 300)
    df = spark.read.parquet(str(tmp_path / "in")).repartition(3)
    r = eosink.run(
        df,
        "file",
        partition_by="grp",
        epoch=7,
        metastore_url=f"sqlite:///{tmp_path}/m.db",
        **_s3_opts(s3_endpoint, b),
    )
    assert isinstance(r, eosink.BatchResult) and r.committed and r.rows == len(ids)
    keys = _s3_visible(c, b)
    assert keys and all(k.startswith("out/grp=") for k in keys)
    assert _s3_ids(c, b, keys, "parquet", tmp_path) == ids
    assert c.list_multipart_uploads(Bucket=b).get("Uploads", []) == []
    assert not [k for k, _ in _s3_keys(c, b) if "/_eosink_staging/" in k]
    assert b"testing" not in (tmp_path / "m.db").read_bytes()


def test_s3_stream_rolls_json_into_one_multipart_upload(
    spark: Any, tmp_path: Path, s3_endpoint: str
) -> None:
    """JSON lines on S3 with max_file_bytes: pieces of ~2 MiB become 5 MiB parts of one
    upload spanning epochs; a tail under 5 MiB waits staged; the stop publishes it."""
    c, b = _bucket(s3_endpoint)
    ids = make_input(tmp_path / "in", 8, 1000, pad=2000)  # ~2 MiB of JSON per micro-batch
    h = eosink.run(
        _stream(spark, tmp_path / "in"),
        "file",
        format="json",
        max_file_bytes=12 * 1024 * 1024,
        s3_part_bytes=5 * 1024 * 1024,
        checkpoint_location=str(tmp_path / "ck"),
        metastore_url=f"sqlite:///{tmp_path}/m.db",
        trigger={"availableNow": True},
        **_s3_opts(s3_endpoint, b),
    )
    assert isinstance(h, eosink.StreamingHandle)
    h.await_termination()
    keys = _s3_visible(c, b)
    assert 2 <= len(keys) <= 3, keys
    assert _s3_ids(c, b, keys, "json", tmp_path) == ids
    from eosink_file.plugin import committed_files

    s3 = {k: v for k, v in _s3_opts(s3_endpoint, b).items() if k != "path"}
    assert sorted(committed_files(f"s3://{b}/out", **s3)) == [f"s3://{b}/{k}" for k in keys]
    assert c.list_multipart_uploads(Bucket=b).get("Uploads", []) == []
    assert not [k for k, _ in _s3_keys(c, b) if "/_eosink_staging/" in k]


def test_sixty_epochs_make_few_files(spark: Any, tmp_path: Path) -> None:
    """60 micro-batches (one small input file each), max_file_bytes: far fewer files than
    epochs, each a valid Parquet file, every row exactly once, nothing left staged."""
    ids = make_input(tmp_path / "in", 60, 20, pad=200)
    out = tmp_path / "out"
    h = eosink.run(
        _stream(spark, tmp_path / "in"),
        "file",
        path=str(out),
        max_file_bytes=64 * 1024,
        checkpoint_location=str(tmp_path / "ck"),
        metastore_url=f"sqlite:///{tmp_path}/m.db",
        trigger={"availableNow": True},
    )
    assert isinstance(h, eosink.StreamingHandle)
    h.await_termination()
    epochs = [f for f in h.figures if not f.skipped]
    files = _visible(out)
    assert len(epochs) == 60
    assert len(files) <= 60 / 10, len(files)
    for f in files:
        assert pq.ParquetFile(f).metadata.num_rows > 0
    assert _read_ids(files, "parquet") == ids
    assert _staged(out) == []


def test_s3_tail_under_a_part_waits_staged_for_many_epochs(
    spark: Any, tmp_path: Path, s3_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Small JSON epochs on S3: no multipart upload is started while the slot's tail stays
    under 5 MiB; the pieces wait staged; the end of the stream publishes one file."""
    c, b = _bucket(s3_endpoint)
    ids = make_input(tmp_path / "in", 10, 30)
    url = f"sqlite:///{tmp_path}/m.db"
    h = eosink.run(
        _stream(spark, tmp_path / "in"),
        "file",
        format="json",
        max_file_bytes=1 << 30,
        checkpoint_location=str(tmp_path / "ck"),
        metastore_url=url,
        trigger={"processingTime": "200 milliseconds"},
        **_s3_opts(s3_endpoint, b),
    )
    assert isinstance(h, eosink.StreamingHandle)
    try:
        h.process_all_available()
        assert c.list_multipart_uploads(Bucket=b).get("Uploads", []) == []
        assert _s3_visible(c, b) == []
        staged = [k for k, _ in _s3_keys(c, b) if "/_eosink_staging/" in k]
        assert len(staged) >= 10  # every epoch's piece, at least one per epoch
        # `eosink status` lists the open file: every row so far, no upload started yet.
        running = status_json(url, capsys)
        (open_file,) = running["open_at_target"]
        assert open_file["kind"] == "open file" and open_file["rows"] == len(ids)
        assert open_file["end_epoch"] == running["last_committed_epoch"]
        assert open_file["s3_upload_id"] is None and open_file["file"].startswith("part-")
    finally:
        h.stop()
    stopped = status_json(url, capsys)  # the stop published it: nothing is open
    assert stopped["open_at_target"] == [] and stopped["last_roll"]["everything"] is True
    assert "published by the roll" in stopped["open_at_target_note"]
    keys = _s3_visible(c, b)
    assert len(keys) == 1
    assert _s3_ids(c, b, keys, "json", tmp_path) == ids
    assert c.list_multipart_uploads(Bucket=b).get("Uploads", []) == []
    assert not [k for k, _ in _s3_keys(c, b) if "/_eosink_staging/" in k]


def test_open_files_of_a_crashed_rolling_run_are_published_by_a_later_run(
    spark: Any, tmp_path: Path
) -> None:
    """A run with rolling options dies while publishing (after its epoch committed); the
    next run has no rolling options at all: it still publishes the open file, once."""
    from eosink.faults import SimulatedCrash, simulate

    ids = make_input(tmp_path / "in", 2, 100)
    df = spark.read.parquet(str(tmp_path / "in"))
    out = tmp_path / "out"
    ms = f"sqlite:///{tmp_path}/m.db"
    with simulate("roll_before_publish") as hits, pytest.raises(SimulatedCrash):
        eosink.run(df, "file", path=str(out), epoch=1, max_row_count=10**6, metastore_url=ms)
    assert hits[0] == 1
    assert _visible(out) == []  # committed, but held in the open file
    r = eosink.run(df, "file", path=str(out), epoch=2, metastore_url=ms)
    assert isinstance(r, eosink.BatchResult) and r.committed
    assert _read_ids(_visible(out), "parquet") == sorted(ids + ids)
    assert _staged(out) == []


def test_merge_coalesces_small_row_groups_and_keeps_the_schema(tmp_path: Path) -> None:
    """The merge of many small Parquet pieces: one row group per million rows, not one per
    piece (a rolled file is no bigger than its pieces), the first piece's schema metadata,
    every row in order; a piece with a narrower type is cast."""
    from eosink_file._rolling import merge_columnar

    pieces = []
    for i in range(30):
        ids = pa.array(range(i * 1000, (i + 1) * 1000), pa.int32() if i == 7 else pa.int64())
        t = pa.table({"id": ids, "s": [f"v{j % 7}" for j in range(1000)]})
        if i == 0:
            t = t.replace_schema_metadata({"org.apache.spark.sql.parquet.row.metadata": "{}"})
        p = tmp_path / f"p{i}.parquet"
        pq.write_table(t, p, compression="snappy")
        pieces.append(p)
    dest = tmp_path / "m.parquet"
    assert merge_columnar("parquet", "snappy", pieces, dest, fsync=True) == 30_000
    pf = pq.ParquetFile(dest)
    assert pf.num_row_groups == 1
    assert pf.schema_arrow.metadata == {b"org.apache.spark.sql.parquet.row.metadata": b"{}"}
    assert pq.read_table(dest).column("id").to_pylist() == list(range(30_000))
    assert dest.stat().st_size < sum(p.stat().st_size for p in pieces)
    small = tmp_path / "small.parquet"
    merge_columnar("parquet", "snappy", pieces, small, fsync=False, row_group_rows=10_000)
    assert pq.ParquetFile(small).num_row_groups == 3


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_new_columns_roll_the_open_file_first(spark: Any, tmp_path: Path, fmt: str) -> None:
    """A file left open (a crash before its roll) and a next run with one more column: the
    open file is published with the old columns, the new rows go to a new file; nothing is
    merged across the change (a CSV would get rows under the wrong header)."""
    from eosink.faults import SimulatedCrash, simulate

    ids = make_input(tmp_path / "in", 2, 100)
    df = spark.read.parquet(str(tmp_path / "in"))
    out = tmp_path / "out"
    kw: dict[str, Any] = dict(
        path=str(out), format=fmt, max_row_count=10**6, metastore_url=f"sqlite:///{tmp_path}/m.db"
    )
    with simulate("roll_before_publish"), pytest.raises(SimulatedCrash):
        eosink.run(df, "file", epoch=1, **kw)
    wider = df.selectExpr("id + 1000000 AS id", "grp", "payload", "'new' AS extra")
    r = eosink.run(wider, "file", epoch=2, **kw)
    assert isinstance(r, eosink.BatchResult) and r.committed
    files = _visible(out)
    assert len(files) == 2
    assert _read_ids(files, fmt) == sorted(ids + [i + 1_000_000 for i in ids])
    if fmt == "csv":
        import pyarrow.csv as pcsv

        widths = sorted(pcsv.read_csv(f).num_columns for f in files)
        assert widths == [3, 4]
    assert _staged(out) == []


def test_an_aborted_epochs_append_never_reaches_a_rolled_file(tmp_path: Path) -> None:
    """Rewind at the roll: epoch 2 appends to the open JSON file and is aborted (never
    committed); epoch 3 adds nothing and the file rolls by inactivity: it holds epoch 1's
    rows only. A file shorter than recorded is an error, not zero bytes."""
    from eosink_file.plugin import FileCoordinator, FileSinkOptions

    from eosink.errors import SinkError

    out = tmp_path / "out"
    opts = FileSinkOptions(path=str(out), format="json", inactivity_seconds=0.2, writer="python")
    coord = FileCoordinator(opts, "s")
    coord.init()

    def piece(epoch: int, text: str) -> dict[str, Any]:
        rel = f"_eosink_staging/{coord.key}/{epoch}/a/f00000.jsonl"
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text)
        return {"files": [{"staged": rel, "partition": "", "rows": 1, "bytes": len(text)}]}

    p1 = coord.pre_commit(1, [piece(1, '{"id": 1}\n')])
    coord.commit(1, p1.committable)
    p2 = coord.pre_commit(2, [piece(2, '{"id": 2}\n')])
    coord.abort(2, p2.committable)
    time.sleep(0.3)
    p3 = coord.pre_commit(3, [])
    assert p3.files == 1
    coord.commit(3, p3.committable)
    assert [f.read_text() for f in _visible(out)] == ['{"id": 1}\n']

    p4 = coord.pre_commit(4, [piece(4, '{"id": 4}\n')])
    coord.commit(4, p4.committable)
    inprogress = (
        out
        / p4.committable["state"]["slots"][next(iter(p4.committable["state"]["slots"]))][
            "inprogress"
        ]
    )
    inprogress.write_text("")
    with pytest.raises(SinkError, match="truncated or replaced outside eosink"):
        coord.pre_commit(5, [piece(5, '{"id": 5}\n')])
