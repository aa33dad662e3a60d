"""Real trees in the mount (issue 26, "The mount"): what a user does with a filesystem full of
small files, checked by what the user sees.

- `tar -xf` of a deterministic tree (TREE_FILES files, mostly 0-16 KiB, a few of 100 KiB to
  2 MiB, nested directories, some symlinks, a few modes) into the mount and into a directory
  under /tmp: both trees the same byte for byte (types, contents, sizes, modes, times,
  symlink targets); every file made durable (`user.gpu.durable`); gpumemd killed with
  SIGKILL and started again: the same tree, and `gpumemctl check` clean.
- `git clone` of a synthetic repository (GIT_FILES files over GIT_COMMITS commits, built
  locally with `git fast-import`) into the mount and into /tmp: the work trees the same,
  `git fsck` clean in the mount; everything made durable, kill -9, restart: `git status`
  clean, `git fsck` clean, `gpumemctl check` clean.

Sizes are set for the CI's 2 cores: 20,000 files in the tree (about 70 s on the 2-core VM),
5,000 files over 200 commits in the repository (about 25 s). GPUMEM_TREE_FILES,
GPUMEM_GIT_FILES and GPUMEM_GIT_COMMITS ask for more: issue 26's tree of 50,000 files took
177 s there, a repository of 20,000 files and 500 commits 88 s (bench/README.md, "Trees in
the mount", has each step's time).
"""
from __future__ import annotations

import hashlib
import io
import os
import random
import shutil
import stat
import subprocess
import tarfile
import time

import pytest

KiB, MiB = 1 << 10, 1 << 20
TREE_FILES = int(os.environ.get("GPUMEM_TREE_FILES", "20000"))
GIT_FILES = int(os.environ.get("GPUMEM_GIT_FILES", "5000"))
GIT_COMMITS = int(os.environ.get("GPUMEM_GIT_COMMITS", "200"))
HOST_CAPACITY = "4G"            # room for 50,000 files (the tree is sparse in memfd pages)
POOL = 8 * MiB                  # random bytes every file's contents are cut from
DURABLE = "user.gpu.durable"
MTIME = 1_700_000_000


def sh(argv: list[str], cwd: str | None = None, stdin: bytes | None = None,
       home: str = "/nonexistent", timeout: float = 600) -> str:
    """Run a command; it must exit 0. Its stdout. git reads no configuration but the
    repository's (HOME is `home`, no system file)."""
    proc = subprocess.run(argv, cwd=cwd, input=stdin, capture_output=True, timeout=timeout,
                          env={**os.environ, "LC_ALL": "C", "GIT_CONFIG_NOSYSTEM": "1",
                               "HOME": home})
    out, err = (x.decode(errors="replace") for x in (proc.stdout, proc.stderr))
    assert proc.returncode == 0, f"{' '.join(argv)}: exit {proc.returncode}\n" \
        f"{err[-3000:]}\n{out[-2000:]}"
    return out


# ---- the tree ----------------------------------------------------------------------------------
def file_size(rng: random.Random) -> int:
    """Mostly small (0-16 KiB, most under 4 KiB, some empty), about 1 in 250 of 100 KiB to
    2 MiB (log-uniform)."""
    r = rng.random()
    if r < 0.004:
        return int(100 * KiB * (20.48 ** rng.random()))
    if r < 0.05:
        return 0
    return int(16 * KiB * rng.random() ** 2.5)


def tree_entries(n: int, seed: int = 26):
    """(kind, path, mode, size or target) of a deterministic tree of `n` files: about 40
    files a directory, directories nested 1-4 deep, a symlink for every 200 files (relative,
    to files and directories, some dangling, some absolute)."""
    rng = random.Random(seed)
    dirs = ["src"]
    entries = [("dir", "src", 0o755, None)]
    files: list[str] = []
    for i in range(n):
        if i % 40 == 0 and i:
            parent = rng.choice(dirs[-50:]) if rng.random() < 0.7 else rng.choice(dirs)
            if parent.count("/") >= 4:
                parent = "src"
            d = f"{parent}/m{len(dirs):05d}"
            dirs.append(d)
            entries.append(("dir", d, 0o700 if rng.random() < 0.02 else 0o755, None))
        mode = rng.choice((0o644,) * 12 + (0o755, 0o600, 0o444, 0o640))
        path = f"{dirs[-1]}/f{i:06d}" + rng.choice(("", ".c", ".h", ".py", ".txt", ".json"))
        files.append(path)
        entries.append(("file", path, mode, file_size(rng)))
        if i % 200 == 199:
            base = dirs[-1]
            target = rng.choice([os.path.relpath(rng.choice(files), base),
                                 os.path.relpath(rng.choice(dirs), base),
                                 "no/such/file", "/etc/hostname"])
            entries.append(("link", f"{base}/l{i:06d}", 0o777, target))
    # Depth first, as `tar -c` writes a tree: tar sets each directory's time once it has
    # left the directory for good.
    return sorted(entries, key=lambda e: e[1].split("/"))


