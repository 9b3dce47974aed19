"""One epoch of one run, from the decision to its commit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from .._rules import (
    SKIP,
    WRITE,
)
from .figures import EpochFigures

if TYPE_CHECKING:
    from .phases import _Phases


@dataclass
class Epoch:
    """One epoch of one run, from the decision to its commit (made by the runtime).

    Both front ends (``eosink.run`` and ``format("eosink")``) drive an epoch the same way::

        ep = runtime.batch_epoch(epoch)          # or runtime.stream_epoch(base + batchId)
        if ep.skipped:                           # committed before, or finished now
            ep.discard()                         # (only if something was written meanwhile)
        else:
            setup = ep.setup(schema)             # coordinator.writer_setup
            ... write (Python writers in tasks, or the native path) ...
            ep.prepare(results, rows, write_s)   # phase 1: PENDING
            ep.commit()                          # phase 2 (or hand it to the AsyncCommitter)

    Attributes:
        epoch: the epoch.
        decision: ``write`` or ``skip``.
        recovered: a crashed run's PENDING epoch (complete data) was committed instead.
        figures: the epoch's figures once prepared (or recovered).
        committable: once prepared.
        schema: the Arrow schema given to :meth:`setup` (what the epoch is staged with).
    """

    runtime: _Phases
    epoch: int
    decision: str
    recovered: bool = False
    figures: EpochFigures | None = None
    committable: Any = None
    schema: pa.Schema | None = None

    @property
    def skipped(self) -> bool:
        """Nothing to write: the epoch is committed (before, or by this recovery)."""
        return self.decision == SKIP

    def setup(self, schema: pa.Schema) -> Any:
        """The coordinator's ``writer_setup`` for this epoch's schema."""
        self.schema = schema
        return self.runtime.coordinator.writer_setup(schema)

    def prepare(
        self,
        results: Sequence[Any],
        rows: int,
        write_s: float,
        *,
        writer: str = "python",
        schema: pa.Schema | None = None,
    ) -> EpochFigures:
        """Phase 1: the coordinator's ``pre_commit``, persisted PENDING (with the epoch spec:
        ``schema``, else the one given to :meth:`setup`)."""
        assert self.decision == WRITE, f"epoch {self.epoch} is not to be written"
        if schema is not None:
            self.schema = schema
        self.committable, self.figures = self.runtime.pre_commit(
            self.epoch, results, rows=rows, write_s=write_s, writer=writer, schema=self.schema
        )
        return self.figures

    def commit(self) -> EpochFigures:
        """Phase 2: commit (retried while transient) and mark COMMITTED."""
        assert self.figures is not None, f"epoch {self.epoch} is not prepared"
        self.runtime.commit_epoch(self.epoch, self.committable, self.figures)
        return self.figures

    def discard(self) -> None:
        """Delete what was staged for the epoch without a committable (failed writers, a
        replay's output)."""
        self.runtime.discard(self.epoch)
