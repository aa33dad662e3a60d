"""`gpumemctl doctor`: can this machine run gpumemd, and what would it use?

Each check is one small function returning `Check`s: `ok`, `warn` (works, with a limit: no
GPU so the host backend, no FUSE so no mount, daemon not started) or `fail` (something that
should work is broken), with a fix hint on warn and fail. The exit status is the worst result:
0 all ok, 1 a warning at worst, 10 a failure (docs/cli.md). Warnings exit 1, not 0, because
scripts use doctor to ask "is everything in place?"; `[ $? -le 1 ]` accepts warnings.

Doctor is a diagnostic: it must finish on any machine. CUDA is reached only through
`gpumemctl.cudadrv`, imported here lazily (never by `gpumemctl ls`); every failure to load or
query it becomes a warn/fail line, never a traceback. NVML is the daemon's business
(`daemon/services/nvml.py`); the CLI does not import it, so the driver version comes from the kernel
module's /proc file and the CUDA driver API.
"""
from __future__ import annotations

import dataclasses
import errno
import importlib
import importlib.util
import os
import shutil
import stat

from .protocol import GpumemError, NotRunning, default_state_dir
from .protocol.errors import INVALID_STATE, OK, REPAIRED

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .protocol.replies import Hello

PASS, WARN, FAIL = "ok", "warn", "fail"
RANK = {PASS: 0, WARN: 1, FAIL: 2}
EXIT_STATUS = {PASS: OK, WARN: REPAIRED, FAIL: INVALID_STATE}   # 0, 1, 10
PROC_DRIVER = "/proc/driver/nvidia/version"
NO_DRIVER = "no NVIDIA driver: the host backend will be used"


@dataclasses.dataclass
class Check:
    check: str                 # stable name, e.g. "driver", "device 0 vmm"
    result: str                # ok / warn / fail
    message: str
    hint: str | None = None    # how to fix it (warn and fail only)

    def line(self) -> str:
        text = f"{self.result:<4} {self.check}: {self.message}"
        return text + (f"; fix: {self.hint}" if self.hint and self.result != PASS else "")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def ok(check: str, message: str) -> Check:
    return Check(check, PASS, message)


def warn(check: str, message: str, hint: str) -> Check:
    return Check(check, WARN, message, hint)


def fail(check: str, message: str, hint: str) -> Check:
    return Check(check, FAIL, message, hint)


def worst(checks: list[Check]) -> str:
    return max((c.result for c in checks), key=RANK.__getitem__, default=PASS)


def exit_status(checks: list[Check]) -> int:
    return EXIT_STATUS[worst(checks)]


def report(checks: list[Check]) -> dict:
    """The --json document."""
    result = worst(checks)
    return {"checks": [c.to_dict() for c in checks], "worst": result,
            "exit_status": EXIT_STATUS[result]}


def run(socket_path: str, state_dir: str | None = None) -> list[Check]:
    checks = check_packages()
    gpu = check_gpu()
    checks += gpu
    checks += check_fuse()
    daemon = DaemonFacts.probe(socket_path)
    checks.append(daemon.check())
    if daemon.backend is not None:
        checks.append(check_backend(daemon.backend, gpu))
    checks += check_permissions(state_dir or daemon.state_dir or default_state_dir(),
                                socket_path, daemon.uid)
    return checks


# ---- Python packages -----------------------------------------------------------------------
# (import name, distribution, needed by, result when missing)
PACKAGES = [
    ("trio", "trio", "gpumemd itself", FAIL),
    ("pyfuse3", "pyfuse3", "the FUSE mount (gpumemd --mount)", WARN),
]
# Found but not imported here: importing them is the business of cudadrv and daemon/nvml.
OPTIONAL = [
    ("cuda.bindings", "cuda-python", "the cuda backend"),
    ("pynvml", "nvidia-ml-py", "GPU telemetry in `devices`/`status`"),
]
# The extra of this distribution that brings each package (pyproject.toml): the hint's install.
EXTRA = {"trio": "daemon", "pyfuse3": "daemon", "cuda-python": "cuda", "nvidia-ml-py": "daemon"}


