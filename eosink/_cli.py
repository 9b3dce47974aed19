"""The ``eosink`` command: demo, status, recover, abandon, plugins, db upgrade."""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import os
import socket
import sys
import time
from datetime import datetime
from typing import Any

from .errors import ConfigError, EosinkError, MetaStoreError, MetaStoreUnavailableError

__all__ = ["main"]


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def line(r: list[str]) -> str:
        return "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=False)).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def cmd_plugins(args: argparse.Namespace) -> int:
    from .registry import list_sinks

    sinks = list_sinks()
    if args.json:
        listed = [
            {
                "name": s.name,
                "package": s.package,
                "version": s.version,
                "description": s.description,
                "status": s.status,
                "missing_modules": list(s.missing),
                "install": s.install or None,
                "error": s.error or None,
            }
            for s in sinks
        ]
        print(json.dumps(listed, indent=2))
        return 0
    print(
        _table(
            [[s.name, s.package, s.version, s.status, s.description] for s in sinks],
            ["sink", "package", "version", "status", "description"],
        )
    )
    fixes = [s for s in sinks if s.missing]
    if fixes:
        print()
    for s in fixes:
        what = ", ".join(s.missing) + (" is" if len(s.missing) == 1 else " are")
        print(f"{s.name}: {what} not installed; to use the sink: {s.install}")
    broken = [s for s in sinks if s.error]
    if broken:
        print()
    for s in broken:
        print(
            f"{s.name}: the plugin of package {s.package} {s.version} failed to load "
            f"({s.error}); fix or uninstall it: pip uninstall {s.package}"
        )
    return 0


_EOSINK_TABLE = "pending_sink_state"


def _not_a_store(url: str, why: str) -> MetaStoreError:
    from ._metastore import redact_url

    return MetaStoreError(f"{redact_url(url)} is not an eosink meta store: {why}")


def _describe_tables(tables: set[str]) -> str:
    if not tables:
        return "the database is empty (create a meta store with `eosink db upgrade --url ...`)"
    shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
    return f"it has no {_EOSINK_TABLE} table (its tables: {shown})"


def _check_sqlite(url: str, *, tables: bool = True) -> None:
    """Refuse, without creating or changing anything, a SQLite URL that is no meta store.

    Args:
        url: the meta store URL (other databases than SQLite pass unchecked).
        tables: also refuse a database without eosink's tables (an empty one included).

    Raises:
        MetaStoreError: no such file, or a file that is not an eosink meta store (an
            unparseable URL is left to the meta store, which says what is wrong with it).
    """
    import sqlite3
    from pathlib import Path
    from urllib.parse import quote

    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        u = make_url(url)
    except (ArgumentError, ValueError):
        return  # the meta store says what is wrong with it
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:":
        return
    if u.database.startswith("file:"):
        return  # a SQLite URI filename: left to the meta store
    path = Path(u.database)
    if path.is_dir():
        raise _not_a_store(url, f"{path} is a directory")
    if not path.is_file():
        raise MetaStoreError(
            f"there is no eosink meta store at {path} (no such file; nothing was created). "
            "Check --metastore-url / EOSINK_METASTORE_URL"
        )
    try:
        # mode=rw: never creates the file; a read changes nothing (no WAL switch).
        con = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=rw", uri=True)
        try:
            found = {
                str(r[0]) for r in con.execute("select name from sqlite_master where type='table'")
            }
        finally:
            con.close()
    except sqlite3.DatabaseError as exc:
        raise _not_a_store(url, str(exc)) from None
    if tables and _EOSINK_TABLE not in found:
        raise _not_a_store(url, _describe_tables(found))


def _store(url: str | None, create: bool = False) -> Any:
    from ._metastore import MetaStore, default_url
    from .errors import SchemaOutdatedError

    url = url or default_url()
    if not create:
        _check_sqlite(url)
    try:
        return MetaStore(url, create=create)
    except SchemaOutdatedError:
        tables = None if create else _tables(url)
        if tables is not None and _EOSINK_TABLE not in tables:
            raise _not_a_store(url, _describe_tables(tables)) from None
        raise


