"""gpumemd's configuration file (TOML): what each key means, and loading it.

Where: `gpumemd --config FILE`; else `$GPUMEMD_CONFIG` (empty: no file); else
`/etc/gpumemd.toml` for root, `$XDG_CONFIG_HOME/gpumemd.toml` (`~/.config/gpumemd.toml`)
for anyone else, read only if it exists. A file named by --config or $GPUMEMD_CONFIG must
exist. Command-line options override the file; the file overrides the built-in defaults.

`KEYS` below is the one description of the keys: docs/config.md shows it, and the man page
generator renders it into gpumemd.conf(5). Every problem with the file (unreadable, not
TOML, an unknown key, a bad value) is a `ConfigError`: gpumemd prints it as one line and
exits 2 before it touches anything (no state directory, socket or memory).
"""
from __future__ import annotations

import dataclasses
import difflib
import grp
import os
import pwd
import re
import tomllib
from collections.abc import Callable
from typing import Any

from gpumemctl.protocol import UsageError, parse_size

from .core import usermeta

CONFIG_ENV = "GPUMEMD_CONFIG"
BACKENDS = ("auto", "cuda", "host")
ECC_MODES = ("rs", "none")
LOG_LEVELS = ("debug", "info", "warning", "error")


class ConfigError(UsageError):
    """The configuration file cannot be used (exit 2, one line)."""


# ---- value parsers: each takes the TOML value and returns the setting, or raises --------
class BadValue(ValueError):
    """`str()` says what is allowed. `where`/`value`: the exact place inside a table (such
    as quotas.alice) and the value found there, when not the key itself."""

    def __init__(self, message: str, where: str | None = None, value: Any = None):
        super().__init__(message)
        self.where, self.value = where, value


def _choice(*allowed: str) -> Callable[[Any], str]:
    def parse(value):
        if not isinstance(value, str) or value not in allowed:
            raise BadValue(f"expected one of {', '.join(allowed)}")
        return value
    return parse


def _path(empty_ok: bool) -> Callable[[Any], str | None]:
    def parse(value):
        if not isinstance(value, str):
            raise BadValue("expected a string holding an absolute path")
        if value == "" and empty_ok:
            return None
        if not value.startswith("/") or "\0" in value:
            raise BadValue("expected an absolute path" + (' or "" for none' if empty_ok
                                                          else ""))
        return os.path.normpath(value)
    return parse


def _size(zero_ok: bool) -> Callable[[Any], int]:
    def parse(value):
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise BadValue('expected a size: a whole number of bytes or a string such as '
                           '"64K", "200M", "1.5G", "2GB"')
        try:
            return parse_size(value, allow_zero=zero_ok)
        except UsageError as exc:
            raise BadValue(str(exc).removeprefix(f"invalid size {str(value)!r}: ")) from None
    return parse


def _uid(key: str) -> int | None:
    """A [quotas] key: a uid written as a string ("1000"), or a user name; None if neither."""
    if re.fullmatch(r"\d{1,10}", key) and int(key) < 2**32 - 1:
        return int(key)
    try:
        return pwd.getpwnam(key).pw_uid
    except KeyError:
        return None


def _quotas(value) -> dict[int, int]:
    if not isinstance(value, dict):
        raise BadValue('expected a table: [quotas] with lines such as 1000 = "16G" or '
                       'alice = "512G"')
    limits: dict[int, int] = {}
    parse = _size(zero_ok=True)
    for key, limit in value.items():
        where = f"quotas.{key}"
        uid = _uid(key)
        if uid is None:
            raise BadValue(f"{key!r} is neither a uid nor a user name on this machine",
                           where, limit)
        try:
            size = parse(limit)
        except BadValue as exc:
            raise BadValue(str(exc), where, limit) from None
        if uid in limits:
            raise BadValue(f"uid {uid} has a quota twice (by number and by name)", where,
                           limit)
        limits[uid] = size
    return limits


MIN_EVENT_LOG_SIZE = 64 << 10     # a few events' worth: less would keep next to nothing


def _event_log_size(value) -> int:
    size = _size(zero_ok=False)(value)
    if size < MIN_EVENT_LOG_SIZE:
        raise BadValue(f"expected at least 64K ({MIN_EVENT_LOG_SIZE} bytes)")
    return size


