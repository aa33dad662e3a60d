"""The `gpumemctl` command line as typer and click read it, built from the declarations of
gpumemctl/cli/ (root.py and the modules it names; how a command is declared:
gpumemctl/cli/declare.py): every command, option and help text. Completions and man pages
are generated from the click tree `build_command()` returns (`make generated`).

Pinned surface and exit codes: docs/cli.md. Every command takes `--json` (or the global
one); with it, stdout is one JSON document. Errors are one line on stderr and the exit
status is the error's protocol code; a usage error is that line and `Try 'gpumemctl
COMMAND -h' for help.` (`run()` below words them, not typer's rich panel).

Each command's body runs through context.invoke, as on the fast path (gpumemctl/cli/plain.py).
This module must not import textual, cuda or pynvml at module scope (a test checks).
"""
from __future__ import annotations

import functools
import importlib
import inspect
import typing
from typing import Annotated

import click
import typer

from .. import output
from ..protocol.errors import OK, USAGE
from . import context, root
from .declare import Arg, Command, Group, Opt
from .examples import epilog, reflowed, short_help

# The order `gpumemctl -h` lists the commands in (the man page's too): by what a person
# looks for first, not by the module that declares each.
ORDER = ("ls", "create", "mkdir", "rm", "mv", "ln", "resize", "durable", "transient", "info",
         "revoke", "write", "read", "sleep", "wake", "status", "load", "save", "metrics",
         "devices", "events", "check", "verify", "recover", "top", "doctor", "scrub", "compact",
         "snapshot", "meta", "debug")


def complete_name(ctx: typer.Context, incomplete: str) -> list[tuple[str, str]]:
    """TAB on an allocation name: ask the daemon (gpumemctl/cli/completion.py)."""
    from .completion import allocation_names
    return allocation_names(ctx.find_root().params.get("socket"), incomplete)


def _acting(action):
    """The click callback of an Opt with an `action`: run it, then end the program."""
    def act(given: bool) -> None:
        if given:
            raise typer.Exit(context.invoke(action, {}))
    return act


def _parameter_info(decl: Arg | Opt):
    """typer's declaration of one parameter, from ours."""
    kwargs = dict(decl.typer)
    if isinstance(decl, Arg):
        if decl.complete:
            kwargs["autocompletion"] = complete_name
        return typer.Argument(help=decl.help, **kwargs)
    if decl.action is not None:
        kwargs.update(is_eager=True, callback=_acting(decl.action))
    return typer.Option(*decl.names, help=decl.help, **kwargs)


def _signature(command: Command, with_context: bool = False) -> inspect.Signature:
    """The body's signature, each parameter annotated as typer wants it: Annotated[type,
    typer.Argument or typer.Option]; `with_context`: a typer.Context first."""
    hints = typing.get_type_hints(command.body)
    params = [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                annotation=typer.Context)] if with_context else []
    for p in inspect.signature(command.body).parameters.values():
        info = _parameter_info(command.params[p.name])
        params.append(p.replace(annotation=Annotated[hints[p.name], info]))
    return inspect.Signature(params)


def _dressed(run, command: Command, with_context: bool = False):
    """`run` as typer must see it: the body's name and docstring (the help), the signature
    of _signature, and `body`, what the fast path calls too (tests/unit/test_cli_plain.py)."""
    functools.update_wrapper(run, command.body)
    run.__doc__ = reflowed(command.body.__doc__)
    run.__signature__ = _signature(command, with_context)
    run.body = command.body
    return run


def _callback(command: Command):
    body = command.body

    def run(**params):
        raise typer.Exit(context.invoke(body, params))
    return _dressed(run, command)


def _bare_callback(command: Command):
    """A group's callback that runs `command` when the group's name comes alone."""
    body = command.body

    def run(ctx: typer.Context, **params):
        if ctx.invoked_subcommand is None:
            raise typer.Exit(context.invoke(body, params))
    return _dressed(run, command, with_context=True)


def _root_callback():
    def run(**params):
        root.main_options(**params)
    run = _dressed(run, Command(root.PROG, root.main_options, root.OPTIONS))
    run.__doc__ = None              # the program's help is root.HELP
    return run


