"""What `gpumemctl load` and `gpumemctl save` print (their declarations are in
gpumemctl/commands.py; the work is gpumemctl/weights.py's, imported only when they run, so
that no other command pays for the safetensors library)."""
from __future__ import annotations

from . import output
from .actions import connect, want_json
from .protocol import format_size


def _rate(nbytes: int, seconds: float) -> str:
    return f"{nbytes / seconds / 1e9:.2f} GB/s" if seconds > 0 and nbytes else "-"


def load(src: str, name: str, durable: bool = False, device: str | None = None,
         mode: str = "0600", ecc: str | None = None, json_: bool = False) -> None:
    from . import weights
    from .formats import parse_mode
    file_mode = parse_mode(mode)
    with connect() as c:
        warming = None
        if c.hello.get("backend") == "cuda":       # CUDA starts while the files are checked
            from .memory import warm_up
            warming = warm_up(device if device is not None else 0)
        plan = weights.plan(src, name)          # every file checked before anything is made
        if warming is not None:
            warming.join()
        meter = output.Progress(f"load {plan.name}", plan.nbytes)
        result = weights.load(c, plan, durable=durable, device=device, mode=file_mode,
                              ecc=ecc, progress=meter)
    meter.finish()
    if want_json(json_):
        output.emit_json(result)
        return
    where = f"{len(result['allocations'])} allocations under {result['name']}/" \
        if plan.directory else result["name"]
    output.data(f"loaded {result['tensors']} tensors ({format_size(result['bytes'])}) from "
                f"{src} into {where} in {result['seconds']:.2f} s "
                f"({_rate(result['bytes'], result['seconds'])})")


def save(name: str, out: str, json_: bool = False) -> None:
    from . import weights
    from .protocol import UsageError
    to_stdout = out == "-"          # the file itself on stdout: nothing else goes there
    if to_stdout and want_json(json_):
        raise UsageError("save NAME - writes the file to stdout, which leaves no room for "
                         "--json: name an OUT file to have both")
    with connect() as c:
        meter = output.Progress(f"save {name}", 0)
        result = weights.save(c, name, out, progress=meter)
    meter.finish()
    if want_json(json_):
        output.emit_json(result)
        return
    files = len(result["files"])
    line = (f"saved {name} to {'stdout' if to_stdout else out} "
            f"({format_size(result['bytes'])} of tensors"
            f"{f' in {files} files' if files > 1 else ''}) in {result['seconds']:.2f} s "
            f"({_rate(result['bytes'], result['seconds'])})")
    if to_stdout:
        output.note(line)
    else:
        output.data(line)
