"""Where the delta sink puts files in the table's directory, and how it finds them again.

* **Data files of an epoch** (both writer paths): ``eosink-<sink key>/e<epoch>/<attempt>/``
  under the table's root, Hive-style partition directories below (``grp=de%2Fat/``, Spark's
  escaping), ``part-<task>-<n>.<codec>.parquet`` inside. One directory per epoch, so that
  the cleanup after a commit lists that epoch's attempts only, not every epoch the sink
  wrote. No version of the table names them until the epoch's commit; a Delta reader reads
  only the files its log names, so they are invisible until then. They are not under a
  hidden (``_``) directory on purpose: once committed they are the table's data files, and
  ``VACUUM`` must be able to delete them after a later ``OPTIMIZE`` or ``DELETE`` removed
  them from the table.
* **Staged changes of an upsert epoch**: ``_eosink/<sink key>/changes/e<epoch>-<attempt>/``.
  They never become data files (the epoch's ``MERGE`` writes its own), so they live in a
  hidden directory, which readers, ``VACUUM`` and ``OPTIMIZE`` never list.
* **The core's batch journal** (local and mounted tables, :class:`eosink.JournalHome`):
  ``_eosink/journal/``, hidden too. A batch job re-run with ``epoch=`` on another machine,
  with a new meta store, finds there whether its epoch was committed or left PENDING.

Names carry the sink key (:func:`eosink.util.sink_key`) and the epoch: what an epoch staged
is found by epoch alone (``abort(e, None)``, ``staged_epochs``), and another writer's files
(other sinks, delta-rs, Spark) are never touched.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from eosink.util import sink_key

__all__ = [
    "CHANGES",
    "JOURNAL",
    "NULL_DIR",
    "attempt_dir",
    "changes_dir",
    "data_root",
    "epoch_dir",
    "epoch_of",
    "epoch_root",
    "escape",
    "partition_value",
    "unescape",
]

NULL_DIR = "__HIVE_DEFAULT_PARTITION__"
CHANGES = "_eosink"
JOURNAL = f"{CHANGES}/journal"
_EPOCH_NAME = re.compile(r"^e(?P<epoch>\d+)$")
_CHANGES_NAME = re.compile(r"^e(?P<epoch>\d+)-(?P<attempt>[A-Za-z0-9_.-]+)$")
# Spark's ExternalCatalogUtils.escapePathName: these and the control characters.
_ESCAPED = set("\"#%'*/:=?\\\x7f{[]^")
_HEX = re.compile(r"%([0-9A-Fa-f]{2})")


def _safe(attempt: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", attempt)


def data_root(sink_id: str) -> str:
    """The directory (relative to the table's root) of every epoch's data directories."""
    return f"eosink-{sink_key(sink_id)}"


def epoch_root(sink_id: str, epoch: int) -> str:
    """The directory of an epoch's write attempts."""
    return f"{data_root(sink_id)}/e{epoch}"


def epoch_dir(sink_id: str, epoch: int, attempt: str) -> str:
    """The directory (relative to the table's root) of one write attempt's data files."""
    return f"{epoch_root(sink_id, epoch)}/{_safe(attempt)}"


def attempt_dir(path: str) -> str:
    """The write attempt's directory of a data file's path (relative to the table's root)."""
    return "/".join(path.split("/")[:3])


def changes_dir(sink_id: str, epoch: int, attempt: str) -> str:
    """The directory (relative to the table's root) of an upsert epoch's staged changes."""
    return f"{CHANGES}/{sink_key(sink_id)}/changes/e{epoch}-{_safe(attempt)}"


def changes_root(sink_id: str) -> str:
    return f"{CHANGES}/{sink_key(sink_id)}/changes"


def epoch_of(name: str) -> int | None:
    """The epoch of an epoch's directory ``name`` (a base name, ``e<epoch>``), or None."""
    m = _EPOCH_NAME.match(name)
    return None if m is None else int(m["epoch"])


def changes_epoch_of(name: str) -> int | None:
    """The epoch of a staged-changes directory ``name`` (a base name), or None."""
    m = _CHANGES_NAME.match(name)
    return None if m is None else int(m["epoch"])


def escape(value: str | None) -> str:
    """A partition value as a directory name's value (Spark's escaping; NULL and the empty
    string as ``__HIVE_DEFAULT_PARTITION__``: Delta reads both as NULL)."""
    if value is None or value == "":
        return NULL_DIR
    return "".join(
        "".join(f"%{b:02X}" for b in c.encode()) if c in _ESCAPED or ord(c) < 0x20 else c
        for c in value
    )


def unescape(text: str) -> str | None:
    """The partition value of a directory name's value (:func:`escape` undone)."""
    if text == NULL_DIR:
        return None
    raw = _HEX.sub(lambda m: "\x00" + m[1], text)
    out = bytearray()
    i = 0
    while i < len(raw):
        if raw[i] == "\x00":
            out.append(int(raw[i + 1 : i + 3], 16))
            i += 3
        else:
            out += raw[i].encode()
            i += 1
    return out.decode()


def partition_value(value: Any, t: pa.DataType) -> str | None:
    """A partition column's value as Delta serializes it in ``partitionValues`` (None: NULL;
    the empty string is NULL too, as Delta's protocol reads it)."""
    if value is None:
        return None
    if pa.types.is_boolean(t):
        return "true" if value else "false"
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return value.isoformat()
    text = str(value)
    return None if text == "" else text


def partition_types_supported(t: pa.DataType) -> bool:
    """The types a partition column may have: exact as a directory value and as Delta's
    serialized partition value."""
    return bool(
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_integer(t)
        or pa.types.is_boolean(t)
        or pa.types.is_date32(t)
    )


def walk_files(fs: Any, root: str, rel: str) -> Iterator[tuple[str, Any]]:
    """``(path relative to the table root, FileInfo)`` of every file under ``root/rel``."""
    from pyarrow import fs as pafs

    base = f"{root}/{rel}"
    for info in fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True)):
        if info.type == pafs.FileType.File:
            yield info.path[len(root) + 1 :], info


def top_dirs(fs: Any, root: str, rel: str = "") -> list[str]:
    """Base names of the directories right under ``root/rel`` (prefixes on an object store)."""
    from pyarrow import fs as pafs

    base = f"{root}/{rel}" if rel else root
    infos = fs.get_file_info(pafs.FileSelector(base, allow_not_found=True))
    return [i.base_name for i in infos if i.type == pafs.FileType.Directory]