def check_packages() -> list[Check]:
    checks = []
    for module, dist, needed_by, missing in PACKAGES:
        try:
            mod = importlib.import_module(module)
            checks.append(ok(f"package {dist}", f"{module} {getattr(mod, '__version__', '')}"
                                                .rstrip()))
        except Exception as exc:   # noqa: BLE001 - ImportError, or a C library failing to load
            hint = f"pip install 'gpumemctl[{EXTRA[dist]}]' (into gpumemd's environment)"
            checks.append(Check(f"package {dist}", missing,
                                f"cannot import {module} ({exc}); needed by {needed_by}", hint))
    for module, dist, needed_by in OPTIONAL:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        checks.append(ok(f"package {dist}", f"{module} is installed") if found else
                      warn(f"package {dist}", f"{module} is not installed; {needed_by} is "
                           "unavailable", f"pip install 'gpumemctl[{EXTRA[dist]}]'"))
    return checks


# ---- NVIDIA driver, CUDA and the devices ------------------------------------------------------
def kernel_driver_version() -> str | None:
    """The loaded kernel module's version from /proc (None: no NVIDIA driver loaded)."""
    try:
        with open(PROC_DRIVER) as f:
            first = f.readline()
    except OSError:
        return None
    words = first.split("Kernel Module")
    return words[1].split()[0] if len(words) > 1 and words[1].split() else first.strip()


def check_gpu() -> list[Check]:
    kernel = kernel_driver_version()
    try:
        facts = cuda_facts()
    except Exception as exc:   # noqa: BLE001 - doctor reports whatever stops CUDA from loading
        return _no_cuda(kernel, exc)
    checks = [ok("driver", f"NVIDIA kernel module {kernel}" if kernel else
                 "NVIDIA driver loaded (no /proc/driver/nvidia/version: a container?)"),
              ok("cuda", f"CUDA driver API {facts['cuda_version']}")]
    if not facts["devices"]:
        checks.append(fail("devices", "the driver is loaded but shows no CUDA device",
                           "check CUDA_VISIBLE_DEVICES and access to /dev/nvidia* (nvidia-smi "
                           "should list the GPUs)"))
    for dev in facts["devices"]:
        checks += _device_checks(dev)
    return checks


def _no_cuda(kernel: str | None, exc: Exception) -> list[Check]:
    reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    skipped = warn("devices", "skipped: no usable CUDA driver, so no GPU checks",
                   "see the driver and cuda lines above")
    if kernel is None:
        # A machine without a GPU is healthy for the host backend: one line says so, and
        # the checks that follow from it are not warnings of their own (issue 27: three
        # warnings and exit 1 for one cause, on a machine with nothing wrong).
        return [ok("driver", f"{NO_DRIVER} (to serve GPU memory, install the NVIDIA "
                   "driver)"),
                ok("cuda", "not checked: no NVIDIA driver"),
                ok("devices", "not checked: no NVIDIA driver")]
    return [ok("driver", f"NVIDIA kernel module {kernel}"),
            fail("cuda", f"the kernel module is loaded but the CUDA driver API fails "
                 f"({reason})", "libcuda.so must match the kernel module's version "
                 f"({kernel}): reinstall the driver or reboot after an upgrade"),
            skipped]


def _device_checks(dev: dict) -> list[Check]:
    label = f"device {dev['index']}"
    what = f"{dev['name']} {dev['uuid']}"
    vmm = (ok(f"{label} vmm", f"{what}: virtual memory management supported")
           if dev["vmm"] else
           fail(f"{label} vmm", f"{what}: no virtual memory management (cuMemCreate)",
                "gpumemd's cuda backend needs VMM (Pascal or newer, not under most vGPU "
                "profiles): use another GPU (--device) or --backend host"))
    fd = (ok(f"{label} posix-fd", f"{what}: POSIX-fd shareable handles supported")
          if dev["posix_fd"] else
          fail(f"{label} posix-fd", f"{what}: no POSIX-fd shareable handles",
               "durable allocations and attach need fd export: use a Linux driver with "
               "VMM IPC support (R450+), or --backend host"))
    dmabuf = (ok(f"{label} dma-buf", f"{what}: dma-buf export supported")
              if dev["dma_buf"] else
              warn(f"{label} dma-buf", f"{what}: no dma-buf export (only "
                   "Client.export_dmabuf, for RDMA, needs it)",
                   "dma-buf needs the NVIDIA open kernel modules and Linux 5.12 or newer"))
    return [vmm, fd, dmabuf]


