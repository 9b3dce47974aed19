"""Path-like options made absolute where the user's working directory is known
(``eosink._paths``): pure logic; the real proof is tests/test_connect.py's
``test_relative_paths_are_the_clients`` against a Spark Connect server."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from eosink._paths import (
    absolute,
    absolute_options,
    check_no_relative,
    in_session_folder,
    is_relative,
    path_options,
)
from eosink.errors import ConfigError

CASES = [
    # value, relative?, absolute against /w
    ("out/f", True, "/w/out/f"),
    ("./out/../f", True, "/w/f"),
    ("/data/out", False, "/data/out"),
    ("file:///data/out", False, "file:///data/out"),
    ("file:out", True, "file:///w/out"),
    ("s3://bucket/out", False, "s3://bucket/out"),
    ("s3a://bucket/out", False, "s3a://bucket/out"),
    ("hdfs://nn:8020/out", False, "hdfs://nn:8020/out"),
    ("sqlite:///meta.db", True, "sqlite:////w/meta.db"),
    ("sqlite+pysqlite:///d/meta.db", True, "sqlite+pysqlite:////w/d/meta.db"),
    ("sqlite:////abs/meta.db", False, "sqlite:////abs/meta.db"),
    ("sqlite://", False, "sqlite://"),
    ("postgresql://u:secret@h/db", False, "postgresql://u:secret@h/db"),
]


@pytest.mark.parametrize(("value", "relative", "expected"), CASES)
def test_absolute(value: str, relative: bool, expected: str) -> None:
    assert is_relative(value) is relative
    assert absolute(value, "/w") == expected
    assert not is_relative(absolute(value, "/w"))


def test_home_is_expanded_not_relative() -> None:
    assert not is_relative("~/out")
    assert absolute("~/out", "/w") == os.path.expanduser("~/out")


def test_only_path_options_are_rewritten() -> None:
    names = path_options(["warehouse"])
    opts = {"Path": "out", "checkpointlocation": "chk", "warehouse": "wh", "topic": "t/x"}
    assert absolute_options(opts, names, "/w") == {
        "Path": "/w/out",
        "checkpointlocation": "/w/chk",
        "warehouse": "/w/wh",
        "topic": "t/x",
    }


def test_refused_only_in_a_session_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    names = path_options()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPARK_JOB_ARTIFACT_UUID", "default")  # a classic session's worker
    assert not in_session_folder()
    check_no_relative({"path": "out"}, names)
    folder = tmp_path / "4c466619-50e9-4dc7-affa-a392de7b5b95"
    folder.mkdir()
    monkeypatch.chdir(folder)
    monkeypatch.setenv("SPARK_JOB_ARTIFACT_UUID", folder.name)  # a Connect session's
    assert in_session_folder()
    check_no_relative({"path": "/data/out", "metastore_url": "sqlite:////m.db"}, names)
    with pytest.raises(ConfigError, match=r"metastore_url='sqlite:///m.db'.*absolute path"):
        check_no_relative({"path": "/data/out", "metastore_url": "sqlite:///m.db"}, names)
