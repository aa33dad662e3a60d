"""Snapshots in an S3-compatible bucket (AWS S3, MinIO, Ceph RGW, moto...), through obstore.

The same calls as DirStore (gpumemctl/snapshots/dirstore.py), for a location
`s3://bucket/prefix` (the prefix may be empty or have several parts; a trailing slash is
allowed). Keys are relative to the prefix: `snap-.../manifest.json` is the object
`prefix/snap-.../manifest.json` of the bucket.

Configuration comes from the environment, read by obstore's S3 builder (object_store's
`AmazonS3Builder::from_env`) each time a store is opened:

    AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY    static credentials
    AWS_SESSION_TOKEN (or AWS_TOKEN)            with temporary credentials
    AWS_REGION, else AWS_DEFAULT_REGION         the region (default us-east-1)
    AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL (or AWS_ENDPOINT)
                                                an S3-compatible server (MinIO, Ceph, moto...);
                                                plain http is allowed only when the endpoint
                                                URL in effect starts with http://
    AWS_VIRTUAL_HOSTED_STYLE_REQUEST            virtual-hosted requests (default: path style)
    AWS_WEB_IDENTITY_TOKEN_FILE + AWS_ROLE_ARN (+ AWS_ROLE_SESSION_NAME, AWS_STS_ENDPOINT)
                                                web identity (EKS IRSA)
    AWS_CONTAINER_CREDENTIALS_RELATIVE_URI / _FULL_URI (+ AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE)
                                                ECS/EKS container credentials
    AWS_METADATA_ENDPOINT, AWS_IMDSV1_FALLBACK  EC2 instance credentials, the last resort
    AWS_SKIP_SIGNATURE                          anonymous requests (public buckets)
    AWS_SERVER_SIDE_ENCRYPTION, AWS_SSE_KMS_KEY_ID, AWS_SSE_BUCKET_KEY_ENABLED,
    AWS_CHECKSUM_ALGORITHM, AWS_REQUEST_PAYER, AWS_UNSIGNED_PAYLOAD, AWS_S3_EXPRESS
                                                as their names say
    AWS_ALLOW_HTTP, AWS_ALLOW_INVALID_CERTIFICATES, AWS_CONNECT_TIMEOUT, AWS_TIMEOUT,
    AWS_PROXY_URL, AWS_PROXY_CA_CERTIFICATE, AWS_PROXY_EXCLUDES, AWS_USER_AGENT, ...
                                                HTTP client options (AWS_ + the option's name)

Any other AWS_* variable that names an obstore S3 option (obstore.store.S3Config) is honoured
too. Not honoured: AWS_PROFILE, ~/.aws/credentials and ~/.aws/config (object_store reads no
shared configuration files); the bucket comes from the location only (AWS_BUCKET is
overridden). One default differs from obstore's: a request may take AWS_TIMEOUT (default
here 120s, not 30s), as a part of a large upload is up to PART_SIZE bytes.

Large objects are written by multipart upload (parts of `part_size` bytes, `concurrency` in
flight) and read back by parallel ranged GETs. Whether an object exists (and its size) is
asked by HEAD; a manifest, or a data object read whole, comes by a GET without a range; a
server that answers a ranged GET with the whole object (obstore refuses that) is then read
by whole-object GETs, each sliced. An upload that is neither completed nor aborted
(a killed process) leaves parts that S3 keeps, invisible, until a lifecycle rule
(AbortIncompleteMultipartUpload) removes them: configure one on buckets used for snapshots.

obstore is imported here and in s3errors.py (its errors as ours) only: open_store() imports
this module for s3:// locations alone.
"""
from __future__ import annotations

import os
import re
from typing import Any

import obstore
from obstore.exceptions import BaseError
from obstore.store import S3Store as _ObStore

from ..protocol import UsageError
from .iopool import PIECE, io_pool
from .manifest import NAME_RE, SnapshotDamaged
from .s3errors import OBSTORE_ERRORS, Errors, http_status, missing

PART_SIZE = 32 << 20       # multipart part size: objects up to 10,000 parts = 312 GiB
CONCURRENCY = 16           # parts uploading at once (each a copy of PART_SIZE bytes in memory)
TIMEOUT = "120s"           # per HTTP request, unless AWS_TIMEOUT says otherwise
# HTTP client options obstore reads from AWS_<NAME> itself, unless client options are passed:
# then those replace the environment's. We pass some (allow_http, timeout), so we read these.
_CLIENT_KEYS = ("allow_http", "allow_invalid_certificates", "connect_timeout",
                "default_content_type", "http1_only", "http2_only",
                "http2_keep_alive_interval", "http2_keep_alive_timeout",
                "http2_keep_alive_while_idle", "http2_max_frame_size", "pool_idle_timeout",
                "pool_max_idle_per_host", "proxy_url", "proxy_ca_certificate", "proxy_excludes",
                "randomize_addresses", "read_timeout", "timeout", "user_agent")
