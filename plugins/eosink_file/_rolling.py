"""Files that span epochs: open slots, their rolling conditions, rewind and truncate.

RisingWave's file-sink RFC (seed 001) in Spark's form. A *slot* is the open file of one
partition directory of one sink. Every committed epoch's pieces (the files its writers
staged) join their partition's slot; a slot becomes one visible file when a rolling
condition is met. Spark never replays a checkpointed batch, so the durable staging area
plays RisingWave's log store:

* row formats (JSON lines, CSV, text) are concatenated as epochs arrive: locally into an
  in-progress file under ``_eosink_staging`` (truncated back to the recorded length before
  each append: the *rewind*), on S3 into the parts of one multipart upload that spans the
  slot's epochs (a tail under ``s3_part_bytes`` stays staged until it grows or the slot
  rolls);
* Parquet and ORC pieces stay staged and are merged into one file when the slot rolls.

The state of every open slot (``start``/``end`` epoch, pieces, in-progress length or upload
id and parts) is part of each epoch's committable, so recovery commits it with the epoch;
after each commit it is also stored in the target (``_eosink/<sink key>.slots.json``),
which is what the next start reads. A rolled file has a deterministic name (sink, slot,
start epoch) and is published atomically (no-overwrite link, or
``CompleteMultipartUpload``); if it is found visible at a start while its slot is still
open (a crash between publishing and storing the state) the slot's staged data is dropped:
the *truncate*.
"""

from __future__ import annotations

import bz2
import copy
import gzip
import hashlib
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eosink import SinkError, fault_point
from eosink.util import fsync_path

from ._s3 import DROP_LOST_HINT, MIN_PART_BYTES, S3Store, local_tmp_dir

if TYPE_CHECKING:
    from .options import FileSinkOptions

log = logging.getLogger("eosink.file")

ROW_FORMATS = ("json", "csv", "text")
ROW_GROUP_ROWS = 1_000_000
"""Rows per row group of a merged Parquet file (pieces' smaller row groups are coalesced)."""
SLOTS_DIR = "slots"
FLUSH_DIR = "flush"

State = dict[str, Any]


def slot_id(partition: str) -> str:
    return hashlib.sha1(partition.encode()).hexdigest()[:12]


def empty_state() -> State:
    return {"seq": 0, "slots": {}}


def _first_record_end(data: bytes) -> int:
    """Index after the first CSV record (its line break; quoted line breaks do not count)."""
    quoted = False
    for i, b in enumerate(data):
        if b == 0x22:  # '"'
            quoted = not quoted
        elif b == 0x0A and not quoted:
            return i + 1
    return len(data)


def piece_content(data: bytes, fmt: str, codec: str, strip_header: bool) -> bytes:
    """A staged piece's bytes as they go into a slot's file.

    CSV pieces carry a header; every piece but a file's first loses it. Compressed text
    pieces are standard gzip/bzip2 streams, and a file of several such members is a valid
    file for every reader (multi-member gzip, concatenated bzip2).
    """
    if not strip_header or fmt != "csv":
        return data
    if codec == "gzip":
        raw = gzip.decompress(data)
        return gzip.compress(raw[_first_record_end(raw) :], compresslevel=6)
    if codec == "bzip2":
        raw = bz2.decompress(data)
        return bz2.compress(raw[_first_record_end(raw) :])
    return data[_first_record_end(data) :]