def write_tar(path: str, entries) -> int:
    """The tree as a tar archive at `path`; returns the bytes of file contents."""
    pool = random.Random(7).randbytes(POOL)
    rng = random.Random(8)
    total = 0
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for i, (kind, name, mode, arg) in enumerate(entries):
            info = tarfile.TarInfo(name)
            info.mode, info.mtime = mode, MTIME + i
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind == "link":
                info.type, info.linkname = tarfile.SYMTYPE, arg
                tar.addfile(info)
            else:
                start = rng.randrange(POOL - arg) if arg < POOL else 0
                info.size = arg
                tar.addfile(info, io.BytesIO(pool[start:start + arg]))
                total += arg
    return total


def manifest(root: str, times: bool = True, skip: str | None = None) -> dict:
    """What a user sees of every entry below `root`: type, mode, uid, gid, and for a file its
    size and sha256, for a symlink its target; with `times`, the modification times of files
    and directories. A directory named `skip` is left out."""
    out = {}
    for here, dirnames, filenames in os.walk(root):
        if skip in dirnames:
            dirnames.remove(skip)
        dirnames.sort()
        for name in dirnames + sorted(filenames):
            path = os.path.join(here, name)
            st = os.lstat(path)
            rel = os.path.relpath(path, root)
            entry = [stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid]
            if stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    data = f.read()
                entry += [st.st_size, len(data), hashlib.sha256(data).hexdigest()]
            elif stat.S_ISLNK(st.st_mode):
                entry.append(os.readlink(path))
            if times and not stat.S_ISLNK(st.st_mode):
                entry.append(st.st_mtime_ns)
            out[rel] = tuple(entry)
    return out


def same_trees(got: dict, want: dict) -> None:
    """Assert equality with a readable account of the first differences."""
    if got == want:
        return
    missing = sorted(set(want) - set(got))[:10]
    extra = sorted(set(got) - set(want))[:10]
    differ = [(k, got[k], want[k]) for k in sorted(set(got) & set(want))
              if got[k] != want[k]][:10]
    raise AssertionError(f"{len(want)} entries wanted, {len(got)} found; missing {missing}; "
                         f"extra {extra}; different (got, wanted) {differ}")


def make_durable(root: str) -> int:
    """Mark every regular file below `root` durable, as a user would (setfattr); how many."""
    n = 0
    for here, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(here, name)
            if stat.S_ISREG(os.lstat(path).st_mode):
                os.setxattr(path, DURABLE, b"true")
                n += 1
    return n


def check_clean(d) -> None:
    """`gpumemctl check`: exit 0, and nothing found."""
    result = d.cli_json("check")
    assert result["clean"] is True, result


class Phases:
    """Wall time of each step, printed when the test passes (pytest -s shows it)."""

    def __init__(self):
        self.t0 = self.last = time.monotonic()
        self.times: list[tuple[str, float]] = []

    def __call__(self, what: str) -> None:
        now = time.monotonic()
        self.times.append((what, now - self.last))
        self.last = now

    def __str__(self) -> str:
        steps = ", ".join(f"{w} {s:.1f} s" for w, s in self.times)
        return f"{steps}; total {time.monotonic() - self.t0:.1f} s"


@pytest.fixture
def big_mount(mounted_factory):
    return mounted_factory(extra_args=["--host-capacity", HOST_CAPACITY])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_tar_tree_same_as_tmp_and_after_kill9(big_mount, tmp_path):
    phase = Phases()
    archive = str(tmp_path / "tree.tar")
    write_tar(archive, tree_entries(TREE_FILES))
    baseline = tmp_path / "baseline"
    baseline.mkdir()
    sh(["tar", "-xf", archive, "-C", str(baseline)])
    want = manifest(str(baseline))
    assert sum(1 for e in want.values() if stat.S_ISREG(e[0])) == TREE_FILES
    phase("archive and /tmp")

    mnt = big_mount.mnt
    sh(["tar", "-xf", archive, "-C", mnt])
    phase("tar -xf into the mount")
    same_trees(manifest(mnt), want)
    phase("compare")
    assert make_durable(mnt) == TREE_FILES
    phase("durable")
    big_mount.restart(hard=True)
    phase("kill -9, restart")
    same_trees(manifest(mnt), want)
    phase("compare")
    check_clean(big_mount)
    phase("check")
    print(f"tree of {TREE_FILES} files: {phase}")


# ---- the git repository ------------------------------------------------------------------------
WORDS = [w.encode() for w in (
    "static int void return struct const char unsigned if else for while size_t break "
    "self def import from class None True False value index buffer device memory alloc "
    "parity block slab arena extent offset length error status result").split()]


def source_text(rng: random.Random, size: int) -> bytes:
    """About `size` bytes of text lines made of WORDS (compresses as source code does)."""
    out, n = [], 0
    while n < size:
        line = b" " * rng.choice((0, 4, 8)) + b" ".join(rng.choices(WORDS, k=rng.randint(1, 12)))
        out.append(line)
        n += len(line) + 1
    return b"\n".join(out)[:size] + b"\n" if size else b""


