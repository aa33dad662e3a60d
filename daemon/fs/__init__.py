"""The FUSE adapter: the mount's handlers (operations), what every request goes through
(requests), attributes (attrs), files open on it (files), the .metadata mirror
(metadata_view), the kernel's cache (cache), xattrs, errnos and the mount itself."""
