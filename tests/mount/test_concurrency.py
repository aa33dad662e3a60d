"""Concurrent I/O on the mount: several threads of one process, each with its own
descriptors, against one daemon. Python's os.pread/os.pwrite release the GIL, so the kernel
has many FUSE requests in flight at once and the daemon serves them interleaved.

(a) 8 writers fill 8 distinct files (two directories, created concurrently) with their own
    random bytes, in 1 MiB and odd-sized chunks, sequentially, out of order (holes filled
    later) or with O_APPEND; then every byte of every file is checked, through the mount
    and through the socket API, and `gpumemctl ls --json` shows the sizes.
(b) 4 readers read one 8 MiB file at random offsets and lengths (two of them sharing a
    descriptor), each checking every byte it gets, while two `cat` processes stream it.
(c) A writer fills files one after another while readers check stable files and the prefix
    of the growing one, and `gpumemctl ls --json` runs in a loop: every listing succeeds,
    shows every file, exact sizes for files at rest, and sizes that never shrink nor
    overshoot for the file being written.
(d) 6 writers fill disjoint regions of one file in shuffled chunks, growing it (and so
    moving its memory) under each other.

All this asserts what a user sees: bytes, sizes, exit codes. The daemon logging a traceback
or an error fails the test (tests/conftest.py).
"""
from __future__ import annotations

import concurrent.futures
import os
import random
import subprocess
import threading
import time

KiB, MiB = 1 << 10, 1 << 20
CHUNKS = (MiB, 4097, MiB + 1, 65535, 333_333, MiB - 1, 7, 2 * MiB + 3)


def pattern(seed: int, size: int) -> bytes:
    """Bytes no other file or offset shares: a misplaced or crossed chunk cannot match."""
    return random.Random(seed).randbytes(size)


def chunks(size: int, first: int = 0) -> list[tuple[int, int]]:
    """(offset, length) pieces covering [0, size): 1 MiB and odd sizes, in turn."""
    out, offset, i = [], 0, first
    while offset < size:
        length = min(CHUNKS[i % len(CHUNKS)], size - offset)
        out.append((offset, length))
        offset, i = offset + length, i + 1
    return out


def run_threads(workers: list, timeout: float = 120) -> list:
    """Run callables on their own threads, all at once; re-raise the first failure."""
    with concurrent.futures.ThreadPoolExecutor(len(workers)) as pool:
        futures = [pool.submit(w) for w in workers]
        return [f.result(timeout=timeout) for f in futures]


def assert_same(got: bytes, want: bytes, what: str) -> None:
    if got == want:
        return
    for i, (x, y) in enumerate(zip(got, want, strict=False)):   # the common prefix
        if x != y:
            raise AssertionError(f"{what}: first difference at byte {i} of {len(want)}: got "
                                 f"{got[i:i + 16].hex()}, want {want[i:i + 16].hex()}")
    raise AssertionError(f"{what}: got {len(got)} bytes, want {len(want)}")


