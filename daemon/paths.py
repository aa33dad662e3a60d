"""The directories gpumemd is told to use, checked before it trusts them, and the files it
makes in them (docs/security.md, "Paths under directories other users control").

gpumemd runs as root and serves every local user. A directory another user controls would
let that user make root act on a name of their choosing: follow a symlink planted there,
chmod or unlink what it names, mount somewhere else. So the socket directory, the state
directory and the mount point are held to sshd's StrictModes rule: every directory from /
down, and every symlink met on the way, is owned by root or the daemon's uid, and the
directory itself is not writable by group or others. A parent may be writable by others
if it is sticky (/tmp): others may add names there but not rename or remove ours, and the
next step down is checked to be ours. Standard library only: the keeper imports it too.
"""
from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
import tempfile

MAX_SYMLINKS = 40              # as the kernel's path walk (ELOOP past it)


class UnsafePath(Exception):
    """A path gpumemd will not use, in one line that names it and says why."""


def trusted(uid: int) -> bool:
    """Root and the daemon's own uid: the only owners whose directories gpumemd trusts."""
    return uid == 0 or uid == os.geteuid()


def _owners() -> str:
    uid = os.geteuid()
    return "root" if uid == 0 else f"root or uid {uid}"


def _refuse(what: str, path: str, where: str, why: str) -> UnsafePath:
    subject = "it" if where == path else where
    return UnsafePath(f"refusing the {what} {path}: {subject} {why}")


def _check_owner(what: str, path: str, where: str, st: os.stat_result) -> None:
    if not trusted(st.st_uid):
        raise _refuse(what, path, where, f"is owned by uid {st.st_uid}, not {_owners()}")


def _check_parent(what: str, path: str, where: str, st: os.stat_result) -> None:
    """A directory on the way: ours, and nobody else may replace what it holds."""
    _check_owner(what, path, where, st)
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise _refuse(what, path, where, f"is writable by group or others (mode "
                                         f"{stat.S_IMODE(st.st_mode):04o}) and not sticky")


def _lstat(what: str, path: str, where: str) -> os.stat_result | None:
    """lstat, None for a name that does not exist (gpumemd makes it)."""
    try:
        return os.lstat(where)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _refuse(what, path, where, f"cannot be checked: {exc.strerror}") from None


def check_parents(what: str, path: str) -> None:
    """Walk from / to the directory that holds `path` (absolute) as the kernel does,
    following symlinks, and check each directory and symlink on the way. A name that does
    not exist ends the walk: what lies below it is made by gpumemd."""
    pending = path.split("/")[1:-1]
    current = "/"
    _check_parent(what, path, "/", os.lstat("/"))
    links = 0
    while pending:
        name = pending.pop(0)
        if name in ("", "."):
            continue
        if name == "..":              # `current` has no symlink in it: its parent is real
            current = os.path.dirname(current)
            continue
        step = os.path.join(current, name)
        st = _lstat(what, path, step)
        if st is None:
            return
        if stat.S_ISLNK(st.st_mode):
            _check_owner(what, path, step, st)     # only its owner may replace it
            links += 1
            if links > MAX_SYMLINKS:
                raise _refuse(what, path, step, "leads through too many symlinks")
            target = os.readlink(step)
            if target.startswith("/"):
                current = "/"
            pending[:0] = target.split("/")
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise _refuse(what, path, step, "is not a directory")
        _check_parent(what, path, step, st)
        current = step


def check_directory(what: str, path: str, *, missing_ok: bool = False) -> None:
    """The directory gpumemd puts its files in: not a symlink, ours, and nobody else may
    add, rename or remove a name in it (sticky or not)."""
    st = _lstat(what, path, path)
    if st is None:
        if missing_ok:
            return
        raise _refuse(what, path, path, "does not exist")
    if stat.S_ISLNK(st.st_mode):
        raise _refuse(what, path, path, "is a symlink")
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(what, path, path, "is not a directory")
    _check_owner(what, path, path, st)
    if st.st_mode & 0o022:
        raise _refuse(what, path, path, f"is writable by group or others (mode "
                                        f"{stat.S_IMODE(st.st_mode):04o})")


def _make_dirs(path: str, mode: int) -> None:
    """mkdir -p, the parents 0755 whatever the umask lets through, `path` itself `mode`.
    mkdir never follows a symlink at the name it makes (EEXIST): check_directory then
    refuses that name."""
    parent = os.path.dirname(path)
    if parent != path and not os.path.lexists(parent):
        _make_dirs(parent, 0o755)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, mode)


