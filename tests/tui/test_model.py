"""What the table shows, without a terminal: filtering, sorting, cells, ages; and the
dependency direction (docs/design.md: tui -> gpumemctl, never the daemon)."""
from __future__ import annotations

import subprocess
import sys

from tests.harness import ROOT, child_env
from tui import model


def entry(path, size=None, kind="allocation", **kw):
    base = {"type": kind, "path": path}
    if kind == "directory":
        return {**base, "entries": kw.get("entries", 0)}
    return {**base, "size": size, "capacity": size, "device": "GPU-a", "durable": False,
            "state": "ready", "ecc": "rs", "refcount": 0, "verified": None, **kw}


ENTRIES = [entry("models", kind="directory", entries=2), entry("models/llama", 64 << 20),
           entry("models/mistral", 16 << 20, durable=True, refcount=3),
           entry("weights", 32 << 20, verified="2026-11-18T11:05:10.000000Z")]


def test_visible_children_and_filter():
    assert [e["path"] for e in model.visible(ENTRIES, "", "")] == ["models", "weights"]
    assert [e["path"] for e in model.visible(ENTRIES, "models", "")] == \
        ["models/llama", "models/mistral"]
    assert [e["path"] for e in model.visible(ENTRIES, "", "LLA")] == ["models/llama"]
    assert [e["path"] for e in model.visible(ENTRIES, "models", "models")] == []


def test_sort_keeps_directories_first_and_missing_values_last():
    rows = model.sorted_entries(ENTRIES, "size", False, {})
    assert [e["path"] for e in rows] == ["models", "models/mistral", "weights",
                                         "models/llama"]
    rows = model.sorted_entries(ENTRIES, "size", True, {})
    assert rows[0]["path"] == "models" and rows[1]["path"] == "models/llama"
    rows = model.sorted_entries(ENTRIES, "verified", False, {})
    assert rows[-1]["verified"] is None and rows[1]["path"] == "weights"


def test_cells_holders_and_ages():
    now = model.epoch("2026-11-18T11:06:40.000000Z")
    cells = model.row_cells(ENTRIES[2], "models", {"GPU-a": 0}, now)
    assert cells == ("mistral", "16M", "16M", "0", "durable", "ready", "2", "", "rs", "never",
                     "never")
    linked = model.row_cells({**ENTRIES[2], "links": 2}, "models", {"GPU-a": 0}, now)
    assert linked[model.COLUMN_KEYS.index("links")] == "2"     # hard links (issue 15)
    verified = model.COLUMN_KEYS.index("verified")
    assert model.row_cells(ENTRIES[3], "", {}, now)[verified] == "1m ago"
    assert model.age("2026-11-16T11:06:40.000000Z", now) == "2d ago"
    assert model.row_cells(entry("x", 1, ecc="none"), "", {}, now)[verified] == "-"
    # the newest snapshot's age (issue 16)
    snapped = {**ENTRIES[2], "snapshot": "/srv/s/snap-x",
               "snapshot_time": "2026-11-18T10:06:40.000000Z"}
    assert model.row_cells(snapped, "", {}, now)[model.COLUMN_KEYS.index("snapshot")] == \
        "1h ago"


def test_cells_of_links_and_special_files():
    """A symlink shows its target and type; a FIFO its type (issue 15). Sorting by a column
    that only allocations have keeps them, as directories' missing values, last."""
    link = {"type": "symlink", "path": "models/current", "target": "v2"}
    fifo = {"type": "fifo", "path": "models/pipe"}
    assert model.row_cells(link, "models", {}, 0) == ("current -> v2", "", "", "", "", "link",
                                                      "", "", "", "", "")
    assert model.row_cells(fifo, "models", {}, 0)[0:6:5] == ("pipe", "fifo")
    rows = model.sorted_entries(ENTRIES + [link, fifo], "size", False, {})
    assert rows[0]["path"] == "models" and {r["type"] for r in rows[-2:]} == {"symlink",
                                                                               "fifo"}


def test_tui_never_imports_the_daemon():
    code = ("import sys, tui, tui.app; bad = [m for m in sys.modules if m.split('.')[0] in "
            "('daemon', 'cuda', 'pynvml')]; print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=child_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_wheel_ships_the_styles_and_kernels(tmp_path):
    """pip/pipx installs from the wheel: `gpumemctl top` needs its .tcss files there (the
    editable install the tests use would not notice them missing)."""
    import shutil
    import zipfile
    src = tmp_path / "src"          # a clean copy: an old build/ in the tree would hide a miss
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".venv", ".git", ".gpu", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
        ".hypothesis", "__snapshots__"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                           "--disable-pip-version-check", "-w", str(tmp_path), str(src)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = tmp_path.glob("gpumemctl-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"tui/styles/main.tcss", "tui/styles/dialogs.tcss", "daemon/ecc/kernels.cu"} <= names


def test_shared_formats():
    """gpumemctl.formats serves the CLI and the TUI alike."""
    import pytest

    from gpumemctl.formats import duration, event_line, parse_mode
    from gpumemctl.protocol import UsageError
    assert parse_mode(" 0640 ") == 0o640
    with pytest.raises(UsageError, match="invalid mode '0980'"):
        parse_mode("0980")
    assert (duration(5), duration(185), duration(3725), duration(None)) == \
        ("5s", "3m05s", "1h02m05s", "unknown")
    e = {"id": 7, "time_ns": 1_795_000_000 * 10**9, "kind": "create", "path": "a/b",
         "uid": 0, "detail": {"capacity": 2097152}}
    assert event_line(e) == "     7 2026-11-18T11:06:40Z create    a/b uid=0 capacity=2097152"
    assert event_line(e, date=False) == "11:06:40 create    a/b uid=0 capacity=2097152"
