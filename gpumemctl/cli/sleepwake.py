"""`gpumemctl sleep|wake`: an allocation's memory to host memory and back (issue 28; the
library side, which keeps attachments at their addresses, is gpumemctl/sleepwake.py).

From the shell nothing of this process is attached: an allocation another process holds is
busy (exit 9) until that process sleeps it itself (Client.sleep parks its attachments). Each
name is one request, in order; a failure is reported and the rest still run, as `rm` does;
--json prints the daemon's replies (docs/engines.md, "Sleep and wake")."""
from __future__ import annotations

from .. import output
from ..protocol import GpumemError, format_size
from ..protocol.errors import OK
from .context import connect, want_json
from .declare import JSON, NAMES, Group

commands = Group()


@commands.command("sleep", plain=True, names=NAMES, json_=JSON)
def sleep(names: list[str], json_: bool = False):
    """Move allocations' bytes to host memory and give their device memory back.

    They keep their names and bytes (a read copies them from host memory); writing or
    attaching one is refused (exit 10) until `gpumemctl wake`. Exit 9 while another process
    holds one: that process sleeps it itself with gpumemctl.Client.sleep, and gets it back
    at the same addresses."""
    return _each(names, "sleep", slept_line, json_)


@commands.command("wake", plain=True, names=NAMES, json_=JSON)
def wake(names: list[str], json_: bool = False):
    """Bring sleeping allocations' bytes back to device memory, every block verified.

    An attachment parked by its process maps the memory again when that process wakes it
    (gpumemctl.Client.wake), at the same address."""
    return _each(names, "wake", woken_line, json_)


def _each(names: list[str], op: str, line, json_: bool) -> int:
    """Client.sleep or Client.wake of each name in turn, carrying on past errors as `rm`
    does: a line on stdout per name done, the error on stderr per name not. --json: the
    replies in order, {name, error} in the place of a name that failed. Exit status: the
    first error's code, else 0."""
    code, replies = OK, []
    with connect() as c:
        for name in names:
            try:
                reply = getattr(c, op)(name)[0]
            except GpumemError as exc:
                output.error(str(exc))
                replies.append({"name": name, "error": exc.to_wire()})
                code = code or exc.code
                continue
            replies.append(reply)
            if not want_json(json_):
                output.data(line(reply))
    if want_json(json_):
        output.emit_json(replies)
    return code


def slept_line(reply: dict) -> str:
    """`sleep models/llama: 16G to host memory in 0.41 s (39.0 GB/s)`."""
    head = f"sleep {reply['info']['path']}: "
    if reply["already"]:
        return head + "already asleep"
    return head + f"{format_size(reply['bytes'])} to host memory in {_timed(reply)}"


def woken_line(reply: dict) -> str:
    """`wake models/llama: 16G back in 0.30 s (53.3 GB/s), 131072 blocks verified`, and
    what the verify corrected or could not."""
    head = f"wake {reply['info']['path']}: "
    if reply["already"]:
        return head + "already awake"
    found = reply.get("verify") or {}
    text = head + f"{format_size(reply['bytes'])} back in {_timed(reply)}, " \
        f"{found.get('blocks', 0)} blocks verified"
    for key in ("corrected", "uncorrectable"):
        if found.get(key):
            text += f", {found[key]} {key}"
    return text


def _timed(reply: dict) -> str:
    seconds = reply["seconds"]
    rate = f" ({reply['bytes'] / seconds / 1e9:.1f} GB/s)" if seconds > 0 else ""
    return f"{seconds:.2f} s{rate}"