def safe_directory(what: str, path: str, mode: int = 0o755, *, create: bool = True) -> str:
    """Check `path` (made absolute) and every directory above it; make what is missing
    (`mode`) once the existing part is safe, then check all of it again. Returns the
    absolute path; UnsafePath otherwise."""
    path = os.path.abspath(path)
    check_parents(what, path)
    if create:
        try:
            _make_dirs(path, mode)
        except OSError as exc:
            raise UnsafePath(f"cannot create the {what} {path}: {exc.strerror}"
                             f"{next_step(what, path, exc.errno)}") from None
    check_parents(what, path)
    check_directory(what, path)
    return path


# The option that names each directory gpumemd makes (next_step's advice).
OPTION_OF = {"socket directory": "--socket PATH", "state directory": "--state-dir DIR"}


def next_step(what: str, path: str, err: int | None) -> str:
    """What to do when the default place of `what` cannot be made: a user's daemon in a
    shell without a login session (`su` keeps no XDG_RUNTIME_DIR, so the default socket
    is /run/user/UID, which only logind makes), or a directory this uid may not write."""
    if err not in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT):
        return ""
    option = OPTION_OF.get(what)
    advice = f"; give {option} in a directory you may write" if option else ""
    if path.startswith("/run/user/") and not os.environ.get("XDG_RUNTIME_DIR"):
        advice += (" (XDG_RUNTIME_DIR is not set, as in a `su` shell, so the default is "
                   "/run/user/UID, which a login makes: log in as this user or `su -l`; or "
                   "`gpumemd --socket ~/gpumemd.sock` with `export "
                   "GPUMEMD_SOCKET=~/gpumemd.sock` for gpumemctl)")
    return advice


# ---- files gpumemd makes in its own directories --------------------------------------------
def create_new(path: str, mode: int = 0o600, flags: int = os.O_WRONLY) -> int:
    """A file made by this call: O_EXCL (so never through a symlink, nor an existing file)
    and O_NOFOLLOW (said twice, for whoever reads the flags)."""
    return os.open(path, flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)


def open_own(path: str, flags: int, mode: int = 0o600) -> int:
    """A regular file gpumemd keeps across runs (its lock, the keeper's log), made if
    missing: never through a symlink (O_NOFOLLOW), never a FIFO or a device (O_NONBLOCK
    while opening, so that a FIFO cannot make it wait)."""
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                     mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(f"refusing {path}: it is a symlink") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafePath(f"refusing {path}: it is not a regular file")
    os.set_blocking(fd, True)
    return fd


def replace_file(path: str, data: bytes, mode: int = 0o644) -> None:
    """Write `path` whole, atomically: a new PATH.tmp (a stale one from a crash is removed
    first: unlink never follows a symlink), then rename over `path` (which never follows
    one either)."""
    tmp = path + ".tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = create_new(tmp, mode)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


# ---- the daemon's socket ---------------------------------------------------------------------
def bind_unix(sock: socket.socket, path: str, mode: int) -> None:
    """Bind `sock` at `path` with `mode`, with no moment when chmod could reach another file.

    A chmod by path after bind follows whatever symlink was swapped in meanwhile, and Linux
    has no lchmod. fchmod of the socket before bind does not help either: bind gives the
    file the socket inode's mode less the umask, and the umask is process-wide (gpumemd has
    worker threads by now, whose files would get it too). So the socket is bound in a new
    directory of its own (mkdtemp: 0700, ours, so nobody else can put a name in it), chmod'ed
    there, then renamed into place: rename is atomic and replaces a name without following
    it. The temporary name is short (`.gXXXXXXXX/s`) so that sun_path's 108 bytes fit
    about as many as before."""
    private = tempfile.mkdtemp(prefix=".g", dir=os.path.dirname(path))
    staged = os.path.join(private, "s")
    try:
        sock.bind(staged)
        os.chmod(staged, mode)
        os.rename(staged, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staged)
        os.rmdir(private)


def file_id(st: os.stat_result) -> tuple[int, int]:
    """What names one file on this machine: an inode number alone repeats across
    filesystems (a new socket on another tmpfs had the same one)."""
    return st.st_dev, st.st_ino
