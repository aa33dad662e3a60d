"""kvikio.defaults, as the stand-in needs it: no GPUDirect Storage here (compatibility
mode), so `io` reads `posix`."""


def is_compat_mode_preferred() -> bool:
    return True
