"""The file sink's target: its layout record (``format``, ``partition_by``) and the checks
at start (an S3 endpoint, credentials, a local path that cannot be written), each failing
with an eosink error before anything is written."""

from __future__ import annotations

import json
import logging
import socket
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import eosink
from eosink import ConfigError, EosinkError, SinkError


def _df(spark: Any, n: int = 7) -> Any:
    return spark.range(n).selectExpr("id", "cast(id % 3 as string) as g")


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def _fails_first(
    spark: Any, tmp_path: Path, kind: type[EosinkError] = ConfigError, **options: Any
) -> EosinkError:
    """Run a batch write on a new meta store; return its error, checking that neither the
    store was created nor a Spark job ran."""
    db = tmp_path / f"store-{uuid.uuid4().hex[:6]}.db"
    jobs = spark.sparkContext.statusTracker().getJobIdsForGroup(None)
    with pytest.raises(kind) as exc:
        eosink.run(_df(spark), sink="file", metastore_url=f"sqlite:///{db}", epoch=1, **options)
    assert not db.exists(), "the meta store was created before the target was checked"
    assert spark.sparkContext.statusTracker().getJobIdsForGroup(None) == jobs, "a job ran"
    return exc.value


# -- the layout record -----------------------------------------------------------------------
def test_a_layout_change_is_refused_and_every_row_stays_readable(
    spark: Any, tmp_path: Path
) -> None:
    out, db = tmp_path / "out", f"sqlite:///{tmp_path / 'm.db'}"
    assert eosink.run(_df(spark), sink="file", path=str(out), epoch=1, metastore_url=db).committed
    record = json.loads((out / "_eosink" / "layout.json").read_text())
    assert record == {"format": "parquet", "partition_by": [], "version": 1}
    before = _files(out)
    jobs = spark.sparkContext.statusTracker().getJobIdsForGroup(None)
    for change, shown in (
        ({"partition_by": ["g"]}, "partition_by=['g']"),
        ({"format": "json"}, "format='json'"),
    ):
        with pytest.raises(ConfigError) as exc:
            eosink.run(_df(spark), sink="file", path=str(out), epoch=2, metastore_url=db, **change)
        msg = str(exc.value)
        recorded = "partition_by=[]" if "partition_by" in change else "format='parquet'"
        assert f"holds files written with {recorded}" in msg
        assert f"this run asks for {shown}" in msg
        assert str(out / "_eosink" / "layout.json") in msg
        assert "to a new path" in msg and "delete the whole directory" in msg
    assert spark.sparkContext.statusTracker().getJobIdsForGroup(None) == jobs, "a job ran"
    assert _files(out) == before
    assert spark.read.parquet(str(out)).count() == 7
    # The recorded layout goes on.
    assert eosink.run(_df(spark), sink="file", path=str(out), epoch=2, metastore_url=db).committed
    assert spark.read.parquet(str(out)).count() == 14


