"""``eosink status``: sinks, their last committed, PENDING and ABORTED epochs, losses, what
is open at the target."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .owners import owner_alive
from .stores import open_store
from .text import iso, one_line, run_label, table

MS = "milliseconds"
"""An epoch's times (PENDING since, committed at) carry milliseconds: charts and lag need them."""


def collect(store: Any, sink_id: str | None, recent: int) -> list[dict[str, Any]]:
    """What ``eosink status --json`` prints: one dict per sink of ``store`` (only ``sink_id``
    if given), with its ``recent`` newest COMMITTED epochs (0: every one the store keeps)."""
    from .._metastore import ABORTED, COMMITTED, DROPPED_OPEN_FILE, PENDING

    out = []
    for s in store.sinks():
        if sink_id and s.sink_id != sink_id:
            continue
        pending_rows = store.epochs(s.sink_id, (PENDING,))
        pending = [e.epoch for e in pending_rows]
        aborted = [e.epoch for e in store.epochs(s.sink_id, (ABORTED,))]
        recent_rows = store.epochs(s.sink_id, (COMMITTED,), limit=recent)
        losses = store.losses(s.sink_id)
        open_items, open_note = open_at_target(s, pending_rows, recent_rows[-1:])
        out.append(
            {
                "sink_id": s.sink_id,
                "plugin": s.plugin,
                "generation": s.generation,
                "owner": s.owner,
                "owner_alive": owner_alive(s.owner, s.heartbeat_at),
                "heartbeat_at": iso(s.heartbeat_at),
                "created_at": iso(s.created_at),
                "updated_at": iso(s.updated_at),
                "last_error": s.last_error,
                "last_error_at": iso(s.last_error_at),
                "target": s.target,
                "stream_lineage": s.lineage,
                "stream_epoch_base": s.epoch_base if s.lineage else None,
                "gc_floor": s.gc_floor if s.gc_floor >= 0 else None,
                "retired": (
                    {"high": s.retired_high, "at": iso(s.retired_at), "by": s.retired_by}
                    if s.retired_high is not None
                    else None
                ),
                "last_committed_epoch": s.high_water if s.high_water >= 0 else None,
                "committed_epochs": s.committed_epochs,
                "pending_epochs": pending,
                "pending": [
                    {
                        "epoch": r.epoch,
                        "run": r.origin,
                        "rows": r.rows,
                        "files": r.files,
                        "pending_since": iso(r.created_at, MS),
                        "staged_with": staged_with(r.spec),
                    }
                    for r in pending_rows
                ],
                "aborted_epochs": aborted,
                "open_at_target": open_items,
                "open_at_target_note": open_note,
                "last_roll": (
                    {**s.last_roll, "at": iso(float(s.last_roll["at"]))} if s.last_roll else None
                ),
                "losses": [
                    {
                        "epoch": x.epoch,
                        "run": x.origin,
                        "rows": x.rows,
                        "files": x.files,
                        "bytes": x.bytes,
                        "reason": x.reason,
                        "recorded_by": x.recorded_by,
                        "recorded_at": iso(x.recorded_at),
                        "written_again": x.origin != DROPPED_OPEN_FILE
                        and again is not None
                        and again.status == COMMITTED,
                    }
                    for x in losses
                    for again in [store.epoch(s.sink_id, x.epoch)]
                ],
                "recent_commits": [
                    {
                        "epoch": r.epoch,
                        "run": r.origin,
                        "pending_since": iso(r.created_at, MS),
                        "committed_at": iso(r.committed_at, MS),
                        "pending_to_committed_s": round(
                            (r.committed_at or 0.0) - (r.created_at or r.committed_at or 0.0), 3
                        ),
                        "rows": r.rows,
                        "files": r.files,
                        "bytes": r.bytes,
                        "pre_commit_ms": round(r.pre_commit_ms or 0.0, 2),
                        "commit_ms": round(r.commit_ms or 0.0, 2),
                        "visibility_lag_s": round(
                            (r.committed_at or 0.0) - (r.batch_end_at or 0.0), 3
                        ),
                    }
                    for r in reversed(recent_rows)
                ],
            }
        )
    return out


