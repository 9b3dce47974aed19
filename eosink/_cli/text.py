"""Text helpers of the commands: tables, one-line messages, times."""

from __future__ import annotations

from datetime import datetime


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def line(r: list[str]) -> str:
        return "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=False)).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def one_line(text: str) -> str:
    """Drivers' multi-line messages (psycopg's hints...) on one line."""
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def iso(t: float | None, timespec: str = "seconds") -> str | None:
    """A Unix time as local ISO 8601 with its offset (None stays None); ``timespec`` as
    ``datetime.isoformat``'s (an epoch's times: ``milliseconds``)."""
    if not t:
        return None
    return datetime.fromtimestamp(t).astimezone().isoformat(timespec=timespec)


def run_label(origin: str | None) -> str:
    """What wrote an epoch: a batch run (explicit epoch), a batch run without epoch=, or a
    stream (its lineage's first 8 characters)."""
    from .._metastore import AUTO_ORIGINS, BATCH, DROPPED_OPEN_FILE

    if origin == BATCH:
        return "batch"
    if origin in AUTO_ORIGINS:
        return "batch (auto epoch)"
    if origin == DROPPED_OPEN_FILE:
        return "dropped open file"
    return f"stream {origin[:8]}" if origin else "-"
