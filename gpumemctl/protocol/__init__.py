"""The wire contract between gpumemd and its clients: framing, errors, names, sizes.

Standard library only: the daemon, the keeper and the CLI all import it, and nothing else of
`gpumemctl` may be imported by the daemon (docs/design.md, "Architecture").
"""
from .defaults import PROTOCOL_VERSION, SOCKET_ENV, default_socket, default_state_dir
from .errors import (
    ERROR_TABLE,
    Busy,
    Exists,
    GpumemError,
    InternalError,
    InvalidState,
    NoMemory,
    NotFound,
    NotRunning,
    PermissionDenied,
    ProtocolError,
    Uncorrectable,
    UsageError,
    error_from_wire,
)
from .names import check_component, name_bytes, name_from_bytes, normalize, split_path
from .sizes import format_size, out_of_range, parse_size, round_up

__all__ = [
    "ERROR_TABLE", "PROTOCOL_VERSION", "SOCKET_ENV", "Busy", "Exists", "GpumemError",
    "InternalError", "InvalidState", "NoMemory", "NotFound", "NotRunning", "PermissionDenied",
    "ProtocolError", "Uncorrectable", "UsageError", "check_component", "default_socket",
    "default_state_dir", "error_from_wire", "format_size", "name_bytes", "name_from_bytes",
    "normalize", "out_of_range", "parse_size", "round_up", "split_path",
]
