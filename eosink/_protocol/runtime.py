"""The runtime of one sink: :class:`SinkRuntime` composes its parts, read top-down in this
order: ``state`` (fields, start, journals, close), ``phases`` (phase 1 and 2), ``recovery``,
``decisions`` (the epoch a run writes) and ``streams`` (a stream's start and rebase). Each
part may call the parts before it, never those after."""

from __future__ import annotations

from .streams import _Streams


class SinkRuntime(_Streams):
    """One live coordinator of one sink_id, with its fencing generation.

    Args:
        plugin: the sink.
        options: validated options.
        sink_id: stable sink name.
        store: the meta store.
        gc_keep: committed rows kept per sink (older ones are garbage-collected).
    """
