"""An example third-party eosink sink: ``jsonl_dir``, one JSON-lines file per epoch.

It is a real package with its own ``pyproject.toml`` and entry point; eosink's tests install
it and check that it is discovered, listed and honours the plugin contracts.

Layout under ``path``: ``.staging/<epoch>/<attempt>.jsonl`` (staged), ``epoch-<epoch>.jsonl``
(published). ``commit`` concatenates the staged files into a temporary file and renames it
into place (atomic, idempotent: a present file means done).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
from pydantic import BaseModel, ConfigDict

import eosink


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str


class Writer(eosink.CoordinatedSinkWriter[dict[str, Any]]):
    def __init__(self, opts: Options, ctx: eosink.WriterContext) -> None:
        self.file = Path(opts.path) / ".staging" / str(ctx.epoch) / f"{ctx.attempt_id}.jsonl"
        self.rows = 0
        self.fh: Any = None

    def begin_epoch(self, epoch: int) -> None:
        self.file.parent.mkdir(parents=True, exist_ok=True)
        self.fh = open(self.file, "w")

    def write_batch(self, batch: pa.RecordBatch) -> None:
        for row in batch.to_pylist():
            self.fh.write(json.dumps(row, default=str) + "\n")
            self.rows += 1

    def finish_write(self, epoch: int) -> dict[str, Any]:
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.fh.close()
        return {"file": str(self.file), "rows": self.rows}

    def abort_write(self) -> None:
        if self.fh is not None:
            self.fh.close()
        self.file.unlink(missing_ok=True)

    def __getstate__(self) -> dict[str, Any]:
        return {"file": self.file, "rows": self.rows, "fh": None}


class Coordinator(
    eosink.SinkCommitCoordinator[dict[str, Any], dict[str, Any]], eosink.StagedEpochs
):
    def __init__(self, opts: Options, sink_id: str) -> None:
        self.root = Path(opts.path)

    def init(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)

    def pre_commit(
        self, epoch: int, results: Sequence[dict[str, Any]]
    ) -> eosink.Prepared[dict[str, Any]]:
        files = sorted(r["file"] for r in results if r["rows"])
        committable = {"files": files, "rows": sum(r["rows"] for r in results)}
        return eosink.Prepared(committable, files=len(files))

    def commit(self, epoch: int, committable: dict[str, Any]) -> None:
        final = self.root / f"epoch-{epoch:08d}.jsonl"
        if not final.exists():
            tmp = self.root / f".epoch-{epoch:08d}.jsonl.tmp"
            with open(tmp, "w") as out:
                for i, f in enumerate(committable["files"]):
                    out.write(Path(f).read_text())
                    if i == 0:
                        eosink.fault_point("mid_commit")  # lets crash tests stop here
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, final)
        shutil.rmtree(self.root / ".staging" / str(epoch), ignore_errors=True)

    def abort(self, epoch: int, committable: dict[str, Any] | None) -> None:
        shutil.rmtree(self.root / ".staging" / str(epoch), ignore_errors=True)

    def staged_epochs(self) -> Iterable[int]:
        d = self.root / ".staging"
        return [int(p.name) for p in d.iterdir() if p.name.isdigit()] if d.is_dir() else []


def make_writer(opts: Options, ctx: eosink.WriterContext) -> Writer:
    return Writer(opts, ctx)


def make_coordinator(opts: Options, sink_id: str) -> Coordinator:
    return Coordinator(opts, sink_id)


@eosink.hookimpl
def eosink_sinks() -> list[eosink.SinkPlugin[Any, Any, Any]]:
    return [
        eosink.SinkPlugin(
            name="jsonl_dir",
            options_model=Options,
            writer_factory=make_writer,
            coordinator_factory=make_coordinator,
            write_result_codec=eosink.JsonCodec[Any](version=1),
            committable_codec=eosink.JsonCodec[Any](version=1),
            default_sink_id=lambda o: f"jsonl_dir:{o.path}",
            description="example third-party sink: one JSON-lines file per epoch",
            capabilities=eosink.Capabilities(staged_epochs=True),
        )
    ]
