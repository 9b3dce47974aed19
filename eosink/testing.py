"""A conformance suite for sink plugins, shipped with eosink. Needs ``eosink[testing]`` (pytest).

Every sink's tests subclass :class:`SinkConformance` and get the plugin contracts checked
against the real target, without Spark (the protocol is driven the way eosink drives it)::

    from eosink.testing import SinkConformance

    class TestMySink(SinkConformance):
        sink_name = "mysink"

        def make_options(self, tmp_path):
            return {"path": str(tmp_path / "out")}

        def read_rows(self, options):           # an independent reader of the target
            return [...list of dicts...]

        def leftovers(self, options):           # staged data that nobody references
            return [...paths or ids...]

Checked: registration through the entry point, picklable writers/options/results, versioned
codecs, N write results -> 1 committable, nothing visible before commit, commit idempotent,
abort (with and without a committable, twice) never raises and leaves nothing behind, a failed
writer cleans up, a replayed commit after abort publishes nothing, the output of a dead task
attempt (its result never reached the driver) is never published and is cleaned up, commits
out of order (a backfill), the target marker (``TargetMarker``) read back by a new
coordinator, staged names that tell two attempts of a task apart, epochs staged without a
committable listed (``StagedEpochs``) and cleaned by recovery, and a
crash at each driver fault point of phases 1 and 2 (:data:`CRASH_POINTS`, simulated
in-process with :func:`eosink.faults.simulate`, then a new coordinator recovers through the
core's ``SinkRuntime`` on a SQLite meta store) ends with every row exactly once and nothing
left (a fault point the sink never reaches fails). Recovery's own fault points and the
executors' are left to SIGKILL crash tests. Writers run through eosink's own task code
(:func:`drive_writers`); each written epoch gets fresh writer attempt ids, as Spark's task
attempts do.
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from .errors import MissingExtraError

try:
    import pytest
except ImportError as _exc:  # eosink.testing is for test environments: pytest is an extra
    raise MissingExtraError(
        "pytest", "testing", "eosink.testing, the conformance suite for sink plugins"
    ) from _exc

from ._mixins import capabilities_of
from .faults import SimulatedCrash, simulate
from .registry import get_sink
from .sink import (
    Capabilities,
    CommitOutcome,
    CoordinatedSinkWriter,
    Prepared,
    SinkCommitCoordinator,
    SinkPlugin,
    StagedEpochs,
    TargetMarker,
    WriterContext,
)

CRASH_POINTS = (
    "after_pre_commit",
    "after_persist",
    "before_commit",
    "mid_commit",
    "after_commit",
    "after_mark_committed",
)
"""Driver fault points the in-process crash test stops at (``mid_commit`` is the plugin's)."""

__all__ = ["SinkConformance", "drive_writers"]


def drive_writers(
    plugin: SinkPlugin[Any, Any, Any],
    options: Any,
    sink_id: str,
    epoch: int,
    partitions: Sequence[Sequence[pa.RecordBatch]],
    setup: Any = None,
    *,
    attempt: int = 0,
) -> list[Any]:
    """Run one writer per partition through eosink's own task code; return their decoded
    results.

    This is the function Spark's tasks run (``eosink._tasks.run_writer``: the writer built
    by the factory in the task, ``begin_epoch``, the batches, ``finish_write``,
    ``abort_write`` on an error, the executors' fault points), given the options and
    ``setup`` (what the coordinator's ``writer_setup`` returned for the epoch) after a
    pickle round trip, as Spark ships them. Every call gets fresh attempt ids, as Spark's
    task attempts do; ``attempt`` is the attempt number.
    """
    from ._tasks import TaskSink, run_writer

    shipped_options = pickle.loads(pickle.dumps(options))
    shipped_setup = pickle.loads(pickle.dumps(setup))
    sink = TaskSink(plugin, shipped_options, sink_id, epoch, shipped_setup)
    codec = plugin.write_result_codec
    results = []
    for i, batches in enumerate(partitions):
        encoded, _ = run_writer(sink, batches, partition=i, attempt=attempt)
        results.append(codec.decode(encoded, codec.version))
    return results


class SinkConformance:
    """Base class of a plugin's conformance tests. See the module docstring."""

    sink_name: str = ""
    """The sink under test, as registered (``sink=``). Required."""
    sink_id: str = "conformance:test"
    """The sink_id the suite writes with (keys its meta store rows)."""

    # -- to implement ------------------------------------------------------------------
    def make_options(self, tmp_path: Path) -> dict[str, Any]:
        """The sink's raw options (as a user passes them) for a fresh target under ``tmp_path``.
        Required."""
        raise NotImplementedError

    def read_rows(self, options: Any) -> list[dict[str, Any]]:
        """Every row a reader of the target sees, as dicts with the ``id`` column; ``options``
        are the parsed options. Use an independent reader (not the sink's code). Required."""
        raise NotImplementedError

    def leftovers(self, options: Any) -> list[str]:
        """Staged data that no committable references (files, uploads...): must be empty
        after every commit and abort. Required: the suite cannot check cleanup without it."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement leftovers(options): list what is staged "
            "in the target and referenced by nothing"
        )

    def batches(self, start: int, n: int) -> list[pa.RecordBatch]:
        """The rows one task writes: ids ``start`` to ``start + n - 1`` and a name. Override it
        for a sink that needs other columns; keep an integer ``id`` column."""
        ids = list(range(start, start + n))
        return [
            pa.record_batch(
                {"id": pa.array(ids, pa.int64()), "name": pa.array([f"row-{i}" for i in ids])}
            )
        ]

    # -- helpers -----------------------------------------------------------------------
    @pytest.fixture
    def setup(self, tmp_path: Path) -> tuple[SinkPlugin[Any, Any, Any], Any]:
        """Fixture: the plugin found by :attr:`sink_name` and its parsed options."""
        plugin = get_sink(self.sink_name)
        return plugin, plugin.parse_options(self.make_options(tmp_path))

    def _coordinator(
        self, plugin: SinkPlugin[Any, Any, Any], options: Any
    ) -> SinkCommitCoordinator[Any, Any]:
        c = plugin.coordinator_factory(options, self.sink_id)
        if plugin.capabilities is not None and plugin.capabilities.epoch_spec:
            # As the core does: every commit and abort gets the epoch spec (these epochs are
            # staged with ``options`` and the schema of :meth:`batches`).
            from ._spec import EpochSpec, persisted_options

            spec = EpochSpec(persisted_options(options), self.batches(0, 1)[0].schema)
            commit: Any = c.commit
            abort: Any = c.abort

            def commit_with_spec(e: int, cm: Any, spec: Any = spec) -> Any:
                return commit(e, cm, spec=spec)

            def abort_with_spec(e: int, cm: Any, spec: Any = spec) -> Any:
                return abort(e, cm, spec=None if cm is None else spec)

            setattr(c, "commit", commit_with_spec)  # noqa: B010
            setattr(c, "abort", abort_with_spec)  # noqa: B010
        c.init()
        return c

    def _epoch(
        self, plugin: SinkPlugin[Any, Any, Any], options: Any, epoch: int, start: int
    ) -> tuple[SinkCommitCoordinator[Any, Any], Any]:
        coord = self._coordinator(plugin, options)
        parts = [self.batches(start, 5), self.batches(start + 5, 5), []]
        setup = coord.writer_setup(parts[0][0].schema)
        results = drive_writers(plugin, options, self.sink_id, epoch, parts, setup)
        prepared = coord.pre_commit(epoch, results)
        assert isinstance(prepared, Prepared), (
            f"pre_commit must return eosink.Prepared(committable, files=, bytes=), not "
            f"{type(prepared).__name__}"
        )
        committable = prepared.committable
        codec = plugin.committable_codec
        return coord, codec.decode(codec.encode(committable), codec.version)

    def _ids(self, options: Any) -> list[int]:
        return sorted(int(r["id"]) for r in self.read_rows(options))

    # -- the contracts -----------------------------------------------------------------
    def test_registered_through_entry_point(self) -> None:
        """The sink is found through the ``eosink`` entry point: a restarted driver and
        Spark's Python workers look it up by name, in a new process."""
        from .registry import list_sinks

        assert self.sink_name in {s.name for s in list_sinks()}

    def test_capabilities_match_the_coordinator(self, setup: Any) -> None:
        """The declared :class:`~eosink.Capabilities` are exactly what the coordinator
        implements: a capability implemented but not declared is never used by the core
        (a ``StagedEpochs`` sink whose crashed runs' data is never swept), one declared but
        not implemented fails every run. A plugin that declares none passes, with a
        ``DeprecationWarning``."""
        plugin, options = setup
        coord = self._coordinator(plugin, options)
        if plugin.capabilities is None:
            return
        implemented = Capabilities.implemented_by(coord)
        assert plugin.capabilities == implemented, (
            f"declared {plugin.capabilities}, but the coordinator implements {implemented}"
        )

    def test_options_and_factories_pickle(self, setup: Any) -> None:
        """Options, the ``writer_setup`` value (equal after a round trip) and writers pickle:
        they are shipped to executors, and a writer never holds driver-side state."""
        plugin, options = setup
        assert pickle.loads(pickle.dumps(options)) == options
        ws = self._coordinator(plugin, options).writer_setup(self.batches(0, 1)[0].schema)
        assert pickle.loads(pickle.dumps(ws)) == ws
        writer = plugin.writer_factory(options, WriterContext(self.sink_id, 0, 0, "a", ws))
        assert isinstance(writer, CoordinatedSinkWriter)
        pickle.loads(pickle.dumps(writer))

    def test_codecs_are_versioned(self, setup: Any) -> None:
        """Both codecs have an integer version >= 1: a committable persisted by an older
        release must still be decoded after an upgrade."""
        plugin, _ = setup
        for codec in (plugin.write_result_codec, plugin.committable_codec):
            assert isinstance(codec.version, int) and codec.version >= 1

    def test_nothing_visible_before_commit(self, setup: Any) -> None:
        """Writers and ``pre_commit`` make nothing visible: an epoch that Spark did not
        checkpoint is aborted and written again, so visible data would be duplicated."""
        plugin, options = setup
        self._epoch(plugin, options, 0, 0)
        assert self._ids(options) == []

    def test_n_results_one_committable_commit_once(self, setup: Any) -> None:
        """The results of three tasks (one empty) become one committable; one commit
        publishes every row once and leaves nothing staged: an epoch is all or nothing."""
        plugin, options = setup
        coord, committable = self._epoch(plugin, options, 0, 0)
        coord.commit(0, committable)
        assert self._ids(options) == list(range(10))
        assert self.leftovers(options) == []

    def test_commit_is_idempotent(self, setup: Any) -> None:
        """A second commit, also from a new coordinator, changes nothing: the driver can die
        between the commit and the COMMITTED mark, and recovery commits again. Each call
        says it succeeded (None, or a ``CommitOutcome`` of ``done`` or
        ``already_committed``), never ``retry_later`` or ``failed``."""
        plugin, options = setup
        coord, committable = self._epoch(plugin, options, 0, 0)
        outcomes = [coord.commit(0, committable), coord.commit(0, committable)]
        # A new process (new coordinator) retrying after a lost answer.
        outcomes.append(self._coordinator(plugin, options).commit(0, committable))
        assert self._ids(options) == list(range(10))
        for got in outcomes:
            kind = got.kind if isinstance(got, CommitOutcome) else "done"
            assert kind in ("done", "already_committed"), f"commit returned {got!r}"

    def test_epochs_accumulate(self, setup: Any) -> None:
        """Successive epochs add their rows: each epoch is a separate, additive commit."""
        plugin, options = setup
        for e in range(3):
            coord, committable = self._epoch(plugin, options, e, e * 10)
            coord.commit(e, committable)
        assert self._ids(options) == list(range(30))

    def test_abort_discards_and_never_raises(self, setup: Any) -> None:
        """``abort`` with the committable, twice, then with None: no error, nothing visible,
        nothing left. Recovery repeats an abort that a crash interrupted."""
        plugin, options = setup
        coord, committable = self._epoch(plugin, options, 0, 0)
        coord.abort(0, committable)
        coord.abort(0, committable)  # twice: still no error
        coord.abort(0, None)
        assert self._ids(options) == []
        assert self.leftovers(options) == []

    def test_abort_without_committable_discards_staged(self, setup: Any) -> None:
        """``abort(e, None)`` deletes what writers staged for ``e`` (data staged before any
        committable existed is found by epoch only); an epoch never written is fine."""
        plugin, options = setup
        coord = self._coordinator(plugin, options)
        batches = self.batches(0, 3)
        setup = coord.writer_setup(batches[0].schema)
        drive_writers(plugin, options, self.sink_id, 7, [batches], setup)
        coord.abort(7, None)
        coord.abort(99, None)  # an epoch that never existed
        assert self.leftovers(options) == []
        assert self._ids(options) == []

    def test_failed_writer_cleans_up(self, setup: Any) -> None:
        """``abort_write`` deletes what the writer staged: a failed task attempt leaves
        nothing behind."""
        plugin, options = setup
        batch = self.batches(0, 3)[0]
        ws = self._coordinator(plugin, options).writer_setup(batch.schema)
        writer = plugin.writer_factory(options, WriterContext(self.sink_id, 0, 0, "fail", ws))
        writer.begin_epoch(0)
        writer.write_batch(batch)
        writer.abort_write()
        assert self.leftovers(options) == []

    def test_rewrite_after_abort(self, setup: Any) -> None:
        """An aborted epoch can be written and committed again under the same number: Spark
        replays a batch it did not checkpoint with the same batch id, hence the same epoch."""
        plugin, options = setup
        coord, committable = self._epoch(plugin, options, 0, 0)
        coord.abort(0, committable)
        coord, committable = self._epoch(plugin, options, 0, 0)
        coord.commit(0, committable)
        assert self._ids(options) == list(range(10))

    def test_dead_attempt_is_never_published(self, setup: Any) -> None:
        """A task attempt that finished writing but died before its result reached the
        driver (a lost executor): Spark re-runs the task; only the new attempt is published,
        and the dead attempt's data is cleaned up by commit or by the next recovery."""
        plugin, options = setup
        coord = self._coordinator(plugin, options)
        first = self.batches(0, 5)
        ws = coord.writer_setup(first[0].schema)
        drive_writers(plugin, options, self.sink_id, 0, [first], ws)  # result lost
        results = drive_writers(plugin, options, self.sink_id, 0, [first, self.batches(5, 5)], ws)
        coord.commit(0, coord.pre_commit(0, results).committable)
        assert self._ids(options) == list(range(10))
        self._recover(plugin, options, first_epoch=1)
        assert self._ids(options) == list(range(10))
        assert self.leftovers(options) == []

    def test_commits_out_of_order(self, setup: Any) -> None:
        """A backfill commits epoch 3 after epoch 5 was committed; replayed commits of both
        change nothing. "Already committed" is decided for *that* epoch, never from "the
        last committed epoch is at or past it"."""
        plugin, options = setup
        coord, five = self._epoch(plugin, options, 5, 0)
        coord.commit(5, five)
        coord, three = self._epoch(plugin, options, 3, 10)
        coord.commit(3, three)
        assert self._ids(options) == list(range(20)), "epoch 3, committed after 5, is missing"
        again = self._coordinator(plugin, options)
        again.commit(3, three)
        again.commit(5, five)
        assert self._ids(options) == list(range(20))
        assert self.leftovers(options) == []

    def test_target_marker_round_trip(self, setup: Any) -> None:
        """A ``TargetMarker`` coordinator: a marker written (once ``writer_setup`` made the
        target) is read back by a new coordinator (a new process), with ``last_epoch`` -1
        before any commit, the newest committed
        epoch after commits, never lowered by a backfill, and kept by ``write_marker``."""
        plugin, options = setup
        coord = self._coordinator(plugin, options)
        if not capabilities_of(plugin, coord).target_marker:
            return  # the sink keeps no marker: nothing to check
        assert isinstance(coord, TargetMarker)
        marker = {
            "sink_id": self.sink_id,
            "plugin": plugin.name,
            "target": "conformance",
            "lineage": "lineage-1",
            "epoch_base": 7,
        }
        # A target that is created with its first data (a table) exists after writer_setup.
        coord.writer_setup(self.batches(0, 1)[0].schema)
        coord.write_marker(marker)
        got = self._read_marker(plugin, options)
        assert got is not None, "read_marker() found no marker after write_marker()"
        assert {k: got.get(k) for k in marker} == marker, f"read_marker() returned {got!r}"
        assert got.get("last_epoch") == -1, f"no epoch committed yet, last_epoch={got!r}"
        coord, c4 = self._epoch(plugin, options, 4, 0)
        coord.commit(4, c4)
        coord, c2 = self._epoch(plugin, options, 2, 10)
        coord.commit(2, c2)  # a backfill: last_epoch stays 4
        got = self._read_marker(plugin, options)
        assert got is not None and got.get("last_epoch") == 4, f"after commits of 4 then 2: {got}"
        again = self._coordinator(plugin, options)
        assert isinstance(again, TargetMarker)
        again.write_marker({**marker, "lineage": "lineage-2"})
        got = self._read_marker(plugin, options)
        assert got is not None and got.get("lineage") == "lineage-2"
        assert got.get("last_epoch") == 4, "write_marker() must keep the current last_epoch"

    def _read_marker(self, plugin: SinkPlugin[Any, Any, Any], options: Any) -> Any:
        fresh = self._coordinator(plugin, options)  # a new process reads the target
        assert isinstance(fresh, TargetMarker)
        return fresh.read_marker()

    def test_staged_names_carry_the_attempt_id(self, setup: Any) -> None:
        """Two attempts of one task stage different rows; the one whose result reached the
        driver is published, even when the other (a zombie or speculative attempt) finished
        after it. Staged names must carry ``ctx.attempt_id``: otherwise the late attempt
        overwrites the live one's data and its rows are published instead."""
        plugin, options = setup
        coord = self._coordinator(plugin, options)
        live_rows = self.batches(0, 5)
        ws = coord.writer_setup(live_rows[0].schema)
        live = drive_writers(plugin, options, self.sink_id, 0, [live_rows], ws)
        drive_writers(plugin, options, self.sink_id, 0, [self.batches(100, 5)], ws, attempt=1)
        coord.commit(0, coord.pre_commit(0, live).committable)
        assert self._ids(options) == list(range(5)), (
            "a later attempt's rows were published: stage under ctx.attempt_id"
        )
        self._recover(plugin, options, first_epoch=1).store.close()
        assert self.leftovers(options) == []

    def test_staged_epochs_lists_what_writers_staged(self, setup: Any) -> None:
        """A ``StagedEpochs`` coordinator lists an epoch its writers staged before any
        committable existed (a crashed run); a new driver's recovery then aborts it, and
        nothing is left."""
        plugin, options = setup
        coord = self._coordinator(plugin, options)
        if not capabilities_of(plugin, coord).staged_epochs:
            return  # recovery cannot find such data; commit and abort(e, None) must
        batches = self.batches(0, 3)
        drive_writers(
            plugin, options, self.sink_id, 7, [batches], coord.writer_setup(batches[0].schema)
        )
        fresh = self._coordinator(plugin, options)
        assert isinstance(fresh, StagedEpochs)
        listed = set(fresh.staged_epochs())
        assert 7 in listed, f"staged_epochs() lists {sorted(listed)}, not epoch 7"
        self._recover(plugin, options, first_epoch=0).store.close()
        assert self.leftovers(options) == []
        assert self._ids(options) == []

    def _recover(self, plugin: SinkPlugin[Any, Any, Any], options: Any, first_epoch: int) -> Any:
        from ._metastore import MetaStore
        from ._protocol import SinkRuntime

        store = MetaStore(f"sqlite:///{self._db}")
        rt = SinkRuntime(plugin, options, self.sink_id, store)
        rt.start()
        rt.lineage = "conformance"
        rt.recover(first_epoch=first_epoch)
        return rt

    @pytest.fixture(autouse=True)
    def _meta_store(self, tmp_path: Path) -> None:
        self._db = tmp_path / "conformance-metastore.db"

    @pytest.mark.parametrize("point", CRASH_POINTS)
    @pytest.mark.parametrize("checkpointed", [True, False], ids=["checkpointed", "replayed"])
    def test_crash_at_fault_point(self, setup: Any, point: str, checkpointed: bool) -> None:
        """Epoch 0 is committed, epoch 1 crashes at ``point``; a new coordinator recovers
        (epoch 1 checkpointed by Spark, or not and replayed), and every row lands once."""
        from ._rules import FINISH, SKIP

        plugin, options = setup

        def write(rt: Any, epoch: int, start: int) -> None:
            parts = [self.batches(start, 5), self.batches(start + 5, 5)]
            ws = rt.coordinator.writer_setup(parts[0][0].schema)
            results = drive_writers(plugin, options, self.sink_id, epoch, parts, ws)
            c, fig = rt.pre_commit(epoch, results, rows=10, write_s=0.0)
            rt.commit_epoch(epoch, c, fig)

        rt = self._recover(plugin, options, first_epoch=0)
        write(rt, 0, 0)
        with simulate(point) as fired:
            try:
                write(rt, 1, 10)
            except SimulatedCrash:
                pass
        if not fired[0]:
            pytest.fail(
                f"the sink never reaches fault point {point!r}: a crash there is untested. "
                + (
                    'Call eosink.fault_point("mid_commit") in commit, between its steps '
                    "(after the step that makes the epoch visible, for a one-step commit)."
                    if point == "mid_commit"
                    else "The core calls it on every commit: is commit raising or returning early?"
                )
            )
        rt.store.close()  # the crashed driver is gone; its objects are abandoned

        # What the restarted driver sees. Before persist, Spark cannot have checkpointed
        # the batch: it is replayed. After persist it may have (after_checkpoint mode) or
        # not; from before_commit on, "not checkpointed" means inline mode, whose recovery
        # commits every PENDING epoch.
        replay = not checkpointed or point == "after_pre_commit"
        if point in ("after_pre_commit", "after_persist"):
            first = 1 if replay else 2
        else:
            first = 2 if checkpointed else sys.maxsize
        rt = self._recover(plugin, options, first_epoch=first)
        if replay:
            decision = rt.stream_decision(1)
            if decision == FINISH:
                rt.finish(1)
            elif decision != SKIP:
                write(rt, 1, 10)
        self._recover(plugin, options, first_epoch=2).store.close()
        rt.store.close()
        assert self._ids(options) == list(range(20))
        assert self.leftovers(options) == []
