"""Quotas through the mount: a write that would grow a file past its owner's quota fails
with EDQUOT, and what was written before stays (daemon/core/quotas.py, docs/config.md)."""
from __future__ import annotations

import errno
import os

import pytest

MiB = 1 << 20


def test_write_past_the_quota_is_edquot_and_keeps_the_data(mounted_factory, tmp_path):
    path = tmp_path / "gpumemd.toml"
    path.write_text(f'[quotas]\n{os.geteuid()} = "8M"\n')
    d = mounted_factory(extra_args=["--config", str(path)])
    d.cli("create", "other", "--size", "4M", check=True)     # 4 MiB of the 8 are taken
    chunks = [os.urandom(MiB) for _ in range(8)]
    f = os.path.join(d.mnt, "f")
    fd = os.open(f, os.O_WRONLY | os.O_CREAT, 0o600)
    written = 0
    try:
        with pytest.raises(OSError) as failure:
            for chunk in chunks:
                assert os.write(fd, chunk) == MiB
                written += 1
        os.fsync(fd)
    finally:
        os.close(fd)
    assert failure.value.errno in (errno.EDQUOT, errno.ENOSPC)
    assert failure.value.errno == errno.EDQUOT           # the precise one (errno_map.py)
    assert written == 4                                  # 4 + 4 MiB: the quota exactly
    with open(f, "rb") as back:
        assert back.read() == b"".join(chunks[:written])
    # Growing with truncate(2) is refused the same way; the size stays.
    with pytest.raises(OSError) as failure:
        os.truncate(f, 6 * MiB)
    assert failure.value.errno == errno.EDQUOT
    assert os.stat(f).st_size == 4 * MiB
    assert d.cli_json("info", "f")["size"] == 4 * MiB


def test_chown_to_a_uid_over_its_quota_is_edquot(mounted_factory, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("chown to another uid needs root")
    path = tmp_path / "gpumemd.toml"
    path.write_text('[quotas]\n4242 = "2M"\n')
    d = mounted_factory(extra_args=["--config", str(path)])
    d.cli("create", "small", "--size", "2M", check=True)
    d.cli("create", "big", "--size", "3M", check=True)
    os.chown(os.path.join(d.mnt, "small"), 4242, -1)        # 2 MiB: exactly the quota
    with pytest.raises(OSError) as failure:
        os.chown(os.path.join(d.mnt, "big"), 4242, -1)
    assert failure.value.errno == errno.EDQUOT
    assert d.cli_json("info", "big")["uid"] == 0
    assert d.cli_json("info", "small")["uid"] == 4242
