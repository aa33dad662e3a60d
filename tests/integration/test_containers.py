"""Holders attributed to containers (issue 28; docs/operations.md, "Containers"), end to
end: a client process put in a cgroup v2 child named as docker's systemd driver names a
container's (`docker-<64 hex>.scope`) before it connects, holding an allocation; `info
--json` shows that holder's cgroup and container, `events` names the container, and
`gpumemctl metrics` has the per-container gauge. A second uid's session in a podman-named
cgroup shows its own, and what a client sends in its hello names no file the daemon reads.

Needs root and a cgroup v2 hierarchy where a directory can be made (the unified one, or
/sys/fs/cgroup/unified of a hybrid host); it skips otherwise. The cgroups are removed after.
"""
from __future__ import annotations

import contextlib
import json
import mmap  # noqa: F401 - the child's open maps; uid 65534 cannot import after the drop
import os
import secrets
import signal
import socket

import pytest

import gpumemctl.memory  # noqa: F401 - as mmap above
from gpumemctl import Client
from gpumemctl.protocol import PROTOCOL_VERSION, framing
from tests.users import NOBODY

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="moving a process between "
                                "cgroups and switching uid need root")

DOCKER_ID = secrets.token_hex(32)
PODMAN_ID = secrets.token_hex(32)


def cgroup2_mount() -> str | None:
    with open("/proc/self/mounts") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 2 and fields[2] == "cgroup2":
                return fields[1]
    return None


@pytest.fixture
def cgroups():
    """{runtime: (directory, path as /proc/PID/cgroup shows it)}, removed after."""
    mount = cgroup2_mount()
    if mount is None:
        pytest.skip("no cgroup v2 hierarchy is mounted")
    top = os.path.join(mount, f"gpumemctl-test-{secrets.token_hex(4)}")
    try:
        os.mkdir(top)
    except OSError as exc:
        pytest.skip(f"cannot make a cgroup under {mount}: {exc}")
    made = {"docker": f"docker-{DOCKER_ID}.scope", "podman": f"libpod-{PODMAN_ID}.scope"}
    out = {}
    try:
        for runtime, name in made.items():
            os.mkdir(os.path.join(top, name))
            out[runtime] = (os.path.join(top, name), "/" + os.path.relpath(
                os.path.join(top, name), mount))
        yield out
    finally:
        for directory, _ in out.values():
            _empty(directory, mount)
            os.rmdir(directory)
        os.rmdir(top)


def _empty(directory: str, mount: str) -> None:
    """Any process left in `directory` moved back to the root cgroup."""
    with open(os.path.join(directory, "cgroup.procs")) as f:
        pids = f.read().split()
    for pid in pids:
        with contextlib.suppress(OSError), open(os.path.join(mount, "cgroup.procs"), "w") as f:
            f.write(pid)


@contextlib.contextmanager
def holding_in(directory: str, fn, *args, uid: int | None = None):
    """A child that moves itself into the cgroup `directory` (cgroup.procs), drops to `uid`,
    runs fn(*args) (which connects and takes a holder) and keeps its connection until the
    block ends; yields (pid, fn's JSON result)."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:                                    # ---- child: never returns into pytest
        status = 0
        try:
            os.close(ready_r)
            os.close(go_w)
            signal.alarm(60)
            with open(os.path.join(directory, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
            if uid is not None:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
            out = {"ok": fn(*args)}
        except BaseException as exc:               # noqa: BLE001 - reported to the parent
            out = {"crash": f"{type(exc).__name__}: {exc}"}
            status = 1
        try:
            os.write(ready_w, json.dumps(out).encode() + b"\n")
            os.read(go_r, 1)                       # hold until the parent has looked
        finally:
            os._exit(status)
    os.close(ready_w)
    os.close(go_r)
    try:
        with os.fdopen(ready_r, "rb") as f:
            out = json.loads(f.readline())
        assert "ok" in out, out
        yield pid, out["ok"]
    finally:
        os.close(go_w)
        os.waitpid(pid, 0)


# Each runs in the child, so it keeps its Client and Handle alive in a global until exit.
_kept: list = []


def open_and_lease(sock: str, name: str, leased: str) -> int:
    c = Client(sock)
    _kept.append(c)
    _kept.append(c.open(name, "r"))
    c.create(leased, 4096, lease=True)
    return c.hello["session"]


def open_and_status(sock: str, name: str) -> list:
    c = Client(sock)
    _kept.append(c)
    _kept.append(c.open(name, "r"))
    return c.status()["containers"]


def forged_hello(sock_path: str, name: str) -> dict:
    """A hello that names another pid and a file as its cgroup, then a leased create."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    _kept.append(s)
    s.connect(sock_path)
    framing.send_frame(s, {"id": 1, "op": "hello", "args": {
        "version": PROTOCOL_VERSION, "client": "/etc/shadow", "pid": 1,
        "cgroup": "/etc/shadow", "cgroup_path": "/proc/1/cgroup"}})
    hello, _ = framing.recv_frame(s, 1 << 20)
    framing.send_frame(s, {"id": 2, "op": "create", "args": {
        "path": name, "size": 4096, "lease": True, "cgroup": "/etc/shadow", "pid": 1}})
    answer, _ = framing.recv_frame(s, 1 << 20)
    assert answer.get("ok"), answer
    return hello


