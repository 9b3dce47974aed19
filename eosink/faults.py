"""Named fault points for crash tests.

Arm one with the environment variable ``EOSINK_FAULT``: ``point`` kills the process with
SIGKILL the first time it reaches ``point``; ``point@N`` the N-th time. Several may be given,
separated by commas. Unarmed (the normal case), :func:`fault_point` is one dict lookup.

Driver points, in protocol order:

=====================  =============================================================
after_spark_write      native path: Spark's writers staged the epoch; no result checked
after_write_results    every writer finished; the driver has the results, nothing built
after_pre_commit       committable built, not persisted
after_persist          PENDING durable; Spark has not checkpointed the epoch yet
before_commit          the epoch is checkpointed; commit not started
mid_commit             the plugin made part of the epoch visible
after_commit           the target holds the epoch; the COMMITTED mark is not written
after_mark_committed   COMMITTED durable
mid_abort              recovery is deleting an aborted epoch's staged data
recovery_before_abort  recovery marked an epoch ABORTED; the plugin's abort not called
recovery_before_finish_abort  the plugin's abort is done; the ABORTED row not deleted
after_lineage_written  a fresh checkpoint's lineage file is written, the meta store
                       does not know it yet
stream_before_start    ``eosink.run``'s stream is set up (recovery held for the first
                       micro-batch); Spark's query not started
=====================  =============================================================

Points of sinks whose files span epochs (the file sink's rolling options):

=====================  =============================================================
roll_after_part        pre_commit uploaded a part (S3) or appended to an in-progress
                       file (local); the committable is not persisted
roll_mid_merge         merging a rolling slot's Parquet/ORC pieces: half are written
roll_before_publish    about to publish a rolled file (CompleteMultipartUpload, link)
roll_after_publish     a rolled file is visible; slot state and pieces untouched
roll_before_drop       rolled files published; their staged pieces not yet deleted
                       (in an epoch's commit: the slots' state is already stored)
roll_after_drop        the rolled slots' staged pieces are deleted (between epochs:
                       the slots' state not yet stored)
=====================  =============================================================

Points of the kafka sink (one transaction per chunk of staged records):

=====================  =============================================================
kafka_after_init       ``init_transactions`` of a transactional id returned (zombies
                       fenced, their open transaction aborted); its marker not read
kafka_mid_produce      inside a chunk's transaction: records produced, not all, no
                       marker
kafka_before_commit    a chunk's records and the slot's marker are produced and
                       flushed; ``commit_transaction`` not called
=====================  =============================================================

Executor points kill the Python worker of a task's *first* attempt (a lost executor; Spark
retries the task): ``task_before_finish`` before ``finish_write``, ``task_after_finish``
after it (the writer's files are durable, its result never reaches the driver).

``EOSINK_FAULT_SIGNAL=STOP`` sends SIGSTOP instead of SIGKILL: the process freezes there
(a driver that stalls, e.g. a long GC pause, while another takes over: a *zombie*) until it
gets SIGCONT.

If ``EOSINK_FAULT_MARK`` names a directory, a file ``<point>.<pid>`` appears there right
before the kill, so a test can tell which point fired and in which process; it holds the
point's *site* (see :func:`fault_point`), empty for points reached by one path only. It
appears whole (written beside the directory, then renamed into it): a watcher that kills
the driver as soon as a mark appears never reads a mark whose site is not written yet.
With ``EOSINK_FAULT_ONCE=1`` too, a point fires in one process only: a point whose mark is
there already (another process fired it: a Python worker that Spark started again) passes.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = [
    "DRIVER_FAULT_POINTS",
    "EXECUTOR_FAULT_POINTS",
    "SimulatedCrash",
    "fault_point",
    "simulate",
]

DRIVER_FAULT_POINTS = (
    "after_spark_write",
    "after_write_results",
    "after_pre_commit",
    "after_persist",
    "before_commit",
    "mid_commit",
    "after_commit",
    "after_mark_committed",
    "mid_abort",
    "recovery_before_abort",
    "recovery_before_finish_abort",
    "after_lineage_written",
    "stream_before_start",
    "roll_after_part",
    "roll_mid_merge",
    "roll_before_publish",
    "roll_after_publish",
    "roll_before_drop",
    "roll_after_drop",
    "kafka_after_init",
    "kafka_mid_produce",
    "kafka_before_commit",
)
"""The driver's fault points, in protocol order (see the table above)."""
EXECUTOR_FAULT_POINTS = ("task_before_finish", "task_after_finish")
"""The fault points in a task's first attempt, before and after its writer's ``finish_write``."""


