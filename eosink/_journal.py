"""The stream's journal in its checkpoint: what phase 2 needs, where every driver finds it.

On a cluster the driver is restarted elsewhere (a new Kubernetes pod, a YARN retry, a
re-created job cluster): its local disk, and with it a default SQLite meta store, is gone;
the checkpoint location and the target are what survives. So everything phase 2 needs for
an epoch Spark checkpointed is also written here, through the checkpoint's own file system
(local, or Spark's Hadoop FileSystem: HDFS, S3A, ABFS, GCS), **before** the epoch's PENDING
row and so before Spark's checkpoint of it::

    <checkpoint>/eosink/<sink key>/generations/<N>.json     one per driver start (atomic create):
                                                            lineage, epoch base, sink id
    <checkpoint>/eosink/<sink key>/pending/<epoch>.<N>.json  the epoch's committable and figures

**Fencing across machines.** Every driver of the query claims the next generation number
with an atomic create (of two drivers claiming one number, one succeeds, the other takes the
next one). A driver whose generation is no longer the newest is a zombie: it gets
:class:`~eosink.errors.FencedError` wherever the meta store's fence is checked (before every
commit, abort, roll and epoch decision), whatever meta store it uses.

**Recovery.** An entry is deleted once a later epoch is committed (the newest committed
epoch's entry stays), or when a newer generation records the same epoch. So the journal
holds the newest committed epoch and every epoch not known committed: epochs of the lineage
below its oldest entry are committed. A driver whose meta store has no row of an entry's
epoch (a new machine, a lost store) imports the entry as PENDING when Spark checkpointed the
epoch (any entry in ``inline`` mode, where PENDING means complete), and the recovery rule
commits it (idempotently) as if the row had never been lost. Which store is right when both
know an epoch: the meta store (it has every transition; the journal only ever adds what the
store lost).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ._checkpoint import CheckpointDir
from .errors import FencedError
from .util import sink_key

log = logging.getLogger("eosink")

__all__ = ["Entry", "Journal", "beside_target"]

_KEEP_GENERATIONS = 3
"""Generation files kept (older ones are deleted; a zombie still sees a newer one)."""


@dataclass(frozen=True)
class Entry:
    """One epoch's PENDING record as the journal keeps it."""

    epoch: int
    generation: int
    committable: bytes
    codec_version: int
    rows: int
    files: int
    bytes: int
    batch_end_at: float
    pre_commit_ms: float
    origin: str
    spec: str | None = None
    """The stored :class:`~eosink.EpochSpec` (JSON) the epoch was staged with, or None (an
    entry written before eosink stored specs)."""


