"""The file sink on a Hadoop FileSystem, through Spark's own JVM on the driver.

``hdfs://``, ``abfs://``/``abfss://``, ``gs://``, ``s3a://``, ``file://`` and any other scheme
Spark has a Hadoop ``FileSystem`` for: Spark's ``DataFrameWriter`` stages each epoch there
(the native path), and the driver lists, publishes, and writes the marker and the manifests
through the ``FileSystem`` Spark itself uses (``Path(uri).getFileSystem(hadoopConf)``, over
py4j), with Spark's Hadoop configuration and credentials. The layout is the local one
(``_eosink_staging/``, ``_eosink/``, the published files), relative to the sink's URI.

Publishing is one ``rename`` per file: atomic on HDFS, the local filesystem and ABFS with a
hierarchical namespace; on object stores (``s3a://``, ``gs://``, ABFS without one) a rename
is a server-side copy of the object then a delete: each published object appears whole or
not at all, but the commit copies every byte of the epoch once more.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from eosink import ConfigError, EosinkError, SinkError

# The connector a scheme needs when Spark has no FileSystem for it (what to tell the user).
_CONNECTORS = {
    "s3a": "hadoop-aws and the AWS SDK it needs (or write s3:// through boto3)",
    "gs": "the Google Cloud Storage connector (gcs-connector)",
    "abfs": "hadoop-azure",
    "abfss": "hadoop-azure",
    "wasb": "hadoop-azure",
    "wasbs": "hadoop-azure",
}


def _java_class(exc: BaseException) -> str:
    java = getattr(exc, "java_exception", None)
    if java is None:
        return ""
    try:
        return str(java.getClass().getName())
    except Exception:  # the gateway is gone
        return ""


def java_message(exc: BaseException) -> str:
    """The Java exception behind a py4j error, as one line (or the error itself)."""
    java = getattr(exc, "java_exception", None)
    try:
        return str(java.toString()) if java is not None else str(exc)
    except Exception:
        return str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)


def _filesystem_error(root: str, exc: BaseException) -> EosinkError:
    """The error of a path whose Hadoop FileSystem cannot be created: a :class:`ConfigError`
    when its host does not resolve, else a :class:`SinkError`; both name the path and what
    to check."""
    said = java_message(exc)
    host = re.search(r"UnknownHostException: ([^\s:;,)]+)", said)
    if host:
        return ConfigError(
            f"the file sink's path {root!r} names the host {host.group(1)!r}, which does not "
            "resolve (java.net.UnknownHostException): check the host in path; for an HDFS "
            "nameservice (HA), Spark's Hadoop configuration must define it "
            "(dfs.nameservices and its namenodes, in hdfs-site.xml or spark.hadoop.dfs.* "
            "settings). Nothing was written"
        )
    return SinkError(
        f"the file sink cannot open the Hadoop FileSystem of its path {root!r}: {said}. "
        "Check path and Spark's Hadoop configuration. Nothing was written"
    )


def _missing(exc: BaseException) -> bool:
    """Whether a py4j error is Java's FileNotFoundException (the path does not exist)."""
    return _java_class(exc) in ("java.io.FileNotFoundException",)


