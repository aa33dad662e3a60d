"""The FUSE adapter: the mount's handlers (operations), what every request goes through
(requests), attributes (attrs), files open on it (files), the .metadata mirror
(metadata_view), the kernel's cache (cache), xattrs, errnos and the mount itself."""

# Before any module of this package loads pyfuse3: the init-flags library must be loaded
# first for pyfuse3's fuse_session_new to bind to it (initflags.py).
from . import initflags

initflags.load()