def fast_import_stream(files: int, commits: int, seed: int = 126) -> bytes:
    """A `git fast-import` stream: `commits` commits on main; the first adds a third of the
    files, each later one adds its share of the rest, changes about 20 files and deletes 2
    (so the history holds more blobs than the last tree); a few executables and symlinks."""
    rng = random.Random(seed)
    out = io.BytesIO()
    mark = 0
    paths: list[str] = []
    dirs = [f"lib/p{i:02d}/m{j:02d}" for i in range(20) for j in range(rng.randint(1, 8))]

    def blob(data: bytes) -> int:
        nonlocal mark
        mark += 1
        out.write(b"blob\nmark :%d\ndata %d\n%s\n" % (mark, len(data), data))
        return mark

    def new_file() -> bytes:
        path = f"{rng.choice(dirs)}/s{len(paths):05d}" + rng.choice((".c", ".h", ".py", ".md"))
        paths.append(path)
        size = int(200 * KiB * rng.random()) if rng.random() < 0.01 else \
            int(16 * KiB * rng.random() ** 2)
        mode = b"100755" if rng.random() < 0.03 else b"100644"
        return b"M %s :%d %s\n" % (mode, blob(source_text(rng, size)), path.encode())

    live: set[str] = set()
    first, previous = files // 3, 0
    for c in range(commits):
        ops = []
        adds = first if c == 0 else (files - first) // (commits - 1) + \
            (1 if c <= (files - first) % (commits - 1) else 0)
        ops += [new_file() for _ in range(adds)]
        live.update(paths[-adds:] if adds else [])
        if c:
            for path in rng.sample(sorted(live), min(20, len(live))):
                ops.append(b"M 100644 :%d %s\n" % (blob(source_text(rng, rng.randint(0, 8 * KiB))),
                                                  path.encode()))
            for path in rng.sample(sorted(live), 2):
                live.discard(path)
                ops.append(b"D %s\n" % path.encode())
                ops.append(new_file())
                live.add(paths[-1])
        if c % 50 == 1:
            target = os.path.relpath(rng.choice(sorted(live)), "links").encode()
            ops.append(b"M 120000 :%d links/l%04d\n" % (blob(target), c))
        mark += 1
        message = b"commit %d" % c
        out.write(b"commit refs/heads/main\nmark :%d\n" % mark)
        out.write(b"author t <t@example.com> %d +0000\n" % (MTIME + c))
        out.write(b"committer t <t@example.com> %d +0000\n" % (MTIME + c))
        out.write(b"data %d\n%s\n" % (len(message), message))
        if c:
            out.write(b"from :%d\n" % previous)
        out.writelines(ops)
        out.write(b"\n")
        previous = mark
    return out.getvalue()


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(not shutil.which("git"), reason="git is not installed")
def test_git_clone_same_as_tmp_and_after_kill9(big_mount, tmp_path):
    phase = Phases()
    home = str(tmp_path)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com",
           "-c", "init.defaultBranch=main", "-c", "advice.detachedHead=false"]
    source = str(tmp_path / "source")
    sh([*git, "init", "-q", source], home=home)
    sh([*git, "fast-import", "--quiet"], cwd=source, home=home,
       stdin=fast_import_stream(GIT_FILES, GIT_COMMITS))
    url = "file://" + source               # the pack protocol, as a clone over the network
    baseline = str(tmp_path / "clone")
    sh([*git, "clone", "-q", url, baseline], home=home)
    want = manifest(baseline, times=False, skip=".git")
    assert len([e for e in want.values() if stat.S_ISREG(e[0])]) >= GIT_FILES
    phase("repository and /tmp clone")

    clone = os.path.join(big_mount.mnt, "clone")
    sh([*git, "clone", "-q", url, clone], home=home)
    phase("git clone into the mount")
    same_trees(manifest(clone, times=False, skip=".git"), want)
    sh([*git, "fsck", "--full", "--strict"], cwd=clone, home=home)
    assert sh([*git, "status", "--porcelain"], cwd=clone, home=home) == ""
    phase("compare, fsck, status")

    make_durable(big_mount.mnt)
    phase("durable")
    big_mount.restart(hard=True)
    phase("kill -9, restart")
    assert sh([*git, "status", "--porcelain"], cwd=clone, home=home) == ""
    assert sh([*git, "rev-list", "--count", "HEAD"], cwd=clone, home=home).strip() == \
        str(GIT_COMMITS)
    sh([*git, "fsck", "--full", "--strict"], cwd=clone, home=home)
    same_trees(manifest(clone, times=False, skip=".git"), want)
    phase("status, fsck, compare")
    check_clean(big_mount)
    phase("check")
    print(f"git clone of {GIT_FILES} files, {GIT_COMMITS} commits: {phase}")
