"""The FUSE connection's init flags (issue 29; daemon/fs/initflags.py): the daemon's library
over libfuse interposes fuse_session_new under pyfuse3, so the flags libfuse asks the kernel
for are the daemon's to set and clear. What a user observes: the daemon's log names what was
asked for, and a read after a write through the page cache keeps the cached pages when
`auto_inval_data` is cleared (the daemon invalidates them itself when another path writes:
tests/mount/test_consistency.py passes either way)."""
from __future__ import annotations

import os

import pytest

from daemon.fs import initflags
from tests.harness import wait_for


def _asked(d) -> list[str]:
    wait_for(lambda: "FUSE init" in d.log(), what="the init flags logged")
    line = next(line for line in d.log().splitlines() if "FUSE init" in line)
    if "asked for" not in line:
        pytest.skip(f"init flags unavailable here: {line.split('INFO: ')[-1]}")
    return line.split("asked for ")[1].split(" ")[0].split(",")


def test_libfuse_defaults_are_asked_for_unless_told(mounted_factory):
    d = mounted_factory()
    assert "auto_inval_data" in _asked(d)


def test_a_cleared_flag_is_not_asked_for_and_a_set_one_is(mounted_factory):
    d = mounted_factory(env={"GPUMEMD_FUSE_INIT": "-auto_inval_data,+flock_locks"})
    asked = _asked(d)
    assert "auto_inval_data" not in asked and "flock_locks" in asked
    # The mount still works, and a socket write still shows through it (the daemon's own
    # invalidation: tests/mount/test_consistency.py has the rules).
    path = os.path.join(d.mnt, "f")
    with open(path, "wb") as f:
        f.write(b"a" * 8192)
    with open(path, "rb") as f:
        assert f.read() == b"a" * 8192
    d.cli("write", "f", "-", input=b"b" * 4096, check=True)
    with open(path, "rb") as f:
        assert f.read() == b"b" * 4096 + b"a" * 4096


def test_an_unknown_flag_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown FUSE init flag"):
        initflags.want(["no_such_flag"], [])


def test_a_bad_setting_names_what_is_allowed(monkeypatch):
    from daemon.fs.mount import init_flags_asked
    monkeypatch.setenv("GPUMEMD_FUSE_INIT", "-auto_inval_data, +splice_read")
    assert init_flags_asked() == (["splice_read"], ["auto_inval_data"])
    monkeypatch.setenv("GPUMEMD_FUSE_INIT", "auto_inval_data")
    with pytest.raises(ValueError, match=r"expected \+NAME or -NAME, NAME one of async_read"):
        init_flags_asked()
