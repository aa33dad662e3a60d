"""fsx in Python: random file operations on the real mount, checked byte for byte against an
in-memory model.

A Hypothesis RuleBasedStateMachine drives create (O_CREAT|O_EXCL), write at any offset (past
the end too: the hole must read as zeros), O_APPEND writes, truncate and ftruncate (grow and
shrink), rename (over an existing file, into and out of subdirectories), unlink, reads of
random ranges and whole-file compares with st_size, reads of a shared read-only mapping, and
stores into a shared read-write mapping made durable by msync(MS_SYNC), munmap alone, close(2)
before the munmap, or fsync, then read back with read(2) and through the socket API (the
device memory itself: docs/mount.md, "Consistency", rule 2), on a small set of names so that
collisions and renames over existing files are frequent. A pool of descriptors stays open
across steps: I/O goes through them too, including after their file was unlinked or
replaced by a rename (the memory must live until the last close).

The model is the one POSIX describes: a name refers to an inode (here a bytearray); an open
descriptor refers to the inode, not the name. Every read is compared exactly; every failure
the model predicts (EEXIST, ENOENT) must happen, and nothing else may fail.

Writes go up to ~3 MiB and files up to 8 MiB, so allocations cross the 2 MiB granularity
and are reallocated by write growth, truncation and the trim at the last writer's close.
After each example every file is removed and the daemon must give all its memory back.

One daemon (the `mounted` fixture) serves all examples of the test: about 21,000 operations
(about 1,300 of them on mappings) in 50-60 s on a 2-core VM, derandomized so CI runs the same
sequence every time. Shrinking is off
(a failure is reported as its full step sequence); GPUMEMCTL_TEST_SHRINK=1 turns it on.
"""
from __future__ import annotations

import collections
import errno
import mmap
import os
import random
import stat

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tests.harness import wait_for

pytestmark = pytest.mark.slow

KiB, MiB = 1 << 10, 1 << 20
GRANULE = 2 * MiB                      # the host backend's (and an H100's) granularity
DIRS = ("sub", "sub/deep")
# Few names, in three directories: renames over existing files and name reuse are frequent.
NAMES = ("a", "b", "c", "sub/a", "sub/b", "sub/deep/a")
# Symbolic links, named apart from the files (a rename of a file never lands on one), each to
# a file name by a relative path: it resolves while the name is there, dangles while not.
LINKS = ("la", "sub/lb", "sub/deep/lc")
MAX_FDS = 4                            # descriptors kept open across steps
MAX_END = 8 * MiB                      # no write or truncate goes past this
BOUNDARIES = (0, 1, 4095, 4096, 4097, MiB - 1, MiB, MiB + 1, GRANULE - 1, GRANULE,
              GRANULE + 1, 2 * GRANULE - 1, 2 * GRANULE, 3 * MiB, 6 * MiB)

# Hypothesis ends some examples early (its mutator replays short prefixes; how many depends
# on its version: 60 examples of up to 100 steps made 5,008 operations with one, 4,026 with
# another; 120 of up to 200 made between 19,364 and 21,202 with hypothesis 6.170, from one tree
# to the next, as outcomes steer it), so test_fsx tops the run up with more rounds if needed.
EXAMPLES, STEPS = 120, 200
OPERATIONS = 20000

LENGTHS = st.one_of(
    st.integers(0, 8 * KiB),
    st.integers(1, 256 * KiB),
    st.integers(1, 3 * MiB + 64 * KiB),
    st.sampled_from([1, 4095, 4096, MiB - 1, MiB, MiB + 1, GRANULE - 1, GRANULE, GRANULE + 1,
                     3 * MiB]),
)
SEEDS = st.integers(0, 2**32 - 1)

PHASES = tuple(Phase) if os.environ.get("GPUMEMCTL_TEST_SHRINK") else \
    tuple(p for p in Phase if p is not Phase.shrink)


def payload(seed: int, length: int) -> bytes:
    """Random bytes, cheap to make and to reproduce (Hypothesis draws only seed and length)."""
    return random.Random(seed).randbytes(length)


