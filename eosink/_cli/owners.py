"""Whether a sink's coordinator still runs: commands that change a sink refuse while it does."""

from __future__ import annotations

import os
import socket
import sys
import time
from typing import Any


def owner_alive(owner: str, heartbeat_at: float | None = None) -> bool | None:
    """Whether the coordinator ``host:pid`` that last acquired a sink still runs.

    On this host its process is asked. On another host its heartbeat tells: recorded
    within :data:`HEARTBEAT_STALE_SECONDS` means running, older means not (killed, or its
    host lost); None when it has none (stopped cleanly, or an eosink before the heartbeat)
    or is not a process (``eosink abandon``): this machine cannot tell. A ``format("eosink")``
    stream's owner (``host:pid (format stream)``, one micro-batch's coordinator) is asked by
    its heartbeat on every host: its process ends with each micro-batch, its query runs on."""
    from .._metastore import FORMAT_STREAM_OWNER, HEARTBEAT_STALE_SECONDS, split_owner

    host, pid, note = split_owner(owner)
    if not host or not pid.isdigit():
        return None
    if host != socket.gethostname() or note == FORMAT_STREAM_OWNER:
        if heartbeat_at is None:
            return None
        return time.time() - heartbeat_at < HEARTBEAT_STALE_SECONDS
    if int(pid) == os.getpid():
        return False  # this command itself (an earlier call in this process)
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def refuse_unless_stopped(store: Any, sink_id: str, command: str) -> int | None:
    """None when ``store`` has ``sink_id`` and its owner does not run on this machine; else
    says why on stderr and returns the exit status (1: no such sink, 2: its job runs)."""
    sink = store.sink(sink_id)
    if sink is None:
        print(
            f"eosink {command}: meta store {store.url_redacted} has no sink {sink_id!r} "
            "(give --sink-id as `eosink status` shows it)",
            file=sys.stderr,
        )
        return 1
    if owner_alive(sink.owner, sink.heartbeat_at):
        from .._metastore import FORMAT_STREAM_OWNER, HEARTBEAT_STALE_SECONDS, split_owner

        host, _, note = split_owner(sink.owner)
        age = time.time() - (sink.heartbeat_at or 0.0)
        if note == FORMAT_STREAM_OWNER:
            where = (
                f'is a format("eosink") stream that committed a micro-batch {age:.0f} s ago '
                f"on {host} (such a query counts as running until {HEARTBEAT_STALE_SECONDS:.0f} "
                "s after its last micro-batch; stop the query, or wait)"
            )
        elif host == socket.gethostname():
            where = "is running on this machine"
        else:
            where = (
                f"on {host} recorded its heartbeat {age:.0f} s ago (a job killed without "
                f"stopping is taken as stopped {HEARTBEAT_STALE_SECONDS:.0f} s after its "
                "last heartbeat)"
            )
        print(
            f"eosink {command}: the sink's coordinator {sink.owner} {where}: stop that job first",
            file=sys.stderr,
        )
        return 2
    return None