def _sub_app(group: Group) -> typer.Typer:
    sub = typer.Typer(help=group.help, **group.typer)
    if group.default is not None:
        sub.callback()(_bare_callback(group.default))
    for name, member in group.members.items():
        if not isinstance(member, Command):
            raise TypeError(f"{group.name} {name}: groups go one level deep")
        sub.command(name, **_help_of(f"{group.name} {name}", member))(_callback(member))
    return sub


def _help_of(full_name: str, command: Command) -> dict:
    """A command's one-line entry in its group's list and its examples (examples.py)."""
    return {"short_help": short_help(command.body.__doc__), "epilog": epilog(full_name)}


def declared() -> dict[str, Command | Group]:
    """Every command and group at the top of the tree, from the modules of root.MODULES."""
    members: dict[str, Command | Group] = {}
    for module in root.MODULES:
        for name, member in importlib.import_module(f"{__package__}.{module}") \
                .commands.members.items():
            if name in members:
                raise ValueError(f"{name!r} is declared twice (the second in {module})")
            members[name] = member
    if set(members) != set(ORDER):
        raise ValueError(f"ORDER must name each command once: {sorted(set(members) ^ set(ORDER))}")
    return members


def build_app() -> typer.Typer:
    # suggest_commands=False: click suggests a near command name itself; typer's own
    # suggestion came on top of it ("Did you mean 'ls'? Did you mean 'ls'?").
    app = typer.Typer(add_completion=False, no_args_is_help=True,
                      pretty_exceptions_enable=False, suggest_commands=False, help=root.HELP,
                      context_settings={"help_option_names": ["-h", "--help"]})
    app.callback()(_root_callback())
    members = declared()
    for name in ORDER:
        member = members[name]
        if isinstance(member, Command):
            app.command(name, **_help_of(name, member))(_callback(member))
        else:
            app.add_typer(_sub_app(member), name=name,
                          short_help=short_help(member.help))
    return app


app = build_app()


# ---- running it -----------------------------------------------------------------------------
def build_command() -> click.Group:
    """The click tree typer builds from `app`, with the help of positional arguments put
    back: click 8.2+ resets the `help` that typer's TyperArgument sets before calling it."""
    group = typer.main.get_command(app)
    if not isinstance(group, click.Group):      # typer makes one for an app of many commands
        raise TypeError(f"typer built a {type(group).__name__} for gpumemctl, not a group")
    _restore_argument_help(group)
    return group


def _restore_argument_help(cmd: click.Command) -> None:
    for sub in getattr(cmd, "commands", {}).values():
        _restore_argument_help(sub)
    bare = [param for param in cmd.params
            if isinstance(param, click.Argument) and not getattr(param, "help", None)]
    if not bare or cmd.callback is None:
        return
    declared = typer.utils.get_params_from_function(cmd.callback)
    for param in bare:
        param.help = getattr(declared[param.name].default, "help", None)


def run(argv: list[str]) -> int:
    """Run a command line through typer and click; returns the exit status. A usage error
    is one line and a hint on stderr, exit 2 (docs/cli.md)."""
    group = build_command()
    try:
        code = group.main(args=argv, prog_name=root.PROG, standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:      # `gpumemctl`, `gpumemctl debug`
        text = exc.format_message()     # the help; typer's rich help printed itself: ""
        if text:
            output.trusted_text(text)
        return USAGE
    except click.UsageError as exc:
        output.usage_error(usage_message(exc), help_hint(exc.ctx))
        return exc.exit_code
    except click.ClickException as exc:
        output.error(exc.format_message())
        return exc.exit_code
    except click.Abort:
        output.error("aborted")
        return 1
    return code if isinstance(code, int) else OK


def usage_message(exc: click.UsageError) -> str:
    """click's message in this program's style: lower case, no full stop, and one
    "did you mean" (click adds its own, worded two ways, in format_message)."""
    alternatives = getattr(exc, "possibilities", None)
    text = exc.message if alternatives else exc.format_message()
    text = text.strip().removesuffix(".")
    if alternatives:
        text += "; did you mean " + " or ".join(repr(a) for a in sorted(alternatives)) + "?"
    return text[:1].lower() + text[1:]


def help_hint(ctx: click.Context | None) -> str | None:
    if ctx is None or not ctx.help_option_names:
        return None
    return f"Try '{ctx.command_path} {ctx.help_option_names[0]}' for help."
