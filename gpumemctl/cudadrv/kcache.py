"""An on-disk cache of compiled kernels, checked before anything in it is loaded: the
daemon's ECC kernels (daemon/ecc/gpu.py, in its state directory) and the client's block-hash
kernel of snapshots (gpumemctl/snapshots/gpuhash.py, in the caller's `~/.cache/gpumemctl`).

A cached cubin (or PTX) is code the process loads into the GPU and runs over memory (the
daemon's: every allocation's): a file another user planted or changed there would run as its
kernels. So (below, "the daemon" is whichever process uses the cache):
- The directory is used only if it is a real directory (not a symlink), owned by the
  daemon's effective uid, and writable by nobody else (no group or other write bit); it is
  made 0700 when missing. Otherwise the cache is not used at all (compiled each start, one
  warning). Everything after the check goes through the directory's descriptor, so the
  path cannot be swapped in between.
- A cache file is read only if it is a regular file (O_NOFOLLOW: no symlink), owned by the
  daemon's uid, writable by nobody else, with one link.
- A file holds a header line and the image. The header names the cache key (SHA-256 of the
  source and the compile options, the architecture among them), the architecture, the
  compiler that made it (NVRTC's version, for the record), the image's size and its SHA-256.
  A file whose header does not name the key asked for, or whose image does not match its
  size and SHA-256 (a torn write, a disk error, a file copied under another name), is not
  loaded: the kernels are compiled again and the file replaced. The checksum sits beside
  the image, so it proves integrity only together with the ownership checks above, which
  keep every other user from writing either.
- Files are written atomically: a new name made with O_EXCL, then renamed over the old one.
The compiler's version is recorded, not part of the key: a cubin stays valid for its
architecture whichever NVRTC made it, and a warm cache must load without libnvrtc
(daemon/ecc/gpu.py).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
import stat

log = logging.getLogger(__name__)

MAGIC = b"gpumemd-ecc-kernel 1 "          # then the JSON header and a newline, then the image
ECC = "ECC kernel cache"                    # what a cache is called in its log lines
HEADER_LIMIT = 4096
GROUP_OTHER_WRITE = stat.S_IWGRP | stat.S_IWOTH


class KernelCache:
    """One cache directory, opened and checked; `usable` is False when it may not be used."""

    def __init__(self, path: str, what: str = ECC):
        self.path, self.what = path, what
        self.fd: int | None = _open_dir(path, what)

    @property
    def usable(self) -> bool:
        return self.fd is not None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> KernelCache:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def load(self, name: str, key: str, arch: str) -> bytes | None:
        """The image cached under `name` for `key` and `arch`, checked; None when there is
        none or it does not pass (logged)."""
        if self.fd is None:
            return None
        where = os.path.join(self.path, name)
        try:
            raw = self._read(name)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("%s %s not used (%s): compiling", self.what, where, exc)
            return None
        image, why = _verified(raw, key, arch)
        if image is None:
            log.warning("%s %s not used: %s; compiling it again", self.what, where, why)
        return image

    def store(self, name: str, image: bytes, key: str, arch: str, compiler: str) -> None:
        """Write `image` under `name` atomically; a cache that cannot be written is only a
        warning (the daemon compiles again next start)."""
        if self.fd is None:
            return
        header = {"key": key, "arch": arch, "compiler": compiler, "size": len(image),
                  "sha256": hashlib.sha256(image).hexdigest()}
        data = MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n" + image
        tmp = f".tmp-{secrets.token_hex(8)}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600, dir_fd=self.fd)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=self.fd)
                raise
        except OSError as exc:
            log.warning("cannot write the %s %s: %s", self.what, self.path, exc)

    def _read(self, name: str) -> bytes:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                     dir_fd=self.fd)
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise ValueError("not a regular file")
            if st.st_uid != os.geteuid() or st.st_mode & GROUP_OTHER_WRITE or st.st_nlink != 1:
                raise ValueError(f"owner {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}, "
                                 f"{st.st_nlink} links: only the daemon's uid may write it")
            return f.read()


def _open_dir(path: str, what: str) -> int | None:
    """The cache directory's descriptor, made 0700 if missing; None (logged) when it is not
    the daemon's own: a symlink, another owner, or writable by group or others."""
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        log.warning("%s %s cannot be used (%s): kernels are compiled each time", what, path,
                    exc)
        return None
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & GROUP_OTHER_WRITE:
        os.close(fd)
        log.warning("%s %s is not used: owner %d, mode %04o; it must belong to uid %d and "
                    "be writable by nobody else (kernels are compiled each time)", what, path,
                    st.st_uid, stat.S_IMODE(st.st_mode), os.geteuid())
        return None
    return fd


def _verified(raw: bytes, key: str, arch: str) -> tuple[bytes | None, str]:
    """(the image, "") when `raw` is a cache file for `key` and `arch` whose image matches
    its size and SHA-256; else (None, why)."""
    if not raw.startswith(MAGIC):
        return None, "not a cache file of this version"
    end = raw.find(b"\n", len(MAGIC), len(MAGIC) + HEADER_LIMIT)
    if end < 0:
        return None, "no header"
    try:
        header = json.loads(raw[len(MAGIC):end])
    except ValueError:
        return None, "a header that is not JSON"
    image = raw[end + 1:]
    if not isinstance(header, dict) or header.get("key") != key or header.get("arch") != arch:
        return None, "made for other source, options or architecture"
    if header.get("size") != len(image) or \
            header.get("sha256") != hashlib.sha256(image).hexdigest():
        return None, "the image does not match its SHA-256"
    return image, ""
