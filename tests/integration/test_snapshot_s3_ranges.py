"""An S3 store whose server answers a ranged GET with the whole object (issue 27, item 7.5):
s3rver answers `bytes=0-0` so, and obstore refuses such an answer, so a store that asked
"does this object exist?" with a 1-byte GET could neither restore nor build an incremental
snapshot there. Here moto sits behind a small proxy that drops every Range header (the
whole object, status 200, as such a server sends) and counts the requests: existence is
asked with HEAD, no 1-byte GET is sent, and create, --incremental, verify and restore work.
"""
from __future__ import annotations

import contextlib
import http.client
import http.server
import json
import os
import threading
import urllib.parse
from collections.abc import Iterator

from tests.integration.s3server import moto_s3

MiB = 1 << 20
_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te",
        "trailer", "upgrade", "host"}


class _Proxy(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, upstream: str):
        super().__init__(("127.0.0.1", 0), _Forward)
        self.upstream = urllib.parse.urlsplit(upstream).netloc
        self.seen: list[tuple[str, str, str | None]] = []     # (method, path, Range)
        self.lock = threading.Lock()


class _Forward(http.server.BaseHTTPRequestHandler):
    """Each request to moto as it came, less its Range header; moto's answer as it is."""
    protocol_version = "HTTP/1.1"
    server: _Proxy

    def log_message(self, *args) -> None:
        pass

    def _forward(self) -> None:
        with self.server.lock:
            self.server.seen.append((self.command, self.path, self.headers.get("Range")))
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items()
                   if k.lower() not in _HOP and k.lower() != "range"}
        headers["Host"] = self.headers.get("Host", self.server.upstream)
        up = http.client.HTTPConnection(self.server.upstream, timeout=60)
        try:
            up.request(self.command, self.path, body=body, headers=headers)
            answer = up.getresponse()
            data = answer.read()
            self.send_response(answer.status, answer.reason)
            for k, v in answer.getheaders():
                if k.lower() not in _HOP and k.lower() != "content-length":
                    self.send_header(k, v)
            self.send_header("Content-Length", answer.getheader("Content-Length", "0")
                             if self.command == "HEAD" else str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        finally:
            up.close()

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward


@contextlib.contextmanager
def range_ignoring_s3() -> Iterator[tuple[dict, _Proxy]]:
    """moto behind the proxy: (the environment a client needs, the proxy and its log)."""
    with moto_s3() as s3:
        proxy = _Proxy(s3["endpoint"])
        thread = threading.Thread(target=proxy.serve_forever, daemon=True)
        thread.start()
        try:
            endpoint = f"http://127.0.0.1:{proxy.server_address[1]}"
            yield {**s3["env"], "AWS_ENDPOINT_URL": endpoint}, proxy
        finally:
            proxy.shutdown()
            proxy.server_close()


def test_a_server_that_ignores_range_still_restores_and_builds_on_snapshots(daemon):
    data = {"w": os.urandom(3 * MiB + 5), "tiny": os.urandom(10)}
    with daemon.client() as c:
        for name, content in data.items():
            c.create(name, len(content), durable=True, mode=0o600)
            c.write(name, content)
    with range_ignoring_s3() as (env, proxy):
        where = "s3://snapshots/ranges"
        daemon.cli("snapshot", "create", where, "--quiet", env=env, check=True)
        with daemon.client() as c:
            c.write("w", b"changed", offset=2 * MiB)
        data["w"] = data["w"][:2 * MiB] + b"changed" + data["w"][2 * MiB + 7:]
        inc = json.loads(daemon.cli("snapshot", "create", where, "--incremental", "--json",
                                    env=env, check=True).stdout)
        assert inc["incremental"] and inc["bytes_written"] == MiB, inc
        daemon.cli("snapshot", "verify", where, "--quiet", env=env, check=True)

        daemon.stop()
        daemon.kill_keeper()
        daemon.start()
        back = json.loads(daemon.cli("snapshot", "restore", where, "--json", env=env,
                                     check=True).stdout)
        assert sorted(a["result"] for a in back["allocations"]) == ["ok", "ok"], back
        with daemon.client() as c:
            for name, content in data.items():
                assert c.read(name) == content, name
                assert c.info(name)["state"] == "ready"

    seen = proxy.seen
    # Existence (is there a manifest? a retired marker?) and sizes are asked by HEAD ...
    heads = [p for m, p, _r in seen if m == "HEAD"]
    assert any(p.endswith("/manifest.json") for p in heads), seen
    # ... and never by a 1-byte ranged GET, which such a server answers with everything.
    assert not [r for m, _p, r in seen if m == "GET" and r == "bytes=0-0"], seen
    # A manifest is read whole, by a GET without a range.
    assert [r for m, p, r in seen if m == "GET" and p.endswith("/manifest.json")] \
        and all(r is None for m, p, r in seen if m == "GET" and p.endswith("/manifest.json"))