def _tables(url: str) -> set[str] | None:
    """The tables of the database at ``url``, or None if that cannot be found out."""
    from sqlalchemy import inspect

    from ._metastore.store import _make_engine

    try:
        engine = _make_engine(url, create=False)
        try:
            with engine.connect() as conn:
                return set(inspect(conn).get_table_names())
        finally:
            engine.dispose()
    except Exception:
        return None


def cmd_status(args: argparse.Namespace) -> int:
    from ._metastore import ABORTED, COMMITTED, DROPPED_OPEN_FILE, PENDING

    store = _store(args.metastore_url)
    try:
        out = []
        for s in store.sinks():
            if args.sink_id and s.sink_id != args.sink_id:
                continue
            pending_rows = store.epochs(s.sink_id, (PENDING,))
            pending = [e.epoch for e in pending_rows]
            aborted = [e.epoch for e in store.epochs(s.sink_id, (ABORTED,))]
            recent = store.epochs(s.sink_id, (COMMITTED,), limit=args.recent)
            losses = store.losses(s.sink_id)
            open_items, open_note = _open_at_target(s, pending_rows, recent[-1:])
            out.append(
                {
                    "sink_id": s.sink_id,
                    "plugin": s.plugin,
                    "generation": s.generation,
                    "owner": s.owner,
                    "owner_alive": owner_alive(s.owner, s.heartbeat_at),
                    "heartbeat_at": _iso(s.heartbeat_at),
                    "created_at": _iso(s.created_at),
                    "updated_at": _iso(s.updated_at),
                    "last_error": s.last_error,
                    "last_error_at": _iso(s.last_error_at),
                    "target": s.target,
                    "stream_lineage": s.lineage,
                    "stream_epoch_base": s.epoch_base if s.lineage else None,
                    "gc_floor": s.gc_floor if s.gc_floor >= 0 else None,
                    "last_committed_epoch": s.high_water if s.high_water >= 0 else None,
                    "committed_epochs": s.committed_epochs,
                    "pending_epochs": pending,
                    "pending": [
                        {
                            "epoch": r.epoch,
                            "run": r.origin,
                            "rows": r.rows,
                            "files": r.files,
                            "pending_since": _iso(r.created_at),
                        }
                        for r in pending_rows
                    ],
                    "aborted_epochs": aborted,
                    "open_at_target": open_items,
                    "open_at_target_note": open_note,
                    "last_roll": (
                        {**s.last_roll, "at": _iso(float(s.last_roll["at"]))}
                        if s.last_roll
                        else None
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
                            "recorded_at": _iso(x.recorded_at),
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
                            "committed_at": _iso(r.committed_at),
                            "rows": r.rows,
                            "files": r.files,
                            "pre_commit_ms": round(r.pre_commit_ms or 0.0, 2),
                            "commit_ms": round(r.commit_ms or 0.0, 2),
                            "visibility_lag_s": round(
                                (r.committed_at or 0.0) - (r.batch_end_at or 0.0), 3
                            ),
                        }
                        for r in reversed(recent)
                    ],
                }
            )
    finally:
        store.close()
    if args.sink_id and not out:
        print(
            f"eosink status: meta store {store.url_redacted} has no sink {args.sink_id!r} "
            "(`eosink status` without --sink-id lists the sinks it has)",
            file=sys.stderr,
        )
        return 1
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
            print(f"  last error ({s['last_error_at']}): {_one_line(s['last_error'])[:500]}")
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
                if s["gc_floor"] is not None
                else ""
            )
        )
        print(
            f"  pending: {s['pending_epochs'] or 'none'}  aborted: {s['aborted_epochs'] or 'none'}"
        )
        for r in s["pending"]:
            print(
                f"    epoch {r['epoch']} PENDING since {r['pending_since']} "
                f"({r['rows']} rows, {r['files']} files, {_run_label(r['run'])})"
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
                f"{_run_label(x['run'])}) abandoned {x['recorded_at']} by {x['recorded_by']}: "
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
                    _run_label(r["run"]),
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
                + _table(
                    rows,
                    ["epoch", "run", "rows", "files", "pre_commit_ms", "commit_ms", "lag_s"],
                ).replace("\n", "\n  ")
            )
    return 0