def holder_of(info: dict, pid: int) -> dict:
    [h] = [h for h in info["holders"] if h["pid"] == pid]
    return h


def test_a_holder_in_a_container_is_shown_as_its(daemon, cgroups):
    directory, path = cgroups["docker"]
    daemon.cli("create", "held", "--size", "3M", check=True)
    with holding_in(directory, open_and_lease, daemon.socket, "held", "leased") as (pid, _):
        info = daemon.cli_json("info", "held")
        holder = holder_of(info, pid)
        assert holder["cgroup"] == path
        assert holder["container"] == {"runtime": "docker", "id": DOCKER_ID, "pod": None}
        leased = holder_of(daemon.cli_json("info", "leased"), pid)
        assert leased["kind"] == "lease" and leased["container"]["id"] == DOCKER_ID
        # The human `info` names it (the id's first 12, as `docker ps`).
        assert f"docker {DOCKER_ID[:12]}" in daemon.cli("info", "held", check=True).stdout.decode()
        # `ls -l --json` describes no holders; info's are the ones above.
        [create] = [e for e in daemon.cli_json("events") if e["kind"] == "create"
                    and e["path"] == "leased"]
        assert create["detail"]["container"] == DOCKER_ID
        metrics = daemon.cli("metrics", check=True).stdout.decode()
        capacity = info["capacity"] + daemon.cli_json("info", "leased")["capacity"]
        assert (f'gpumemd_container_held_bytes{{container="{DOCKER_ID}",runtime="docker",'
                f'pod=""}} {capacity}') in metrics, metrics
        assert (f'gpumemd_container_holders{{container="{DOCKER_ID}",runtime="docker",'
                f'pod=""}} 2') in metrics
        mine = daemon.client()
        assert holder_of(mine.info("held"), pid)["container"]["id"] == DOCKER_ID
        mine.close()
    # Gone with its session: no holder, no sample.
    assert "gpumemd_container_held_bytes" not in daemon.cli("metrics", check=True).stdout.decode()


def test_another_uids_session_shows_its_own_container(daemon, cgroups):
    docker_dir, _ = cgroups["docker"]
    podman_dir, podman_path = cgroups["podman"]
    daemon.cli("create", "shared", "--size", "3M", "--mode", "0644", check=True)
    with holding_in(docker_dir, open_and_lease, daemon.socket, "shared", "l1") as (root_pid, _), \
            holding_in(podman_dir, open_and_status, daemon.socket, "shared",
                       uid=NOBODY) as (nobody_pid, seen):
        info = daemon.cli_json("info", "shared")
        theirs = holder_of(info, nobody_pid)
        assert theirs["uid"] == NOBODY and theirs["cgroup"] == podman_path
        assert theirs["container"] == {"runtime": "podman", "id": PODMAN_ID, "pod": None}
        assert holder_of(info, root_pid)["container"]["id"] == DOCKER_ID
        # A user's status shows the containers of its own holders only.
        assert [(c["runtime"], c["id"]) for c in seen] == [("podman", PODMAN_ID)]
        metrics = daemon.cli("metrics", check=True).stdout.decode()
        assert f'container="{PODMAN_ID}",runtime="podman"' in metrics
        assert f'container="{DOCKER_ID}",runtime="docker"' in metrics


def test_a_client_cannot_name_the_file_read_as_its_cgroup(daemon, cgroups):
    """The daemon reads /proc/<SO_PEERCRED pid>/cgroup and nothing a client sends: a hello
    or a request naming another pid or a file changes nothing."""
    directory, path = cgroups["podman"]
    with holding_in(directory, forged_hello, daemon.socket, "forged", uid=NOBODY) as (pid, _):
        [holder] = daemon.cli_json("info", "forged")["holders"]
        assert holder["pid"] == pid and holder["uid"] == NOBODY
        assert holder["cgroup"] == path
        assert holder["container"] == {"runtime": "podman", "id": PODMAN_ID, "pod": None}
