"""
One console script per thing a user does, with subcommands (``oxygen_bench engine ...``).

A group names its subcommands and the module whose ``main(argv)`` runs each; the module is
imported only when its subcommand runs, so ``oxygen_bench --help`` loads neither torch nor rclpy.
"""

from __future__ import annotations

from dataclasses import dataclass
import importlib
import sys
from typing import Sequence


@dataclass(frozen=True, slots=True)
class Subcommand:
    """A subcommand: the module whose ``main(argv) -> int | None`` runs it, and one help line."""

    module: str
    summary: str


def _usage(prog: str, description: str, commands: dict[str, Subcommand],
           default: str | None) -> str:
    width = max(map(len, commands))
    lines = [f'usage: {prog} {{{",".join(commands)}}} [ARGS ...]', '', description, '',
             'subcommands:']
    lines += [f'  {name:<{width}}  ' + ('(default) ' if name == default else '') + cmd.summary
              for name, cmd in commands.items()]
    lines += ['', f"'{prog} SUBCOMMAND --help' shows a subcommand's options."]
    return '\n'.join(lines)


def run_group(prog: str, description: str, commands: dict[str, Subcommand],
              argv: Sequence[str] | None = None, *, default: str | None = None) -> int:
    """
    Run the subcommand named by ``argv[0]`` with the rest of ``argv``; return its exit status.

    ``default`` runs when ``argv`` is empty or starts with an option other than ``-h``/``--help``
    (``oxygen_demo --duration 5`` is ``oxygen_demo bag --duration 5``). An unknown subcommand
    prints the usage to stderr and returns 2, as argparse does.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ('-h', '--help'):
        print(_usage(prog, description, commands, default))
        return 0
    if default is not None and (not args or args[0].startswith('-')):
        args.insert(0, default)
    if not args or args[0] not in commands:
        given = f'unknown subcommand {args[0]!r}' if args else 'a subcommand is needed'
        print(f'{_usage(prog, description, commands, default)}\n\n{prog}: error: {given}',
              file=sys.stderr)
        return 2
    name, *rest = args
    module = importlib.import_module(commands[name].module)
    status = module.main(rest)
    return 0 if status is None else int(status)