_BUCKET_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")
# obstore's refusal of a 200 (the whole object) where it asked for a range (s3rver answers
# `bytes=0-0` so): the read is done again with a plain GET (S3Store.get_whole).
NOT_PARTIAL = "non-partial response when range requested"


def _client_options() -> dict[str, Any]:
    options: dict[str, Any] = {}
    for key in _CLIENT_KEYS:
        value = os.environ.get(f"AWS_{key.upper()}")
        if value is not None:
            options[key] = value
    endpoint = (os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
                or os.environ.get("AWS_ENDPOINT") or "")
    if endpoint.lower().startswith("http://"):
        options["allow_http"] = "true"
    options.setdefault("timeout", TIMEOUT)
    return options


def _parse(location: str) -> tuple[str, str]:
    """(bucket, prefix) of `s3://bucket/prefix`; UsageError for anything else."""
    rest = location[len("s3://"):] if location.startswith("s3://") else ""
    bucket, _, prefix = rest.partition("/")
    prefix = prefix.rstrip("/")
    parts = prefix.split("/") if prefix else []
    if (not _BUCKET_RE.fullmatch(bucket) or any(p in ("", ".", "..") for p in parts)
            or any(c in location for c in "\x00\\?#%")):
        raise UsageError(f"invalid snapshot location {location!r}: expected s3://bucket/prefix "
                         "(a bucket name, then path segments that are neither empty, '.' nor "
                         "'..')")
    return bucket, prefix


class _Aborted(Exception):
    """Passed to obstore's writer __exit__: an exception type there aborts the upload."""


# ---- the store -------------------------------------------------------------------------------
class S3Writer:
    """A data object uploaded in order: buffered into parts of `part_size` bytes, which upload
    `concurrency` at a time (multipart upload once more than one part is written; a single PUT
    at commit for a smaller object)."""

    def __init__(self, store: S3Store, key: str):
        self.store, self.key = store, key
        self.part = store.part_size
        self._w = obstore.open_writer(store._s, key, buffer_size=store.part_size,
                                      max_concurrency=store.concurrency)
        self._open = True

    def write(self, view: memoryview) -> None:
        """Returns once `view` may be reused: obstore's write keeps a reference to the buffer
        it is given until its part is uploaded, so each piece is copied first. Blocks while
        `concurrency` parts are uploading."""
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        with self.store._errors(f"cannot write {self.store.where(self.key)}"):
            for o in range(0, len(view), self.part):
                self._w.write(bytes(view[o:o + self.part]))

    def commit(self) -> None:
        """Complete the upload: the object appears whole, or not at all."""
        self._open = False
        with self.store._errors(f"cannot write {self.store.where(self.key)}"):
            self._w.close()

    def abort(self) -> None:
        """Abort the multipart upload (its parts are deleted); best effort, never raises."""
        if self._open:
            self._open = False
            try:
                self._w.__exit__(_Aborted, _Aborted("aborted"), None)
            except OBSTORE_ERRORS:
                pass        # the upload is left to the bucket's lifecycle rule


class S3Reader:
    """A data object read by byte range: parallel GETs of PIECE bytes on the I/O pool."""

    def __init__(self, store: S3Store, key: str):
        self.store, self.key = store, key
        with store._errors(f"cannot read {store.where(key)}"):
            try:
                meta = obstore.head(store._s, key)
            except FileNotFoundError as exc:
                if not missing(exc):
                    raise
                raise SnapshotDamaged(f"data object {key} is missing") from None
        self.size = int(meta["size"])

    def read_into(self, offset: int, view: memoryview) -> None:
        """Fill `view` with the bytes at `offset`; SnapshotDamaged where the object is short
        or gone."""
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        end = offset + len(view)
        if end > self.size:
            raise SnapshotDamaged(f"data object {self.key} ends at {self.size} bytes, before "
                                  f"{end}")
        pieces = [(view[o:o + PIECE], offset + o) for o in range(0, len(view), PIECE)]
        if len(pieces) == 1:
            self._get(*pieces[0])
        else:
            for f in [io_pool().submit(self._get, p, at) for p, at in pieces]:
                f.result()

    def _get(self, piece: memoryview, at: int) -> None:
        """One piece: by a ranged GET, or, for the whole object or from a server that answers
        a range with the whole object (obstore refuses that answer), by a plain GET."""
        with self.store._errors(f"cannot read {self.store.where(self.key)}"):
            try:
                if (at == 0 and len(piece) == self.size) or self.store.ranges_ignored:
                    got = self.store.get_whole(self.key, at, len(piece))
                else:
                    got = self._get_range(at, len(piece))
            except FileNotFoundError as exc:
                if not missing(exc):
                    raise
                raise SnapshotDamaged(f"data object {self.key} is missing") from None
            except BaseError as exc:
                if http_status(str(exc)) != 416:       # 416: starts after the object's end
                    raise
                raise SnapshotDamaged(f"data object {self.key} ends before {at} bytes") from None
        if len(got) != len(piece):
            raise SnapshotDamaged(f"data object {self.key} ends before {at + len(piece)} bytes")
        piece[:] = memoryview(got)

    def _get_range(self, at: int, length: int):
        try:
            return obstore.get_range(self.store._s, self.key, start=at, length=length)
        except BaseError as exc:
            if NOT_PARTIAL not in str(exc):
                raise
            self.store.ranges_ignored = True        # from now on: whole objects, sliced
            return self.store.get_whole(self.key, at, length)

    def close(self) -> None:
        pass


