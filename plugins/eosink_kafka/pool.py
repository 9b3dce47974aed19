"""The kafka sink's fixed pool of transactional ids: its slots, made ready (fenced, then their
markers read) at once, and work run on every slot in parallel."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from eosink import ConfigError

from .options import transactional_id
from .state import CoordinatorState

__all__ = ["SlotPool", "per_slot"]


def per_slot(fn: Callable[[int], None], numbers: list[int], prefer: type[Exception]) -> None:
    """``fn(n)`` for every slot number, one thread each (inline for one). Once all have
    finished, the first error is raised, the first of type ``prefer`` if any."""
    if len(numbers) == 1:
        fn(numbers[0])
        return
    with ThreadPoolExecutor(max_workers=len(numbers)) as pool:
        futures = [pool.submit(fn, n) for n in numbers]
        errors = [exc for exc in (fut.exception() for fut in futures) if exc is not None]
    if errors:
        raise ([e for e in errors if isinstance(e, prefer)] or errors)[0]


class SlotPool(CoordinatorState):
    """The coordinator's part that keeps the pool's slots (``self.slots``)."""

    def _slot(self, n: int) -> Any:
        from .transactions import Slot

        slot = self.slots.get(n)
        if slot is None:
            slot = self.slots[n] = Slot(
                self.opts, transactional_id(self.key, n), self.control_topic, f"{self.key}/{n}"
            )
        return slot

    def _ready(self, numbers: Iterable[int]) -> None:
        """Initialise the slots that are not, then read their markers.

        Order matters: ``init_transactions`` of a slot fences its zombies (aborting their
        open transaction) *before* its marker is read, so the marker read is final. Slots of
        the sink that are not asked for but left marker records in open transactions (a
        larger pool of an earlier run) are initialised too: their open transactions would
        hold the control topic's last stable offset back until they time out.
        """
        from .control import read_markers

        want = set(numbers)
        todo = {n for n in want if not self._slot(n).ready}
        if not todo:
            return
        prefix = f"{self.key}/"
        for key in read_markers(self.opts, self.control_topic, prefix, committed=False):
            number = key[len(prefix) :]
            if number.isdigit() and not self._slot(int(number)).ready:
                todo.add(int(number))
        # At once: each waits ~0.3 s for the broker (one after the other, a pool of 16
        # took ~4 s per start and per format("eosink") micro-batch).
        per_slot(lambda n: self._slot(n).init(), sorted(todo), ConfigError)
        markers = read_markers(self.opts, self.control_topic, prefix)
        for n in todo:
            slot = self._slot(n)
            slot.marker = markers.get(slot.marker_key)
            slot.ready = True
        self.sink_marker = markers.get(f"{self.key}/sink", self.sink_marker)
