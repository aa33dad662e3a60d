"""The Client library: thread safety, handles, the event stream."""
from __future__ import annotations

import json
import subprocess
import threading

from tests.harness import child_env, script_argv

MiB = 1 << 20


def test_one_client_shared_by_threads(daemon):
    errors: list[BaseException] = []
    with daemon.client() as c:
        def work(t: int):
            try:
                for i in range(20):
                    name = f"t{t}/a{i}"
                    c.create(name, 4096)
                    c.write(name, f"{t}:{i}".encode())
                    assert c.read(name, length=len(f"{t}:{i}")) == f"{t}:{i}".encode()
                    assert c.info(name)["size"] == 4096
                    c.remove(name)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
        threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not errors, errors
        assert all(e["type"] == "directory" for e in c.ls(recursive=True))
        assert c.check()["clean"]


def test_handle_reads_what_another_client_wrote(daemon):
    with daemon.client() as a, daemon.client() as b:
        a.create("shared", 3 * MiB)
        with a.open("shared", "rw") as w:
            w.write(b"\xab" * MiB, offset=MiB)
        with b.open("shared", "r") as r:
            assert r.read(MiB, MiB) == b"\xab" * MiB
            assert r.read(0, 16) == bytes(16)
        info = a.info("shared")
        assert info["modified"] > info["created"]


def test_events_follow_streams_new_events(daemon):
    proc = subprocess.Popen(script_argv("gpumemctl") + ["--socket", daemon.socket, "events", "-f",
                                                  "--json", "--since", "1000000"],
                            stdout=subprocess.PIPE, env=child_env())
    try:
        with daemon.client() as c:
            # The follower is connected once the daemon counts two sessions.
            from tests.harness import wait_for
            wait_for(lambda: c.status()["totals"]["sessions"] >= 2, what="the follower")
            c.create("followed", 4096)
        event = json.loads(proc.stdout.readline())
        assert (event["kind"], event["path"]) == ("create", "followed")
        assert event["detail"]["size"] == 4096
    finally:
        proc.terminate()
        proc.wait(10)
