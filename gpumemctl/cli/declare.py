"""How a command of gpumemctl is declared: its body, a plain function that does the work, and
beside it what each of the body's parameters is on the command line (`Arg`, `Opt`).

    commands = Group()

    @commands.command("info", plain=True, name=NODE, json_=JSON)
    def info(name: str, json_: bool = False):
        ...                     # its docstring is the command's help

No typer or click here: gpumemctl/cli/typerapp.py builds the typer app from these
declarations (help, usage errors, completions, man pages), and a command declared `plain`
carries `plain`, the Spec by which gpumemctl/cli/plain.py reads its plain command lines
without loading typer at all (docs/cli.md, "Start-up"). Both read the same body's
parameters, their order, types and defaults, so the two cannot disagree about a command.
"""
from __future__ import annotations

TYPE_CHECKING = False               # typing is not imported at run time (the CLI's start-up)
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any


class Arg:
    """A positional argument. `complete`: TAB completes allocation and directory names (the
    daemon is asked). Other keywords go to typer.Argument as they are."""

    def __init__(self, help: str, *, complete: bool = False, **typer: Any):
        self.help, self.complete, self.typer = help, complete, typer


class Opt:
    """An option, spelled `names`. `action`: an option that acts as soon as it is read,
    before any command is looked for, and then ends the program with the exit status
    action() returns (`--version`). Other keywords go to typer.Option as they are."""

    def __init__(self, *names: str, help: str, action: Callable[[], int | None] | None = None,
                 **typer: Any):
        self.names, self.help, self.action, self.typer = names, help, action, typer


class Spec:
    """How a plain command line of one command reads (gpumemctl/cli/plain.py): `positional`
    parameter names in order (with `variadic`, the last takes all the rest, as a list);
    `required` how many positional arguments must be there; `flags` option -> boolean
    parameter it sets; `values` option -> parameter that takes the next argument; `needed`
    the value parameters that must be given."""

    def __init__(self, positional: tuple = (), required: int = 0, *,
                 flags: dict | None = None, values: dict | None = None,
                 variadic: bool = False, needed: tuple = ()):
        self.positional, self.required, self.variadic = positional, required, variadic
        self.flags, self.values, self.needed = flags or {}, values or {}, needed


def parameters(body: Callable) -> tuple[str, ...]:
    """The names of `body`'s parameters, in order (what inspect.signature would say, without
    importing inspect: it costs more than the whole fast path)."""
    code = body.__code__
    return code.co_varnames[:code.co_argcount]


def plain_spec(body: Callable, params: Mapping[str, Arg | Opt]) -> Spec:
    """The Spec of a body and its declaration, as click reads the command typer makes of
    them: an Arg is positional, required without a default, variadic if a list; an Opt is a
    flag if it is a bool, else takes a value, and is needed without a default. Options with
    an `action` are left out: they end the program (typer's to run)."""
    names = parameters(body)
    first_default = len(names) - len(body.__defaults__ or ())
    annotations = body.__annotations__
    positional: list[str] = []
    flags: dict[str, str] = {}
    values: dict[str, str] = {}
    needed: list[str] = []
    required = 0
    for i, name in enumerate(names):
        decl, optional = params[name], i >= first_default
        if isinstance(decl, Arg):
            positional.append(name)
            required += not optional
        elif decl.action is None:
            table = flags if annotations.get(name) in ("bool", bool) else values
            table.update(dict.fromkeys(decl.names, name))
            if not optional:
                needed.append(name)
    variadic = bool(positional) and str(annotations.get(positional[-1])).startswith("list[")
    return Spec(tuple(positional), required, flags=flags, values=values, variadic=variadic,
                needed=tuple(needed))


class Command:
    """One command: its name, its body and the declaration of each of the body's parameters.
    `plain`: the Spec of its plain command lines, for the commands scripts run in loops
    (None: typer reads every command line of it)."""

    def __init__(self, name: str, body: Callable, params: Mapping[str, Arg | Opt],
                 plain: bool = False):
        if set(params) != set(parameters(body)):
            raise TypeError(f"command {name!r}: declared {sorted(params)}, but "
                            f"{body.__name__}() takes {list(parameters(body))}")
        self.name, self.body, self.params = name, body, params
        self.plain = plain_spec(body, params) if plain else None


class Group:
    """Commands under one name (`gpumemctl scrub ...`), or, without a name, a module's
    commands at the top of the tree (each module of gpumemctl/cli/root.py MODULES has one,
    `commands`). `typer`: keywords for the group's typer.Typer."""

    def __init__(self, name: str | None = None, help: str | None = None, **typer: Any):
        self.name, self.help, self.typer = name, help, typer
        self.members: dict[str, Command | Group] = {}
        self.default: Command | None = None

    def _add(self, name: str, member: Command | Group) -> None:
        if name in self.members:
            raise ValueError(f"{name!r} is declared twice")
        self.members[name] = member

    def command(self, name: str, /, *, plain: bool = False, **params: Arg | Opt):
        """Declare the function below as the command `name`, its parameters as `params`."""
        def declare(body: Callable) -> Callable:
            self._add(name, Command(name, body, params, plain))
            return body
        return declare

    def group(self, name: str, help: str, **typer: Any) -> Group:
        """A group of commands under `name`."""
        group = Group(name, help, **typer)
        self._add(name, group)
        return group

    def bare(self, **params: Arg | Opt):
        """Declare the function below as what the group's name alone runs (`gpumemctl
        scrub`); the group must be declared with invoke_without_command=True."""
        def declare(body: Callable) -> Callable:
            self.default = Command(self.name or "", body, params)
            return body
        return declare


# ---- what many commands take ----------------------------------------------------------------
JSON = Opt("--json", help="Print JSON on stdout (for scripts).")
NAME = Arg("Allocation name, e.g. models/llama.", complete=True)
NODE = Arg("Allocation or directory name, e.g. models.", complete=True)
NAMES = Arg("One or more allocation names.", complete=True)
OFFSET = Opt("--offset", help="Byte offset (sizes like 4K work).")
# What create and load both take for the allocations they make.
DURABLE = Opt("--durable", help="Survive daemon restarts.")
DEVICE = Opt("--device", help="Device index or UUID.")
FILE_MODE = Opt("--mode", help="Octal permissions.")
ECC = Opt("--ecc", help="rs or none (default: the daemon's, rs unless configured).")
