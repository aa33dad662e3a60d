"""The out-of-memory error names every number (daemon/backends/base.py): the size requested,
what it needs on the device (the capacity it rounds up to, plus ECC parity), and the device's
free and total bytes. docs/design.md ("Sizes") shows the line; this runs its example."""
from __future__ import annotations

import os
import re

import pytest

from tests.harness import ROOT

MiB = 1 << 20


def documented_example() -> tuple[list[list[str]], str]:
    """docs/design.md's example: the commands run in order, and the error line the last one
    prints."""
    with open(os.path.join(ROOT, "docs", "design.md"), encoding="utf-8") as f:
        text = f.read()
    found = re.search(r"((?:^\$ gpumemctl .+\n)+)(gpumemctl: error: out of memory .+)$", text,
                      re.MULTILINE)
    assert found, "docs/design.md lost its out-of-memory example"
    commands = [line.split()[2:] for line in found.group(1).splitlines()]
    return commands, found.group(2)


def test_the_documented_out_of_memory_line_is_what_a_user_sees(daemon_factory):
    d = daemon_factory(extra_args=["--host-capacity", "64M"])      # as docs/design.md says
    commands, line = documented_example()
    for args in commands[:-1]:
        d.cli(*args, check=True)
    before = d.cli_json("ls")
    proc = d.cli(*commands[-1], check=7)
    uuid = d.cli_json("devices")[0]["uuid"]
    assert proc.stderr.decode().strip() == line.replace("HOST-...", uuid)
    assert d.cli_json("ls") == before                              # nothing was made


@pytest.mark.slabs_off     # parity of its own, whole granules: an exact total per request
def test_its_capacity_is_what_info_shows_and_its_total_what_the_device_takes(daemon_factory):
    small = daemon_factory(extra_args=["--host-capacity", "64M"])
    err = small.cli("create", "big", "--size", "61M", check=7).stderr.decode()
    needed = int(re.search(r"which needs \S+ \((\d+) bytes\)", err).group(1))
    capacity, parity = (int(n) * MiB for n in
                        re.search(r"capacity (\d+)M .*\+ ECC parity (\d+)M;", err).groups())
    assert needed == capacity + parity
    # Where it fits, the same request gets that capacity (as `info` shows it, parity apart)
    # and takes `needed` from the device.
    roomy = daemon_factory(extra_args=["--host-capacity", "128M"])
    assert roomy.cli_json("create", "big", "--size", "61M")["capacity"] == capacity
    assert roomy.cli_json("devices")[0]["ours"] == needed