def read_all(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        parts = []
        while True:
            part = os.read(fd, 4 * MiB)
            if not part:
                return b"".join(parts)
            parts.append(part)
    finally:
        os.close(fd)


def write_file(path: str, mode: str, data: bytes, barrier: threading.Barrier, index: int):
    """Fill a new file with `data`: 'seq' (write(2) in turn), 'shuffled' (pwrite in a random
    order: the file has holes until the last chunk lands) or 'append' (O_APPEND)."""
    flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | (os.O_APPEND if mode == "append" else 0)
    pieces = chunks(len(data), first=index)
    if mode == "shuffled":
        random.Random(index).shuffle(pieces)
    barrier.wait()
    fd = os.open(path, flags, 0o644)
    try:
        for offset, length in pieces:
            view = memoryview(data)[offset:offset + length]
            if mode == "shuffled":
                written = os.pwrite(fd, view, offset)
            else:
                written = os.write(fd, view)
            assert written == length, f"{path}: wrote {written} of {length} at {offset}"
        assert os.fstat(fd).st_size == len(data)
    finally:
        os.close(fd)


# =========================================================================================
# (a) many writers, distinct files
# =========================================================================================
def test_concurrent_writers_distinct_files(mounted):
    mnt = mounted.mnt
    os.mkdir(os.path.join(mnt, "w"))
    names = [f"f{i}" if i % 2 else f"w/f{i}" for i in range(8)]
    sizes = [5 * MiB + 12_345 * i + i for i in range(8)]           # none a round number
    modes = ["seq", "shuffled", "append", "shuffled", "seq", "append", "shuffled", "seq"]
    datas = [pattern(1000 + i, size) for i, size in enumerate(sizes)]
    barrier = threading.Barrier(len(names))

    run_threads([
        (lambda i=i: write_file(os.path.join(mnt, names[i]), modes[i], datas[i], barrier, i))
        for i in range(len(names))])

    # Every byte, through the mount (readers in parallel too) ...
    def verify(i: int) -> None:
        path = os.path.join(mnt, names[i])
        assert os.stat(path).st_size == sizes[i], names[i]
        assert_same(read_all(path), datas[i], f"{names[i]} ({modes[i]}) via the mount")
    run_threads([lambda i=i: verify(i) for i in range(len(names))])

    # ... through the socket API, which reads the same memory without the kernel ...
    with mounted.client() as client:
        for name, data in zip(names, datas, strict=True):
            assert_same(client.read(name), data, f"{name} via the socket API")

    # ... and as `gpumemctl ls` shows them.
    listed = {e["path"]: e for e in mounted.cli_json("ls", "-R")}
    for name, size in zip(names, sizes, strict=True):
        entry = listed[name]
        assert (entry["type"], entry["size"], entry["state"]) == ("allocation", size, "ready")
        assert entry["capacity"] >= size
    assert sorted(p for p, e in listed.items() if e["type"] == "allocation") == sorted(names)


# =========================================================================================
# (b) many readers, one file
# =========================================================================================
def test_concurrent_readers_one_file(mounted):
    size = 8 * MiB
    data = pattern(7, size)
    path = os.path.join(mounted.mnt, "big")
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    try:
        assert os.write(fd, data) == size
    finally:
        os.close(fd)

    shared = os.open(path, os.O_RDONLY)        # readers 0 and 1 share this descriptor
    lengths = (1, 4095, 4096, 65536, MiB, MiB + 17, 3 * MiB)
    reads_each = 300
    barrier = threading.Barrier(4)

    def reader(index: int) -> int:
        rng = random.Random(index)
        fd = shared if index < 2 else os.open(path, os.O_RDONLY)
        checked = 0
        try:
            barrier.wait()
            for _ in range(reads_each):
                length = rng.choice(lengths) if rng.random() < 0.5 else rng.randint(1, 2 * MiB)
                offset = rng.randint(0, size + 4096)       # now and then past the end
                got = os.pread(fd, length, offset)
                assert_same(got, data[offset:offset + length],
                            f"reader {index}: pread({length}, {offset})")
                checked += len(got)
            assert os.fstat(fd).st_size == size
        finally:
            if fd != shared:
                os.close(fd)
        return checked

    # Two other processes stream the whole file meanwhile (cat: sequential 128 KiB reads).
    cats = [subprocess.Popen(["cat", path], stdout=subprocess.PIPE) for _ in range(2)]
    try:
        checked = run_threads([lambda i=i: reader(i) for i in range(4)] +
                              [lambda c=c: c.communicate(timeout=60)[0] for c in cats])
    finally:
        os.close(shared)
        for c in cats:
            c.kill()
            c.wait()
    assert all(checked[:4]), checked[:4]
    for c, out in zip(cats, checked[4:], strict=True):
        assert c.returncode == 0
        assert_same(out, data, "cat of big")
    # Reading changed nothing.
    assert_same(read_all(path), data, "big after the readers")
    assert mounted.cli_json("ls", "big")[0]["size"] == size


# =========================================================================================
# (c) readers and a writer on different files, `gpumemctl ls --json` in a loop
# =========================================================================================
def test_readers_writer_and_ls_loop(mounted):
    mnt = mounted.mnt
    os.mkdir(os.path.join(mnt, "in"))
    stable = {"s0": pattern(20, 3 * MiB + 5), "in/s1": pattern(21, 4 * MiB - 3)}
    for name, data in stable.items():
        fd = os.open(os.path.join(mnt, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        try:
            assert os.write(fd, data) == len(data)
        finally:
            os.close(fd)

    # The writer fills in/g0, in/g1, ... one after another, until the ls loop has seen it
    # at work for a while (at least MIN_LISTINGS listings, and at least MIN_FILES files).
    MIN_LISTINGS, MIN_FILES, MAX_FILES = 6, 3, 32
    grow_size = 6 * MiB + 1001
    grown: dict[int, bytes] = {}             # k -> the bytes of in/g<k>
    finished_at: dict[str, float] = {}       # name -> monotonic time its writer closed it
    completed: dict[str, int] = {}           # name -> the end of its last write(2) returned
    started: list[str] = []
    listings = 0
    writer_done = threading.Event()
    stop = threading.Event()

    def writer() -> None:
        try:
            for k in range(MAX_FILES):
                if k >= MIN_FILES and listings >= MIN_LISTINGS:
                    break
                name = f"in/g{k}"
                grown[k] = pattern(100 + k, grow_size)
                started.append(name)
                fd = os.open(os.path.join(mnt, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY,
                             0o644)
                try:
                    for offset, length in chunks(grow_size, first=k):
                        view = memoryview(grown[k])[offset:offset + length]
                        assert os.write(fd, view) == length
                        completed[name] = offset + length
                finally:
                    os.close(fd)
                finished_at[name] = time.monotonic()
        finally:
            writer_done.set()

    def stable_reader(index: int) -> int:
        rng, count = random.Random(50 + index), 0
        fds = {n: os.open(os.path.join(mnt, n), os.O_RDONLY) for n in stable}
        try:
            while not stop.is_set() or count < 20:
                name = rng.choice(sorted(stable))
                data = stable[name]
                offset = rng.randint(0, len(data))
                length = rng.choice((1, 4096, MiB, rng.randint(1, 2 * MiB)))
                got = os.pread(fds[name], length, offset)
                assert_same(got, data[offset:offset + length],
                            f"reader {index}: {name} pread({length}, {offset})")
                count += 1
        finally:
            for fd in fds.values():
                os.close(fd)
        return count

    def growing_reader() -> int:
        """A read sees at least every write(2) that returned before it began, and the
        bytes it sees are the writer's. (Not st_size: a fstat during a write(2) may show
        the size the daemon has already, before the kernel's page cache takes it when that
        write returns: docs/mount.md, "Consistency".)"""
        count = 0
        while not stop.is_set():
            if not started:
                time.sleep(0.001)
                continue
            name = started[-1]
            k = int(name.rsplit("g", 1)[1])
            try:
                fd = os.open(os.path.join(mnt, name), os.O_RDONLY)
            except FileNotFoundError:        # listed in `started` a moment before creation
                continue
            try:
                floor = completed.get(name, 0)
                got = os.pread(fd, grow_size + MiB, 0)
            finally:
                os.close(fd)
            assert floor <= len(got) <= grow_size, (name, floor, len(got))
            assert_same(got, grown[k][:len(got)], f"{name}: prefix of {len(got)} bytes")
            count += 1
        return count

    def ls_loop() -> list[tuple[float, float, dict]]:
        nonlocal listings
        seen = []
        while not writer_done.is_set() or listings < MIN_LISTINGS:
            before = time.monotonic()
            # cli_json asserts exit status 0 and parses stdout as JSON.
            entries = {e["path"]: e for e in mounted.cli_json("ls", "-R")}
            seen.append((before, time.monotonic(), entries))
            listings += 1
        return seen

    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        futures = {
            "writer": pool.submit(writer),
            "reader 0": pool.submit(stable_reader, 0),
            "reader 1": pool.submit(stable_reader, 1),
            "growing reader": pool.submit(growing_reader),
        }
        try:
            seen = pool.submit(ls_loop).result(timeout=180)
            futures["writer"].result(timeout=60)
        finally:
            stop.set()
        counts = {what: f.result(timeout=60) for what, f in futures.items()}

    assert counts["reader 0"] and counts["reader 1"], counts
    assert len(seen) >= MIN_LISTINGS and len(started) >= MIN_FILES

    # Every listing: the stable files exactly; each file of the writer's once it exists,
    # its size never shrinking from one listing to the next and never past the final
    # size, and exact once its writer had closed it before the listing began.
    last_size: dict[str, int] = {}
    for before, after, entries in seen:
        assert entries["in"]["type"] == "directory"
        for name, data in stable.items():
            e = entries[name]
            assert (e["type"], e["size"], e["state"]) == ("allocation", len(data), "ready"), e
        for name in started:
            e = entries.get(name)
            if e is None:
                assert name not in last_size, f"{name} vanished from a listing"
                assert finished_at.get(name, after) >= before, f"{name} missing after close"
                continue
            assert e["type"] == "allocation" and e["state"] in ("pending", "ready"), e
            assert last_size.get(name, 0) <= e["size"] <= grow_size, (name, e["size"])
            if e["state"] == "ready":
                assert e["capacity"] >= e["size"]
            if finished_at.get(name, after) < before:
                assert e["size"] == grow_size, (name, e["size"])
            last_size[name] = e["size"]
        unknown = {p for p in entries if p not in stable and p not in started and p != "in"}
        assert not unknown, unknown

    # At rest: every file whole, every size exact.
    listed = {e["path"]: e for e in mounted.cli_json("ls", "-R")}
    for k, name in enumerate(started):
        assert listed[name]["size"] == grow_size
        assert_same(read_all(os.path.join(mnt, name)), grown[k], name)
    for name, data in stable.items():
        assert_same(read_all(os.path.join(mnt, name)), data, name)


# =========================================================================================
# (d) many writers, one file, disjoint ranges (the file grows and moves under them)
# =========================================================================================
def test_concurrent_writers_one_file_disjoint_ranges(mounted):
    """Six writers, each with its own descriptor, fill their own region (an odd size) of
    one file in shuffled chunks: writes past the end grow (and reallocate) the file while
    the others write below and above. Every byte must land where it was sent."""
    writers, region = 6, 3 * MiB + 12_345
    for round_ in range(3):
        path = os.path.join(mounted.mnt, f"shared{round_}")
        datas = [pattern(round_ * 100 + k, region) for k in range(writers)]
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        barrier = threading.Barrier(writers)

        # This round's values bound now, as the lambdas below bind k.
        def write_region(k: int, round_=round_, path=path, barrier=barrier, datas=datas) -> None:
            pieces = chunks(region, first=k)
            random.Random(round_ * 100 + k).shuffle(pieces)
            fd = os.open(path, os.O_WRONLY)
            try:
                barrier.wait()
                for offset, length in pieces:
                    view = memoryview(datas[k])[offset:offset + length]
                    assert os.pwrite(fd, view, k * region + offset) == length
            finally:
                os.close(fd)

        run_threads([lambda k=k: write_region(k) for k in range(writers)])
        assert os.stat(path).st_size == writers * region
        assert_same(read_all(path), b"".join(datas), f"{os.path.basename(path)}")
