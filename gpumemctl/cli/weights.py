"""`gpumemctl load|save`: safetensors weights into allocations and back (docs/tensors.md). The
work is gpumemctl/weights.py's, imported only when they run, so that no other command pays
for the safetensors library. Their one-line summaries go to stderr (stdout carries data only:
the JSON document, or the file itself for `save NAME -`)."""
from __future__ import annotations

from .. import output
from ..protocol import format_size
from ..protocol.defaults import FILE_MODE
from .context import connect, want_json
from .declare import DEVICE, DURABLE, ECC, JSON, Arg, Group
from .declare import FILE_MODE as MODE
from .snapshot import summary

commands = Group()


def _rate(nbytes: int, seconds: float) -> str:
    return f"{nbytes / seconds / 1e9:.2f} GB/s" if seconds > 0 and nbytes else "-"


@commands.command(
    "load",
    src=Arg("A .safetensors file, a sharded model's *.safetensors.index.json, or a directory "
            "of .safetensors files."),
    name=Arg("The allocation to make (a directory of allocations for a sharded model), e.g. "
             "models/llama.", complete=True),
    durable=DURABLE, device=DEVICE, mode=MODE, ecc=ECC, json_=JSON)
def load(src: str, name: str, durable: bool = False, device: str | None = None,
         mode: str = f"{FILE_MODE:04o}", ecc: str | None = None, json_: bool = False) -> None:
    """Load safetensors weights into NAME: tensor bytes at their offsets, the header kept as
    NAME's metadata (gpumemctl.tensors.load makes zero-copy tensors of them)."""
    from .. import weights
    from ..formats import parse_mode
    file_mode = parse_mode(mode)
    with connect() as c:
        warming = None
        if c.hello.get("backend") == "cuda":       # CUDA starts while the files are checked
            from ..memory import warm_up
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
    summary(f"loaded {result['tensors']} tensors ({format_size(result['bytes'])}) from "
            f"{src} into {where} in {result['seconds']:.2f} s "
            f"({_rate(result['bytes'], result['seconds'])})")


@commands.command(
    "save",
    name=Arg("An allocation made by load (or a directory of them).", complete=True),
    out=Arg("The .safetensors file to write, or - for stdout (a directory for a sharded "
            "model)."),
    json_=JSON)
def save(name: str, out: str, json_: bool = False) -> None:
    """Write NAME back as a safetensors file, byte-identical to its source if unchanged."""
    from .. import weights
    from ..protocol import UsageError
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
    summary(line)           # stderr: stdout carries only data (the file itself, with -)