def _open_at_target(
    sink: Any, pending_rows: list[Any], last: list[Any]
) -> tuple[list[dict[str, Any]] | None, str | None]:
    """What the sink holds open at its target (open rolling files, transactions of PENDING
    epochs), from its plugin's ``describe_open`` over the stored committables (``last``: the
    last COMMITTED epoch's record, or none), and a note when that cannot be told here. None
    when the sink does not describe it."""
    from .errors import EosinkError
    from .registry import get_sink

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
        return None, f"the {sink.plugin} sink cannot describe it: {_one_line(str(exc))[:200]}"
    # A roll between epochs changes the target only; the sink row notes when it happened.
    roll = sink.last_roll
    newest = max(
        [r.committed_at or 0.0 for r in last] + [r.created_at or 0.0 for r in pending_rows],
        default=0.0,
    )
    if roll and float(roll["at"]) > newest:
        when = _iso(float(roll["at"]))
        if roll.get("everything"):
            return [], f"nothing (every open file was published by the roll at {when})"
        if items:
            return items, (
                f"{roll['files']} open file(s) were rolled at {when}, after the last epoch: "
                "some listed here may be published already"
            )
    return items, None if items else "nothing"


def _iso(t: float | None) -> str | None:
    """A Unix time as local ISO 8601 with its offset (None stays None)."""
    if not t:
        return None
    return datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds")


def owner_alive(owner: str, heartbeat_at: float | None = None) -> bool | None:
    """Whether the coordinator ``host:pid`` that last acquired a sink still runs.

    On this host its process is asked. On another host its heartbeat tells: recorded
    within :data:`HEARTBEAT_STALE_SECONDS` means running, older means not (killed, or its
    host lost); None when it has none (stopped cleanly, or an eosink before the heartbeat)
    or is not a process (``eosink abandon``): this machine cannot tell. A ``format("eosink")``
    stream's owner (``host:pid (format stream)``, one micro-batch's coordinator) is asked by
    its heartbeat on every host: its process ends with each micro-batch, its query runs on."""
    from ._metastore import FORMAT_STREAM_OWNER, HEARTBEAT_STALE_SECONDS, split_owner

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


def _refuse_unless_stopped(store: Any, sink_id: str, command: str) -> int | None:
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
        from ._metastore import FORMAT_STREAM_OWNER, HEARTBEAT_STALE_SECONDS, split_owner

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


def cmd_abandon(args: argparse.Namespace) -> int:
    from ._metastore import ABORTED, PENDING

    store = _store(args.metastore_url)
    try:
        refused = _refuse_unless_stopped(store, args.sink_id, "abandon")
        if refused is not None:
            return refused
        rec = store.epoch(args.sink_id, args.epoch)
        if rec is None or rec.status not in (PENDING, ABORTED):
            state = "unknown to this meta store" if rec is None else rec.status
            print(
                f"eosink abandon: sink {args.sink_id!r} epoch {args.epoch} is {state}; only a "
                "PENDING epoch (see `eosink status`) can be abandoned",
                file=sys.stderr,
            )
            return 1
        what = f"epoch {args.epoch} of sink {args.sink_id!r} ({rec.rows} rows, {rec.files} files)"
        if not args.accept_data_loss:
            print(
                f"eosink abandon: this would give up {what} for good: its rows are never "
                "published, and the loss is recorded in the meta store (shown by `eosink "
                "status` forever after). Stop every job of the sink, then run again with "
                "--accept-data-loss",
                file=sys.stderr,
            )
            return 2
        by = f"{getpass.getuser()}@{socket.gethostname()} (eosink abandon)"
        loss = store.abandon(args.sink_id, args.epoch, args.reason, by)
    finally:
        store.close()
    print(
        f"abandoned {what}, recorded as a known loss at {_iso(loss.recorded_at)}. "
        "The next run of the sink deletes its staged data; every coordinator of the sink "
        "that was running is fenced and stops."
    )
    return 0