def _metadata_max_bytes(value) -> int:
    size = _size(zero_ok=True)(value)
    if size > usermeta.MAX_BYTES_LIMIT:
        raise BadValue(f"expected at most 896K ({usermeta.MAX_BYTES_LIMIT} bytes): a request "
                       "is at most 1 MiB, and one must carry an allocation's metadata whole")
    return size


def _bool(value) -> bool:
    if not isinstance(value, bool):
        raise BadValue("expected true or false (without quotes)")
    return value


def _snapshot_dir(value) -> str | None:
    if isinstance(value, str) and value.startswith("s3://"):
        if len(value) <= len("s3://") or "\0" in value:
            raise BadValue("expected s3://bucket/prefix")
        return value
    return _path(True)(value)


def _default_quota(value) -> int | float | None:
    """default_quota: "none", a size, or a share of all devices' memory ("50%", a float in
    (0, 1] here; daemon/main.py turns it into bytes once the backend is known)."""
    if value == "none":
        return None
    if isinstance(value, str) and value.endswith("%"):
        try:
            share = float(value[:-1])
        except ValueError:
            share = -1.0
        if not 0 < share <= 100:
            raise BadValue('expected a share from "1%" to "100%"')
        return share / 100
    try:
        return _size(zero_ok=False)(value)
    except BadValue as exc:
        raise BadValue(f'{exc}, a share of all device memory such as "50%", or '
                       '"none"') from None


def _group(value) -> int | None:
    """admin_group: a group name that exists, or a gid; "" for none."""
    if value == "":
        return None
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**32 - 1:
        return value
    if isinstance(value, str):
        try:
            return grp.getgrnam(value).gr_gid
        except KeyError:
            raise BadValue(f"there is no group {value!r} on this machine") from None
    raise BadValue('expected a group name in quotes, a gid, or "" for none')


def _count(low: int, high: int) -> Callable[[Any], int]:
    def parse(value):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise BadValue(f"expected a whole number from {low} to {high}")
        return value
    return parse


DEFAULT_MAX_CONNECTIONS = 4096
DEFAULT_MAX_CONNECTIONS_PER_UID = 256
DEFAULT_MAX_CONNECTION_RATE_PER_UID = 1000    # connections a second
DEFAULT_MAX_NAMES_PER_UID = 100_000
DEFAULT_MAX_FD_SHARE_PER_UID = 50      # percent of the descriptors for allocations
DEFAULT_MAX_HANDLES_PER_UID = 4096
DEFAULT_FD_STORE_MAX = 4096         # FileDescriptorStoreMax= of systemd/gpumemd.service


@dataclasses.dataclass(frozen=True)
class Key:
    name: str
    type: str                   # as the docs name it: string, path, size, table
    default: str                # the default, as the docs show it
    doc: str                    # one line
    parse: Callable[[Any], Any] = dataclasses.field(repr=False, compare=False)
    option: str | None = None   # the gpumemd option that overrides it