def merge_columnar(
    fmt: str,
    codec: str,
    sources: Sequence[Path],
    dest: Path,
    fsync: bool,
    row_group_rows: int = ROW_GROUP_ROWS,
) -> int:
    """Merge Parquet or ORC pieces into one file at ``dest`` (row groups rewritten).

    pyarrow cannot copy Parquet row groups as raw bytes, so the pieces are read and written
    again with the sink's codec (about 85 MB/s of Parquet per thread here). Small row groups
    of many pieces are coalesced into row groups of ``row_group_rows`` rows, so a rolled
    file is not bigger than its pieces. The schema (and its metadata, e.g. Spark's) is the
    first piece's; the others are cast to it. Returns the rows written.
    """
    import pyarrow as pa

    dest.parent.mkdir(parents=True, exist_ok=True)
    rows = 0
    if fmt == "parquet":
        import pyarrow.parquet as pq

        full = pq.read_schema(sources[0])
        schema = full.remove_metadata()
        buf: list[pa.Table] = []
        buffered = 0
        with pq.ParquetWriter(dest, full, compression=codec) as w:

            def flush() -> None:
                nonlocal buf, buffered
                if buf:
                    t = pa.concat_tables(buf).replace_schema_metadata(full.metadata)
                    w.write_table(t, row_group_size=max(buffered, 1))
                buf, buffered = [], 0

            for i, src in enumerate(sources):
                pf = pq.ParquetFile(src)
                for rg in range(pf.num_row_groups):
                    t = pf.read_row_group(rg).replace_schema_metadata(None)
                    if t.schema != schema:
                        t = t.cast(schema)
                    buf.append(t)
                    buffered += t.num_rows
                    rows += t.num_rows
                    if buffered >= row_group_rows:
                        flush()
                if i == len(sources) // 2:
                    fault_point("roll_mid_merge", site="parquet")
            flush()
    else:
        import pyarrow.orc as orc

        first = orc.ORCFile(sources[0]).schema
        w2 = orc.ORCWriter(str(dest), compression="uncompressed" if codec == "none" else codec)
        try:
            for i, src in enumerate(sources):
                t = orc.ORCFile(src).read()
                if t.schema != first:
                    t = t.cast(first)
                w2.write(t)
                rows += t.num_rows
                if i == len(sources) // 2:
                    fault_point("roll_mid_merge", site="orc")
        finally:
            w2.close()
    if fsync:
        fsync_path(dest)
    return rows


