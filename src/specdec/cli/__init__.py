"""The `specdec` command line: argument parsing and printing only; the work lives in the library.

Each sub-command is a module with ``register(subparsers)``, which adds its parser and sets
``run=`` to a function taking the parsed arguments and returning an exit code.
"""

from __future__ import annotations

import argparse
import sys

from . import bench, explore, fit_draft, generate, measure, plan, serve

COMMANDS = (generate, plan, measure, explore, bench, fit_draft, serve)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specdec",
        description="Exact speculative decoding: a draft proposes, the target verifies, the output "
        "distribution stays exactly the target's.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except ValueError as err:  # bad input found by the library: one clear line, no traceback
        print(f"specdec {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"specdec {args.command}: interrupted", file=sys.stderr)
        return 130