def _sink_options(args: argparse.Namespace) -> dict[str, Any]:
    """``--options-json`` merged with each ``--option KEY=VALUE`` (a JSON value, else the
    string)."""
    opts: dict[str, Any] = {}
    if args.options_json:
        loaded = json.loads(args.options_json)
        if not isinstance(loaded, dict):
            raise ConfigError("--options-json must be a JSON object of the sink's options")
        opts.update(loaded)
    for item in args.option or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--option takes KEY=VALUE, not {item!r}")
        try:
            opts[key] = json.loads(value)
        except ValueError:
            opts[key] = value
    return opts


def cmd_recover(args: argparse.Namespace) -> int:
    from ._metastore import ABORTED, COMMITTED, PENDING
    from ._setup import open_runtime, prepare_sink

    setup = prepare_sink(
        args.sink,
        _sink_options(args),
        streaming=False,
        sink_id=args.sink_id,
        metastore_url=args.metastore_url,
    )
    store = _store(setup.metastore_url)
    try:
        refused = _refuse_unless_stopped(store, setup.sink_id, "recover")
        if refused is not None:
            return refused
        before = {r.epoch: r.status for r in store.epochs(setup.sink_id, (PENDING, ABORTED))}
    finally:
        store.close()
    if args.drop_lost_open_files and not (args.accept_data_loss and args.reason):
        print(
            "eosink recover: --drop-lost-open-files gives up the rows of the open files it "
            "drops (recorded as known losses, shown by `eosink status`): run again with "
            "--reason and --accept-data-loss",
            file=sys.stderr,
        )
        return 2
    from .errors import SinkError

    rt = open_runtime(setup)  # fences every other coordinator; the sink's init runs
    dropped: list[dict[str, Any]] = []
    rolled = 0
    failure: SinkError | None = None
    try:
        try:
            rt.recover(first_epoch=0)  # lineage "batch": every PENDING epoch is complete data
        except SinkError as exc:  # an epoch that still cannot be committed: reported below
            failure = exc
        if failure is None:
            if args.drop_lost_open_files:
                dropped = _drop_lost_open_files(rt, args.reason)
            rolled = rt.roll(everything=True)
        after = {r.epoch: r.status for r in rt.store.epochs(setup.sink_id)}
    finally:
        rt.close()
        rt.store.close()
    if failure is not None:
        print(f"eosink recover: {_one_line(str(failure))}", file=sys.stderr)
    committed = sorted(e for e, st in before.items() if st == PENDING and after.get(e) == COMMITTED)
    aborted = sorted(e for e, st in before.items() if st == ABORTED and e not in after)
    left = sorted(e for e in before if after.get(e) in (PENDING, ABORTED))
    print(
        f"sink {setup.sink_id}: committed the PENDING epoch(s) {committed or 'none'}; finished "
        f"the abort of {aborted or 'none'}; deleted staged data without a committable"
        + (f"; dropped {len(dropped)} lost open file(s)" if dropped else "")
        + (f"; published {rolled} open file(s)" if rolled else "")
        + (f"; still not finished: {left} (see `eosink status`)" if left else "")
    )
    return 1 if left or failure is not None else 0