class Roller:
    """The rolling part of one file sink's coordinator (local directory or S3 prefix).

    Thread-safety: the core may call :meth:`roll` from a timer thread while epochs are
    prepared and committed on others; one lock serialises them, and a roll outside an epoch
    never runs while an epoch this process prepared is neither committed nor aborted.
    """

    def __init__(
        self,
        opts: FileSinkOptions,
        key: str,
        root: Path | None,
        s3: S3Store | None,
        write_json: Callable[[str, dict[str, Any]], None],
        read_json: Callable[[str], dict[str, Any] | None],
    ) -> None:
        self.opts = opts
        self.key = key
        self.root = root
        self.s3 = s3
        self.write_json = write_json
        self.read_json = read_json
        self.staging = f"_eosink_staging/{key}"
        self.state_rel = f"_eosink/{key}.slots.json"
        self.lock = threading.RLock()
        self.committed: State = empty_state()
        self.head: State = empty_state()
        # epoch -> the head it was prepared on, for every epoch neither committed nor aborted
        self.inflight: dict[int, State] = {}
        self.swept = False
        self._published_open: dict[str, tuple[str, int]] = {}
        self.row = opts.format in ROW_FORMATS
        self._consumed: list[str] = []

    # -- rolling conditions ------------------------------------------------------------------
    def _due(self, slot: dict[str, Any], now: float, touched: bool) -> str | None:
        o = self.opts
        if o.max_file_bytes is not None and slot["bytes"] >= o.max_file_bytes:
            return "max_file_bytes"
        if o.max_row_count is not None and slot["rows"] >= o.max_row_count:
            return "max_row_count"
        if o.rollover_seconds is not None and now - slot["opened_at"] >= o.rollover_seconds:
            return "rollover_seconds"
        if (
            not touched
            and o.inactivity_seconds is not None
            and now - slot["last_at"] >= o.inactivity_seconds
        ):
            return "inactivity_seconds"
        return None

    def next_roll_in(self) -> float | None:
        o = self.opts
        with self.lock:
            slots = list(self.head["slots"].values())
        if not slots:
            return None
        now = time.time()
        waits = []
        for s in slots:
            if o.rollover_seconds is not None:
                waits.append(s["opened_at"] + o.rollover_seconds - now)
            if o.inactivity_seconds is not None:
                waits.append(s["last_at"] + o.inactivity_seconds - now)
        return max(0.0, min(waits)) if waits else None

    def held(self, state: State) -> tuple[int, int]:
        rows = sum(int(s["rows"]) for s in state["slots"].values())
        return rows, sum(int(s["bytes"]) for s in state["slots"].values())

    # -- storage -----------------------------------------------------------------------------
    def _path(self, rel: str) -> Path:
        assert self.root is not None
        return self.root / rel

    def _exists(self, rel: str) -> int | None:
        if self.s3 is not None:
            return self.s3.size(rel)
        try:
            return self._path(rel).stat().st_size
        except FileNotFoundError:
            return None

    def _delete(self, rels: Sequence[str]) -> None:
        if not rels:
            return
        if self.s3 is not None:
            self.s3.delete(rels)
            return
        for r in rels:
            self._path(r).unlink(missing_ok=True)

    def _read(self, rel: str) -> bytes:
        if self.s3 is not None:
            return self.s3.get(rel)
        return self._path(rel).read_bytes()

    # -- start -------------------------------------------------------------------------------
    def load(self) -> None:
        """Read the open slots the target records; note the ones found already published.

        Their truncate waits for :meth:`_settle`, after the core's recovery: a PENDING
        epoch whose commit published the file is replayed first and settles it itself.
        """
        with self.lock:
            state = self.read_json(self.state_rel) or empty_state()
            self._published_open = {}
            for sid, slot in state["slots"].items():
                have = self._exists(slot["final"])
                if have is not None:
                    self._published_open[sid] = (slot["final"], have)
            self.committed = state
            self.head = copy.deepcopy(state)

    def _settle(self) -> None:
        """Truncate: drop the staged data of open slots whose file is published.

        A crash between publishing a roll made between epochs and storing the slots leaves
        them so; the roll's manifest (same name) is written again if it was not.
        """
        pending, self._published_open = self._published_open, {}
        done = []
        for sid, (final, have) in pending.items():
            slot = self.head["slots"].get(sid)
            if slot is None or slot["final"] != final:
                continue  # a replayed commit rolled it
            log.info(
                "file sink: the rolled file %s of epochs %d..%d is visible but its slot was "
                "still open (a crash after publishing it): dropping its staged data",
                final,
                slot["start"],
                slot["end"],
            )
            self._write_roll_manifest({**slot, "bytes": have})
            done.append(sid)
        if not done:
            return
        victims = []
        for sid in done:
            victims += self._slot_files(self.head["slots"].pop(sid))
            self.committed["slots"].pop(sid, None)
        self.head["seq"] = int(self.head["seq"]) + 1
        self.store_state(self.head)
        self.committed["seq"] = self.head["seq"]
        self._delete(victims)

    def _write_roll_manifest(self, r: dict[str, Any]) -> None:
        """The manifest of one file rolled between epochs; its name depends on the slot only."""
        self.write_json(
            f"_eosink/commits/{self.key}/{r['end']}.roll-{slot_id(r['partition'])}-{r['start']}.json",
            manifest(int(r["end"]), [r]),
        )

    def _slot_files(self, slot: dict[str, Any]) -> list[str]:
        files = [p["staged"] for p in slot["pieces"]]
        if slot.get("inprogress"):
            files.append(slot["inprogress"])
        return files

    def sweep(self, current_epoch: int | None) -> None:
        """Delete in-progress files and abort uploads of this sink that no state references.

        Runs once per start, at the first epoch (after the core's recovery), and before a
        final roll: only then is every epoch this sink has PENDING committed or aborted.
        """
        referenced = set()
        uploads = set()
        for slot in self.head["slots"].values():
            referenced.update(self._slot_files(slot))
            if slot.get("upload"):
                uploads.add(slot["upload"]["id"])
        for st in self.inflight.values():
            for slot in st["slots"].values():
                if slot.get("upload"):
                    uploads.add(slot["upload"]["id"])
        if self.s3 is not None:
            mine = f"-s{self.key[:8]}"
            for rel, uid in self.s3.uploads():
                name = rel.rsplit("/", 1)[-1]
                if mine not in name or uid in uploads:
                    continue
                if current_epoch is not None and name.startswith(f"part-{current_epoch:010d}-"):
                    continue  # this epoch's own uploads (the per-epoch mode's writers)
                log.info("file sink: aborting an upload no state references: %s", rel)
                self.s3.abort_upload(rel, uid)
            orphans = [r for r, _ in self.s3.objects(f"{self.staging}/{SLOTS_DIR}/")]
            orphans += [r for r, _ in self.s3.objects(f"{self.staging}/{FLUSH_DIR}/")]
            self._delete([r for r in orphans if r not in referenced])
        elif self.root is not None:
            for sub in (SLOTS_DIR, FLUSH_DIR):
                d = self._path(f"{self.staging}/{sub}")
                if d.is_dir():
                    for p in d.rglob("*"):
                        if p.is_file() and p.relative_to(self.root).as_posix() not in referenced:
                            p.unlink(missing_ok=True)

    # -- an epoch ----------------------------------------------------------------------------
    def prepare(self, epoch: int, files: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """Add the epoch's pieces to their slots; roll the slots that are due.

        Everything this does is either recorded in the returned committable or undone by the
        next prepare (a local in-progress file is truncated back, an S3 part re-uploaded).
        """
        with self.lock:
            self._settle()
            if not self.swept:
                self.sweep(epoch)
                self.swept = True
            base = self.head
            head = copy.deepcopy(base)
            head["seq"] = int(base["seq"]) + 1
            self._consumed = []
            now = time.time()
            touched: dict[str, list[dict[str, Any]]] = {}
            for f in sorted(files, key=lambda f: str(f["staged"])):
                touched.setdefault(f["partition"], []).append(f)
            changed: list[dict[str, Any]] = []
            for partition, pieces in touched.items():
                sid = slot_id(partition)
                slot = head["slots"].get(sid)
                schema = pieces[0].get("schema")
                if slot is not None and schema and slot.get("schema") not in (None, schema):
                    # New columns (or types) cannot join the open file: it rolls as it is.
                    log.info(
                        "file sink epoch %d: rolling %s (epochs %d..%d): this epoch's columns "
                        "differ from the open file's",
                        epoch,
                        slot["final"],
                        slot["start"],
                        slot["end"],
                    )
                    changed.append(head["slots"].pop(sid))
                    slot = None
                if slot is None:
                    ext = piece_ext(pieces[0]["staged"])
                    name = f"part-{epoch:010d}-s{self.key[:8]}.{ext}"
                    slot = head["slots"][sid] = {
                        "partition": partition,
                        "start": epoch,
                        "end": epoch,
                        "opened_at": now,
                        "last_at": now,
                        "rows": 0,
                        "bytes": 0,
                        "pieces": [],
                        "final": f"{partition}/{name}" if partition else name,
                        "inprogress": None,
                        "upload": None,
                        "schema": schema,
                    }
                slot["end"] = max(int(slot["end"]), epoch)
                slot["last_at"] = now
                slot["rows"] += sum(int(p["rows"] or 0) for p in pieces)
                self._add_pieces(epoch, sid, slot, pieces)
            due = []
            for sid, slot in list(head["slots"].items()):
                why = self._due(slot, now, slot["partition"] in touched)
                if why is None:
                    continue
                log.info(
                    "file sink epoch %d: rolling %s (epochs %d..%d, %d bytes): %s",
                    epoch,
                    slot["final"],
                    slot["start"],
                    slot["end"],
                    slot["bytes"],
                    why,
                )
                due.append(head["slots"].pop(sid))
            rolled = self._seal_all(changed + due, f"{self.staging}/{epoch}/_rolled")
            self.inflight[epoch] = base
            self.head = head
            consumed, self._consumed = self._consumed, []
            return {"mode": "rolling", "state": head, "rolled": rolled, "consumed": consumed}

    def _add_pieces(
        self, epoch: int, sid: str, slot: dict[str, Any], pieces: list[dict[str, Any]]
    ) -> None:
        o = self.opts
        if not self.row:
            for p in pieces:
                slot["pieces"].append(
                    {"staged": p["staged"], "bytes": int(p["bytes"]), "epoch": epoch}
                )
                slot["bytes"] += int(p["bytes"])
            return
        if self.s3 is None:  # append to the slot's in-progress file, after a rewind
            if slot["inprogress"] is None:
                slot["inprogress"] = (
                    f"{self.staging}/{SLOTS_DIR}/{sid}-{slot['start']}.{piece_ext(slot['final'])}"
                )
            path = self._path(slot["inprogress"])
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "ab+") as fh:
                self._rewind(fh, slot)
                for p in pieces:
                    strip = fh.tell() > 0
                    if strip and o.format == "csv":
                        data = piece_content(
                            self._read(p["staged"]), o.format, o.codec, strip_header=True
                        )
                        fh.write(data)
                    else:
                        with open(self._path(p["staged"]), "rb") as src:
                            shutil.copyfileobj(src, fh, 1024 * 1024)
                fh.flush()
                if o.fsync:
                    os.fsync(fh.fileno())
                slot["bytes"] = fh.tell()
            fault_point("roll_after_part", site="local")
            return
        # S3: pieces queue in the tail; a tail of part_bytes or more becomes the next part.
        for p in pieces:
            slot["pieces"].append({"staged": p["staged"], "bytes": int(p["bytes"]), "epoch": epoch})
            slot["bytes"] += int(p["bytes"])
        tail = sum(int(p["bytes"]) for p in slot["pieces"])
        if tail >= self.s3.part_bytes:
            self._upload_tail(slot)
            fault_point("roll_after_part", site="s3")

    def _rewind(self, fh: Any, slot: dict[str, Any]) -> None:
        """Cut an in-progress file back to the length its slot records."""
        size = fh.seek(0, os.SEEK_END)
        want = int(slot["bytes"])
        if size < want:
            raise SinkError(
                f"the in-progress file {self._path(slot['inprogress'])} of the open file "
                f"{slot['final']} (epochs {slot['start']}..{slot['end']}) has {size} bytes, "
                f"not the {want} committed into it: it was truncated or replaced outside "
                f"eosink, and the rows of those epochs cannot be published: {DROP_LOST_HINT}"
            )
        if size > want:
            fh.truncate(want)  # what an epoch that was never committed appended
        fh.seek(0, os.SEEK_END)

    def _upload_tail(self, slot: dict[str, Any], last: bool = False) -> None:
        """Upload the slot's staged tail as its next part (S3, row formats).

        Every part but the ``last`` must be >= 5 MiB: a tail that is smaller once CSV headers
        are dropped stays staged.
        """
        assert self.s3 is not None
        o = self.opts
        up = slot["upload"]
        n = len(up["parts"]) + 1 if up else 1
        pieces = slot["pieces"]
        data: bytes | None = None
        if not (len(pieces) == 1 and not (o.format == "csv" and n > 1)):
            data = b"".join(
                piece_content(
                    self._read(p["staged"]), o.format, o.codec, strip_header=n > 1 or i > 0
                )
                for i, p in enumerate(pieces)
            )
            if not last and len(data) < MIN_PART_BYTES:
                return
        if up is None:
            up = slot["upload"] = {"id": self.s3.create_upload(slot["final"]), "parts": []}
        if data is None:  # one piece, as it is: copied server-side
            part = self.s3.copy_part(
                slot["final"], up["id"], n, pieces[0]["staged"], pieces[0]["bytes"]
            )
        else:
            part = self.s3.upload_part(slot["final"], up["id"], n, data)
        up["parts"].append(part.as_dict())
        self._consumed += [p["staged"] for p in pieces]
        slot["pieces"] = []
        slot["bytes"] = sum(int(q["bytes"]) for q in up["parts"])

    def _seal_all(self, slots: list[dict[str, Any]], scratch: str) -> list[dict[str, Any]]:
        """Seal due slots, a few at a time (merging and uploading release the GIL)."""
        if len(slots) <= 1:
            return [self._seal(s, scratch) for s in slots]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(4, len(slots))) as pool:
            return list(pool.map(lambda s: self._seal(s, scratch), slots))

    def _seal(self, slot: dict[str, Any], scratch: str) -> dict[str, Any]:
        """Make a due slot's file ready to publish; what ``publish`` needs, and what to drop."""
        o = self.opts
        drop = [p["staged"] for p in slot["pieces"]]
        out: dict[str, Any] = {
            "partition": slot["partition"],
            "start": slot["start"],
            "end": slot["end"],
            "final": slot["final"],
            "rows": slot["rows"],
        }
        if self.row and self.s3 is None:
            # Cut what a later, uncommitted epoch may have appended (the rewind), then seal.
            with open(self._path(slot["inprogress"]), "r+b") as fh:
                self._rewind(fh, slot)
                if o.fsync:
                    os.fsync(fh.fileno())
            out.update(src=slot["inprogress"], bytes=int(slot["bytes"]), drop=drop)
            return out
        if self.row:  # S3: the tail is the last part
            if slot["pieces"] or slot["upload"] is None:
                self._upload_tail(slot, last=True)
            out.update(upload=slot["upload"], bytes=int(slot["bytes"]), drop=drop)
            return out
        # Parquet / ORC: merge the pieces
        if self.s3 is None:
            src = f"{scratch}/{slot['final']}"
            rows = merge_columnar(
                o.format,
                o.codec,
                [self._path(p["staged"]) for p in slot["pieces"]],
                self._path(src),
                o.fsync,
            )
            out.update(src=src, bytes=self._path(src).stat().st_size, rows=rows, drop=drop)
            return out
        tmp = local_tmp_dir()
        try:
            local = []
            for i, p in enumerate(slot["pieces"]):
                dst = tmp / f"{i:06d}"
                self.s3.download(p["staged"], dst)
                local.append(dst)
            merged = tmp / "merged"
            rows = merge_columnar(o.format, o.codec, local, merged, False)
            upload_id, parts = self.s3.upload_file_parts(merged, slot["final"])
            out.update(
                upload={"id": upload_id, "parts": [p.as_dict() for p in parts]},
                bytes=merged.stat().st_size,
                rows=rows,
                drop=drop,
            )
            return out
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def publish(self, r: dict[str, Any]) -> None:
        """Make one sealed slot's file visible; idempotent; never overwrites."""
        fault_point("roll_before_publish")
        if self.s3 is not None:
            self.s3.complete(r["final"], r["upload"]["id"], r["upload"]["parts"], int(r["bytes"]))
        else:
            final = self._path(r["final"])
            have = self._exists(r["final"])
            if have is not None:
                if have != int(r["bytes"]):
                    raise SinkError(
                        f"{final} exists with {have} bytes, not the {r['bytes']} of the rolled "
                        "file eosink publishes under that name: another writer uses this path"
                    )
            else:
                src = self._path(r["src"])
                if not src.exists():
                    raise SinkError(
                        f"the rolled file {final} (epochs {r['start']}..{r['end']}) was never "
                        f"published and its staged data {src} is missing: was the staging "
                        "directory deleted?"
                    )
                final.parent.mkdir(parents=True, exist_ok=True)
                os.link(src, final)  # fails if ``final`` exists: never overwritten
                if self.opts.fsync:
                    fsync_path(final.parent)
                src.unlink()
        fault_point("roll_after_publish")

    def store_state(self, state: State) -> None:
        """Store ``state`` in the target unless a newer one is there (a replayed commit).

        ``committed`` mirrors the stored state (read at the start, updated after every store;
        only this sink's fenced run writes it), so no read of the target is needed.
        """
        if int(self.committed["seq"]) >= int(state["seq"]):
            return
        self.write_json(self.state_rel, state)

    def commit(self, epoch: int, c: dict[str, Any]) -> list[dict[str, Any]]:
        """Publish the epoch's rolled files, store the slots, drop rolled staged data."""
        with self.lock:
            rolled: list[dict[str, Any]] = c["rolled"]
            for r in rolled:
                self.publish(r)
            return rolled

    def after_commit(self, epoch: int, c: dict[str, Any]) -> None:
        """Store the slots after the epoch, then drop what it rolled or consumed."""
        with self.lock:
            self.store_state(c["state"])
            fault_point("roll_before_drop", site="commit")
            self._delete([d for r in c["rolled"] for d in r["drop"]] + list(c.get("consumed", [])))
            fault_point("roll_after_drop", site="commit")
            self.inflight.pop(epoch, None)
            if int(c["state"]["seq"]) >= int(self.committed["seq"]):
                self.committed = c["state"]
            if not self.inflight:
                self.head = copy.deepcopy(c["state"])

    def referenced(self) -> set[str]:
        """Staged files the open slots still need (an epoch's commit must keep them)."""
        with self.lock:
            out: set[str] = set()
            for st in (self.head, self.committed, *self.inflight.values()):
                for slot in st["slots"].values():
                    out.update(self._slot_files(slot))
            return out

    def abort(self, epoch: int, c: dict[str, Any] | None) -> None:
        with self.lock:
            base = self.inflight.pop(epoch, None)
            if base is not None:
                # Epochs prepared after this one were built on it: they cannot commit either.
                for later in [e for e in self.inflight if e > epoch]:
                    del self.inflight[later]
                self.head = base
            if c is None or self.s3 is None:
                return
            base_uploads = {
                s["upload"]["id"]
                for st in (self.head, self.committed)
                for s in st["slots"].values()
                if s.get("upload")
            }
            for r in c.get("rolled", []):
                up = r.get("upload")
                if up and up["id"] not in base_uploads:
                    self.s3.abort_upload(r["final"], up["id"])
            for s in c["state"]["slots"].values():
                up = s.get("upload")
                if up and up["id"] not in base_uploads:
                    self.s3.abort_upload(s["final"], up["id"])

    # -- an operator's way out -----------------------------------------------------------------
    def _lost(self, slot: dict[str, Any]) -> str | None:
        """Why an open slot's committed data can no longer be published, or None."""
        up = slot.get("upload")
        if self.s3 is not None and up and not self.s3.upload_exists(slot["final"], up["id"]):
            return f"its multipart upload (id {str(up['id'])[:16]}...) was aborted outside eosink"
        if slot.get("inprogress"):
            have = self._exists(slot["inprogress"])
            if have is None or have < int(slot["bytes"]):
                return (
                    f"its in-progress file {slot['inprogress']} has "
                    f"{'gone' if have is None else f'{have} bytes'}, not the {slot['bytes']} "
                    "committed into it"
                )
        missing = [p["staged"] for p in slot["pieces"] if self._exists(p["staged"]) is None]
        if missing:
            return f"{len(missing)} of its staged pieces are missing ({missing[0]}...)"
        return None

    def drop_lost(self) -> list[dict[str, Any]]:
        """Drop the open files whose committed data can no longer be published (an S3
        upload aborted outside eosink, an in-progress file truncated or deleted, a staged
        piece deleted): their slots leave the stored state and what is left of their staged
        data is deleted, so that the sink goes on; the rows are lost. Returns, per dropped
        file: ``final``, ``start``, ``end``, ``rows``, ``bytes`` and ``why``. Runs only
        when no epoch of this process is in flight (after recovery)."""
        with self.lock:
            if self.inflight:
                raise SinkError(
                    "open files cannot be dropped while epochs are in flight; finish or "
                    "abandon the PENDING epochs first"
                )
            self._settle()
            state = copy.deepcopy(self.committed)
            lost = []
            for sid in sorted(state["slots"]):
                why = self._lost(state["slots"][sid])
                if why is not None:
                    lost.append((sid, why))
            if not lost:
                return []
            state["seq"] = int(state["seq"]) + 1
            out: list[dict[str, Any]] = []
            victims: list[str] = []
            for sid, why in lost:
                slot = state["slots"].pop(sid)
                victims += self._slot_files(slot)
                log.warning(
                    "file sink: dropping the open file %s (epochs %d..%d, %d rows): %s",
                    slot["final"],
                    slot["start"],
                    slot["end"],
                    slot["rows"],
                    why,
                )
                out.append(
                    {
                        "final": slot["final"],
                        "start": int(slot["start"]),
                        "end": int(slot["end"]),
                        "rows": int(slot["rows"]),
                        "bytes": int(slot["bytes"]),
                        "why": why,
                        "upload": slot.get("upload"),
                    }
                )
            self.store_state(state)
            self.committed = state
            self.head = copy.deepcopy(state)
            self._delete(victims)
            if self.s3 is not None:
                for d in out:
                    if d["upload"]:  # gone already, or half-gone on some servers
                        self.s3.abort_upload(d["final"], d["upload"]["id"])
            return out

    # -- rolls between epochs ----------------------------------------------------------------
    def roll(self, everything: bool, last_epoch: int) -> list[dict[str, Any]]:
        """Roll due slots (all with ``everything``) outside an epoch; returns what it published.

        Only committed data is rolled, and only when no epoch of this process is in flight.
        """
        with self.lock:
            if self.inflight:
                if everything:
                    log.info(
                        "file sink: %d epoch(s) not committed yet (Spark did not checkpoint "
                        "them): the open files stay open; the next run rolls them once those "
                        "epochs are committed or aborted",
                        len(self.inflight),
                    )
                return []
            self._settle()
            now = time.time()
            state = copy.deepcopy(self.committed)
            due = [
                sid
                for sid, slot in state["slots"].items()
                if everything or self._due(slot, now, touched=False)
            ]
            if everything and not self.swept:
                self.sweep(None)  # also at the end of a run without rolling options
                self.swept = True
            if not due:
                return []
            state["seq"] = int(state["seq"]) + 1
            slots = []
            for sid in sorted(due):
                slot = state["slots"].pop(sid)
                log.info(
                    "file sink: rolling %s (epochs %d..%d, %d bytes): %s",
                    slot["final"],
                    slot["start"],
                    slot["end"],
                    slot["bytes"],
                    "end of run" if everything else "by time",
                )
                slots.append(slot)
            try:
                sealed = self._seal_all(slots, f"{self.staging}/{FLUSH_DIR}/{state['seq']}")
            except FileNotFoundError as exc:  # a staged piece deleted outside eosink
                for slot in slots:
                    why = self._lost(slot)
                    if why is not None:
                        raise SinkError(
                            f"the open file {slot['final']} (epochs {slot['start']}.."
                            f"{slot['end']}, {slot['rows']} rows) cannot be published: {why} "
                            "(deleted outside eosink), and the rows of those epochs are gone: "
                            f"{DROP_LOST_HINT}"
                        ) from exc
                raise
            consumed, self._consumed = self._consumed, []
            for r in sealed:
                self.publish(r)
                self._write_roll_manifest(r)
            # Drop, then store the slots: a crash between leaves open slots whose files are
            # published, which the next start truncates (_settle); never unreferenced pieces.
            fault_point("roll_before_drop", site="flush")
            self._delete([d for r in sealed for d in r["drop"]] + consumed)
            fault_point("roll_after_drop", site="flush")
            self.store_state(state)
            self.committed = state
            self.head = copy.deepcopy(state)
            return sealed


