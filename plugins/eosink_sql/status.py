"""What a PENDING epoch of the sql sink holds open in the target database, for
``eosink status``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eosink.util import sink_key

from .holds import HOLD_S, hold_name

__all__ = ["describe_open"]


def describe_open(
    sink_id: str, last: dict[str, Any] | None, pending: Mapping[int, dict[str, Any]]
) -> list[dict[str, Any]]:
    """What a PENDING epoch holds in the target database, for ``eosink status``: its staging
    tables (one per task attempt that wrote rows; dropped by the commit) and, on PostgreSQL,
    its phase-1 transaction, which may still be held open (``application_name`` ``eosink-hold
    <sink key> <epoch>``), with the locks of its statements on the target table, until the
    commit, the sink's next start or ``eosink recover`` ends it, or :data:`HOLD_S` seconds
    idle. A COMMITTED epoch leaves nothing open."""
    key = sink_key(sink_id)
    out = []
    for epoch in sorted(pending):
        c = pending[epoch]
        tables = list(c.get("tables") or [])
        target = c["table"] if "table" in c else c["spec"]["table"]  # (codec version 1)
        hold = hold_name(key, epoch)
        out.append(
            {
                "kind": "staging tables",
                "what": f"epoch {epoch}: {len(tables)} staging table(s), {c['rows']} rows to "
                f"move into {target}; on PostgreSQL its phase-1 transaction may be held open "
                f"(application_name '{hold}', locks on {target}) until the "
                f"commit or {HOLD_S} s idle",
                "epoch": epoch,
                "table": target,
                "staging_tables": tables,
                "rows": int(c["rows"]),
                "hold_application_name": hold,
            }
        )
    return out