def cuda_facts() -> dict:
    """The CUDA driver API version and each visible device's support flags, through
    gpumemctl.cudadrv (the only module that touches cuda.bindings). Raises when CUDA cannot
    load or initialise."""
    from . import cudadrv
    major, minor = cudadrv.driver_version()      # CudaUnavailable: no libcuda.so.1
    try:
        count = cudadrv.device_count()           # cuInit: CudaNoDevice with none visible
    except cudadrv.CudaNoDevice:
        count = 0
    devices = []
    for index in range(count):
        support = cudadrv.device_support(index)
        devices.append({"index": index, "name": cudadrv.device_name(index),
                        "uuid": cudadrv.device_uuid(index), "vmm": support.vmm,
                        "posix_fd": support.posix_fd, "dma_buf": support.dma_buf})
    return {"cuda_version": f"{major}.{minor}", "devices": devices}


def check_backend(backend: str, gpu: list[Check]) -> Check:
    usable = any(c.check.endswith(" posix-fd") and c.result == PASS for c in gpu) and \
        not any(c.check.endswith((" vmm", " posix-fd")) and c.result == FAIL for c in gpu)
    if backend == "host" and usable:
        return warn("backend", "gpumemd uses the host backend (memfd), but a GPU here "
                    "supports VMM with POSIX-fd handles",
                    "restart gpumemd with --backend cuda (or auto)")
    if backend == "host":
        return ok("backend", "host (memfd): no usable GPU on this machine")
    return ok("backend", backend)


# ---- FUSE ----------------------------------------------------------------------------------
def check_fuse() -> list[Check]:
    root = os.geteuid() == 0
    checks = [_fuse_device()]
    path = shutil.which("fusermount3")
    if path:
        checks.append(ok("fusermount3", path))
    elif root:
        checks.append(ok("fusermount3", "not on PATH (not needed as root: gpumemd mounts "
                         "directly)"))
    else:
        checks.append(warn("fusermount3", "not on PATH: a non-root gpumemd cannot mount",
                           "install fuse3 (apt install fuse3 / dnf install fuse3)"))
    checks.append(_fuse_conf(root))
    return checks


def _fuse_device() -> Check:
    try:
        fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return warn("/dev/fuse", "missing: no FUSE mount (the socket API still works)",
                        "modprobe fuse (in a container: --device /dev/fuse --cap-add "
                        "SYS_ADMIN)")
        return warn("/dev/fuse", f"cannot open it as uid {os.geteuid()} ({exc.strerror})",
                    "chmod 0666 /dev/fuse (the usual mode) or run gpumemd as root")
    os.close(fd)
    return ok("/dev/fuse", "present and openable")


def _fuse_conf(root: bool) -> Check:
    if root:
        return ok("fuse.conf", "user_allow_other is not needed as root")
    try:
        with open("/etc/fuse.conf") as f:
            lines = [line.split("#")[0].strip() for line in f]
    except OSError:
        lines = []
    if "user_allow_other" in lines:
        return ok("fuse.conf", "user_allow_other is set")
    return warn("fuse.conf", "user_allow_other is not set in /etc/fuse.conf: a mount made by "
                "a non-root gpumemd is visible to its own user only",
                "add a line 'user_allow_other' to /etc/fuse.conf")


