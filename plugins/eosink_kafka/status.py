"""What a PENDING epoch of the kafka sink leaves open at the broker, for ``eosink status``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .options import sink_key, transactional_id

__all__ = ["describe_open"]


def describe_open(
    sink_id: str, last: dict[str, Any] | None, pending: Mapping[int, dict[str, Any]]
) -> list[dict[str, Any]]:
    """The transactions a PENDING epoch's commit runs, for ``eosink status``.

    No transaction is open across a checkpoint, so a COMMITTED epoch leaves none. A PENDING
    one is published by its slots' transactional ids; if a commit was interrupted, the
    transaction it had begun stays open at the broker (holding back ``read_committed``
    readers of its partitions) until the sink's next start or ``eosink recover`` fences the
    id, or the broker's ``transaction.timeout.ms`` aborts it.
    """
    key = sink_key(sink_id)
    out = []
    for epoch in sorted(pending):
        for n, chunks in sorted(pending[epoch]["slots"].items(), key=lambda kv: int(kv[0])):
            if not chunks:
                continue
            txn = transactional_id(key, n)
            records = sum(int(c[2]) - int(c[1]) for c in chunks)
            out.append(
                {
                    "kind": "transaction",
                    "what": f"{txn}: epoch {epoch}, {len(chunks)} transaction(s) of "
                    f"{records} records to publish (one may be open at the broker if a "
                    "commit was interrupted)",
                    "transactional_id": txn,
                    "epoch": epoch,
                    "chunks": len(chunks),
                    "records": records,
                }
            )
    return out
