"""``eosink db upgrade`` of a meta store at each older schema revision holding a PENDING epoch:
the upgraded store's epoch is finished by the next run, exactly once (docs/deploy.md promises
that a store from an older eosink keeps its PENDING epochs finishable).

The PENDING epoch is a real one: a batch run of the file sink stopped in-process right after
its epoch was persisted (``simulate("after_persist")``), its files staged. The store is then
taken down to the older revision with the migrations' own downgrades (what a store of that
revision holds), refused by this eosink until ``eosink db upgrade`` (the CLI, as an operator
runs it), and the batch run again: it commits the crashed run's epoch instead of writing it
twice.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from harness import epoch_states, make_input, read_ids, staged_files

import eosink
from eosink._cli import main as cli
from eosink._metastore import MetaStore
from eosink._metastore.migrations import _config, head_revision
from eosink.errors import SchemaOutdatedError
from eosink.faults import SimulatedCrash, simulate

OLDER = ["0001", "0002", "0003", "0004"]


def _downgrade(url: str, revision: str) -> None:
    from alembic import command

    eng = sa.create_engine(url)
    try:
        with eng.begin() as conn:
            cfg = _config()
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, revision)
    finally:
        eng.dispose()


@pytest.mark.parametrize(
    ("store", "revision"),
    [*(("sqlite", r) for r in OLDER), ("postgres", OLDER[0])],
    ids=lambda v: str(v),
)
def test_pending_epoch_of_an_older_store_is_finished_after_upgrade(
    spark: Any, request: pytest.FixtureRequest, tmp_path: Path, store: str, revision: str
) -> None:
    assert revision < head_revision()
    url = (
        f"sqlite:///{tmp_path / 'meta.db'}"
        if store == "sqlite"
        else str(request.getfixturevalue("fresh_pg_url"))
    )
    expected = make_input(tmp_path / "in", files=2, rows=30)
    df = spark.read.parquet(str(tmp_path / "in")).repartition(2)
    out = tmp_path / "out"
    opts = {"path": str(out), "metastore_url": url}
    with simulate("after_persist") as hits, pytest.raises(SimulatedCrash):
        eosink.run(df, sink="file", epoch=5, **opts)
    assert hits[0] == 1
    sink_id = f"file:{out}"
    assert epoch_states(url, sink_id) == {"PENDING": [5]}
    assert read_ids(out) == []  # staged, not visible

    _downgrade(url, revision)
    with pytest.raises(SchemaOutdatedError, match="eosink db upgrade"):
        MetaStore(url)
    assert epoch_states(url, sink_id) == {"PENDING": [5]}
    assert cli(["db", "upgrade", "--url", url]) == 0

    r = eosink.run(df, sink="file", epoch=5, **opts)
    assert r.recovered and r.committed, r
    assert read_ids(out) == expected
    assert staged_files(out) == []
    assert epoch_states(url, sink_id) == {"COMMITTED": [5]}
    again = eosink.run(df, sink="file", epoch=5, **opts)
    assert again.skipped and read_ids(out) == expected