def first_difference(got: bytes, want: bytes) -> str:
    for i, (x, y) in enumerate(zip(got, want, strict=False)):   # the common prefix
        if x != y:
            return (f"first difference at byte {i}: got {got[i:i + 16].hex()}, "
                    f"want {bytes(want[i:i + 16]).hex()}")
    return f"lengths differ: got {len(got)} bytes, want {len(want)}"


class Inode:
    """The model of one file: its bytes. Names and descriptors refer to it."""
    _ids = 0

    def __init__(self):
        Inode._ids += 1
        self.id = Inode._ids
        self.data = bytearray()

    def write(self, offset: int, data: bytes) -> None:
        if not data:
            return                   # write(2) of nothing never extends a file
        if offset > len(self.data):
            self.data.extend(bytes(offset - len(self.data)))     # the hole reads as zeros
        self.data[offset:offset + len(data)] = data

    def truncate(self, size: int) -> None:
        if size < len(self.data):
            del self.data[size:]
        else:
            self.data.extend(bytes(size - len(self.data)))

    def __repr__(self) -> str:
        return f"<inode {self.id}: {len(self.data)} bytes>"


class OpenFile:
    def __init__(self, fd: int, inode: Inode, name: str, writable: bool):
        self.fd, self.inode, self.name, self.writable = fd, inode, name, writable

    def __repr__(self) -> str:
        return f"<fd {self.fd} of {self.name!r} {'rw' if self.writable else 'r'} {self.inode}>"


