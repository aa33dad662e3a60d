"""The documentation stands alone and says what the code does.

- Every relative link in every tracked Markdown file resolves to a tracked file or directory
  inside the repository (and a `#anchor` to a heading of the Markdown file it names).
- No tracked file points at the directory that used to hold the design documents beside the
  repository: a clone does not have it.
- docs/ecc.md's test vectors are what the numpy codec computes.
- docs/config.md's example is a configuration file gpumemd accepts.
- docs/design.md's exit codes are the protocol's, and its command table's "built" and
  "planned" match the CLI.
"""
from __future__ import annotations

import hashlib
import os
import pwd
import re
import struct
import subprocess

import numpy as np
import pytest

from tests.harness import ROOT, child_env, script_argv

OUTSIDE = "../" + "shared"          # spelled in two pieces so that this file passes its own test
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def tracked_files() -> list[str]:
    """The files a clone would have: tracked ones, and new ones not ignored (not yet added)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                              "--exclude-standard"], cwd=ROOT, capture_output=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"not a git checkout, cannot list tracked files: {exc}")
    return [p for p in out.decode().split("\0") if p]


def prose(text: str) -> str:
    """The Markdown without fenced code blocks and code spans (links there are not links)."""
    text = re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", text, flags=re.DOTALL | re.MULTILINE)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    headings = re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", prose(text), flags=re.MULTILINE)
    return {slug(h) for h in headings}


def broken_links(files: dict[str, str], tracked: set[str]) -> list[str]:
    """'file: target (why)' for every relative link in `files` (path -> text) that does not
    resolve to a tracked file or directory inside the repository."""
    directories = {os.path.dirname(p) for p in tracked}
    directories |= {d for p in directories for d in _parents(p)}
    problems = []
    for path, text in files.items():
        for target in LINK.findall(prose(text)):
            if SCHEME.match(target):
                continue                                  # http:, mailto:...: not ours
            where, _, anchor = target.partition("#")
            resolved = os.path.normpath(os.path.join(os.path.dirname(path), where)) \
                if where else path
            why = None
            if resolved == ".." or resolved.startswith("../") or os.path.isabs(resolved):
                why = "outside the repository"
            elif resolved not in tracked and resolved.rstrip("/") not in directories:
                why = "no such tracked file or directory"
            elif anchor and resolved.endswith(".md") and resolved in files \
                    and anchor not in anchors(files[resolved]):
                why = f"no heading #{anchor} in {resolved}"
            if why:
                problems.append(f"{path}: {target} ({why})")
    return problems


def _parents(path: str):
    while path:
        path = os.path.dirname(path)
        yield path


def markdown_files() -> tuple[dict[str, str], set[str]]:
    tracked = set(tracked_files())
    texts = {}
    for path in sorted(p for p in tracked if p.endswith(".md")):
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            texts[path] = f.read()
    return texts, tracked


# ---- links --------------------------------------------------------------------------------
def test_every_relative_link_resolves_inside_the_repository():
    files, tracked = markdown_files()
    assert "README.md" in files and "docs/design.md" in files
    links = sum(len(LINK.findall(prose(text))) for text in files.values())
    assert links > 30, f"only {links} links found: is the link pattern still right?"
    assert broken_links(files, tracked) == []


def test_the_link_check_finds_what_is_broken():
    files = {
        "README.md": "[ok](docs/a.md#usage) [dir](docs/) [gone](docs/b.md) "
                     "[up](../x/y.md) [anchor](docs/a.md#nope) [self](#intro) "
                     "[web](https://example.org/z) `[code](docs/c.md)`\n# Intro\n",
        "docs/a.md": "## Usage\n[back](../README.md#intro)\n```\n[in code](missing.md)\n```\n",
    }
    assert broken_links(files, set(files)) == [
        "README.md: docs/b.md (no such tracked file or directory)",
        "README.md: ../x/y.md (outside the repository)",
        "README.md: docs/a.md#nope (no heading #nope in docs/a.md)",
    ]


def test_no_tracked_file_points_outside_the_repository():
    named = []
    for path in tracked_files():
        try:
            with open(os.path.join(ROOT, path), "rb") as f:
                data = f.read()
        except (IsADirectoryError, FileNotFoundError):     # a submodule, or deleted meanwhile
            continue
        for number, line in enumerate(data.splitlines(), 1):
            if OUTSIDE.encode() in line:
                named.append(f"{path}:{number}: {line.decode(errors='replace').strip()}")
    assert named == [], "these point at files a clone does not have:\n" + "\n".join(named)


# ---- docs/ecc.md: the vectors are the codec's ------------------------------------------------
def ecc_doc() -> str:
    with open(os.path.join(ROOT, "docs", "ecc.md"), encoding="utf-8") as f:
        return f.read()


def table_rows(text: str, header: str) -> list[list[str]]:
    """The cells of the Markdown table whose header row starts with `header`; a cell that
    holds a code span is given as the span's content."""
    lines = text[text.index(header):].splitlines()
    rows = []
    for line in lines[2:]:                             # past the header and the --- row
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        rows.append([_code(cell) for cell in cells])
    return rows