# ---- the daemon ------------------------------------------------------------------------------
@dataclasses.dataclass
class DaemonFacts:
    socket: str
    hello: Hello | None = None
    state_dir: str | None = None
    uid: int | None = None          # the daemon's uid, from /proc/PID
    error: Exception | None = None  # GpumemError, or OSError (e.g. timed out)

    @property
    def backend(self) -> str | None:
        return None if self.hello is None else self.hello.get("backend")

    @classmethod
    def probe(cls, socket_path: str) -> DaemonFacts:
        from .client import Client
        facts = cls(socket_path)
        try:
            with Client(socket_path, client_name="gpumemctl doctor", timeout=10) as c:
                facts.hello = c.hello
                facts.state_dir = c.status()["daemon"].get("state_dir")
        except (GpumemError, OSError) as exc:    # OSError: a daemon that hangs (timeout)
            facts.error = exc
            return facts
        try:
            facts.uid = os.stat(f"/proc/{facts.hello['pid']}").st_uid
        except (OSError, KeyError, TypeError):
            pass                       # another pid namespace: owner checks use our uid
        return facts

    def check(self) -> Check:
        if self.hello is not None:
            h = self.hello
            return ok("socket", f"{h.get('daemon')} answers at {self.socket} (pid "
                      f"{h.get('pid')}, backend {h.get('backend')})")
        if isinstance(self.error, NotRunning) and "permission denied" in str(self.error):
            return fail("socket", str(self.error),
                        f"uid {os.geteuid()} needs search permission on the socket's "
                        "directory and write permission on the socket (gpumemd makes it "
                        "0666)")
        if isinstance(self.error, NotRunning):
            return warn("socket", f"gpumemd is not running at {self.socket}",
                        f"start it: gpumemd --socket {self.socket} (or: systemctl start "
                        "gpumemd)")
        if isinstance(self.error, OSError):
            return fail("socket", f"gpumemd at {self.socket} does not answer ({self.error!r})",
                        "look at gpumemd's log (journalctl -u gpumemd); restart it if it hangs")
        return fail("socket", f"gpumemd at {self.socket} answered with an error: "
                    f"{self.error}", "upgrade gpumemctl and gpumemd together (one protocol "
                    "version)")


# ---- permissions -----------------------------------------------------------------------------
def check_permissions(state_dir: str, socket_path: str, daemon_uid: int | None) -> list[Check]:
    owner = os.geteuid() if daemon_uid is None else daemon_uid
    return [_state_dir(os.path.abspath(state_dir), owner, running=daemon_uid is not None),
            _socket_dir(os.path.dirname(os.path.abspath(socket_path)), owner)]


def _state_dir(path: str, owner: int, running: bool) -> Check:
    name = "state directory"
    try:
        st = os.stat(path)
    except PermissionError:
        return ok(name, f"{path}: not visible to uid {os.geteuid()} (private to gpumemd)")
    except OSError:
        if running:
            return warn(name, f"gpumemd reports {path}, which does not exist here",
                        "run doctor in gpumemd's mount namespace (or container)")
        return _creatable(name, path, "0700")
    if not stat.S_ISDIR(st.st_mode):
        return fail(name, f"{path} is not a directory", f"move it away; gpumemd creates {path}")
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid != owner:
        return fail(name, f"{path} is owned by uid {st.st_uid}, gpumemd runs as uid {owner}",
                    f"chown -R {owner} {path}")
    if mode & 0o022:
        return fail(name, f"{path} has mode {mode:04o}: others can change the registry",
                    f"chmod 0700 {path}")
    if mode & 0o077:
        return warn(name, f"{path} has mode {mode:04o}: others can read allocation names",
                    f"chmod 0700 {path}")
    return ok(name, f"{path}: owner uid {st.st_uid}, mode {mode:04o}")


def _socket_dir(path: str, owner: int) -> Check:
    name = "socket directory"
    try:
        st = os.stat(path)
    except OSError:
        return _creatable(name, path, "0755")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o002 and not mode & stat.S_ISVTX:
        return fail(name, f"{path} has mode {mode:04o}: anyone can replace the socket",
                    f"chmod o-w {path}, or use /run/gpumemd or $XDG_RUNTIME_DIR")
    if st.st_uid not in (owner, 0):
        return warn(name, f"{path} is owned by uid {st.st_uid}, not by gpumemd's uid {owner} "
                    "or root", f"use a directory of uid {owner}, e.g. $XDG_RUNTIME_DIR")
    if mode & 0o002:
        return warn(name, f"{path} is a shared sticky directory (mode {mode:04o}): another "
                    "user can take the socket's name first",
                    "use /run/gpumemd (root) or $XDG_RUNTIME_DIR")
    return ok(name, f"{path}: owner uid {st.st_uid}, mode {mode:04o}")


def _creatable(name: str, path: str, mode: str) -> Check:
    """A missing directory: fine if gpumemd (assumed to be us) can create it."""
    parent = os.path.dirname(path)
    while parent and not os.path.isdir(parent):
        parent = os.path.dirname(parent)
    if parent and os.access(parent, os.W_OK | os.X_OK):
        return ok(name, f"{path} does not exist yet; gpumemd creates it (mode {mode})")
    return warn(name, f"{path} does not exist and uid {os.geteuid()} cannot create it",
                f"mkdir -m {mode} {path} && chown <gpumemd's user> {path}")
