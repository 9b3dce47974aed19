"""eosink's log lines, visible without configuring logging, and easy to quiet.

A stream that prints nothing is blind to operate: by default eosink's logger (``eosink``)
says that a run started, what recovery did and one line per committed epoch, at INFO, on
stderr, when the application configured no logging (the root logger has no handler). Once the
application configures logging (``logging.basicConfig``, a framework's set-up), its
configuration decides alone: eosink's own handler steps aside.

To quiet it: ``EOSINK_LOG_LEVEL=WARNING`` (or ``ERROR``...), or
``logging.getLogger("eosink").setLevel(logging.WARNING)``. Libraries' start-up chatter
(Alembic's "setup plugin" lines, py4j's gateway lines) is kept at WARNING unless their
loggers were given a level.
"""

from __future__ import annotations

import logging
import os
import sys

__all__ = ["default_logging"]

_FORMAT = "%(asctime)s eosink %(levelname)s %(message)s"
_QUIET = ("alembic", "py4j")


class _DefaultHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """stderr, only while the application has configured no logging of its own."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)
        self.setFormatter(logging.Formatter(_FORMAT, "%H:%M:%S"))

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers:
            return  # the application's logging configuration shows it (or not)
        self.stream = sys.stderr  # follow a replaced stderr (notebooks, pytest)
        super().emit(record)


def default_logging() -> None:
    """Set up eosink's default logging once per process (see the module)."""
    eosink = logging.getLogger("eosink")
    if any(isinstance(h, _DefaultHandler) for h in eosink.handlers):
        return
    for name in _QUIET:
        lg = logging.getLogger(name)
        if lg.level == logging.NOTSET:
            lg.setLevel(logging.WARNING)
    wanted = os.environ.get("EOSINK_LOG_LEVEL", "").strip().upper()
    if wanted:
        level = logging.getLevelName(wanted)
        if isinstance(level, int):
            eosink.setLevel(level)
    elif eosink.level == logging.NOTSET and not logging.getLogger().handlers:
        eosink.setLevel(logging.INFO)
    eosink.addHandler(_DefaultHandler())