def _code(cell: str) -> str:
    span = re.search(r"`([^`]+)`", cell)
    return span.group(1) if span else cell


def encode_block(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    from daemon.ecc import cpu
    from daemon.ecc.layout import CHECKSUM_BYTES, PARITY_BLOCK
    parity = np.zeros(PARITY_BLOCK, np.uint8)
    sums = np.zeros(CHECKSUM_BYTES, np.uint8)
    cpu.encode(np.frombuffer(data, np.uint8).copy(), parity, sums)
    return parity, sums


def test_ecc_doc_vectors_are_what_the_codec_computes():
    rows = table_rows(ecc_doc(), "| data | data sha256 |")
    assert len(rows) == 3
    for source, data_sha, parity_sha, parity_head, checksum in rows:
        # The data column is the Python expression a reader would run: run exactly that.
        data = eval(source, {"__builtins__": {}, "hashlib": hashlib, "bytes": bytes,
                             "range": range})
        parity, sums = encode_block(data)
        assert hashlib.sha256(data).hexdigest() == data_sha, source
        assert hashlib.sha256(parity).hexdigest() == parity_sha, source
        assert parity[:32].tobytes().hex() == parity_head, source
        assert sums.tobytes().hex() == checksum, source


def test_ecc_doc_checksum_sums_match_the_vector_table():
    text = ecc_doc()
    checksums = [row[4] for row in table_rows(text, "| data | data sha256 |")]
    sums = table_rows(text, "| data | s1 | s2 | checksum hex |")
    assert [row[3] for row in sums] == checksums
    for _, s1, s2, checksum in sums:
        assert struct.pack("<II", int(s1, 0), int(s2, 0)).hex() == checksum


def test_ecc_doc_single_codeword_vector():
    from daemon.ecc.layout import BLOCK, CODEWORDS, MESSAGE, NSYM
    found = re.search(r"message `bytes\(range\(128\)\)` has the parity `([0-9a-f]{16})`",
                      ecc_doc())
    assert found, "docs/ecc.md lost its one-codeword vector"
    data = bytearray(BLOCK)
    data[7:MESSAGE * CODEWORDS:CODEWORDS] = bytes(range(MESSAGE))    # codeword 7 of the block
    parity, _ = encode_block(bytes(data))
    assert parity.reshape(NSYM, CODEWORDS)[:, 7].tobytes().hex() == found.group(1)


# ---- docs/design.md: the contract matches the code ---------------------------------------
def design_doc() -> str:
    with open(os.path.join(ROOT, "docs", "design.md"), encoding="utf-8") as f:
        return f.read()


def test_design_exit_codes_are_the_protocols():
    from gpumemctl.protocol.errors import ERROR_TABLE
    codes = [int(row[0]) for row in table_rows(design_doc(), "| code | meaning |")]
    assert codes == sorted(ERROR_TABLE)


def commands_by_status() -> dict[str, set[str]]:
    """{'built': {...}, 'planned': {...}}: the first word of each command in the table."""
    found: dict[str, set[str]] = {"built": set(), "planned": set()}
    text = design_doc()
    for line in text[text.index("| command | does | today |"):].splitlines()[2:]:
        if not line.startswith("|"):
            break
        commands, _, status = (cell.strip() for cell in line.strip().strip("|").split("|"))
        words = {span.split()[0] for span in re.findall(r"`([^`]+)`", commands)}
        found["planned" if status.startswith("planned") else "built"] |= words
    return found


def test_design_command_table_says_what_is_built_and_what_is_planned():
    table = commands_by_status()
    assert {"load", "save", "meta"} <= table["built"]     # issue 17
    assert "ln" in table["built"]             # `ln` and `ln -s` (issue 15)
    assert "snapshot" in table["built"]       # issue 16
    answers = {}
    for word in sorted(table["built"] | table["planned"]):
        proc = subprocess.run(script_argv("gpumemctl") + [word, "--help"], capture_output=True,
                              env=child_env(), timeout=60, check=False)
        answers[word] = proc.returncode
    assert {w for w in table["built"] if answers[w] != 0} == set(), answers
    # A planned command that has been built must move to "built" in docs/design.md (an
    # unknown command is a usage error: exit 2 with the pinned click; never 0).
    assert {w for w in table["planned"] if answers[w] == 0} == set(), answers


# ---- docs/config.md: the example is a valid file ------------------------------------------
def test_config_doc_example_is_accepted():
    from daemon import config
    with open(os.path.join(ROOT, "docs", "config.md"), encoding="utf-8") as f:
        text = f.read()
    example = re.search(r"^## Example\n+```toml\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    assert example, "docs/config.md lost its example"
    loaded = config.parse(example.group(1), "docs/config.md")     # ConfigError on a problem
    assert loaded.quotas == {1000: 16 << 30, pwd.getpwnam("nobody").pw_uid: 4 << 30}
