"""S3Store (gpumemctl/snapshots/s3.py) against a local S3 server (moto, started by
tests/integration/s3server.py): the DirStore interface (gpumemctl/snapshots/stores.py) on a
bucket, multipart uploads, ranged reads, and the errors a user sees."""
from __future__ import annotations

import os
import urllib.request
import uuid

import pytest

pytest.importorskip("obstore", reason="obstore is not installed (extra `snapshot`)")

import obstore

from gpumemctl.protocol import NotFound, PermissionDenied, UsageError
from gpumemctl.snapshots.manifest import SnapshotDamaged, data_key
from gpumemctl.snapshots.s3 import S3Store
from gpumemctl.snapshots.stores import open_store
from tests.integration.s3server import free_port, moto_s3

MiB = 1 << 20
SNAPS = ["snap-20261123T141500.123456Z-3fa9c1", "snap-20250101T000000.000000Z-000000",
         "snap-20261123T141500.123457Z-ffffff"]


@pytest.fixture(scope="module")
def server():
    with moto_s3() as s3:
        yield s3


@pytest.fixture
def s3(server, monkeypatch):
    """The server, with only its AWS_* variables in the environment."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    for name, value in server["env"].items():
        monkeypatch.setenv(name, value)
    return server


@pytest.fixture
def store(s3) -> S3Store:
    """A store under a prefix of its own, of several parts, with a trailing slash."""
    return S3Store(f"s3://{s3['bucket']}/t-{uuid.uuid4().hex[:12]}/deep/")


def pattern(n: int) -> bytes:
    return os.urandom(n)


def make_bucket(s3, name: str) -> None:
    request = urllib.request.Request(f"{s3['endpoint']}/{name}", method="PUT")
    urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=10)


def one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert text and "\n" not in text, text
    return text


def test_names_lists_snapshots_directly_under_the_prefix(s3, store):
    assert store.kind == "s3" and store.names() == []
    for name in SNAPS:
        store.put_atomic(f"{name}/manifest.json", b"{}")
        store.put_atomic(data_key(name, 0), b"x")
    for key in ("notes.txt", "snap-bad/manifest.json", "other/dir/x",
                f"nested/{SNAPS[0]}x/manifest.json", f"{SNAPS[0]}x/manifest.json"):
        store.put_atomic(key, b"unrelated")
    # A sibling prefix that shares the store's as a string is not under it.
    sibling = S3Store(store.location.rstrip("/") + "-sibling")
    sibling.put_atomic("snap-20200101T000000.000000Z-aaaaaa/manifest.json", b"{}")
    assert store.names() == sorted(SNAPS)
    assert sibling.names() == ["snap-20200101T000000.000000Z-aaaaaa"]
    assert open_store(store.location).names() == sorted(SNAPS)


def test_store_at_the_bucket_root(s3):
    make_bucket(s3, "rootbucket")
    for location in ("s3://rootbucket", "s3://rootbucket/"):
        root = S3Store(location)
        assert root.location == location and root.where("a/b") == "s3://rootbucket/a/b"
    root.put_atomic(f"{SNAPS[1]}/manifest.json", b"{}")
    root.put_atomic("deeper/" + f"{SNAPS[0]}/manifest.json", b"{}")
    assert root.names() == [SNAPS[1]]
    assert root.keys(SNAPS[1]) == [f"{SNAPS[1]}/manifest.json"]


def test_put_atomic_and_read(store):
    key = f"{SNAPS[0]}/manifest.json"
    assert store.read(key, 1 << 20) is None
    assert store.object_size(key) is None
    store.begin(SNAPS[0])                         # nothing to create; harmless
    store.put_atomic(key, b'{"first": 1}\n')
    assert store.read(key, 1 << 20) == b'{"first": 1}\n'
    store.put_atomic(key, b"second" * 1000)       # replaced whole
    assert store.read(key, 1 << 20) == b"second" * 1000
    assert store.read(key, 9) == b"secondseco"    # at most limit + 1 bytes
    assert store.object_size(key) == 6000
    store.sync_dir(SNAPS[0])
    store.sync_dir()
    store.put_atomic(f"{SNAPS[0]}/lock.json", b"")
    assert store.read(f"{SNAPS[0]}/lock.json", 100) == b""
    assert store.object_size(f"{SNAPS[0]}/lock.json") == 0


def test_multipart_write_then_ranged_reads(store):
    store.part_size = 5 * MiB                     # S3's smallest part: several parts here
    key = data_key(SNAPS[0], 7)
    sizes = [3 * MiB + 7, 6 * MiB + 1, 1, 9 * MiB - 3, 123_457]
    chunks = [pattern(n) for n in sizes]
    staging = bytearray(max(sizes))
    w = store.writer(key)
    for chunk in chunks:
        staging[:len(chunk)] = chunk
        w.write(memoryview(staging)[:len(chunk)])
        staging[:] = b"\xee" * len(staging)       # the caller reuses its buffer at once
    assert store.object_size(key) is None         # not visible before commit
    w.commit()
    data = b"".join(chunks)
    total = len(data)
    assert total > 16 * MiB and store.object_size(key) == total
    etag = obstore.head(store._s, key)["e_tag"] or ""
    assert etag.rstrip('"').endswith(f"-{-(-total // store.part_size)}"), etag  # multipart
    assert store.keys(SNAPS[0]) == [key]

    r = store.reader(key)
    assert r.size == total
    ends = [sum(sizes[:i + 1]) for i in range(len(sizes))]
    ranges = [(0, 100), (0, total), (total - 1, 1), (ends[0] - 10, 20),     # across 1 write
              (ends[0] - 5, sizes[1] + 10),                                 # across 3 writes
              (ends[2] - 1, 2), (5 * MiB - 3, 6), (12_345, 17 * MiB + 3),   # parts, pieces
              (ends[3], total - ends[3]), (total, 0)]
    for offset, length in ranges:
        view = memoryview(bytearray(length))
        r.read_into(offset, view)
        assert view.tobytes() == data[offset:offset + length], (offset, length)
    with pytest.raises(SnapshotDamaged, match=key):
        r.read_into(total - 10, memoryview(bytearray(11)))
    r.close()


def test_small_and_empty_objects_through_the_writer(store):
    small, empty = data_key(SNAPS[0], 0), data_key(SNAPS[0], 1)
    w = store.writer(small)
    w.write(memoryview(b"abc"))
    w.write(memoryview(b""))
    w.write(memoryview(bytearray(b"defg")))
    w.commit()
    w.abort()                                     # after commit: nothing to undo
    assert store.read(small, 100) == b"abcdefg"
    w = store.writer(empty)
    w.commit()
    assert store.object_size(empty) == 0
    r = store.reader(empty)
    assert r.size == 0
    r.read_into(0, memoryview(bytearray(0)))
    with pytest.raises(SnapshotDamaged, match=empty):
        r.read_into(0, memoryview(bytearray(1)))


def test_short_or_missing_object_is_damaged(store):
    key = data_key(SNAPS[1], 3)
    with pytest.raises(SnapshotDamaged, match=f"{key} is missing"):
        store.reader(key)
    store.put_atomic(key, b"z" * 1000)
    r = store.reader(key)
    with pytest.raises(SnapshotDamaged, match=f"{key} ends at 1000 bytes, before 1500"):
        r.read_into(500, memoryview(bytearray(1000)))
    # Replaced by a shorter one, or deleted, after the reader learnt its size.
    store.put_atomic(key, pattern(3 * MiB))
    r = store.reader(key)
    store.put_atomic(key, b"short" * 200)
    with pytest.raises(SnapshotDamaged, match=key):
        r.read_into(0, memoryview(bytearray(2 * MiB)))        # a short answer
    with pytest.raises(SnapshotDamaged, match=key):
        r.read_into(2 * MiB, memoryview(bytearray(1000)))     # past the end: HTTP 416
    store.delete(key)
    with pytest.raises(SnapshotDamaged, match=f"{key} is missing"):
        r.read_into(0, memoryview(bytearray(10)))


def in_progress_uploads(s3) -> list[str]:
    import boto3  # installed with moto; only to ask for multipart uploads

    client = boto3.client("s3", endpoint_url=s3["endpoint"], region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    return [u["Key"] for u in client.list_multipart_uploads(Bucket=s3["bucket"])
            .get("Uploads", [])]


def test_abort_leaves_nothing(s3, store):
    store.part_size = 5 * MiB
    big, small = data_key(SNAPS[2], 0), data_key(SNAPS[2], 1)
    w = store.writer(big)
    w.write(memoryview(pattern(12 * MiB)))     # two parts uploaded or uploading
    assert any(k.endswith(big) for k in in_progress_uploads(s3))
    w.abort()
    w.abort()                                     # twice: harmless
    w2 = store.writer(small)
    w2.write(memoryview(b"buffered, never sent"))
    w2.abort()
    assert store.keys(SNAPS[2]) == []
    assert store.object_size(big) is None and store.object_size(small) is None
    assert not any(k.endswith(big) for k in in_progress_uploads(s3))


def test_delete_keys_object_size_where(store):
    name, other = SNAPS[0], SNAPS[1]
    keys = [f"{name}/manifest.json", f"{name}/lock.json", data_key(name, 0), data_key(name, 10)]
    for i, key in enumerate(keys):
        store.put_atomic(key, b"k" * i)
    store.put_atomic(data_key(other, 0), b"other")
    assert store.keys(name) == sorted(keys)
    assert store.keys(other) == [data_key(other, 0)]
    assert store.keys("snap-20000101T000000.000000Z-000000") == []
    assert [store.object_size(k) for k in keys] == [0, 1, 2, 3]
    store.delete(f"{name}/lock.json")
    store.delete(f"{name}/lock.json")             # missing is fine
    store.delete("never/was")
    assert store.object_size(f"{name}/lock.json") is None
    assert store.keys(name) == sorted(set(keys) - {f"{name}/lock.json"})
    for key in store.keys(name):
        store.delete(key)
    store.finish_removal(name)
    assert store.keys(name) == [] and store.names() == [other]
    base = store.location.rstrip("/")
    assert store.where() == store.location
    assert store.where(data_key(name, 0)) == f"{base}/{data_key(name, 0)}"


def test_missing_bucket_is_not_found(s3):
    with pytest.raises(NotFound) as exc:
        S3Store("s3://no-such-bucket/some/prefix")
    text = one_line(exc)
    assert "s3://no-such-bucket/some/prefix" in text and "does not exist" in text, text
    with pytest.raises(NotFound):
        open_store("s3://no-such-bucket")


@pytest.mark.parametrize("location", ["s3://", "s3:///prefix", "s3://bucket//a",
                                      "s3://bucket/a/../b", "s3://bucket/./a",
                                      "s3://bu?cket/a", "s3://bucket/a%2Fb"])
def test_invalid_location_is_a_usage_error(s3, location):
    with pytest.raises(UsageError) as exc:
        S3Store(location)
    assert repr(location) in one_line(exc)


def test_unreachable_endpoint_is_one_line(s3, monkeypatch):
    port = free_port()                           # nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    with pytest.raises(UsageError) as exc:
        S3Store(f"s3://{s3['bucket']}/x")
    text = one_line(exc)
    assert f"s3://{s3['bucket']}/x" in text and f"cannot reach http://127.0.0.1:{port}" in text


def test_denied_access_is_permission_denied(monkeypatch):
    with moto_s3("locked", auth=True) as locked:  # moto checks keys: ours are unknown to it
        for name in list(os.environ):
            if name.startswith("AWS_"):
                monkeypatch.delenv(name)
        for name, value in locked["env"].items():
            monkeypatch.setenv(name, value)
        with pytest.raises(PermissionDenied) as exc:
            S3Store("s3://locked/p")
        text = one_line(exc)
        assert text.startswith("permission denied: ") and "s3://locked/p" in text, text


def test_obstore_is_loaded_for_s3_locations_only():
    import subprocess
    import sys

    code = ("import sys, gpumemctl.snapshots.stores as s; s.open_store('.'); "
            "assert 'obstore' not in sys.modules, 'obstore imported for a directory store'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
