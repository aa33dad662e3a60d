"""A local S3 server for the snapshot tests: moto's server mode in a subprocess.

    with moto_s3() as s3:             # skips the test where moto[server] is not installed
        monkeypatch.setenv(...)       # for name, value in s3["env"].items()
        store = S3Store(f"s3://{s3['bucket']}/prefix")

The server listens on a free port of 127.0.0.1, has one bucket (`s3["bucket"]`), and stops
when the block ends. With `auth=True` it checks credentials like S3 does (moto's
INITIAL_NO_AUTH_ACTION_COUNT): the bucket is made before that starts, and any key pair is
then unknown to it, so every request is denied.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator

import pytest

ACCESS_KEY = SECRET_KEY = "testing"
REGION = "us-east-1"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
        return True
    return False


@contextlib.contextmanager
def moto_s3(bucket: str = "snapshots", *, auth: bool = False,
            timeout: float = 30.0) -> Iterator[dict]:
    """{"env": variables a client needs, "bucket": name, "endpoint": URL}, while it runs."""
    for module in ("moto", "flask", "werkzeug"):       # moto[server]: moto and its web stack
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"moto[server] is not installed (no module {module!r}): "
                        "no local S3 server to test against")
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    if auth:
        env["INITIAL_NO_AUTH_ACTION_COUNT"] = "1"        # the bucket's creation, then none
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                                 "-p", str(port)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env)
        try:
            deadline = time.monotonic() + timeout
            while not _listening(port):          # a TCP probe: not an action moto counts
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise RuntimeError(f"moto server did not start on port {port} "
                                       f"(exit status {proc.poll()}):\n"
                                       + log.read().decode(errors="replace")[-3000:])
                time.sleep(0.05)
            request = urllib.request.Request(f"{endpoint}/{bucket}", method="PUT")
            direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            with direct.open(request, timeout=10) as answer:
                assert answer.status == 200, answer.status
            yield {
                "bucket": bucket,
                "endpoint": endpoint,
                "env": {
                    "AWS_ENDPOINT_URL": endpoint,
                    "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                    "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                    "AWS_REGION": REGION,
                    "AWS_DEFAULT_REGION": REGION,
                    "NO_PROXY": "127.0.0.1,localhost",     # never through an HTTP proxy
                    "no_proxy": "127.0.0.1,localhost",
                },
            }
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