KEYS: tuple[Key, ...] = (
    Key("backend", "string", "auto",
        "memory backend: auto (cuda where a GPU supports it, else host), cuda or host",
        _choice(*BACKENDS), "--backend"),
    Key("mount", "path", '"" (no mount)',
        'serve the allocations as a FUSE filesystem at this directory; "" for none',
        _path(empty_ok=True), "--mount"),
    Key("socket", "path", "$GPUMEMD_SOCKET, else /run/gpumemd/gpumemd.sock (root), else "
        "$XDG_RUNTIME_DIR/gpumemd.sock",
        "the Unix socket gpumemctl and applications connect to",
        _path(empty_ok=False), "--socket"),
    Key("state_dir", "path", "/var/lib/gpumemd (root), else $XDG_STATE_HOME/gpumemd",
        "registry, keeper socket and lock", _path(empty_ok=False), "--state-dir"),
    Key("ecc", "string", "rs",
        "ECC of allocations created without --ecc: rs (Reed-Solomon parity, +6.25%) or none",
        _choice(*ECC_MODES)),
    Key("scrub_rate", "size", "0 (10% duty cycle)",
        'bytes/s a scrub started without --rate reads, e.g. "200M"; 0: at most 10% of the '
        "time", _size(zero_ok=True)),
    Key("host_capacity", "size", "half of RAM",
        "bytes the host backend may hand out (ignored by the cuda backend); by default half "
        "of RAM, at most the memory available at start. Each gpumemd offers its own: with "
        "several on one machine (a root's and users'), give each a share; a start names the "
        "others it sees",
        _size(zero_ok=False), "--host-capacity"),
    Key("log_level", "string", "info", "debug, info, warning or error",
        _choice(*LOG_LEVELS), "--log-level"),
    Key("event_log_size", "size", "64M",
        "bytes of event-log text (details and paths) the registry keeps, at least 64K; the "
        "oldest events go first, as they do past 100,000 events", _event_log_size),
    Key("max_connections", "integer", str(DEFAULT_MAX_CONNECTIONS),
        "client connections open at once, all users together (kept below the open-file "
        "limit); root and the daemon's own uid may always open a few more",
        _count(16, 1 << 20)),
    Key("max_connections_per_uid", "integer", str(DEFAULT_MAX_CONNECTIONS_PER_UID),
        "client connections one uid may hold open at once; root and the daemon's own uid "
        "are not limited by it", _count(1, 1 << 20)),
    Key("max_connection_rate_per_uid", "integer", str(DEFAULT_MAX_CONNECTION_RATE_PER_UID),
        "new client connections of one uid served a second (max_connections_per_uid at "
        "once); one past it waits its turn, counted among the uid's connections; root and "
        "the daemon's own uid never wait", _count(1, 1 << 20)),
    Key("max_names_per_uid", "integer", f"{DEFAULT_MAX_NAMES_PER_UID}",
        "allocations and directories one uid may own; root and the daemon's own uid are "
        "not limited by it", _count(1, 1 << 32)),
    Key("max_handles_per_uid", "integer", str(DEFAULT_MAX_HANDLES_PER_UID),
        "open handles, attachments and leases one uid may hold at once (files open on the "
        "mount are not counted); root and the daemon's own uid are not limited by it",
        _count(1, 1 << 32)),
    Key("max_fd_share_per_uid", "integer", str(DEFAULT_MAX_FD_SHARE_PER_UID),
        "percent of the file descriptors gpumemd's open-file limit leaves for allocations "
        "that one uid's allocations may hold (each holds 1, 2 with ECC); root and the "
        "daemon's own uid are bound only by the total", _count(1, 100)),
    Key("admin_group", "string", '"" (none)',
        "a group (name or gid) whose members may start and stop scrubs and recover other "
        "users' allocations, as root and the daemon's own uid may", _group),
    Key("default_quota", "size", '"none"',
        "the quota of every uid that [quotas] does not name, but root and the daemon's own: "
        'a size, or a share of all devices\' memory such as "50%"; set it on a shared server',
        _default_quota),
    Key("cuda_fds_to_readers", "boolean", "false",
        "on the cuda backend, also give descriptors of the memory (open, attach) to callers "
        "with only read permission: trust every such reader to leave the memory unchanged, "
        "for no CUDA handle can be made read-only", _bool),
    Key("fd_store_max", "integer", str(DEFAULT_FD_STORE_MAX),
        "under systemd older than 254, the unit's FileDescriptorStoreMax= (newer ones tell "
        "gpumemd in $FDSTORE, which wins): past it, making memory durable exits 7, as "
        "systemd would drop the descriptors", _count(1, 1 << 32)),
    Key("snapshot_dir", "string", '"" (none)',
        "where the automatic snapshots go and come from: an absolute directory (local disk, "
        "or NFS/Lustre/3FS shared by a fleet) or s3://bucket/prefix "
        "(docs/snapshots.md)", _snapshot_dir),
    Key("snapshot_on_stop", "boolean", "false",
        "a clean stop (systemctl stop, shutdown) first snapshots every durable allocation "
        "into snapshot_dir, incrementally; size the unit's TimeoutStopSec= for it "
        "(docs/operations.md)", _bool),
    Key("restore_on_start", "boolean", "false",
        "allocations found lost at start (a reboot, a GPU reset) are restored from the "
        "newest snapshot in snapshot_dir, in the background, each served once it is whole",
        _bool),
    Key("metadata_max_bytes", "size", "512K",
        "user metadata one allocation or directory may hold (`gpumemctl meta`, user.* "
        "attributes on the mount): the sum of its keys' and values' bytes, at most 896K",
        _metadata_max_bytes),
    Key("metadata_user_max_bytes", "size", "64M",
        "user metadata all of one uid's allocations and directories may hold together; root "
        "and the daemon's own uid are not limited by it", _size(zero_ok=True)),
    Key("slabs", "boolean", "true",
        "pack allocations of up to half a granule into slabs of their owner's (issue 26, "
        "docs/storage.md): a 4 KiB file takes 4 KiB and no descriptor of its own; false: "
        "every allocation has memory of its own, whole granules, as before", _bool,
        "--slabs"),
    Key("parity_arenas", "boolean", "true",
        "keep ECC parity in spans of shared parity arenas (issue 26, docs/storage.md): a "
        "2 MiB allocation's parity takes 132 KiB and no descriptor of its own; false: each "
        "allocation's and slab's parity is a buffer of its own, whole granules, as before",
        _bool, "--parity-arenas"),
    Key("extents", "boolean", "true",
        "let memory of 64 MiB and more grow and shrink by extents (cuda backend; issue 26, "
        "docs/storage.md): a resize appends or drops backend allocations instead of copying "
        "the whole into new memory; false: every resize copies, as before", _bool,
        "--extents"),
    Key("compact_min_slack", "size", "64M",
        "housekeeping compacts the slabs (`gpumemctl compact`, docs/storage.md) when a "
        "device's slabs have more free slots than this and than 25% of their bytes; 0: "
        "only when asked", _size(zero_ok=True)),
    Key("quotas", "table", "none",
        'per-user limit on the capacity of one\'s allocations: [quotas] 1000 = "16G", '
        'nobody = "4G" (a user name must exist when gpumemd starts)', _quotas),
)
KEY_NAMES = tuple(k.name for k in KEYS)
_BY_NAME = {k.name: k for k in KEYS}


