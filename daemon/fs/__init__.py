"""The FUSE adapter: the mount's handlers, its page cache, xattrs and the mount itself."""