def _parse(spec: str | None) -> dict[str, int]:
    armed: dict[str, int] = {}
    for part in (spec or "").split(","):
        part = part.strip()
        if not part:
            continue
        name, _, n = part.partition("@")
        if name not in DRIVER_FAULT_POINTS + EXECUTOR_FAULT_POINTS:
            raise ValueError(f"EOSINK_FAULT: unknown fault point {name!r}")
        armed[name] = int(n or 1)
    return armed


_ARMED = _parse(os.environ.get("EOSINK_FAULT"))
_SEEN: dict[str, int] = {}
_SIMULATED: dict[str, list[int]] = {}
_COUNT = threading.Lock()  # points are reached from several threads (a pool's slots)


class SimulatedCrash(BaseException):
    """Raised by a fault point armed with :func:`simulate`: the in-process stand-in for a kill.

    A ``BaseException``, so that no ``except Exception`` of the core or a plugin swallows it.
    """


@contextmanager
def simulate(point: str, nth: int = 1) -> Iterator[list[int]]:
    """Within the block, the ``nth`` time ``point`` is reached it raises :class:`SimulatedCrash`.

    For in-process crash tests (``eosink.testing``): the test abandons the objects of the
    "crashed" run and starts a new one, as a restarted driver would. Yields a list that holds
    the count of times the point was reached, so a test can tell whether it fired.
    """
    if point not in DRIVER_FAULT_POINTS + EXECUTOR_FAULT_POINTS:
        raise ValueError(f"unknown fault point {point!r}")
    state = [0, nth]
    _SIMULATED[point] = state
    try:
        yield state
    finally:
        _SIMULATED.pop(point, None)


def fault_point(name: str, *, first_attempt: bool = True, site: str = "") -> None:
    """Die here with SIGKILL if ``name`` is armed and reached for the armed time.

    Args:
        name: one of the documented fault points.
        first_attempt: for executor points, whether this is a task's first attempt
            (retries never die, so the job can finish).
        site: which of a point's places this is, where one point is reached by different
            paths (``"held"``, ``"fresh"``: the sql sink's commit of a transaction phase 1
            held open, or of a new one). Armed by ``name`` alone; the mark file holds it, so
            that a crash test can tell, and the fault coverage table count, each path.
    """
    if _SIMULATED and name in _SIMULATED:
        with _COUNT:
            state = _SIMULATED[name]
            state[0] += 1
            crash = state[0] == state[1]
        if crash:
            raise SimulatedCrash(name)
    if not _ARMED or name not in _ARMED or not first_attempt:
        return
    with _COUNT:
        _SEEN[name] = seen = _SEEN.get(name, 0) + 1
    if seen == _ARMED[name]:
        mark = os.environ.get("EOSINK_FAULT_MARK")
        if mark and os.environ.get("EOSINK_FAULT_ONCE") == "1":
            if any(f.startswith(f"{name}.") for f in os.listdir(mark)):
                return
        if mark:
            final = os.path.join(mark, f"{name}.{os.getpid()}")
            # Beside the directory, not in it: watchers react to any file in it.
            part = os.path.join(
                os.path.dirname(os.path.abspath(mark)), f".{name}.{os.getpid()}.mark-part"
            )
            with open(part, "w") as fh:
                fh.write(site)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(part, final)
        sig = os.environ.get("EOSINK_FAULT_SIGNAL", "KILL").upper().removeprefix("SIG")
        # Sent to this thread: a signal sent to the process may be taken by another of its
        # threads, and this one would run on for a moment (a SIGSTOP at kafka_before_commit
        # let the commit through). The whole process stops or dies either way.
        signal.pthread_kill(
            threading.get_ident(), signal.SIGSTOP if sig == "STOP" else signal.SIGKILL
        )