def cmd_status(args: argparse.Namespace) -> int:
    store = open_store(args.metastore_url)
    try:
        out = collect(store, args.sink_id, 0 if args.html else args.recent)
    finally:
        store.close()
    if args.sink_id and not out:
        print(
            f"eosink status: meta store {store.url_redacted} has no sink {args.sink_id!r} "
            "(`eosink status` without --sink-id lists the sinks it has)",
            file=sys.stderr,
        )
        return 1
    if args.html:
        from .statuspage import write_pages

        for path in write_pages(out, args.html, store.url_redacted):
            print(f"wrote {path}")
        return 0
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"meta store: {store.url_redacted}")
    if not out:
        print("no sinks recorded yet")
    for s in out:
        alive = {True: ": running", False: ": not running", None: ""}[s["owner_alive"]]
        print(
            f"\nsink {s['sink_id']} (plugin {s['plugin']}, generation {s['generation']}, "
            f"owner {s['owner']}{alive})"
        )
        print(f"  target: {s['target'] or 'not recorded (written by a pre-release eosink)'}")
        print(f"  created: {s['created_at']}  last change: {s['updated_at']}")
        if s["heartbeat_at"]:
            print(f"  last heartbeat of its coordinator: {s['heartbeat_at']}")
        if s["last_error"]:
            print(f"  last error ({s['last_error_at']}): {one_line(s['last_error'])[:500]}")
        if s["retired"]:
            r = s["retired"]
            print(
                f"  retired by `eosink retire` at {r['at'] or '(unknown)'} by "
                f"{r['by'] or '(unknown)'}, with epochs up to {r['high']}: later runs write "
                "epochs above it"
            )
        if s["stream_lineage"]:
            print(
                f"  current stream: lineage {s['stream_lineage']}, epochs = "
                f"{s['stream_epoch_base']} + batchId"
            )
        print(
            f"  last committed epoch: {s['last_committed_epoch']}  "
            f"committed epochs: {s['committed_epochs']}"
            + (
                f"  (streaming epochs up to {s['gc_floor']} garbage-collected)"
                if s["gc_floor"] is not None and not s["retired"]
                else ""
            )
        )
        print(
            f"  pending: {s['pending_epochs'] or 'none'}  aborted: {s['aborted_epochs'] or 'none'}"
        )
        for r in s["pending"]:
            print(
                f"    epoch {r['epoch']} PENDING since {r['pending_since']} "
                f"({r['rows']} rows, {r['files']} files, {run_label(r['run'])})"
            )
        if s["open_at_target"]:
            print(f"  open at the target ({len(s['open_at_target'])}):")
            for item in s["open_at_target"]:
                print(f"    {item.get('kind', 'open')}: {item.get('what', '')}")
            if s["open_at_target_note"]:
                print(f"    ({s['open_at_target_note']})")
        elif s["open_at_target_note"]:
            print(f"  open at the target: {s['open_at_target_note']}")
        for x in s["losses"]:
            print(
                f"  KNOWN LOSS: epoch {x['epoch']} ({x['rows']} rows, {x['files']} files, "
                f"{run_label(x['run'])}) abandoned {x['recorded_at']} by {x['recorded_by']}: "
                f"{x['reason']}"
                + (
                    " (the epoch was written again by a later run since)"
                    if x["written_again"]
                    else ""
                )
            )
        if s["recent_commits"]:
            rows = [
                [
                    str(r["epoch"]),
                    run_label(r["run"]),
                    str(r["rows"]),
                    str(r["files"]),
                    f"{r['pre_commit_ms']:.1f}",
                    f"{r['commit_ms']:.1f}",
                    f"{r['visibility_lag_s']:.3f}",
                ]
                for r in s["recent_commits"]
            ]
            print(
                "  "
                + table(
                    rows,
                    ["epoch", "run", "rows", "files", "pre_commit_ms", "commit_ms", "lag_s"],
                ).replace("\n", "\n  ")
            )
    return 0


def staged_with(stored: str | None) -> dict[str, Any] | None:
    """A PENDING epoch's epoch spec for people: the options it was staged with (no secrets)
    and its schema as ``name: type`` strings; None when it has none (or it cannot be read)."""
    if stored is None:
        return None
    from .._spec import EpochSpec

    try:
        spec = EpochSpec.decode(stored)
    except Exception:  # a newer eosink's: status still shows the rest
        return None
    schema = None if spec.schema is None else [f"{f.name}: {f.type}" for f in spec.schema]
    return {"options": dict(spec.options), "schema": schema}


def open_at_target(
    sink: Any, pending_rows: list[Any], last: list[Any]
) -> tuple[list[dict[str, Any]] | None, str | None]:
    """What the sink holds open at its target (open rolling files, transactions of PENDING
    epochs), from its plugin's ``describe_open`` over the stored committables (``last``: the
    last COMMITTED epoch's record, or none), and a note when that cannot be told here. None
    when the sink does not describe it."""
    from ..errors import EosinkError
    from ..registry import get_sink

    try:
        plugin = get_sink(sink.plugin)
    except EosinkError:
        return None, f"not known here (the {sink.plugin} sink is not installed on this machine)"
    if plugin.describe_open is None:
        return None, None
    codec = plugin.committable_codec

    def decoded(r: Any) -> Any:
        return codec.decode(r.committable, r.codec_version)

    try:
        pending = {r.epoch: decoded(r) for r in pending_rows if r.committable is not None}
        last_c = decoded(last[-1]) if last and last[-1].committable is not None else None
        items = plugin.describe_open(sink.sink_id, last_c, pending)
    except Exception as exc:  # a plugin's bug must not break status
        return None, f"the {sink.plugin} sink cannot describe it: {one_line(str(exc))[:200]}"
    # A roll between epochs changes the target only; the sink row notes when it happened.
    roll = sink.last_roll
    newest = max(
        [r.committed_at or 0.0 for r in last] + [r.created_at or 0.0 for r in pending_rows],
        default=0.0,
    )
    if roll and float(roll["at"]) > newest:
        when = iso(float(roll["at"]))
        if roll.get("everything"):
            return [], f"nothing (every open file was published by the roll at {when})"
        if items:
            return items, (
                f"{roll['files']} open file(s) were rolled at {when}, after the last epoch: "
                "some listed here may be published already"
            )
    return items, None if items else "nothing"


def register(sub: Any) -> None:
    """Add this module's sub-command(s) to the ``eosink`` parser's ``sub``."""
    sp = sub.add_parser("status", help="sinks, last committed epoch, pending/aborted epochs")
    sp.add_argument("--metastore-url", help="default: EOSINK_METASTORE_URL or ~/.eosink")
    sp.add_argument("--sink-id")
    sp.add_argument("--recent", type=int, default=5, help="recent commits shown per sink")
    sp.add_argument("--json", action="store_true")
    sp.add_argument(
        "--html",
        metavar="FILE",
        help="write a self-contained page with charts (epochs over time, visibility lag, rows "
        "per epoch, losses, what is open) from every epoch the meta store keeps: FILE for one "
        "sink; with several, FILE is an index and each sink gets FILE's name + its id "
        "(needs eosink[charts])",
    )
    sp.set_defaults(fn=cmd_status)
