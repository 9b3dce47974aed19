"""The sql sink's records in the target database: the epoch's row in ``sql_epochs`` (inserted
by the commit's own transaction: a replayed commit finds it), the sink's marker in
``sql_markers``, and what ``eosink retire`` deletes.
"""

from __future__ import annotations

import json
import time
from typing import Any

from .state import CoordinatorState

__all__ = ["EpochRecords"]


class EpochRecords(CoordinatorState):
    """The coordinator's part that reads and writes eosink's own rows beside the target."""

    def _epoch_row(self, conn: Any, epoch: int, committable: dict[str, Any]) -> None:
        from sqlalchemy import text

        conn.execute(
            text(
                f"INSERT INTO {self.db.own('sql_epochs')} "
                "(sink_key, epoch, committed_at, rows_written) VALUES (:k, :e, :t, :r)"
            ),
            {"k": self.key, "e": epoch, "t": time.time(), "r": committable["rows"]},
        )

    def _committed(self, conn: Any, epoch: int) -> bool:
        """Whether the epoch's row is in ``sql_epochs`` (its commit is done)."""
        from sqlalchemy import text

        row = conn.execute(
            text(f"SELECT 1 FROM {self.db.own('sql_epochs')} WHERE sink_key = :k AND epoch = :e"),
            {"k": self.key, "e": epoch},
        ).first()
        return row is not None

    def read_marker(self) -> dict[str, Any] | None:
        from sqlalchemy import text

        db = self.db
        try:
            with db.engine.connect() as conn:
                raw = conn.execute(
                    text(f"SELECT marker FROM {db.own('sql_markers')} WHERE sink_key = :k"),
                    {"k": self.key},
                ).scalar()
                last = conn.execute(
                    text(f"SELECT MAX(epoch) FROM {db.own('sql_epochs')} WHERE sink_key = :k"),
                    {"k": self.key},
                ).scalar()
        except Exception as exc:
            raise db.error("cannot read the sink's marker", exc) from None
        if raw is None and last is None:
            return None
        marker: dict[str, Any] = dict(json.loads(raw)) if raw is not None else {}
        marker["last_epoch"] = int(last) if last is not None else -1
        return marker

    def write_marker(self, marker: dict[str, Any]) -> None:
        from sqlalchemy import text

        raw = json.dumps({k: v for k, v in marker.items() if k != "last_epoch"}, sort_keys=True)
        db = self.db
        try:
            with db.engine.begin() as conn:
                conn.execute(
                    text(f"DELETE FROM {db.own('sql_markers')} WHERE sink_key = :k"),
                    {"k": self.key},
                )
                conn.execute(
                    text(f"INSERT INTO {db.own('sql_markers')} (sink_key, marker) VALUES (:k, :m)"),
                    {"k": self.key, "m": raw},
                )
        except Exception as exc:
            raise db.error("cannot write the sink's marker", exc) from None

    def retire_records(self, dry_run: bool) -> list[str]:
        """``eosink retire``: the sink's rows of ``sql_epochs`` (its marker row stays: the
        retirement's)."""
        from sqlalchemy import text

        db = self.db
        table = db.own("sql_epochs")
        try:
            with db.engine.begin() as conn:
                n = int(
                    conn.execute(
                        text(f"SELECT COUNT(*) FROM {table} WHERE sink_key = :k"), {"k": self.key}
                    ).scalar()
                    or 0
                )
                if n and not dry_run:
                    conn.execute(text(f"DELETE FROM {table} WHERE sink_key = :k"), {"k": self.key})
        except Exception as exc:
            raise db.error("cannot delete the sink's rows of sql_epochs", exc) from None
        return [f"{n} row(s) of {table} (which epochs were applied)"] if n else []