@dataclasses.dataclass
class Config:
    """The settings the file gave; None where it said nothing (the default applies)."""
    path: str | None = None
    backend: str | None = None
    mount: str | None = None
    socket: str | None = None
    state_dir: str | None = None
    ecc: str | None = None
    scrub_rate: int | None = None
    host_capacity: int | None = None
    log_level: str | None = None
    event_log_size: int | None = None
    max_connections: int | None = None
    max_connections_per_uid: int | None = None
    max_connection_rate_per_uid: int | None = None
    max_fd_share_per_uid: int | None = None
    max_names_per_uid: int | None = None
    max_handles_per_uid: int | None = None
    admin_group: int | None = None
    default_quota: int | float | None = None
    cuda_fds_to_readers: bool | None = None
    fd_store_max: int | None = None
    snapshot_dir: str | None = None
    snapshot_on_stop: bool | None = None
    restore_on_start: bool | None = None
    metadata_max_bytes: int | None = None
    metadata_user_max_bytes: int | None = None
    slabs: bool | None = None
    parity_arenas: bool | None = None
    extents: bool | None = None
    compact_min_slack: int | None = None
    quotas: dict[int, int] = dataclasses.field(default_factory=dict)


def default_path() -> str:
    if os.geteuid() == 0:
        return "/etc/gpumemd.toml"
    home = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return os.path.join(home, "gpumemd.toml")


def find(explicit: str | None) -> tuple[str | None, bool]:
    """(path, required): the file to read, and whether a missing one is an error."""
    if explicit is not None:
        return explicit, True
    if CONFIG_ENV in os.environ:
        env = os.environ[CONFIG_ENV]
        return (env, True) if env else (None, False)
    return default_path(), False


def load(explicit: str | None = None) -> Config:
    path, required = find(explicit)
    if path is None:
        return Config()
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        if required:
            raise ConfigError(f"{path}: no such configuration file") from None
        return Config()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the configuration file: "
                          f"{exc.strerror}") from None
    return parse(raw, path)


