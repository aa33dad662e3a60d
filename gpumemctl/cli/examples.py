"""One or two examples for every command's `-h` (issue 27: no command's help had one, as
git's and zfs's do), shown under the options as "Examples". Kept here, one table, so that a
test can hold every command to having some (tests/integration/test_help.py)."""
from __future__ import annotations

EXAMPLES: dict[str, tuple[str, ...]] = {
    "ls": ("gpumemctl ls -lR models", "gpumemctl ls --json | jq '.[].path'"),
    "create": ("gpumemctl create models/llama --size 16G --durable",
               "gpumemctl create --from sizes.txt   # one 'NAME SIZE' per line"),
    "mkdir": ("gpumemctl mkdir -p kv/cache",),
    "rm": ("gpumemctl rm models/old", "gpumemctl rm -r kv/cache"),
    "mv": ("gpumemctl mv models/llama-new models/llama",
           "gpumemctl mv kv/chunk-7 archive/   # into a directory"),
    "ln": ("gpumemctl ln -s llama-3.1 models/current",),
    "resize": ("gpumemctl resize kv/cache --size 8G",),
    "durable": ("gpumemctl durable models/llama",),
    "transient": ("gpumemctl transient scratch/tmp",),
    "info": ("gpumemctl info models/llama", "gpumemctl info models/llama --json | jq .holders"),
    "revoke": ("gpumemctl revoke models/llama",),
    "write": ("gpumemctl write models/llama weights.bin",
              "tar c dir | gpumemctl write --grow backup/dir.tar -"),
    "read": ("gpumemctl read models/llama copy.bin",
             "gpumemctl read kv/0 --offset 1M --length 4K | xxd | head"),
    "sleep": ("gpumemctl sleep models/llama", "gpumemctl sleep --json kv/a kv/b"),
    "wake": ("gpumemctl wake models/llama",),
    "status": ("gpumemctl status", "gpumemctl status --json | jq .devices"),
    "load": ("gpumemctl load model.safetensors models/llama --durable",),
    "save": ("gpumemctl save models/llama copy.safetensors",),
    "metrics": ("gpumemctl metrics > /var/lib/node_exporter/textfile/gpumemd.prom",),
    "devices": ("gpumemctl devices",),
    "events": ("gpumemctl events --limit 20", "gpumemctl events --json --follow"),
    "check": ("gpumemctl check", "gpumemctl check --repair"),
    "verify": ("gpumemctl verify --all", "gpumemctl verify models/llama --repair"),
    "recover": ("gpumemctl recover models/llama",),
    "top": ("gpumemctl top",),
    "doctor": ("gpumemctl doctor",),
    "scrub": ("gpumemctl scrub --wait", "gpumemctl scrub status"),
    "scrub start": ("gpumemctl scrub start --rate 1G",),
    "scrub status": ("gpumemctl scrub status --json",),
    "scrub stop": ("gpumemctl scrub stop",),
    "compact": ("gpumemctl compact --dry-run",),
    "snapshot create": ("gpumemctl snapshot create /srv/snaps",
                        "gpumemctl snapshot create s3://bucket/gpumem --incremental"),
    "snapshot restore": ("gpumemctl snapshot restore /srv/snaps",
                         "gpumemctl snapshot restore /srv/snaps/snap-... models/llama"),
    "snapshot verify": ("gpumemctl snapshot verify /srv/snaps",),
    "snapshot ls": ("gpumemctl snapshot ls /srv/snaps",),
    "snapshot rm": ("gpumemctl snapshot rm /srv/snaps --keep 7",),
    "meta ls": ("gpumemctl meta ls models/llama",),
    "meta get": ("gpumemctl meta get models/llama revision",),
    "meta set": ("gpumemctl meta set models/llama revision 3f2a9c",),
    "meta rm": ("gpumemctl meta rm models/llama revision",),
    "debug corrupt": ("gpumemctl debug corrupt kv/0 --offset 4096 --length 64",),
    "debug gpu-event": ("gpumemctl debug gpu-event --device 0 --ecc double",
                        "gpumemctl debug gpu-event --device 0 --xid 79"),
}


def epilog(command: str) -> str | None:
    """The "Examples" text under a command's options, or None."""
    lines = EXAMPLES.get(command)
    if not lines:
        return None
    # Rich reflows the lines of a paragraph into one: each example is a paragraph.
    return "Examples:\n\n" + "\n\n".join(f"  {line}" for line in lines)


def short_help(doc: str | None) -> str | None:
    """A command's line in its group's list: the docstring's first paragraph on one line
    (the docstring's own line breaks showed in `gpumemctl -h`)."""
    if not doc:
        return None
    return (reflowed(doc) or "").split("\n\n", 1)[0]


def reflowed(doc: str | None) -> str | None:
    """A docstring as help text: each paragraph on one line, for the help's own wrapping
    (typer's rich help kept the docstring's line breaks: issue 27)."""
    if not doc:
        return doc
    import inspect
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(" ".join(p.split()) for p in paragraphs)
