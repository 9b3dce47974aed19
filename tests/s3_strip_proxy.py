"""A forwarding proxy in front of an S3 server that drops ``If-None-Match`` from every
request: a store that accepts a conditional PUT and ignores its condition, as some
S3-compatible servers do (``tests/test_delta.py``). ``--keep`` passes requests unchanged
(the control).

Run as its own process (``python tests/s3_strip_proxy.py UPSTREAM [--keep]``): delta-rs
holds the GIL while it waits on the network, so a proxy thread in the test's process would
never answer it. It prints ``http://127.0.0.1:<port>`` once it listens.
"""

from __future__ import annotations

import http.client
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

_HOP = {"transfer-encoding", "content-length", "connection", "server", "date"}


def serve(upstream: str, *, strip: bool) -> None:
    up = urlsplit(upstream)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                chunks = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                    chunk = self.rfile.read(size)
                    self.rfile.readline()
                    if not size:
                        return b"".join(chunks)
                    chunks.append(chunk)
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _forward(self) -> None:
            body = self._body()
            headers = {
                k: v
                for k, v in self.headers.items()
                if k.lower() not in ("transfer-encoding", "content-length")
                and not (strip and k.lower() == "if-none-match")
            }
            conn = http.client.HTTPConnection(up.hostname, up.port, timeout=60)
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            self.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() not in _HOP:
                    self.send_header(k, v)
                elif k.lower() == "content-length" and self.command == "HEAD":
                    self.send_header(k, v)
            if self.command != "HEAD":
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
            conn.close()

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    serve(sys.argv[1], strip="--keep" not in sys.argv[2:])
