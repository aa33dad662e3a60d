"""`ls`: in one answer (listdir), or by pages (list_page, issue 24), which bring a listing
of any size in answers of bounded size.

One answer is at most 64 MiB (daemon/server/transport.py), and one user's tree can take more
than that to list (long paths, names whose bytes JSON spells six characters each), which made
root's `snapshot create` of every durable allocation fail. A paged `ls` answers at most
`limit` entries and at most PAGE_BYTES of them (always one at least), and the path of the
last one as `next`; the next request passes it back as `after`.

The order is the walk's (daemon/nodes.walk_entries): pre-order, the entries of a directory by
name, which is the order of the paths' component lists. A cursor is compared by that key,
never looked up: a page after a cursor whose entry was removed (or renamed, or whose
directory went) since goes on with the entries that sort after it. Between pages the tree may
change: an entry that stays throughout is listed exactly once; one made or removed meanwhile
may or may not be. A cursor leads only through directories the walk itself would enter
(search and read permission), so it reveals nothing the listing would not.

A page lists only entries whose path a request can name (MAX_PATH_BYTES, as every op's
`path`), and enters no directory below that: through the mount a chain of directories can be
made deeper than any path, and listing it whole costs the square of its depth (each entry
carries its full path: 100,000 levels would be terabytes of paths). What lies deeper is
reached through the mount, by relative paths, as `find` would.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

from gpumemctl.protocol import UsageError, jsontext, name_bytes, name_from_bytes, split_path
from gpumemctl.protocol.defaults import EVENTS_MAX_LIMIT
from gpumemctl.protocol.names import MAX_PATH_BYTES
from gpumemctl.protocol.replies import Node as NodeInfo

from .describe import describe
from .namespace import Namespace
from .nodes import Directory, Node, walk_entries
from .permissions import Credentials, R, X, allowed, require

PAGE_BYTES = 8 << 20        # JSON of one page's entries: well under the 64 MiB of an answer
PAGE_ENTRIES = EVENTS_MAX_LIMIT     # entries of a page that asks for no `limit` (the most)

Entry = tuple[str, str, Node]       # (path, name, node), as walk_entries yields them


def listdir(ns: Namespace, path: str, cred: Credentials, *, recursive: bool = False
            ) -> list[NodeInfo]:
    """`ls PATH` in one answer: the entries below a directory, pre-order, each under its
    own name (a hard-linked file once per name), with `recursive` in every directory the
    caller may list; or the one node PATH names. The last component is not followed: `ls
    LINK` shows the link, as `ls -l` does."""
    node = ns.lookup(path, cred, allow_root=True, follow=False)
    if not isinstance(node, Directory):
        parts = split_path(path)      # a hard link is listed under the name asked for
        return [describe(node, path="/".join(parts), name=parts[-1])]
    require(node, cred, R | X, "list")

    def enter(d: Directory) -> bool:    # walk_entries: no recursion, a chain may be deep
        return d is node or (recursive and allowed(d, cred, R | X))
    return [describe(n, path=p, name=name) for p, name, n in walk_entries(node, enter)]


def list_page(ns: Namespace, path: str, cred: Credentials, *, recursive: bool,
              after: str | None, limit: int | None) -> tuple[list[NodeInfo], str | None]:
    """The entries of `path` (as listdir gives them) that come after the cursor
    `after` (None: from the first), at most `limit` (None: PAGE_ENTRIES) and PAGE_BYTES of
    JSON, and the cursor of the next page (None: this one is the last)."""
    limit = PAGE_ENTRIES if limit is None else limit
    top = ns.lookup(path, cred, allow_root=True, follow=False)
    if not isinstance(top, Directory):
        return listdir(ns, path, cred), None          # one entry: the node itself
    require(top, cred, R | X, "list")

    def enter(d: Directory) -> bool:
        if d is top:
            return True
        # A child's path is this one's, "/" and a name: it must leave room for them.
        return recursive and len(name_bytes(d.path)) < MAX_PATH_BYTES - 1 \
            and allowed(d, cred, R | X)

    entries: list[NodeInfo] = []
    size = 0
    for entry_path, name, node in entries_after(top, enter, _cursor(top, after)):
        if len(entry_path) > MAX_PATH_BYTES // 4 and \
                len(name_bytes(entry_path)) > MAX_PATH_BYTES:
            continue                    # no request could name it (module docstring)
        if len(entries) == limit:
            return entries, entries[-1]["path"]
        shown = describe(node, path=entry_path, name=name)
        shown_bytes = len(jsontext.dumps(shown)) + 1     # ASCII (ensure_ascii), and a comma
        if entries and size + shown_bytes > PAGE_BYTES:
            return entries, entries[-1]["path"]
        entries.append(shown)
        size += shown_bytes
    return entries, None


def _cursor(top: Directory, after: str | None) -> list[str]:
    """The components of `after` below `top` (the key the walk's order compares)."""
    if after is None:
        return []
    try:
        canonical = name_from_bytes(name_bytes(after))      # the one spelling names have
    except UnicodeEncodeError:
        canonical = ""
    prefix = f"{top.path}/" if top.path else ""
    parts = canonical.removeprefix(prefix).split("/") if canonical.startswith(prefix) else [""]
    if "" in parts:
        shown = after if len(after) <= 78 else f"{after[:59]}...({len(after)} characters)"
        raise UsageError(f"argument 'after' must be the `next` of the previous page of this "
                         f"listing (a path below '{top.path or '/'}'), not {shown!r}")
    return parts


def entries_after(top: Directory, enter: Callable[[Directory], bool],
                  cursor: list[str]) -> Iterator[Entry]:
    """What walk_entries(top, enter) yields after the entry whose components below `top`
    are `cursor` (everything for an empty cursor), whether that entry still exists or not:
    first the cursor's own subtree, then at each level up the entries that sort after the
    cursor's component there, each with its subtree."""
    levels: list[tuple[Directory, str]] = []    # each directory on the way, and the name
    directory = top
    for name in cursor:
        levels.append((directory, name))
        child = directory.children.get(name)
        if not isinstance(child, Directory) or not enter(child):
            break       # gone, a file, or not listed: nothing below it comes next
        directory = child
    else:
        yield from walk_entries(directory, enter)   # the cursor's subtree, or all of top
    for directory, name in reversed(levels):
        later = sorted(n for n in directory.children if n > name)
        under = directory.path                      # once per level: a chain may be deep
        for sibling in later:
            node = directory.children.get(sibling)
            if node is None:
                continue
            yield (f"{under}/{sibling}" if under else sibling), sibling, node
            if isinstance(node, Directory):
                yield from walk_entries(node, enter)
