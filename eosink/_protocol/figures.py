"""What happened to an epoch (its figures), and the Arrow schema as bytes."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

FIGURES_KEPT = 1000
"""Epochs whose :class:`EpochFigures` a driver keeps in memory (the newest ones): a runtime's
``figures`` and a streaming handle's. The meta store keeps every epoch's (``eosink status``);
the ``eosink_epoch_committed`` hook receives each one."""


@dataclass
class EpochFigures:
    """What happened to one epoch; exposed by handles and results, logged, sent to hooks.

    Attributes:
        epoch: the epoch.
        rows: rows written.
        files: files (or other units) the commit published (``Prepared.files``).
        bytes: their size (``Prepared.bytes``).
        write_s: seconds the writers took (Spark's job, or the Python writer tasks).
        pre_commit_ms: the coordinator's ``pre_commit``, in milliseconds.
        persist_ms: persisting the PENDING row in the meta store.
        commit_ms: the coordinator's ``commit`` (with retries) and the COMMITTED mark.
        batch_end_at: wall-clock time (``time.time()``) the epoch's data was complete.
        committed_at: wall-clock time its commit was visible (0 until then).
        skipped: a replay of a committed epoch (nothing written).
        held_rows: rows of committed epochs the sink still holds in open files after this
            epoch (files that span epochs: the file sink's rolling options); visible once
            their file rolls, so their visibility lag is up to the rolling interval.
        held_bytes: their size in bytes.
    """

    epoch: int
    rows: int = 0
    files: int = 0
    bytes: int = 0
    write_s: float = 0.0
    pre_commit_ms: float = 0.0
    persist_ms: float = 0.0
    commit_ms: float = 0.0
    batch_end_at: float = 0.0
    committed_at: float = 0.0
    skipped: bool = False
    held_rows: int = 0
    held_bytes: int = 0
    writer: str = ""
    """Which writers staged the epoch: ``spark`` (the native path) or ``python``."""

    @property
    def visibility_lag_s(self) -> float:
        """Commit visible minus batch end."""
        return max(0.0, self.committed_at - self.batch_end_at) if self.committed_at else 0.0

    def as_dict(self) -> dict[str, Any]:
        """Every field, plus ``visibility_lag_s``: what the ``eosink_epoch_committed`` hook gets."""
        d = asdict(self)
        d["visibility_lag_s"] = self.visibility_lag_s
        return d