def _drop_lost_open_files(rt: Any, reason: str) -> list[dict[str, Any]]:
    """Drop the sink's open files whose committed rows can no longer be published, and
    record their rows as known losses (one per last epoch of a file's epochs)."""
    from ._metastore import DROPPED_OPEN_FILE, PENDING

    drop = getattr(rt.coordinator, "drop_lost_open_files", None)
    if drop is None:
        raise ConfigError(
            f"--drop-lost-open-files: sink {rt.sink_id} ({rt.plugin.name}) has no open files"
        )
    if rt.store.epochs(rt.sink_id, (PENDING,)):
        raise ConfigError(
            f"--drop-lost-open-files: sink {rt.sink_id} still has PENDING epochs that could "
            "not be committed (see `eosink status`); if one of them fails on a lost open "
            "file, abandon it first (`eosink abandon`), then run this again"
        )
    dropped: list[dict[str, Any]] = drop()
    by = f"{getpass.getuser()}@{socket.gethostname()} (eosink recover --drop-lost-open-files)"
    for d in dropped:
        rt.store.record_loss(
            rt.sink_id,
            d["end"],
            rows=d["rows"],
            files=1,
            nbytes=d["bytes"],
            origin=DROPPED_OPEN_FILE,
            reason=f"{reason}: open file {d['final']} of epochs {d['start']}..{d['end']} "
            f"dropped, {d['why']}",
            by=by,
        )
        print(
            f"dropped the open file {d['final']} (epochs {d['start']}..{d['end']}, "
            f"{d['rows']} rows): {d['why']}; recorded as a known loss"
        )
    if not dropped:
        print("no open file has lost data: nothing dropped")
    return dropped


def _run_label(origin: str | None) -> str:
    """What wrote an epoch: a batch run (explicit epoch), a batch run without epoch=, or a
    stream (its lineage's first 8 characters)."""
    from ._metastore import AUTO_ORIGINS, BATCH, DROPPED_OPEN_FILE

    if origin == BATCH:
        return "batch"
    if origin in AUTO_ORIGINS:
        return "batch (auto epoch)"
    if origin == DROPPED_OPEN_FILE:
        return "dropped open file"
    return f"stream {origin[:8]}" if origin else "-"