def test_a_failed_first_run_records_no_layout(spark: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    coord = eosink.get_sink("file")
    opts = coord.parse_options({"path": str(out), "partition_by": ["g"]})
    c = coord.coordinator_factory(opts, "file:x")
    c.init()  # a run that stops before its first commit
    assert not (out / "_eosink" / "layout.json").exists()
    assert eosink.run(_df(spark), sink="file", path=str(out), epoch=1).committed
    assert json.loads((out / "_eosink" / "layout.json").read_text())["partition_by"] == []


def test_a_target_without_a_record_adopts_the_layout_once(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out, db = tmp_path / "out", f"sqlite:///{tmp_path / 'm.db'}"
    eosink.run(
        _df(spark), sink="file", path=str(out), partition_by=["g"], epoch=1, metastore_url=db
    )
    (out / "_eosink" / "layout.json").unlink()  # as written before eosink recorded layouts
    with caplog.at_level(logging.INFO, logger="eosink.file"):
        r = eosink.run(
            _df(spark), sink="file", path=str(out), partition_by=["g"], epoch=2, metastore_url=db
        )
    assert r.committed
    adopted = [m for m in caplog.messages if "no layout record" in m]
    assert (
        len(adopted) == 1
        and "adopting this run's format='parquet', partition_by=['g']" in (adopted[0])
    )
    assert json.loads((out / "_eosink" / "layout.json").read_text())["partition_by"] == ["g"]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="eosink.file"):
        eosink.run(
            _df(spark), sink="file", path=str(out), partition_by=["g"], epoch=3, metastore_url=db
        )
    assert not [m for m in caplog.messages if "no layout record" in m]
    with pytest.raises(ConfigError, match=r"partition_by=\['g'\]"):
        eosink.run(_df(spark), sink="file", path=str(out), epoch=4, metastore_url=db)
    assert spark.read.parquet(str(out)).count() == 21


def test_the_coordinator_checks_the_layout_at_init(tmp_path: Path) -> None:
    """The check of ``init``, for the entry points that do not go through validate_schema."""
    out = tmp_path / "out"
    (out / "_eosink").mkdir(parents=True)
    (out / "_eosink" / "layout.json").write_text('{"format": "orc", "partition_by": ["a"]}')
    sink = eosink.get_sink("file")
    c = sink.coordinator_factory(sink.parse_options({"path": str(out), "format": "orc"}), "s")
    with pytest.raises(ConfigError, match=r"written with partition_by=\['a'\].*asks for "):
        c.init()
    (out / "_eosink" / "layout.json").write_text("{not json")
    with pytest.raises(SinkError, match=r"layout record .* is corrupt"):
        c.init()


# -- local paths -----------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/proc/x", "/proc/eosink/out", "/proc"])
def test_a_path_the_os_refuses_is_a_config_error(spark: Any, tmp_path: Path, path: str) -> None:
    err = _fails_first(spark, tmp_path, path=path)
    assert f"path: {path!r}" in str(err)
    # The OS's own words (root passes os.access everywhere: the directory is really tried).
    assert "No such file or directory" in str(err) or "not writable by this user" in str(err)
    assert not Path(path).exists() or path == "/proc"


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


def _keys(c: Any, bucket: str) -> list[str]:
    return [o["Key"] for o in c.list_objects_v2(Bucket=bucket).get("Contents", [])]


def test_s3_missing_bucket_names_the_endpoint(spark: Any, tmp_path: Path, s3_endpoint: str) -> None:
    _, b = _bucket(s3_endpoint)
    err = _fails_first(
        spark,
        tmp_path,
        SinkError,
        path=f"s3://{b}-missing/out",
        s3_endpoint_url=s3_endpoint,
        s3_region="us-east-1",
        s3_access_key_id="testing",
        s3_secret_access_key="testing",
    )
    assert f"cannot use bucket '{b}-missing' at {s3_endpoint}" in str(err)


def test_s3_endpoint_refused(spark: Any, tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    err = _fails_first(
        spark,
        tmp_path,
        SinkError,
        path="s3://bucket/out",
        s3_endpoint_url=endpoint,
        s3_region="us-east-1",
        s3_access_key_id="testing",
        s3_secret_access_key="testing",
    )
    assert time.monotonic() - t0 < 30
    msg = str(err)
    assert not isinstance(err, ConfigError)
    assert f"cannot reach the S3 endpoint {endpoint} for s3://bucket/out" in msg
    assert "HeadBucket 'bucket': 2 attempt(s), connect timeout 5 s" in msg
    assert "s3_endpoint_url" in msg


def test_s3_layout_change_is_refused(spark: Any, tmp_path: Path, s3_endpoint: str) -> None:
    import pyarrow.dataset as ds
    import pyarrow.fs as pafs

    c, b = _bucket(s3_endpoint)
    s3 = dict(
        s3_endpoint_url=s3_endpoint,
        s3_region="us-east-1",
        s3_access_key_id="testing",
        s3_secret_access_key="testing",
    )
    path, db = f"s3://{b}/out", f"sqlite:///{tmp_path / 'm.db'}"
    eosink.run(_df(spark), sink="file", path=path, epoch=1, metastore_url=db, **s3)
    assert json.loads(c.get_object(Bucket=b, Key="out/_eosink/layout.json")["Body"].read()) == {
        "format": "parquet",
        "partition_by": [],
        "version": 1,
    }
    before = _keys(c, b)
    err = _fails_first(spark, tmp_path, path=path, partition_by=["g"], **s3)
    assert f"(its layout record s3://{b}/out/_eosink/layout.json)" in str(err)
    assert _keys(c, b) == before
    fs = pafs.S3FileSystem(
        endpoint_override=s3_endpoint,
        access_key="testing",
        secret_key="testing",
        region="us-east-1",
    )
    data = ds.dataset(f"{b}/out", filesystem=fs, format="parquet", exclude_invalid_files=True)
    assert data.count_rows() == 7