def parse(raw: bytes | str, path: str = "<config>") -> Config:
    try:
        text = raw.decode() if isinstance(raw, bytes) else raw
        table = tomllib.loads(text)
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        # tomllib says "Expected '=' after a key in a key/value pair (at line 3, column 5)".
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    config = Config(path=path)
    for name, value in table.items():
        key = _BY_NAME.get(name)
        if key is None:
            raise ConfigError(f"{path}: unknown key {name!r}{_suggest(name)}; the keys are "
                              f"{', '.join(KEY_NAMES)}")
        try:
            setattr(config, name, key.parse(value))
        except BadValue as exc:
            where, shown = (exc.where, exc.value) if exc.where else (name, value)
            raise ConfigError(f"{path}: bad value for {where!r}: {_show(shown)}: "
                              f"{exc}") from None
    return config


def _suggest(name: str) -> str:
    close = difflib.get_close_matches(name.replace("-", "_").lower(), KEY_NAMES, n=1,
                                      cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _show(value) -> str:
    text = repr(value) if not isinstance(value, dict) else "a table"
    return text if len(text) <= 60 else text[:57] + "..."


def markdown_table() -> str:
    """KEYS as the Markdown table docs/config.md carries (a test keeps the two equal)."""
    rows = ["| key | type | default | meaning | option |", "| --- | --- | --- | --- | --- |"]
    for k in KEYS:
        cells = (f"`{k.name}`", k.type, k.default, k.doc, f"`{k.option}`" if k.option else "")
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows) + "\n"


def apply(args, config: Config) -> None:
    """Fill the options not given on the command line (None) from the file, then the
    built-in defaults where the file is silent too. Sizes stay strings on `args` where
    they came from the command line; `args.host_capacity` is bytes or None after this."""
    for key in KEYS:
        if key.option is None:
            continue
        attr = key.name
        if getattr(args, attr, None) is None:
            setattr(args, attr, getattr(config, attr))
    if args.backend is None:
        args.backend = "auto"
    if args.log_level is None:
        args.log_level = "info"
    if isinstance(args.host_capacity, str):
        args.host_capacity = parse_size(args.host_capacity)
    args.ecc = config.ecc or "rs"
    args.scrub_rate = config.scrub_rate or None     # 0: the duty cycle (daemon/services/scrub.py)
    args.quotas = dict(config.quotas)
    args.default_quota = config.default_quota    # bytes, a share (float) or None
    args.cuda_fds_to_readers = bool(config.cuda_fds_to_readers)
    args.event_log_size = config.event_log_size     # None: the registry's default (64 MiB)
    args.admin_group = config.admin_group
    args.max_connections = config.max_connections or DEFAULT_MAX_CONNECTIONS
    args.max_connections_per_uid = (config.max_connections_per_uid
                                    or DEFAULT_MAX_CONNECTIONS_PER_UID)
    args.max_connection_rate_per_uid = (config.max_connection_rate_per_uid
                                        or DEFAULT_MAX_CONNECTION_RATE_PER_UID)
    args.max_fd_share_per_uid = config.max_fd_share_per_uid or DEFAULT_MAX_FD_SHARE_PER_UID
    args.max_names_per_uid = config.max_names_per_uid or DEFAULT_MAX_NAMES_PER_UID
    args.max_handles_per_uid = config.max_handles_per_uid or DEFAULT_MAX_HANDLES_PER_UID
    args.fd_store_max = config.fd_store_max or DEFAULT_FD_STORE_MAX
    args.metadata_max_bytes = (usermeta.DEFAULT_MAX_BYTES if config.metadata_max_bytes is None
                               else config.metadata_max_bytes)
    args.metadata_user_max_bytes = (usermeta.DEFAULT_USER_MAX_BYTES
                                    if config.metadata_user_max_bytes is None
                                    else config.metadata_user_max_bytes)
    args.snapshot_dir = config.snapshot_dir
    args.slabs = args.slabs in (True, "on") if args.slabs is not None else True
    args.parity_arenas = args.parity_arenas in (True, "on") \
        if args.parity_arenas is not None else True
    args.extents = args.extents in (True, "on") if args.extents is not None else True
    args.compact_min_slack = 64 << 20 if config.compact_min_slack is None \
        else config.compact_min_slack
    args.snapshot_on_stop = bool(config.snapshot_on_stop)
    args.restore_on_start = bool(config.restore_on_start)
    if (args.snapshot_on_stop or args.restore_on_start) and not args.snapshot_dir:
        raise ConfigError(f"{config.path}: snapshot_on_stop and restore_on_start need "
                          "snapshot_dir: where the snapshots go")
    args.config_path = config.path

