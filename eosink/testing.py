"""A conformance suite for sink plugins, shipped with eosink. Requires pytest.

Every sink's tests subclass :class:`SinkConformance` and get the plugin contracts checked
against the real target, without Spark (the protocol is driven the way eosink drives it)::

    from eosink.testing import SinkConformance

    class TestMySink(SinkConformance):
        sink_name = "mysink"

        def make_options(self, tmp_path):
            return {"path": str(tmp_path / "out")}

        def read_rows(self, options):           # an independent reader of the target
            return [...list of dicts...]

        def leftovers(self, options):           # optional: staged data that nobody references
            return []

Checked: registration through the entry point, picklable writers/options/results, versioned
codecs, N write results -> 1 committable, nothing visible before commit, commit idempotent,
abort (with and without a committable, twice) never raises and leaves nothing behind, a failed
writer cleans up, a replayed commit after abort publishes nothing.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from .registry import get_sink
from .sink import CoordinatedSinkWriter, SinkCommitCoordinator, SinkPlugin, WriterContext

__all__ = ["SinkConformance", "drive_writers"]


def drive_writers(
    plugin: SinkPlugin[Any, Any, Any],
    options: Any,
    sink_id: str,
    epoch: int,
    partitions: Sequence[Sequence[pa.RecordBatch]],
    setup: Any = None,
) -> list[Any]:
    """Run one writer per partition as Spark tasks would; return their decoded results.

    ``setup`` is what the coordinator's ``writer_setup`` returned for the epoch.
    """
    results = []
    for i, batches in enumerate(partitions):
        ctx = WriterContext(sink_id, epoch, i, f"p{i:05d}-a0-test", setup)
        writer = pickle.loads(pickle.dumps(plugin.writer_factory(options, ctx)))
        writer.begin_epoch(epoch)
        for b in batches:
            writer.write_batch(b)
        result = writer.finish_write(epoch)
        codec = plugin.write_result_codec
        results.append(codec.decode(codec.encode(result), codec.version))
    return results


class SinkConformance:
    """Base class of a plugin's conformance tests. See the module docstring."""

    sink_name: str = ""
    sink_id: str = "conformance:test"

    # -- to implement ------------------------------------------------------------------
    def make_options(self, tmp_path: Path) -> dict[str, Any]:
        raise NotImplementedError

    def read_rows(self, options: Any) -> list[dict[str, Any]]:
        raise NotImplementedError

    def leftovers(self, options: Any) -> list[str]:
        return []

    def batches(self, start: int, n: int) -> list[pa.RecordBatch]:
        ids = list(range(start, start + n))
        return [
            pa.record_batch(
                {"id": pa.array(ids, pa.int64()), "name": pa.array([f"row-{i}" for i in ids])}
            )
        ]

    # -- helpers -----------------------------------------------------------------------
    @pytest.fixture
    def setup(self, tmp_path: Path) -> tuple[SinkPlugin[Any, Any, Any], Any]:
        plugin = get_sink(self.sink_name)
        return plugin, plugin.parse_options(self.make_options(tmp_path))

    def _coordinator(
        self, plugin: SinkPlugin[Any, Any, Any], options: Any
    ) -> SinkCommitCoordinator[Any, Any]:
        c = plugin.coordinator_factory(options, self.sink_id)
        c.init()
        return c

    def _epoch(
        self, plugin: SinkPlugin[Any, Any, Any], options: Any, epoch: int, start: int
    ) -> tuple[SinkCommitCoordinator[Any, Any], Any]:
        coord = self._coordinator(plugin, options)
        parts = [self.batches(start, 5), self.batches(start + 5, 5), []]
        setup = coord.writer_setup(parts[0][0].schema)
        results = drive_writers(plugin, options, self.sink_id, epoch, parts, setup)
        committable = coord.pre_commit(epoch, results, [])
        codec = plugin.committable_codec
        return coord, codec.decode(codec.encode(committable), codec.version)

    def _ids(self, options: Any) -> list[int]:
        return sorted(int(r["id"]) for r in self.read_rows(options))

    # -- the contracts -----------------------------------------------------------------
    def test_registered_through_entry_point(self) -> None:
        from .registry import list_sinks

        assert self.sink_name in {s.name for s in list_sinks()}

    def test_options_and_factories_pickle(self, setup: Any) -> None:
        plugin, options = setup
        assert pickle.loads(pickle.dumps(options)) == options
        ws = self._coordinator(plugin, options).writer_setup(self.batches(0, 1)[0].schema)
        assert pickle.loads(pickle.dumps(ws)) == ws
        writer = plugin.writer_factory(options, WriterContext(self.sink_id, 0, 0, "a", ws))
        assert isinstance(writer, CoordinatedSinkWriter)
        pickle.loads(pickle.dumps(writer))

    def test_codecs_are_versioned(self, setup: Any) -> None:
        plugin, _ = setup
        for codec in (plugin.write_result_codec, plugin.committable_codec):
            assert isinstance(codec.version, int) and codec.version >= 1

    def test_nothing_visible_before_commit(self, setup: Any) -> None:
        plugin, options = setup
        self._epoch(plugin, options, 0, 0)
        assert self._ids(options) == []

    def test_n_results_one_committable_commit_once(self, setup: Any) -> None:
        plugin, options = setup
        coord, committable = self._epoch(plugin, options, 0, 0)
        coord.commit(0, committable)
        assert self._ids(options) == list(range(10))
        assert self.leftovers(options) == []

    def test_commit_is_idempotent(self, setup: Any) -> None:
        plugin, options = setup
        coord, committable = self._epoch(plugin, options, 0, 0)
        coord.commit(0, committable)
        coord.commit(0, committable)
        # A new process (new coordinator) retrying after a lost answer.
        self._coordinator(plugin, options).commit(0, committable)
        assert self._ids(options) == list(range(10))

    def test_epochs_accumulate(self, setup: Any) -> None:
        plugin, options = setup
        for e in range(3):
            coord, committable = self._epoch(plugin, options, e, e * 10)
            coord.commit(e, committable)
        assert self._ids(options) == list(range(30))

    def test_abort_discards_and_never_raises(self, setup: Any) -> None:
        plugin, options = setup
        coord, committable = self._epoch(plugin, options, 0, 0)
        coord.abort(0, committable)
        coord.abort(0, committable)  # twice: still no error
        coord.abort(0, None)
        assert self._ids(options) == []
        assert self.leftovers(options) == []

    def test_abort_without_committable_discards_staged(self, setup: Any) -> None:
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
        plugin, options = setup
        batch = self.batches(0, 3)[0]
        ws = self._coordinator(plugin, options).writer_setup(batch.schema)
        writer = plugin.writer_factory(options, WriterContext(self.sink_id, 0, 0, "fail", ws))
        writer.begin_epoch(0)
        writer.write_batch(batch)
        writer.abort_write()
        assert self.leftovers(options) == []

    def test_rewrite_after_abort(self, setup: Any) -> None:
        plugin, options = setup
        coord, committable = self._epoch(plugin, options, 0, 0)
        coord.abort(0, committable)
        coord, committable = self._epoch(plugin, options, 0, 0)
        coord.commit(0, committable)
        assert self._ids(options) == list(range(10))