class Journal:
    """eosink's journal of one sink in one streaming checkpoint (see the module docstring).

    Thread safety: :meth:`record`, :meth:`forget_before` and :meth:`assert_live` may run on
    the batch thread and the committer thread at once (they touch different files).
    """

    def __init__(
        self,
        ckpt: CheckpointDir,
        sink_id: str,
        generation: int | None = None,
        *,
        prefix: str = "eosink/",
    ) -> None:
        self.ckpt = ckpt
        self.sink_id = sink_id
        self.dir = f"{prefix}{sink_key(sink_id)}"
        self.generation = generation
        self._pruned = False  # record() deleted older generations' entries of its epoch

    # -- generations -----------------------------------------------------------------------
    def _generations(self) -> list[int]:
        names = self.ckpt.list_names(f"{self.dir}/generations")
        return sorted(int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit())

    def state(self) -> dict[str, Any] | None:
        """The newest readable generation's record (lineage, epoch_base...), or None."""
        for g in reversed(self._generations()):
            raw = self.ckpt.read_bytes(f"{self.dir}/generations/{g:012d}.json")
            try:
                data = json.loads(raw or b"")
            except ValueError:
                log.warning("checkpoint %s: ignoring a torn journal file", self.ckpt.location)
                continue
            if isinstance(data, dict) and data.get("sink_id") == self.sink_id:
                return data
        return None

    def claim(
        self,
        lineage: str,
        epoch_base: int,
        run: str | None = None,
        first_batch: int = 0,
        inline: bool = False,
    ) -> int:
        """Become the newest generation of this sink's drivers on this checkpoint.

        Every other driver (on any machine) is fenced from now on. ``run``: the id of the
        ``eosink.run`` call whose coordinator claims (a Spark Connect stream's client and its
        server worker share one), kept in the record. ``first_batch``: the first batch id
        that ``epoch_base`` maps (a query whose base moved above other runs' epochs: its
        earlier batches had other epochs). ``inline``: the driver commits inside its
        micro-batches (a PENDING epoch of it may be committed in part). Returns the
        generation.
        """
        while True:
            n = max(self._generations(), default=0) + 1
            body = json.dumps(
                {
                    "sink_id": self.sink_id,
                    "generation": n,
                    "lineage": lineage,
                    "epoch_base": epoch_base,
                    "first_batch": first_batch,
                    "inline": inline,
                    "owner": f"{socket.gethostname()}:{os.getpid()}",
                    "at": time.time(),
                    "run": run,
                },
                sort_keys=True,
            ).encode()
            if self.ckpt.write_bytes(f"{self.dir}/generations/{n:012d}.json", body, exclusive=True):
                break
        self.generation = n
        for old in self._generations()[:-_KEEP_GENERATIONS]:
            try:
                self.ckpt.delete(f"{self.dir}/generations/{old:012d}.json")
            except Exception:  # best effort: a leftover costs nothing
                log.debug("cannot delete an old journal generation", exc_info=True)
        return n

    def assert_live(self) -> None:
        """Raise :class:`FencedError` if a newer driver claimed the sink on this checkpoint."""
        if self.generation is None:
            return
        newest = max(self._generations(), default=0)
        if newest > self.generation:
            raise FencedError(
                f"sink {self.sink_id!r}: this driver (checkpoint generation {self.generation}) "
                f"was fenced by a newer one (generation {newest}) of the query on checkpoint "
                f"{self.ckpt.location}; this zombie changes nothing"
            )

    # -- entries ---------------------------------------------------------------------------
    def record(self, entry: Entry) -> None:
        """Write ``entry`` durably (before the epoch's PENDING row), then delete the entries
        of the same epoch that older drivers (generations) wrote.

        Such an entry is superseded: its driver recorded the epoch and died before Spark
        checkpointed it, so this driver ran the batch again and its staging was discarded.
        :meth:`entries` reads an epoch's newest generation anyway; deleting the older ones
        keeps a torn newest entry (possible mid-write: it is created in place) from
        falling back to a record whose data is gone. A crash between the two steps leaves a
        superseded entry, deleted by the next record of the epoch or by
        :meth:`forget_before`. Only a driver's first record can supersede one (Spark runs
        again only the one batch it had not committed), so only the first record of this
        object lists the entries (a listing per epoch costs a LIST on object stores).
        """
        fields: dict[str, Any] = {
            "sink_id": self.sink_id,
            "epoch": entry.epoch,
            "generation": entry.generation,
            "committable": base64.b64encode(entry.committable).decode(),
            "codec_version": entry.codec_version,
            "rows": entry.rows,
            "files": entry.files,
            "bytes": entry.bytes,
            "batch_end_at": entry.batch_end_at,
            "pre_commit_ms": entry.pre_commit_ms,
            "origin": entry.origin,
        }
        if entry.spec is not None:  # (an older eosink reading the entry ignores the key)
            fields["spec"] = entry.spec
        body = json.dumps(fields).encode()
        name = f"{entry.epoch:012d}.{entry.generation}.json"
        rel = f"{self.dir}/pending/{name}"
        # Locally, a new name (this generation's first record of the epoch) is created in
        # place: one sync less than a replace by rename (on Hadoop file systems an exclusive
        # create costs an existence check instead). A crash mid-write leaves it torn, which
        # entries() skips as it skips a torn entry of any file system (the epoch was never
        # persisted). A second record of the epoch by this driver replaces it atomically.
        if not (self.ckpt.is_local and self.ckpt.write_bytes(rel, body, exclusive=True)):
            self.ckpt.write_bytes(rel, body)
        if self._pruned:
            return
        self._pruned = True
        for e, gen, old in self._names():
            if e == entry.epoch and gen < entry.generation:
                try:
                    self.ckpt.delete(f"{self.dir}/pending/{old}")
                except Exception:  # best effort: entries() reads the newest generation
                    log.debug("cannot delete a superseded journal entry %s", old, exc_info=True)

    def _names(self) -> list[tuple[int, int, str]]:
        out = []
        for name in self.ckpt.list_names(f"{self.dir}/pending"):
            parts = name.split(".")
            if len(parts) == 3 and parts[2] == "json" and parts[0].isdigit() and parts[1].isdigit():
                out.append((int(parts[0]), int(parts[1]), name))
        return out

    def entries(self) -> dict[int, Entry]:
        """Every epoch's entry (of its newest generation that reads back whole)."""
        newest: dict[int, list[tuple[int, str]]] = {}
        for epoch, gen, name in self._names():
            newest.setdefault(epoch, []).append((gen, name))
        out: dict[int, Entry] = {}
        for epoch, names in newest.items():
            for gen, name in sorted(names, reverse=True):
                raw = self.ckpt.read_bytes(f"{self.dir}/pending/{name}")
                try:
                    d = json.loads(raw or b"")
                    out[epoch] = Entry(
                        epoch=int(d["epoch"]),
                        generation=gen,
                        committable=base64.b64decode(d["committable"]),
                        codec_version=int(d["codec_version"]),
                        rows=int(d["rows"]),
                        files=int(d["files"]),
                        bytes=int(d["bytes"]),
                        batch_end_at=float(d["batch_end_at"]),
                        pre_commit_ms=float(d["pre_commit_ms"]),
                        origin=str(d["origin"]),
                        spec=None if d.get("spec") is None else str(d["spec"]),
                    )
                    break
                except (ValueError, KeyError, TypeError):
                    # Torn by a crash while it was written: its epoch was never persisted.
                    log.warning(
                        "checkpoint %s: ignoring the torn journal entry %s",
                        self.ckpt.location,
                        name,
                    )
        return out

    def forget_before(self, epoch: int) -> None:
        """Delete the entries of epochs below ``epoch`` (called once ``epoch`` is committed)."""
        for e, _gen, name in self._names():
            if e < epoch:
                self.ckpt.delete(f"{self.dir}/pending/{name}")

    # -- batch epochs (the batch journal beside the target: sink.JournalHome) ---------------
    def forget(self, epoch: int) -> None:
        """Delete the entries of ``epoch``."""
        for e, _gen, name in self._names():
            if e == epoch:
                self.ckpt.delete(f"{self.dir}/pending/{name}")

    def mark_committed(self, epoch: int, origin: str) -> None:
        """Record that epoch ``epoch`` (of ``origin``) is committed; drop its entry. Recorded:
        batch epochs, and a stream's epochs that another run committed (rule 7): the stream
        itself may not know (:meth:`committed_of`)."""
        self.ckpt.write_bytes(f"{self.dir}/committed/{epoch:012d}.{origin}", b"")
        self.forget(epoch)

    def committed_of(self, origin: str) -> set[int]:
        """The committed epochs recorded for ``origin``: a stream's lineage (its epochs that
        other runs committed, rule 7, from this journal's entries), or
        ``batch-auto-unreported`` (:meth:`unreported`). A stream's own journal in its
        checkpoint may lack its epochs here: a driver killed while the two journals were
        written could leave the entry here only (the epoch was never checkpointed then, and
        its batch is run again: it must be skipped as a replay, on a driver that lost the
        meta store too)."""
        names = self.ckpt.list_names(f"{self.dir}/committed")
        return {
            int(n.split(".")[0])
            for n in names
            if n.split(".")[0].isdigit() and n.endswith(f".{origin}")
        }

    def committed_origin(self, epoch: int) -> str | None:
        """The origin of committed batch epoch ``epoch`` (``batch``, ``batch-auto``), or None."""
        for origin in ("batch", "batch-auto", "batch-auto-unreported"):
            if self.ckpt.exists(f"{self.dir}/committed/{epoch:012d}.{origin}"):
                return "batch-auto" if origin.startswith("batch-auto") else origin
        return None

    def unreported(self) -> list[int]:
        """Committed epochs of crashed runs without ``epoch=`` that no such run reported yet
        (committed by another run's recovery)."""
        return sorted(self.committed_of("batch-auto-unreported"))

    def mark_reported(self, epoch: int) -> None:
        """Committed epoch ``epoch`` of a run without ``epoch=`` is reported (the run returned,
        or a later one raised ``UnfinishedRunError``): recorded committed as ``batch-auto``,
        its entry deleted (also one a crash left before it was recorded committed)."""
        rel = f"{self.dir}/committed/{epoch:012d}"
        self.mark_committed(epoch, "batch-auto")
        if self.ckpt.exists(f"{rel}.batch-auto-unreported"):
            self.ckpt.delete(f"{rel}.batch-auto-unreported")

    def files(self) -> list[str]:
        """Every file of this sink's journal (names relative to its directory's root)."""
        return [
            f"{self.dir}/{sub}/{name}"
            for sub in ("generations", "pending", "committed")
            for name in self.ckpt.list_names(f"{self.dir}/{sub}")
        ]

    def remove(self) -> int:
        """Delete every file of this sink's journal (``eosink retire``); the number deleted."""
        names = self.files()
        for rel in names:
            self.ckpt.delete(rel)
        return len(names)


