"""The NVRTC kernel cache is checked before anything in it is loaded (issue 14).

Before, gpumemd loaded whatever file lay at the cache path into the GPU: a changed or
planted cubin ran as the daemon's ECC kernels. Now (gpumemctl/cudadrv/kcache.py) a file is loaded
only from a directory that is the daemon's own and writable by nobody else, only if it is a
regular file of the daemon's uid, and only if its image matches the SHA-256 in its header;
otherwise the kernels are compiled again and the file replaced. No GPU needed: NVRTC is
replaced by a stand-in that returns known bytes."""
from __future__ import annotations

import logging
import os

import pytest

from daemon.ecc import gpu
from gpumemctl.cudadrv import kcache

IMAGE = b"\x7fELF a cubin, as NVRTC made it" * 100
CAPABILITY = (9, 0)


@pytest.fixture
def nvrtc(monkeypatch):
    """NVRTC's stand-in: counts compilations, returns IMAGE."""
    calls = []

    def compile_(source, name, options, *, cubin=True):
        calls.append(options)
        return IMAGE, ""
    monkeypatch.setattr(gpu.cudadrv, "nvrtc_compile", compile_)
    monkeypatch.setattr(gpu.cudadrv, "nvrtc_supported_archs", lambda: [80, 90])
    monkeypatch.setattr(gpu.cudadrv, "nvrtc_version", lambda: (12, 8))
    return calls


def cache_dir(tmp_path, mode=0o700) -> str:
    path = tmp_path / "ecc-cache"
    path.mkdir(mode=mode)
    os.chmod(path, mode)
    return str(path)


def test_a_warm_cache_is_used_and_the_file_says_what_it_holds(tmp_path, nvrtc):
    where = cache_dir(tmp_path)
    image, cached, path, arch = gpu.load_or_compile(CAPABILITY, where)
    assert (image, cached, arch) == (IMAGE, False, "sm_90") and len(nvrtc) == 1
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert open(path, "rb").read().startswith(kcache.MAGIC)
    assert b'"compiler": "nvrtc 12.8"' in open(path, "rb").read(1000)
    assert gpu.load_or_compile(CAPABILITY, where)[:2] == (IMAGE, True) and len(nvrtc) == 1
    assert [n for n in os.listdir(where) if n.startswith(".tmp-")] == []


def test_a_tampered_cubin_is_not_loaded_but_compiled_again(tmp_path, nvrtc, caplog):
    where = cache_dir(tmp_path)
    path = gpu.load_or_compile(CAPABILITY, where)[2]
    data = bytearray(open(path, "rb").read())
    data[-10:] = b"EVIL CODE!"                   # the image changed, the header kept
    open(path, "wb").write(bytes(data))
    with caplog.at_level(logging.WARNING):
        image, cached, _, _ = gpu.load_or_compile(CAPABILITY, where)
    assert (image, cached) == (IMAGE, False) and len(nvrtc) == 2
    assert "does not match its SHA-256" in caplog.text
    assert open(path, "rb").read().endswith(IMAGE)          # replaced
    assert gpu.load_or_compile(CAPABILITY, where)[1] is True


@pytest.mark.parametrize("plant", ["bare image", "other key", "symlink", "group-writable"])
def test_a_planted_file_is_not_loaded(tmp_path, nvrtc, plant):
    where = cache_dir(tmp_path)
    name, key = gpu.cache_name(gpu.read_source(), "sm_90", True)
    path = os.path.join(where, name)
    evil = b"\x7fELF the attacker's cubin"
    if plant == "bare image":                    # as the old cache stored them
        open(path, "wb").write(evil)
    elif plant == "other key":                   # a valid file, renamed to this key
        with kcache.KernelCache(where) as cache:
            cache.store(name, evil, "0" * 64, "sm_90", "nvrtc")
    elif plant == "symlink":
        with kcache.KernelCache(str(tmp_path / "elsewhere")) as cache:
            cache.store(name, evil, key, "sm_90", "nvrtc")
        os.symlink(tmp_path / "elsewhere" / name, path)
    else:
        with kcache.KernelCache(where) as cache:
            cache.store(name, evil, key, "sm_90", "nvrtc")
        os.chmod(path, 0o664)
    image, cached, _, _ = gpu.load_or_compile(CAPABILITY, where)
    assert (image, cached) == (IMAGE, False) and len(nvrtc) == 1


def test_a_cache_directory_others_may_write_is_not_used(tmp_path, nvrtc, caplog):
    where = cache_dir(tmp_path, mode=0o777)
    name, key = gpu.cache_name(gpu.read_source(), "sm_90", True)
    os.chmod(where, 0o700)
    with kcache.KernelCache(where) as cache:     # a file that would pass every other check
        cache.store(name, b"planted by another user", key, "sm_90", "nvrtc")
    os.chmod(where, 0o777)
    with caplog.at_level(logging.WARNING):
        image, cached, _, _ = gpu.load_or_compile(CAPABILITY, where)
    assert (image, cached) == (IMAGE, False)
    assert f"is not used: owner {os.geteuid()}, mode 0777" in caplog.text
    assert sorted(os.listdir(where)) == [name]   # and nothing is written there either


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_a_cache_directory_of_another_user_is_not_used(tmp_path, nvrtc):
    where = cache_dir(tmp_path)
    os.chown(where, 65534, 65534)
    assert not kcache.KernelCache(where).usable
    assert gpu.load_or_compile(CAPABILITY, where)[1] is False


def test_a_symlinked_cache_directory_is_not_used(tmp_path, nvrtc):
    real = cache_dir(tmp_path)
    link = str(tmp_path / "link")
    os.symlink(real, link)
    assert not kcache.KernelCache(link).usable
    assert gpu.load_or_compile(CAPABILITY, link)[1] is False


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_roots_snapshot_never_loads_a_kernel_from_a_users_cache(tmp_path, monkeypatch):
    """`sudo -E gpumemctl snapshot create` keeps the user's XDG_CACHE_HOME: root's client
    would look for its block-hash kernel (gpumemctl/snapshots/gpuhash.py) in a directory the
    user owns. The same checks refuse it: nothing there is read, nothing written."""
    from gpumemctl.snapshots import gpuhash
    home = tmp_path / "user-cache"
    (home / "gpumemctl").mkdir(parents=True)
    planted = home / "gpumemctl" / "xxh3-sm_90-planted.cubin"
    planted.write_bytes(b"\x7fELF the user's cubin")
    for p in (home, home / "gpumemctl", planted):
        os.chown(p, 65534, 65534)
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    assert gpuhash.cache_dir() == str(home / "gpumemctl")
    with kcache.KernelCache(gpuhash.cache_dir(), gpuhash.WHAT) as cache:
        assert not cache.usable
        assert cache.load(planted.name, planted.name, "sm_90") is None
        cache.store("xxh3-new.cubin", b"root's", "k", "sm_90", "nvrtc")
    assert sorted(os.listdir(home / "gpumemctl")) == [planted.name]