def spark_session() -> Any:
    """The classic SparkSession of this process (with a JVM), or None."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:  # pragma: no cover - pyspark is a core dependency
        return None
    spark = SparkSession.getActiveSession()
    if spark is None:
        spark = getattr(SparkSession, "_instantiatedSession", None)
    if spark is None or getattr(spark, "_jvm", None) is None:
        return None  # none, or Spark Connect: no JVM in this process
    return spark


class HadoopStore:
    """A directory of a Hadoop FileSystem (the sink's root), reached from the driver.

    Paths are relative to the root (``_eosink/<key>.json``, ``grp=a/part-...``). Thread
    safety: py4j calls may come from any thread; the store keeps no mutable state besides
    caches.
    """

    def __init__(self, spark: Any, root: str) -> None:
        sc = spark.sparkContext
        self._jvm = sc._jvm
        self._gateway = sc._gateway
        self._conf = sc._jsc.hadoopConfiguration()
        self._Path = self._jvm.org.apache.hadoop.fs.Path
        self.scheme = root.split(":", 1)[0].lower()
        try:
            self._jvm.org.apache.hadoop.fs.FileSystem.getFileSystemClass(self.scheme, self._conf)
        except Exception as exc:
            need = _CONNECTORS.get(self.scheme, f"a Hadoop FileSystem for {self.scheme}://")
            raise ConfigError(
                f"the file sink's path {root} is on {self.scheme}://, and Spark has no Hadoop "
                f"FileSystem for that scheme ({java_message(exc)}): add {need} to Spark (its "
                "jars and configuration)"
            ) from None
        if self.scheme == "file":
            # Hadoop's raw local filesystem: no .crc files beside the marker and the
            # manifests, and a rename that replaces its target atomically (rename(2)).
            fs = self._jvm.org.apache.hadoop.fs.FileSystem.getLocal(self._conf).getRawFileSystem()
        else:
            try:
                fs = self._Path(root).getFileSystem(self._conf)
            except Exception as exc:
                raise _filesystem_error(root, exc) from None
        self.fs = fs
        qualified = fs.makeQualified(self._Path(root))
        self.root = str(qualified.toString()).rstrip("/")
        self._root_path = str(qualified.toUri().getPath()).rstrip("/")
        self._fc: Any = None

    # -- paths -----------------------------------------------------------------------------
    def url(self, rel: str) -> str:
        """The URI of ``rel`` (as Spark and Hadoop take it)."""
        return f"{self.root}/{rel}" if rel else self.root

    def path(self, rel: str) -> Any:
        return self._Path(self.url(rel))

    def _rel(self, jpath: Any) -> str:
        full = str(jpath.toString())  # one py4j call; the root's own form, qualified
        if full.startswith(self.root + "/"):
            return full[len(self.root) + 1 :]
        p = str(jpath.toUri().getPath())
        return p[len(self._root_path) :].lstrip("/")

    # -- reading ---------------------------------------------------------------------------
    def size(self, rel: str) -> int | None:
        """The size of the file ``rel``, or None if there is none."""
        # exists() first: a py4j call that raises costs far more than one that does not
        # (pyspark converts every Java exception, with several calls of its own).
        path = self.path(rel)
        if not self.fs.exists(path):
            return None
        try:
            st = self.fs.getFileStatus(path)
        except Exception as exc:
            if _missing(exc):
                return None
            raise
        return int(st.getLen()) if st.isFile() else None

    def exists(self, rel: str) -> bool:
        return bool(self.fs.exists(self.path(rel)))

    def files(self, rel: str) -> list[tuple[str, int]]:
        """Every file under the directory ``rel``, recursively: (relative path, size)."""
        path = self.path(rel)
        if not self.fs.exists(path):
            return []
        try:
            it = self.fs.listFiles(path, True)
            out = []
            while it.hasNext():
                st = it.next()
                out.append((self._rel(st.getPath()), int(st.getLen())))
        except Exception as exc:
            if _missing(exc):
                return []
            raise
        return sorted(out)

    def names(self, rel: str) -> list[str]:
        """The names of the entries of the directory ``rel`` ([] if it does not exist)."""
        path = self.path(rel)
        if not self.fs.exists(path):
            return []
        try:
            return sorted(str(st.getPath().getName()) for st in self.fs.listStatus(path))
        except Exception as exc:
            if _missing(exc):
                return []
            raise

    def read(self, rel: str) -> bytes | None:
        """The bytes of the (small) file ``rel``, or None if there is none."""
        path = self.path(rel)
        if not self.fs.exists(path):
            return None
        try:
            stream = self.fs.open(path)
        except Exception as exc:
            if _missing(exc):
                return None
            raise
        try:
            return bytes(self._jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
        finally:
            stream.close()

    def parquet_rows(self, rel: str) -> int:
        """The rows of a Parquet file, from its footer (Parquet's own Java reader)."""
        j = self._jvm.org.apache.parquet.hadoop
        reader = j.ParquetFileReader.open(
            j.util.HadoopInputFile.fromPath(self.path(rel), self._conf)
        )
        try:
            return int(reader.getRecordCount())
        finally:
            reader.close()

    def orc_rows(self, rel: str) -> int:
        """The rows of an ORC file, from its footer (ORC's own Java reader)."""
        orc = self._jvm.org.apache.orc.OrcFile
        reader = orc.createReader(self.path(rel), orc.readerOptions(self._conf))
        try:
            return int(reader.getNumberOfRows())
        finally:
            reader.close()

    # -- writing ---------------------------------------------------------------------------
    def mkdirs(self, rel: str) -> None:
        self.fs.mkdirs(self.path(rel))

    def rename(self, src: str, dst: str) -> bool:
        """Rename the file ``src`` to ``dst`` (whose directory exists); False if ``src`` is
        missing or ``dst`` exists (the file systems differ in which one they report)."""
        try:
            return bool(self.fs.rename(self.path(src), self.path(dst)))
        except Exception as exc:
            if _missing(exc) or _java_class(exc).endswith("FileAlreadyExistsException"):
                return False
            raise

    def delete(self, rel: str, recursive: bool = False) -> bool:
        try:
            return bool(self.fs.delete(self.path(rel), recursive))
        except Exception as exc:
            if _missing(exc):
                return False
            raise

    def write_atomic(self, rel: str, data: bytes, fsync: bool) -> None:
        """Write ``data`` to ``rel`` so that readers see the old file or the new one: a
        temporary file, then a rename over ``rel`` (atomic where the filesystem renames
        atomically; a PUT on object stores, where the object appears whole)."""
        parent, _, name = rel.rpartition("/")
        tmp = f"{parent}/.{name}.{uuid.uuid4().hex[:8]}.tmp" if parent else f".{name}.tmp"
        out = self.fs.create(self.path(tmp), True)
        try:
            out.write(bytearray(data))
            if fsync and out.hasCapability("hsync"):
                out.hsync()
        finally:
            out.close()
        try:
            self._replace(tmp, rel)
        except BaseException:
            self.delete(tmp)
            raise

    def _replace(self, src: str, dst: str) -> None:
        if self.scheme == "file":  # rename(2): replaces dst atomically
            if not self.fs.rename(self.path(src), self.path(dst)):
                raise SinkError(f"cannot rename {self.url(src)} to {self.url(dst)}")
            return
        fc = self._file_context()
        if fc is not None:
            rename = getattr(self._jvm, "org.apache.hadoop.fs.Options$Rename")
            opts = self._gateway.new_array(rename, 1)
            opts[0] = rename.OVERWRITE
            fc.rename(self.path(src), self.path(dst), opts)  # atomic on HDFS
            return
        # No AbstractFileSystem for the scheme: delete, then rename (an object store's
        # rename is a copy anyway; a reader may briefly find no file).
        self.fs.delete(self.path(dst), False)
        if not self.fs.rename(self.path(src), self.path(dst)):
            raise SinkError(f"cannot rename {self.url(src)} to {self.url(dst)}")

    def _file_context(self) -> Any:
        if self._fc is None:
            try:
                self._fc = self._jvm.org.apache.hadoop.fs.FileContext.getFileContext(
                    self.fs.getUri(), self._conf
                )
            except Exception:  # no fs.AbstractFileSystem.<scheme>.impl configured
                self._fc = False
        return self._fc or None