def make_machine(mnt: str, client, stats: collections.Counter):
    """The state machine class, bound to one mount and its daemon's client."""

    class FileSystemExerciser(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            self.names: dict[str, Inode] = {}      # the model's namespace
            self.links: dict[str, str] = {}        # link name: the file name it points to
            self.fds: list[OpenFile] = []          # the open-descriptor pool
            self.since_missing = 0                 # steps since missing_name last ran

        # ---- helpers --------------------------------------------------------------------
        @staticmethod
        def path(name: str) -> str:
            return os.path.join(mnt, name)

        def _linked(self, inode: Inode) -> bool:
            return any(i is inode for i in self.names.values())

        def _note_io(self, kind: str, inode: Inode) -> None:
            stats[kind] += 1
            if not self._linked(inode):
                stats[kind + " on unlinked file"] += 1

        def _pwrite(self, fd: int, inode: Inode, data: bytes, offset: int, what: str) -> None:
            size = len(inode.data)
            if offset > size and data:
                stats["write past EOF (hole)"] += 1
            if offset + len(data) > max(size, GRANULE) and data:
                stats["write growing past a granule"] += 1
            written = os.pwrite(fd, data, offset)
            assert written == len(data), \
                f"{what}: pwrite of {len(data)} bytes at {offset} wrote {written}"
            inode.write(offset, data)
            self._check_changed(fd, inode, min(size, offset), offset + len(data), what)

        def _check_changed(self, fd: int, inode: Inode, start: int, end: int,
                           what: str) -> None:
            """Read back what a write or truncate just changed (and a page either side): a
            hole or a grown tail with stale bytes is found at once, before later writes
            cover it. `fd` must be readable."""
            start = max(0, start - 4096)
            self._check_read(fd, inode, start, end + 4096 - start, what + " (read back)")

        @staticmethod
        def _check_read(fd: int, inode: Inode, offset: int, length: int, what: str) -> None:
            got = os.pread(fd, length, offset)
            want = bytes(inode.data[offset:offset + length])
            assert got == want, (f"{what}: pread({length}, {offset}) of {inode}: got "
                                 f"{len(got)} bytes, wanted {len(want)}; "
                                 + first_difference(got, want))

        def _check_whole(self, fd: int, inode: Inode, st_size: int, what: str) -> None:
            size = len(inode.data)
            assert st_size == size, f"{what}: st_size {st_size}, model {size} ({inode})"
            got = os.pread(fd, size + MiB, 0)
            assert got == inode.data, f"{what}: whole file of {inode}: " + \
                first_difference(got, inode.data)

        def _draw_offset(self, data, size: int, length: int) -> int:
            offset = data.draw(st.one_of(
                st.integers(0, size),                     # inside (or at) the end
                st.just(size),                            # append
                st.integers(size, size + GRANULE + 1),    # past the end: a hole
                st.sampled_from(BOUNDARIES),              # page, MiB and granule edges
            ), label="offset")
            return max(0, min(offset, MAX_END - length))

        def _draw_size(self, data, size: int) -> int:
            new = data.draw(st.one_of(
                st.integers(0, MAX_END),
                st.sampled_from(BOUNDARIES),
                st.integers(max(0, size - 64 * KiB), size + 64 * KiB),   # near the old size
            ), label="size")
            return min(new, MAX_END)

        def _draw_name(self, data, existing: bool = True, label: str = "name") -> str:
            """Mostly a name the model has (or, existing=False, lacks); now and then any
            name, for the error paths (missing_name tests those more)."""
            pool = sorted(n for n in NAMES if (n in self.names) == existing)
            if pool and data.draw(st.integers(0, 19), label=f"{label} kind") > 0:
                return data.draw(st.sampled_from(pool), label=label)
            return data.draw(st.sampled_from(NAMES), label=label)

        def _pick_fd(self, data, writable: bool = False) -> OpenFile | None:
            pool = [f for f in self.fds if f.writable or not writable]
            if not pool:
                return None
            return data.draw(st.sampled_from(pool), label="fd")

        def _keep_or_close(self, fd: int, inode: Inode, name: str, writable: bool,
                           keep: bool) -> None:
            if keep and len(self.fds) < MAX_FDS:
                self.fds.append(OpenFile(fd, inode, name, writable))
            else:
                os.close(fd)

        # ---- setup ----------------------------------------------------------------------
        @initialize()
        def start_clean(self):
            stats["examples"] += 1
            for d in DIRS:
                assert os.path.isdir(self.path(d))
            self.check_listing()

        # ---- namespace ------------------------------------------------------------------
        @rule(data=st.data(), keep=st.booleans())
        def create(self, data, keep):
            name = self._draw_name(data, existing=False)
            flags = os.O_CREAT | os.O_EXCL | os.O_RDWR
            if name in self.names:
                with pytest.raises(FileExistsError):
                    os.close(os.open(self.path(name), flags, 0o644))
                stats["create: EEXIST"] += 1
                return
            fd = os.open(self.path(name), flags, 0o644)
            inode = self.names[name] = Inode()
            st_ = os.fstat(fd)
            assert stat.S_ISREG(st_.st_mode) and st_.st_size == 0
            stats["create"] += 1
            self._keep_or_close(fd, inode, name, True, keep)

        @precondition(lambda self: self.names)
        @rule(data=st.data())
        def rename(self, data):
            src = self._draw_name(data, label="src")
            dst = data.draw(st.sampled_from(NAMES), label="dst")
            self._rename(src, dst)

        @precondition(lambda self: any(self._linked(f.inode) for f in self.fds))
        @rule(data=st.data())
        def rename_over_open_file(self, data):
            """Replace a file a pooled descriptor holds (the pool then does I/O on it)."""
            names = sorted(n for n, i in self.names.items()
                           if any(f.inode is i for f in self.fds))
            dst = data.draw(st.sampled_from(names), label="dst")
            self._rename(self._draw_name(data, label="src"), dst)

        def _rename(self, src: str, dst: str) -> None:
            if src not in self.names:
                with pytest.raises(FileNotFoundError):
                    os.rename(self.path(src), self.path(dst))
                stats["rename: ENOENT"] += 1
                return
            os.rename(self.path(src), self.path(dst))
            if src == dst:
                stats["rename to itself"] += 1
                return
            if self.names.get(dst) is self.names[src]:
                # Two names of one file: POSIX says rename does nothing, both stay.
                stats["rename onto another name of the same file"] += 1
                return
            if dst in self.names:
                stats["rename over an existing file"] += 1
                if any(f.inode is self.names[dst] for f in self.fds):
                    stats["rename over an open file"] += 1
            if os.path.dirname(src) != os.path.dirname(dst):
                stats["rename across directories"] += 1
            self.names[dst] = self.names.pop(src)

        @precondition(lambda self: self.names)
        @rule(data=st.data())
        def unlink(self, data):
            self._unlink(self._draw_name(data))

        def _unlink(self, name: str) -> None:
            if name not in self.names:
                with pytest.raises(FileNotFoundError):
                    os.unlink(self.path(name))
                stats["unlink: ENOENT"] += 1
                return
            os.unlink(self.path(name))
            inode = self.names.pop(name)
            stats["unlink"] += 1
            if any(i is inode for i in self.names.values()):
                stats["unlink of one name of several"] += 1
            if any(f.inode is inode for f in self.fds):
                stats["unlink of an open file"] += 1

        @precondition(lambda self: any(self._linked(f.inode) for f in self.fds))
        @rule(data=st.data())
        def unlink_open_file(self, data):
            """Unlink a file a pooled descriptor holds (the pool then does I/O on it)."""
            names = sorted(n for n, i in self.names.items()
                           if any(f.inode is i for f in self.fds))
            self._unlink(data.draw(st.sampled_from(names), label="name"))

        # At most every tenth step: Hypothesis would otherwise pick this rule (enabled almost
        # always) for a third of all steps.
        @precondition(lambda self: len(self.names) < len(NAMES) and self.since_missing >= 10)
        @rule(data=st.data(), op=st.sampled_from(["open r", "open rw", "open append", "stat",
                                                   "truncate", "unlink", "rename"]))
        def missing_name(self, data, op):
            """Whatever a missing name is asked, the answer is ENOENT and nothing changes."""
            name = data.draw(st.sampled_from(sorted(set(NAMES) - set(self.names))),
                             label="name")
            path = self.path(name)
            calls = {
                "open r": lambda: os.open(path, os.O_RDONLY),
                "open rw": lambda: os.open(path, os.O_RDWR),
                "open append": lambda: os.open(path, os.O_WRONLY | os.O_APPEND),
                "stat": lambda: os.stat(path),
                "truncate": lambda: os.truncate(path, data.draw(st.sampled_from(BOUNDARIES))),
                "unlink": lambda: os.unlink(path),
                "rename": lambda: os.rename(path, self.path(
                    data.draw(st.sampled_from(NAMES), label="dst"))),
            }
            with pytest.raises(FileNotFoundError):
                calls[op]()
            stats["ENOENT: " + op] += 1
            self.since_missing = 0

        # ---- I/O by path ----------------------------------------------------------------
        @rule(length=LENGTHS, seed=SEEDS, data=st.data())
        def write(self, length, seed, data):
            """open(O_RDWR|O_CREAT), pwrite, close: creates the file if missing."""
            name = self._draw_name(data)
            inode = self.names.get(name)
            offset = self._draw_offset(data, len(inode.data) if inode else 0, length)
            fd = os.open(self.path(name), os.O_RDWR | os.O_CREAT, 0o644)
            try:
                if inode is None:
                    inode = self.names[name] = Inode()
                    stats["create by write"] += 1
                self._pwrite(fd, inode, payload(seed, length), offset, f"write {name!r}")
            finally:
                os.close(fd)
            self._note_io("write", inode)

        @precondition(lambda self: self.names)
        @rule(length=LENGTHS, seed=SEEDS, data=st.data())
        def append(self, length, seed, data):
            """O_APPEND: the kernel puts each write at the current end of the file."""
            name = self._draw_name(data)
            flags = os.O_RDWR | os.O_APPEND
            if name not in self.names:
                with pytest.raises(FileNotFoundError):
                    os.open(self.path(name), flags)
                return
            inode = self.names[name]
            length = min(length, MAX_END - len(inode.data))
            chunk = payload(seed, length)
            fd = os.open(self.path(name), flags)
            try:
                old_size = len(inode.data)
                written = os.write(fd, chunk)
                assert written == len(chunk), f"append to {name!r}: wrote {written}/{length}"
                inode.write(old_size, chunk)
                if chunk:        # a write of nothing leaves the position alone (as on ext4)
                    assert os.lseek(fd, 0, os.SEEK_CUR) == len(inode.data)
                self._check_changed(fd, inode, old_size, len(inode.data), f"append {name!r}")
            finally:
                os.close(fd)
            self._note_io("append", inode)

        @precondition(lambda self: self.names)
        @rule(data=st.data())
        def truncate(self, data):
            name = self._draw_name(data)
            inode = self.names.get(name)
            size = self._draw_size(data, len(inode.data) if inode else 0)
            if inode is None:
                with pytest.raises(FileNotFoundError):
                    os.truncate(self.path(name), size)
                stats["truncate: ENOENT"] += 1
                return
            old_size = len(inode.data)
            stats["truncate grow" if size > old_size else "truncate shrink"] += 1
            os.truncate(self.path(name), size)
            inode.truncate(size)
            assert os.stat(self.path(name)).st_size == size
            fd = os.open(self.path(name), os.O_RDONLY)
            try:
                self._check_changed(fd, inode, min(old_size, size), max(old_size, size),
                                    f"truncate {name!r}")
            finally:
                os.close(fd)

        @precondition(lambda self: self.names)
        @rule(data=st.data())
        def read(self, data):
            name = self._draw_name(data)
            inode = self.names.get(name)
            if inode is None:
                with pytest.raises(FileNotFoundError):
                    os.open(self.path(name), os.O_RDONLY)
                stats["read: ENOENT"] += 1
                return
            size = len(inode.data)
            offset = data.draw(st.one_of(st.integers(0, size), st.integers(0, size + MiB),
                                         st.sampled_from(BOUNDARIES)), label="offset")
            length = data.draw(LENGTHS, label="length")
            fd = os.open(self.path(name), os.O_RDONLY)
            try:
                self._check_read(fd, inode, offset, length, f"read {name!r}")
            finally:
                os.close(fd)
            self._note_io("read", inode)

        @precondition(lambda self: self.names)
        @rule(data=st.data())
        def compare(self, data):
            """The whole file and its st_size (by path) against the model."""
            name = self._draw_name(data)
            inode = self.names.get(name)
            if inode is None:
                with pytest.raises(FileNotFoundError):
                    os.stat(self.path(name))
                return
            st_size = os.stat(self.path(name)).st_size
            fd = os.open(self.path(name), os.O_RDONLY)
            try:
                self._check_whole(fd, inode, st_size, f"compare {name!r}")
            finally:
                os.close(fd)
            self._note_io("compare", inode)

        # ---- symbolic links ---------------------------------------------------------------
        @precondition(lambda self: len(self.links) < len(LINKS))
        @rule(data=st.data())
        def symlink(self, data):
            """A link to a file name (there or not), by a relative path from its directory."""
            link = data.draw(st.sampled_from([n for n in LINKS if n not in self.links]))
            existing = sorted(self.names)          # mostly a name that is there now
            target = data.draw(st.sampled_from(existing) if existing and data.draw(
                st.integers(0, 3), label="dangling?") else st.sampled_from(NAMES),
                label="target")
            relative = os.path.relpath(target, os.path.dirname(link) or ".")
            os.symlink(relative, self.path(link))
            assert os.readlink(self.path(link)) == relative
            self.links[link] = target
            stats["symlink"] += 1

        @precondition(lambda self: self.links)
        @rule(data=st.data())
        def read_through_link(self, data):
            """The link leads to the file its target names now, or dangles (ENOENT)."""
            link = data.draw(st.sampled_from(sorted(self.links)))
            inode = self.names.get(self.links[link])
            assert os.lstat(self.path(link)).st_mode & 0o170000 == 0o120000
            if inode is None:
                with pytest.raises(FileNotFoundError):
                    os.open(self.path(link), os.O_RDONLY)
                stats["read_through_link: dangling"] += 1
                return
            fd = os.open(self.path(link), os.O_RDONLY)
            try:
                self._check_whole(fd, inode, os.fstat(fd).st_size, f"through link {link!r}")
            finally:
                os.close(fd)
            stats["read_through_link"] += 1

        @precondition(lambda self: self.links)
        @rule(data=st.data())
        def unlink_link(self, data):
            link = data.draw(st.sampled_from(sorted(self.links)))
            os.unlink(self.path(link))        # the link goes; its target stays
            del self.links[link]
            stats["unlink_link"] += 1

        # ---- hard links -----------------------------------------------------------------
        def _nlink(self, inode: Inode) -> int:
            return sum(1 for i in self.names.values() if i is inode)

        @precondition(lambda self: self.names)
        @rule(data=st.data())
        def link(self, data):
            """link(2): one more name of a file (the model's names share the Inode), or
            EEXIST for a name that is taken; st_nlink counts the names."""
            src = self._draw_name(data, label="src")
            dst = self._draw_name(data, existing=False, label="dst")
            if src not in self.names:
                with pytest.raises(FileNotFoundError):
                    os.link(self.path(src), self.path(dst))
                stats["link: ENOENT"] += 1
                return
            if dst in self.names:
                with pytest.raises(FileExistsError):
                    os.link(self.path(src), self.path(dst))
                stats["link: EEXIST"] += 1
                return
            os.link(self.path(src), self.path(dst))
            inode = self.names[dst] = self.names[src]
            st_src, st_dst = os.stat(self.path(src)), os.stat(self.path(dst))
            assert st_src.st_ino == st_dst.st_ino
            assert st_dst.st_nlink == self._nlink(inode), (st_dst.st_nlink, inode)
            if os.path.dirname(src) != os.path.dirname(dst):
                stats["link across directories"] += 1
            stats["link"] += 1

        @precondition(lambda self: self.names)
        @rule(data=st.data())
        def check_nlink(self, data):
            """st_nlink of a name (and of a descriptor of its file) is its names in the
            model."""
            name = data.draw(st.sampled_from(sorted(self.names)), label="name")
            inode = self.names[name]
            assert os.stat(self.path(name)).st_nlink == self._nlink(inode)
            for f in self.fds:
                if f.inode is inode:
                    assert os.fstat(f.fd).st_nlink == self._nlink(inode)
            if self._nlink(inode) > 1:
                stats["check_nlink: hard-linked"] += 1

        # ---- the descriptor pool --------------------------------------------------------
        @precondition(lambda self: self.names and len(self.fds) < MAX_FDS)
        @rule(data=st.data(), writable=st.booleans())
        def open_fd(self, data, writable):
            name = self._draw_name(data)
            flags = os.O_RDWR if writable else os.O_RDONLY
            if name not in self.names:
                with pytest.raises(FileNotFoundError):
                    os.open(self.path(name), flags)
                return
            fd = os.open(self.path(name), flags)
            self.fds.append(OpenFile(fd, self.names[name], name, writable))
            stats["open"] += 1

        @precondition(lambda self: self.fds)
        @rule(data=st.data())
        def close_fd(self, data):
            f = data.draw(st.sampled_from(self.fds), label="fd")
            self.fds.remove(f)
            os.close(f.fd)
            stats["close"] += 1

        @precondition(lambda self: any(f.writable for f in self.fds))
        @rule(length=LENGTHS, seed=SEEDS, data=st.data())
        def write_fd(self, length, seed, data):
            f = self._pick_fd(data, writable=True)
            offset = self._draw_offset(data, len(f.inode.data), length)
            self._pwrite(f.fd, f.inode, payload(seed, length), offset, f"write_fd {f}")
            self._note_io("write_fd", f.inode)

        @precondition(lambda self: any(not f.writable for f in self.fds))
        @rule(data=st.data())
        def write_fd_readonly(self, data):
            """A descriptor opened O_RDONLY cannot write (EBADF), and nothing changes."""
            f = data.draw(st.sampled_from([f for f in self.fds if not f.writable]),
                          label="fd")
            with pytest.raises(OSError) as exc:
                os.pwrite(f.fd, b"x", 0)
            assert exc.value.errno == errno.EBADF

        @precondition(lambda self: any(f.writable for f in self.fds))
        @rule(data=st.data())
        def ftruncate(self, data):
            f = self._pick_fd(data, writable=True)
            old_size = len(f.inode.data)
            size = self._draw_size(data, old_size)
            os.ftruncate(f.fd, size)
            f.inode.truncate(size)
            assert os.fstat(f.fd).st_size == size
            self._check_changed(f.fd, f.inode, min(old_size, size), max(old_size, size),
                                f"ftruncate {f}")
            self._note_io("ftruncate", f.inode)

        @precondition(lambda self: self.fds)
        @rule(data=st.data())
        def read_fd(self, data):
            f = self._pick_fd(data)
            size = len(f.inode.data)
            offset = data.draw(st.one_of(st.integers(0, size), st.integers(0, size + MiB),
                                         st.sampled_from(BOUNDARIES)), label="offset")
            length = data.draw(LENGTHS, label="length")
            self._check_read(f.fd, f.inode, offset, length, f"read_fd {f}")
            self._note_io("read_fd", f.inode)

        @precondition(lambda self: self.fds)
        @rule(data=st.data())
        def compare_fd(self, data):
            f = self._pick_fd(data)
            self._check_whole(f.fd, f.inode, os.fstat(f.fd).st_size, f"compare_fd {f}")
            self._note_io("compare_fd", f.inode)

        # ---- shared mappings (docs/mount.md, "Consistency", rule 2) ---------------------
        def _map_target(self, data, writable: bool):
            """A file to map: by name (opened here) or a pooled descriptor (its file may be
            unlinked or replaced); (fd, inode, what, whether the fd is ours to close)."""
            pool = [f for f in self.fds if f.writable or not writable]
            if pool and data.draw(st.booleans(), label="pooled fd"):
                f = data.draw(st.sampled_from(pool), label="fd")
                return f.fd, f.inode, repr(f), False
            name = self._draw_name(data)
            if name not in self.names:
                with pytest.raises(FileNotFoundError):
                    os.open(self.path(name), os.O_RDWR if writable else os.O_RDONLY)
                return None
            fd = os.open(self.path(name), os.O_RDWR if writable else os.O_RDONLY)
            return fd, self.names[name], repr(name), True

        def _draw_range(self, data, size: int) -> tuple[int, int]:
            offset = data.draw(st.one_of(st.integers(0, size - 1), st.sampled_from(
                [b for b in BOUNDARIES if b < size] or [0])), label="map offset")
            length = data.draw(LENGTHS, label="map length")
            return offset, max(1, min(length, size - offset))

        @precondition(lambda self: self.names or self.fds)
        @rule(data=st.data())
        def mmap_read(self, data):
            """A range of a shared read-only mapping (the page cache's, or fresh pages)
            against the model."""
            target = self._map_target(data, writable=False)
            if target is None:
                return
            fd, inode, what, ours = target
            try:
                size = len(inode.data)
                if size == 0:
                    return                       # an empty file cannot be mapped
                offset, length = self._draw_range(data, size)
                with mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ) as m:
                    got = m[offset:offset + length]
                want = bytes(inode.data[offset:offset + length])
                assert got == want, (f"mmap_read {what}: [{offset}:{offset + length}] of "
                                     f"{inode}: " + first_difference(got, want))
            finally:
                if ours:
                    os.close(fd)
            self._note_io("mmap_read", inode)

        @precondition(lambda self: self.names or any(f.writable for f in self.fds))
        @rule(data=st.data(), seed=SEEDS,
              sync=st.sampled_from(["msync", "munmap", "close then munmap", "fsync"]))
        def mmap_write(self, data, seed, sync):
            """Stores into a shared mapping, then made durable by msync(MS_SYNC), munmap
            alone, close(2) of the descriptor before the munmap, or fsync; then read back
            through another descriptor and (for a named file) through the socket API."""
            target = self._map_target(data, writable=True)
            if target is None:
                return
            fd, inode, what, ours = target
            try:
                size = len(inode.data)
                if size == 0:
                    return
                offset, length = self._draw_range(data, size)
                chunk = payload(seed, length)
                m = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
                m[offset:offset + length] = chunk
                inode.write(offset, chunk)
                if sync == "msync":
                    m.flush()
                elif sync == "fsync":
                    os.fsync(fd)
                elif sync == "close then munmap" and ours:
                    os.close(fd)
                    ours = False
                m.close()
                stats["mmap_write: " + sync] += 1
            finally:
                if ours:
                    os.close(fd)
            self._check_elsewhere(inode, offset, length, f"mmap_write {what} ({sync})")
            self._note_io("mmap_write", inode)

        def _check_elsewhere(self, inode: Inode, offset: int, length: int, what: str) -> None:
            """The stores as a new read(2) of the file sees them, and as the socket API
            does (the device memory itself) where the file still has a name."""
            name = next((n for n, i in self.names.items() if i is inode), None)
            want = bytes(inode.data[offset:offset + length])
            if name is not None:
                got = client.read(name, offset, length)
                assert got == want, f"{what}: socket read: " + first_difference(got, want)
                stats["mmap_write checked through the socket"] += 1
                fd = os.open(self.path(name), os.O_RDONLY)
                try:
                    self._check_read(fd, inode, offset, length, what + " (read(2))")
                finally:
                    os.close(fd)

        # ---- whole-namespace checks -----------------------------------------------------
        @rule()
        def check_listing(self):
            """readdir of every directory shows exactly the model's names."""
            for d in ("", *DIRS):
                want = {n.rsplit("/", 1)[-1] for n in (*self.names, *self.links)
                        if os.path.dirname(n) == d}
                want |= {s.rsplit("/", 1)[-1] for s in DIRS if os.path.dirname(s) == d}
                got = set(os.listdir(self.path(d) if d else mnt))
                assert got == want, f"listing of {d or '/'}: {sorted(got)} != {sorted(want)}"

        @invariant()
        def count_step(self):
            stats["steps"] += 1
            self.since_missing += 1

        def teardown(self):
            for f in self.fds:
                os.close(f.fd)
            self.fds.clear()
            for d in (*reversed(DIRS), ""):
                where = self.path(d) if d else mnt
                for entry in os.listdir(where):
                    full = os.path.join(where, entry)
                    if os.path.islink(full) or os.path.isfile(full):
                        os.unlink(full)
            self.names.clear()
            self.links.clear()
            # Every byte comes back once the last descriptor is released (the kernel sends
            # RELEASE after close(2) returns, so give it a moment).
            def all_freed():
                devs = client.devices()
                # Only the host backend's `free` is the daemon's own bookkeeping (it counts
                # unlinked files still held); a GPU's free memory is shared with others.
                return all(d["ours"] == 0 and (d["backend"] != "host" or
                                               d["free"] == d["total"]) for d in devs)
            wait_for(all_freed, timeout=10, what="the daemon to free all memory")

    return FileSystemExerciser