class S3Store:
    kind = "s3"
    part_size = PART_SIZE       # S3: 5 MiB at least, 5 GiB at most, 10,000 parts an object
    concurrency = CONCURRENCY
    ranges_ignored = False      # the server answered a ranged GET with the whole object

    def __init__(self, location: str):
        self.location = location
        self.bucket, self.prefix = _parse(location)
        with self._errors(f"cannot open snapshot store {location}"):
            self._s = _ObStore(self.bucket, prefix=self.prefix or None,
                               client_options=_client_options())  # type: ignore[arg-type]
        # One request now: a missing bucket, denied access or an unreachable endpoint is
        # reported here, as DirStore reports a missing directory.
        with self._errors(f"cannot open snapshot store {location}"):
            next(iter(obstore.list(self._s, None, chunk_size=1)), None)

    def _errors(self, what: str) -> Errors:
        return Errors(self, what)

    def close(self) -> None:
        """Nothing held open between requests."""

    def __enter__(self) -> S3Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def owner(self, name: str) -> int | None:
        """S3 objects have no owning uid: the bucket's write access is the trust."""
        return None

    def exists(self, key: str) -> bool:
        """Asked with a HEAD request (object_size), never a GET of a byte or two: some
        servers (s3rver) answer `Range: bytes=0-0` with the whole object."""
        return self.object_size(key) is not None

    def confirm(self, snapshot: str) -> None:
        """Nothing to confirm: an object's key cannot be swapped for a link."""

    def where(self, key: str = "") -> str:
        base = f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"
        return f"{base}/{key}" if key else self.location

    def names(self) -> list[str]:
        with self._errors(f"cannot list {self.location}"):
            result = obstore.list_with_delimiter(self._s, None)
        return sorted(p.rstrip("/") for p in result["common_prefixes"]
                      if NAME_RE.fullmatch(p.rstrip("/")))

    def begin(self, snapshot: str) -> None:
        """Nothing to create: S3 has no directories."""

    def read(self, key: str, limit: int, trust=None) -> bytes | None:
        """The whole object (at most limit+1 bytes of it), or None where there is none: one
        GET without a range (a server may answer a range with the whole object, which
        obstore refuses), read no further than limit+1 bytes. `trust` is a directory
        store's: an object has no owner to check."""
        with self._errors(f"cannot read {self.where(key)}"):
            try:
                return self.get_whole(key, 0, limit + 1)
            except FileNotFoundError as exc:
                if not missing(exc):
                    raise
                return None

    def get_whole(self, key: str, at: int, length: int) -> bytes:
        """Bytes [at, at+length) of an object, by a GET of all of it (no Range header): the
        body is streamed, what comes before `at` dropped, and the rest not read. Shorter
        where the object ends first (a data object's reader counts that as damage)."""
        result = obstore.get(self._s, key)
        out = bytearray()
        skip = at
        for chunk in result.stream(min_chunk_size=PIECE):
            view = memoryview(chunk)
            if skip:
                dropped = min(skip, len(view))
                view, skip = view[dropped:], skip - dropped
            out += view[:length - len(out)]
            if len(out) >= length:
                break
        return bytes(out)

    def put_atomic(self, key: str, data: bytes) -> None:
        """One PUT: S3 shows the old object or the new one, never half of it."""
        with self._errors(f"cannot write {self.where(key)}"):
            obstore.put(self._s, key, data, use_multipart=False)

    def sync_dir(self, key: str = "") -> None:
        """Nothing to sync: a completed PUT is durable."""

    def writer(self, key: str) -> S3Writer:
        with self._errors(f"cannot write {self.where(key)}"):
            return S3Writer(self, key)

    def reader(self, key: str, trust=None) -> S3Reader:
        return S3Reader(self, key)

    def delete(self, key: str) -> None:
        with self._errors(f"cannot delete {self.where(key)}"):
            try:
                obstore.delete(self._s, key)
            except FileNotFoundError as exc:
                if not missing(exc):
                    raise

    def keys(self, snapshot: str) -> list[str]:
        """Every object of one snapshot (uploads in progress are no objects yet)."""
        with self._errors(f"cannot list {self.where(snapshot)}"):
            return sorted(meta["path"] for chunk in obstore.list(self._s, snapshot)
                          for meta in chunk)

    def finish_removal(self, snapshot: str) -> None:
        """Nothing left once the objects are gone."""

    def object_size(self, key: str) -> int | None:
        with self._errors(f"cannot read {self.where(key)}"):
            try:
                return int(obstore.head(self._s, key)["size"])
            except FileNotFoundError as exc:
                if not missing(exc):
                    raise
                return None