def cmd_db(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import DatabaseError, OperationalError

    from ._metastore import default_url, redact_url
    from ._metastore.migrations import current_revision, head_revision, upgrade
    from ._metastore.store import _make_engine

    url = args.url or default_url()
    if args.action != "upgrade":
        _check_sqlite(url, tables=False)  # `current` never creates a meta store
    engine = _make_engine(url, create=args.action == "upgrade")
    try:
        with engine.begin() as conn:
            before = current_revision(conn)
            if args.action == "upgrade":
                upgrade(conn)
            after = current_revision(conn)
    except OperationalError as exc:
        raise MetaStoreUnavailableError(
            f"meta store {redact_url(url)} is unreachable: {exc.orig}"
        ) from None
    except DatabaseError as exc:
        raise _not_a_store(url, str(exc.orig)) from None
    finally:
        engine.dispose()
    if args.action == "upgrade":
        print(
            f"{redact_url(url)}: schema {before or '(empty)'} -> {after} (head {head_revision()})"
        )
    else:
        print(f"{redact_url(url)}: schema {after or '(empty)'} (this eosink: {head_revision()})")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from ._demo import demo

    return demo(
        args.sink,
        args.dir,
        rows=args.rows,
        batches=args.batches,
        bootstrap_servers=args.bootstrap_servers,
    )


def cmd_new_sink(args: argparse.Namespace) -> int:
    from ._scaffold import new_sink, next_steps

    print(next_steps(new_sink(args.name, args.dir)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``eosink`` command's parser (docs/cli.md's synopsis is checked against it)."""
    p = argparse.ArgumentParser(prog="eosink", description="Exactly-once sinks for PySpark.")
    p.add_argument("-v", "--verbose", action="store_true", help="log every state change")
    sub = p.add_subparsers(dest="cmd", required=True)

    sp = sub.add_parser("plugins", help="list installed sinks with their packages and versions")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(fn=cmd_plugins)

    sp = sub.add_parser("status", help="sinks, last committed epoch, pending/aborted epochs")
    sp.add_argument("--metastore-url", help="default: EOSINK_METASTORE_URL or ~/.eosink")
    sp.add_argument("--sink-id")
    sp.add_argument("--recent", type=int, default=5, help="recent commits shown per sink")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(fn=cmd_status)

    sp = sub.add_parser(
        "abandon",
        help="give up a PENDING epoch that can never be published, recorded as a known loss",
    )
    sp.add_argument("--metastore-url", help="default: EOSINK_METASTORE_URL or ~/.eosink")
    sp.add_argument("--sink-id", required=True)
    sp.add_argument("--epoch", type=int, required=True)
    sp.add_argument("--reason", required=True, help="why: kept with the loss record")
    sp.add_argument(
        "--accept-data-loss",
        action="store_true",
        help="required: the epoch's rows are never published",
    )
    sp.set_defaults(fn=cmd_abandon)

    sp = sub.add_parser(
        "recover",
        help="finish a stopped sink now: commit its PENDING epochs, abort what must be "
        "aborted (e.g. lingering Kafka transactions)",
    )
    sp.add_argument("--sink", required=True, help="the sink's name (eosink plugins)")
    sp.add_argument("--sink-id", help="default: the sink's default for its target")
    sp.add_argument("--metastore-url", help="default: EOSINK_METASTORE_URL or ~/.eosink")
    sp.add_argument(
        "--option",
        action="append",
        metavar="KEY=VALUE",
        help="a sink option, as the job gives it (VALUE in JSON, or a string); repeatable",
    )
    sp.add_argument("--options-json", help="the sink's options as one JSON object")
    sp.add_argument(
        "--drop-lost-open-files",
        action="store_true",
        help="file sink: drop the open rolling files whose committed rows were destroyed "
        "outside eosink (an S3 upload aborted, staged data deleted), recorded as known "
        "losses; needs --reason and --accept-data-loss",
    )
    sp.add_argument("--reason", help="--drop-lost-open-files: why, kept with the losses")
    sp.add_argument(
        "--accept-data-loss",
        action="store_true",
        help="--drop-lost-open-files: confirm that the rows of those files are given up",
    )
    sp.set_defaults(fn=cmd_recover)

    sp = sub.add_parser("db", help="meta store schema")
    sp.add_argument("action", choices=["upgrade", "current"])
    sp.add_argument("--url", help="default: EOSINK_METASTORE_URL or ~/.eosink/metastore.db")
    sp.set_defaults(fn=cmd_db)

    sp = sub.add_parser("demo", help="write, crash-free re-run and verify, on embedded defaults")
    sp.add_argument("--sink", default="file", choices=["file", "iceberg", "kafka"])
    sp.add_argument("--dir", help="working directory (default: a new temporary one)")
    sp.add_argument(
        "--bootstrap-servers",
        help="--sink kafka: the Kafka broker(s) to write to, host:port (the demo starts none)",
    )
    sp.add_argument("--rows", type=int, default=30000)
    sp.add_argument("--batches", type=int, default=3)
    sp.set_defaults(fn=cmd_demo)

    sp = sub.add_parser(
        "new-sink", help="write a new sink plugin package: a working SQLite sink and its tests"
    )
    sp.add_argument("name", help="the sink's name: lowercase letters, digits, underscores")
    sp.add_argument("--dir", default=".", help="where eosink-NAME/ is created (default: here)")
    sp.set_defaults(fn=cmd_new_sink)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.fn(args))
    except EosinkError as exc:
        print(f"eosink: error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except Exception as exc:
        if args.verbose:
            raise
        print(
            f"eosink: error: {type(exc).__name__}: {_one_line(str(exc))} "
            "(run with -v for the traceback)",
            file=sys.stderr,
        )
        return 2


def _one_line(text: str) -> str:
    """Drivers' multi-line messages (psycopg's hints...) on one line."""
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