def beside_target(coordinator: Any, journal_home: bool, sink_id: str) -> Journal | None:
    """The journal beside the target of ``coordinator`` (``journal_home``: its plugin declares
    :class:`~eosink.JournalHome`), or None where the sink has none."""
    if not journal_home:
        return None
    location = coordinator.journal_location()
    if not location:
        return None
    return Journal(CheckpointDir(None, location), sink_id, prefix="")


def record_all(journals: list[Journal], entry: Entry) -> None:
    """Record ``entry`` in every journal, durably, before the epoch's PENDING row. A stream
    of a sink with a journal beside its target has two: their writes (each waits on a sync
    to disk, or on an object store's answer) run side by side, the second on a helper thread
    that lives as long as the process (starting a thread per epoch cost more than a local
    write). Raises the first one's error after both ended (an entry of an epoch that is never
    persisted is harmless: recovery never finds it PENDING, and the next record of the epoch
    replaces it)."""
    if len(journals) < 2:
        for journal in journals:
            journal.record(entry)
        return
    helper = _helpers().submit(journals[1].record, entry)
    try:
        journals[0].record(entry)
    finally:
        error = helper.exception()  # waits for it: both end before this returns or raises
    if error is not None:
        raise error


_helper_pool: ThreadPoolExecutor | None = None
_helper_lock = threading.Lock()


def _helpers() -> ThreadPoolExecutor:
    """The process's journal helper threads (created at first use; a forked child makes its
    own, since its parent's threads do not exist in it)."""
    global _helper_pool
    with _helper_lock:
        if _helper_pool is None:
            _helper_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="eosink-journal")
        return _helper_pool


def _forget_helpers_in_child() -> None:
    global _helper_pool, _helper_lock
    _helper_pool = None
    _helper_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_helpers_in_child)
