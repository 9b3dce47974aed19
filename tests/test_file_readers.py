"""What readers that are not Spark see of a file sink's target, at every instant of an
epoch's life: DuckDB and Polars, the way people read a folder of Parquet files today.

docs/file-sink.md "What a reader sees" makes three promises, each checked here after real
SIGKILLs of a driver (a plain Python process running the core's runtime and the file sink's
own writers; no Spark: what is checked is the target's layout, which is the same whatever
wrote it):

* the files the manifests list (``committed_files``) are exactly the committed epochs' rows,
  while an epoch is staged, PENDING, half published by a killed commit, and after recovery;
* a glob with one level per partition column (``out/grp=*/*.parquet``) never reads staged
  files; it may see part of an epoch while its commit runs (as Spark's reader may);
* a recursive glob (``out/**/*.parquet``) also reads ``_eosink_staging/``: it sees rows of
  epochs that are not committed (and may never be). The docs say not to read that way.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import polars as pl
import pytest
from eosink_file.plugin import committed_files
from harness import staged_files

ROWS = 30
GROUPS = ("a", "b", "c")

_DRIVER = textwrap.dedent(
    f"""
    import os, signal, sys
    import pyarrow as pa
    from eosink._metastore import MetaStore
    from eosink._protocol import SinkRuntime
    from eosink.registry import get_sink
    from eosink.testing import drive_writers

    url, out, sid, first, last, stop = sys.argv[1:7]
    first, last = int(first), int(last)
    plugin = get_sink("file")
    options = plugin.parse_options({{"path": out, "format": "parquet", "partition_by": "grp"}})
    rt = SinkRuntime(plugin, options, sid, MetaStore(url))
    rt.start()
    rt.lineage = "0123456789abcdef"
    rt.recover(first_epoch=first)  # epochs below `first` are checkpointed (a stream's rule 1)
    for epoch in range(first, last + 1):
        ids = list(range(epoch * {ROWS}, (epoch + 1) * {ROWS}))
        groups = [{GROUPS!r}[i % {len(GROUPS)}] for i in ids]
        batch = pa.record_batch({{"id": pa.array(ids, pa.int64()), "grp": pa.array(groups)}})
        setup = rt.coordinator.writer_setup(batch.schema)
        results = drive_writers(plugin, options, sid, epoch, [[batch]], setup)
        if epoch == last and stop == "staged":
            os.kill(os.getpid(), signal.SIGKILL)  # staged by its tasks, no committable yet
        committable, figures = rt.pre_commit(epoch, results, rows=len(ids), write_s=0.0)
        if epoch == last and stop == "pending":
            os.kill(os.getpid(), signal.SIGKILL)  # PENDING
        rt.commit_epoch(epoch, committable, figures)  # EOSINK_FAULT may kill it mid-commit
    rt.store.close()
    """
)


def _drive(tmp_path: Path, first: int, last: int, stop: str = "", fault: str = "") -> int:
    env = {**os.environ, "EOSINK_FAULT": fault} if fault else dict(os.environ)
    env.pop("EOSINK_FAULT_MARK", None)
    url, out = f"sqlite:///{tmp_path / 'm.db'}", str(tmp_path / "out")
    argv = [sys.executable, "-c", _DRIVER, url, out, "readers", str(first), str(last), stop]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, -signal.SIGKILL), done.stderr
    return done.returncode


def _ids(epochs: range) -> list[int]:
    return list(range(epochs.start * ROWS, epochs.stop * ROWS))


def _duckdb(files_or_glob: str | list[str]) -> list[int]:
    rel = duckdb.sql(
        "SELECT id FROM read_parquet($f, hive_partitioning = true)", params={"f": files_or_glob}
    )
    assert rel is not None
    return sorted(r[0] for r in rel.fetchall())


def _polars(files_or_glob: str | list[str]) -> list[int]:
    return sorted(pl.scan_parquet(files_or_glob).select("id").collect()["id"].to_list())


def _manifests(out: Path) -> tuple[list[int], list[int]]:
    """What DuckDB and Polars read of the files the manifests list."""
    files = committed_files(out)
    return _duckdb(files), _polars(files)


def test_duckdb_and_polars_see_exactly_the_committed_epochs(tmp_path: Path) -> None:
    out = tmp_path / "out"
    by_partition = str(out / "grp=*" / "*.parquet")
    recursive = str(out / "**" / "*.parquet")

    assert _drive(tmp_path, 0, 1) == 0  # epochs 0 and 1 committed
    committed = _ids(range(0, 2))
    assert _manifests(out) == (committed, committed)

    # Epoch 2 staged by its tasks, the driver killed before phase 1.
    assert _drive(tmp_path, 2, 2, stop="staged") == -signal.SIGKILL
    assert staged_files(out), "epoch 2 was staged"
    assert _manifests(out) == (committed, committed)
    assert _duckdb(by_partition) == committed == _polars(by_partition)
    # The recursive globs read the staging area: rows no commit ever made visible.
    epoch2 = _ids(range(2, 3))
    assert _duckdb(recursive) == sorted(committed + epoch2) == _polars(recursive)

    # Epoch 2 written again (the restart swept the dead attempt) and PENDING; killed.
    assert _drive(tmp_path, 2, 2, stop="pending") == -signal.SIGKILL
    assert _manifests(out) == (committed, committed)
    assert _duckdb(by_partition) == committed == _polars(by_partition)
    assert _duckdb(recursive) == sorted(committed + epoch2), "one attempt staged, not two"

    # The restart commits epoch 2 (checkpointed), then dies inside epoch 3's commit, after
    # its first file was published.
    assert _drive(tmp_path, 3, 3, fault="mid_commit@2") == -signal.SIGKILL
    committed = _ids(range(0, 3))
    assert _manifests(out) == (committed, committed), "the manifests list whole epochs"
    seen = _duckdb(by_partition)
    part = sorted(set(seen) - set(committed))
    assert set(committed) <= set(seen) and part, "epoch 3's first file is published"
    assert set(part) < set(_ids(range(3, 4))), "a part of epoch 3, not all of it"
    assert _polars(by_partition) == seen

    # The next run finishes epoch 3 (checkpointed) and writes epoch 4: every reader, the
    # recursive globs included, sees every row once; nothing is left staged.
    assert _drive(tmp_path, 4, 4) == 0
    every = _ids(range(0, 5))
    assert staged_files(out) == []
    assert _manifests(out) == (every, every)
    for reader in (_duckdb, _polars):
        assert reader(by_partition) == every
        assert reader(recursive) == every


@pytest.mark.parametrize("reader", ["duckdb", "polars"])
def test_an_unpartitioned_target_read_one_level_deep(tmp_path: Path, reader: str) -> None:
    """The docs' safe glob of an unpartitioned target: ``out/*.parquet`` (one level, no
    ``**``) reads published files only, never the staging area."""
    out = tmp_path / "out"
    script = _DRIVER.replace('"partition_by": "grp"', '"partition_by": ()')
    url = f"sqlite:///{tmp_path / 'm.db'}"
    for first, last, stop in ((0, 1, ""), (2, 2, "pending")):
        argv = [sys.executable, "-c", script, url, str(out), "flat", str(first), str(last), stop]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert done.returncode == (-signal.SIGKILL if stop else 0), done.stderr
    assert staged_files(out)
    read = _duckdb if reader == "duckdb" else _polars
    assert read(str(out / "*.parquet")) == _ids(range(0, 2))