@pytest.mark.timeout(900)
def test_fsx(mounted):
    for d in DIRS:
        os.mkdir(os.path.join(mounted.mnt, d))
    stats: collections.Counter = collections.Counter()
    with mounted.client() as client:
        machine = make_machine(mounted.mnt, client, stats)
        # The first round is derandomized (the same run every time); where hypothesis ended
        # enough examples early that it fell short of OPERATIONS, random rounds top it up
        # (a failure there still prints the steps that made it).
        derandomize = True
        while stats["steps"] - stats["examples"] < OPERATIONS and stats["rounds"] < 4:
            stats["rounds"] += 1
            run_state_machine_as_test(machine, settings=settings(
                max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None,
                derandomize=derandomize, database=None, phases=PHASES, print_blob=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much]))
            derandomize = False
    print("fsx:", dict(sorted(stats.items())))

    # The run must have exercised what it is for (a change to the strategies that stopped
    # reaching these would otherwise pass silently). The invariant that counts steps also
    # runs once after each example's initialize.
    operations = stats["steps"] - stats["examples"]
    assert operations >= OPERATIONS, f"only {operations} operations ran"
    for what in ("write past EOF (hole)", "write growing past a granule", "truncate grow",
                 "truncate shrink", "rename over an existing file", "rename across directories",
                 "rename over an open file", "unlink of an open file",
                 "read_fd on unlinked file", "write_fd on unlinked file",
                 "compare_fd on unlinked file", "append", "ftruncate", "mmap_read",
                 "mmap_read on unlinked file", "mmap_write on unlinked file",
                 "mmap_write checked through the socket", "mmap_write: msync",
                 "mmap_write: munmap", "mmap_write: close then munmap", "mmap_write: fsync",
                 "symlink", "read_through_link", "read_through_link: dangling", "unlink_link",
                 "link", "link across directories", "link: EEXIST",
                 "unlink of one name of several",
                 "check_nlink: hard-linked", "rename onto another name of the same file"):
        assert stats[what] > 0, f"the run never did: {what}"