def manifest(epoch: int, sealed: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A roll's manifest: what :func:`eosink_file.committed.committed_files` reads."""
    return {
        "epoch": epoch,
        "files": [
            {
                "path": r["final"],
                "bytes": r["bytes"],
                "start_epoch": r["start"],
                "end_epoch": r["end"],
            }
            for r in sealed
        ],
    }


def piece_ext(rel: str) -> str:
    """A file name's extension after its first dot: ``parquet``, ``jsonl.gz``; Spark's
    ``part-...c000.snappy.parquet`` gives ``snappy.parquet`` (its ``c000`` dropped)."""
    return re.sub(r"^c\d+\.", "", rel.rsplit("/", 1)[-1].split(".", 1)[1])


__all__ = [
    "Roller",
    "fsync_path",
    "manifest",
    "merge_columnar",
    "piece_content",
    "piece_ext",
    "slot_id",
]


def describe_open(
    sink_id: str, last: dict[str, Any] | None, pending: Mapping[int, dict[str, Any]]
) -> list[dict[str, Any]]:
    """The open rolling files as the newest committable records them (``eosink status``).

    With PENDING epochs that is the newest PENDING one's state: what is open once recovery
    commits it. A roll between epochs (``rollover_interval``, or a stop) is recorded in the
    target only, so a file listed here may have been published since; ``eosink recover``
    reads the target.
    """
    newest = pending[max(pending)] if pending else last
    if not newest or newest.get("mode") != "rolling":
        return []
    out = []
    for slot in sorted(newest["state"]["slots"].values(), key=lambda s: str(s["final"])):
        up = slot.get("upload")
        where = (
            f", S3 upload {str(up['id'])[:16]}... ({len(up['parts'])} parts)"
            if up
            else f", {len(slot['pieces'])} staged pieces"
            if slot["pieces"]
            else ""
        )
        out.append(
            {
                "kind": "open file",
                "what": f"{slot['final']} (epochs {slot['start']}..{slot['end']}, "
                f"{slot['rows']} rows, {slot['bytes']} bytes{where})",
                "file": slot["final"],
                "start_epoch": int(slot["start"]),
                "end_epoch": int(slot["end"]),
                "rows": int(slot["rows"]),
                "bytes": int(slot["bytes"]),
                "opened_at": slot.get("opened_at"),
                "s3_upload_id": up["id"] if up else None,
                "after_pending_epoch": bool(pending),
            }
        )
    return out
