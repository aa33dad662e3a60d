"""A holder's container from its cgroup (daemon/core/containers.py): the parser on
recorded /proc/PID/cgroup files of each runtime and driver, on a plain user session, and on
garbage; reading it once, bounded, by the pid alone."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from daemon.core import containers
from daemon.core.containers import MAX_BYTES, PATH_LIMIT, UNKNOWN, Origin, parse

ID = "3f4e5d6c7b8a99887766554433221100ffeeddccbbaa00112233445566778899"
ID2 = "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90"
POD = "6a8f3b2c-1d2e-4f5a-8b9c-0d1e2f3a4b5c"
POD_ = POD.replace("-", "_")

# Docker, cgroup v1 (hybrid), the cgroupfs driver: every controller in /docker/<id>.
DOCKER_V1 = f"""12:hugetlb:/docker/{ID}
11:memory:/docker/{ID}
10:pids:/docker/{ID}
9:cpu,cpuacct:/docker/{ID}
8:devices:/docker/{ID}
4:net_cls,net_prio:/docker/{ID}
1:name=systemd:/docker/{ID}
0::/system.slice/containerd.service
"""
# Docker, cgroup v1, the systemd driver.
DOCKER_V1_SYSTEMD = f"""11:memory:/system.slice/docker-{ID}.scope
3:pids:/system.slice/docker-{ID}.scope
1:name=systemd:/system.slice/docker-{ID}.scope
"""
# Docker, cgroup v2 (unified), the systemd driver.
DOCKER_V2_SYSTEMD = f"0::/system.slice/docker-{ID}.scope\n"
# Docker, cgroup v2, the cgroupfs driver (no cgroup namespace).
DOCKER_V2_CGROUPFS = f"0::/docker/{ID}\n"
# containerd under Kubernetes (CRI), systemd driver, a burstable pod.
CONTAINERD_BURSTABLE = ("0::/kubepods.slice/kubepods-burstable.slice/"
                        f"kubepods-burstable-pod{POD_}.slice/cri-containerd-{ID}.scope\n")
# containerd without Kubernetes (the cgroupfs layout of its default namespace).
CONTAINERD_PLAIN = f"0::/containerd/{ID}\n"
# CRI-O, systemd driver, a best-effort pod; and its conmon (the monitor, no container).
CRIO_BESTEFFORT = ("0::/kubepods.slice/kubepods-besteffort.slice/"
                   f"kubepods-besteffort-pod{POD_}.slice/crio-{ID}.scope\n")
CRIO_CONMON = ("0::/kubepods.slice/kubepods-besteffort.slice/"
               f"kubepods-besteffort-pod{POD_}.slice/crio-conmon-{ID}.scope\n")
# A guaranteed pod (no QoS slice), systemd driver.
GUARANTEED_SYSTEMD = f"0::/kubepods.slice/kubepods-pod{POD_}.slice/cri-containerd-{ID}.scope\n"
# The cgroupfs driver: /kubepods/<class>/pod<uid>/<id>, v1 controllers.
BURSTABLE_CGROUPFS = f"""11:memory:/kubepods/burstable/pod{POD}/{ID}
1:name=systemd:/kubepods/burstable/pod{POD}/{ID}
"""
BESTEFFORT_CGROUPFS = f"0::/kubepods/besteffort/pod{POD}/{ID}\n"
GUARANTEED_CGROUPFS = f"0::/kubepods/pod{POD}/{ID}\n"
# A pod's own cgroup (no container below it).
POD_ONLY = f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_}.slice\n"
# Podman: root (machine.slice) and rootless (a user's delegated subtree).
PODMAN = f"0::/machine.slice/libpod-{ID}.scope/container\n"
PODMAN_ROOTLESS = ("0::/user.slice/user-1000.slice/user@1000.service/user.slice/"
                   f"libpod-{ID}.scope/container\n")
# A plain login session, v2 and hybrid.
USER_SESSION = "0::/user.slice/user-1000.slice/session-3.scope\n"
HYBRID_PLAIN = """9:name=systemd:/
4:memory:/process_api/c5c5ab0f32219137a51e9306746f699c
0::/
"""


@pytest.mark.parametrize(("text", "cgroup", "container"), [
    (DOCKER_V1, f"/docker/{ID}", {"runtime": "docker", "id": ID, "pod": None}),
    (DOCKER_V1_SYSTEMD, f"/system.slice/docker-{ID}.scope",
     {"runtime": "docker", "id": ID, "pod": None}),
    (DOCKER_V2_SYSTEMD, f"/system.slice/docker-{ID}.scope",
     {"runtime": "docker", "id": ID, "pod": None}),
    (DOCKER_V2_CGROUPFS, f"/docker/{ID}", {"runtime": "docker", "id": ID, "pod": None}),
    (CONTAINERD_BURSTABLE, CONTAINERD_BURSTABLE[3:-1],
     {"runtime": "containerd", "id": ID, "pod": POD}),
    (CONTAINERD_PLAIN, f"/containerd/{ID}", {"runtime": "containerd", "id": ID, "pod": None}),
    (CRIO_BESTEFFORT, CRIO_BESTEFFORT[3:-1], {"runtime": "cri-o", "id": ID, "pod": POD}),
    (GUARANTEED_SYSTEMD, GUARANTEED_SYSTEMD[3:-1],
     {"runtime": "containerd", "id": ID, "pod": POD}),
    (BURSTABLE_CGROUPFS, f"/kubepods/burstable/pod{POD}/{ID}",
     {"runtime": "cri", "id": ID, "pod": POD}),
    (BESTEFFORT_CGROUPFS, f"/kubepods/besteffort/pod{POD}/{ID}",
     {"runtime": "cri", "id": ID, "pod": POD}),
    (GUARANTEED_CGROUPFS, f"/kubepods/pod{POD}/{ID}", {"runtime": "cri", "id": ID, "pod": POD}),
    (POD_ONLY, POD_ONLY[3:-1], {"runtime": "kubernetes", "id": None, "pod": POD}),
    # the monitor is not the container: its pod only
    (CRIO_CONMON, CRIO_CONMON[3:-1], {"runtime": "kubernetes", "id": None, "pod": POD}),
    (PODMAN, f"/machine.slice/libpod-{ID}.scope/container",
     {"runtime": "podman", "id": ID, "pod": None}),
    (PODMAN_ROOTLESS, PODMAN_ROOTLESS[3:-1], {"runtime": "podman", "id": ID, "pod": None}),
])
def test_recorded_cgroup_files(text, cgroup, container):
    origin = parse(text)
    assert origin.cgroup == cgroup
    assert origin.container == container
    assert origin.detail() == ({"container": ID} if container["id"] else {})
    assert origin.key() == (container["runtime"], container["id"] or "", container["pod"] or "")


@pytest.mark.parametrize(("text", "cgroup"), [
    (USER_SESSION, "/user.slice/user-1000.slice/session-3.scope"),
    (HYBRID_PLAIN, "/"),                 # the v2 line first, though a v1 one is deeper
    ("1:name=systemd:/user.slice\n", "/user.slice"),
])
def test_no_container(text, cgroup):
    origin = parse(text)
    assert origin == Origin(cgroup, None) and origin.key() is None and origin.detail() == {}


def test_the_innermost_container_wins():
    """Docker in docker: the process is in the inner one."""
    assert parse(f"0::/docker/{ID}/docker/{ID2}\n").container_id == ID2


@pytest.mark.parametrize("text", [
    "", "\n\n", "garbage", "0:/docker", "x::/docker/" + ID, "0::docker/" + ID,
    "\x00\xff\udcff" * 1000, "0::", ":::::", "\n".join(["0:"] * 10000),
    f"0::/docker/{ID.upper()}\n",                      # not an id docker makes
    f"0::/system.slice/docker-{ID}x.scope\n",
    f"0::/system.slice/docker-{ID[:63]}.scope\n",
    f"0::/kubepods/burstable/pod{POD}\x1b]0;pwned\x07/{ID}\n",  # not a pod dir
    f"0::/{'d' * 300}/docker-{ID}.scope\n",
    None, b"0::/docker/" + ID.encode(),                # not text at all
])
def test_garbage_never_raises_and_names_no_container(text):
    origin = parse(text)            # type: ignore[arg-type]
    if origin.container is not None:       # the over-long component is skipped, not the rest
        assert origin.container == {"runtime": "docker", "id": ID, "pod": None}
    if origin.cgroup is not None:
        assert len(origin.cgroup) <= PATH_LIMIT


def test_control_characters_kept_in_the_path_but_never_in_an_id():
    """The path is the client's to name (a delegated subtree): it is kept as it is (the
    human output escapes it), but an id is only ever what the patterns allow."""
    evil = f"0::/user.slice/x\x1b[2J\u202e/docker-{ID}.scope\n"
    origin = parse(evil)
    assert origin.cgroup == f"/user.slice/x\x1b[2J\u202e/docker-{ID}.scope"
    assert origin.container_id == ID
    assert parse(f"0::/docker/{ID[:-1]}\x1b\n").container is None


def test_an_overlong_path_is_cut():
    long_path = "/" + "/".join(["a" * 200] * 50) + f"/docker-{ID}.scope"
    origin = parse(f"0::{long_path}\n")
    assert len(origin.cgroup) == PATH_LIMIT and origin.cgroup.endswith("...")
    assert origin.container_id == ID        # the container is read from the whole path


def test_read_is_bounded(tmp_path):
    """A file longer than MAX_BYTES (/proc never is, a test's may be) is read only so far,
    its last partial line dropped."""
    (tmp_path / "7").mkdir()
    body = "1:name=systemd:/plain\n" + "0::/" + "x" * (2 * MAX_BYTES) + f"/docker/{ID}\n"
    (tmp_path / "7" / "cgroup").write_text(body)
    assert containers.read(7, proc=str(tmp_path)) == Origin("/plain", None)


def test_read_follows_no_link(tmp_path):
    """The daemon opens /proc/PID/cgroup of the peer's pid and nothing else: a link there
    is not followed, and a pid is a number, never a path."""
    (tmp_path / "secret").write_text(f"0::/docker/{ID}\n")
    (tmp_path / "8").mkdir()
    os.symlink(tmp_path / "secret", tmp_path / "8" / "cgroup")
    assert containers.read(8, proc=str(tmp_path)) is UNKNOWN
    assert containers.read(0) is UNKNOWN and containers.read(-1) is UNKNOWN


def test_read_of_this_process_and_of_one_gone():
    mine = containers.read(os.getpid())
    with open(f"/proc/{os.getpid()}/cgroup") as f:
        assert mine == parse(f.read())
    assert mine.cgroup is not None
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    pidfd = os.pidfd_open(child.pid)
    try:
        child.wait()
        # The pid is reaped (and free to be reused): its pidfd says so, and nothing is kept.
        assert containers.read(child.pid, pidfd) is UNKNOWN
    finally:
        os.close(pidfd)


def test_a_live_pidfd_keeps_the_answer():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    pidfd = os.pidfd_open(child.pid)
    try:
        assert containers.read(child.pid, pidfd).cgroup is not None
    finally:
        os.close(pidfd)
        child.send_signal(signal.SIGKILL)
        child.wait()
