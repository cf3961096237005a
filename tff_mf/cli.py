"""The ``tff-mf`` console script: one subcommand per module in ``tff_mf.commands``.

Each command module defines ``register(subparsers)``, which adds its parser and sets
``func`` to a callable taking the parsed arguments and returning an exit code.
Command modules import nothing heavy at module level, so that ``tff-mf factorize``
on a cache hit answers in about a second. Every error a user can cause is one line
on stderr (``tff-mf <command>: error: ...``) and exit status 2, never a traceback; flags
are spelled as in every other tool (``tff_mf.clitools``).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import List, Optional

from tff_mf import clitools
from tff_mf import interrupt

# Subcommand name -> module (in the order `tff-mf --help` lists them).
COMMANDS = (
    ("factorize", "tff_mf.commands.factorize"),
    ("cache", "tff_mf.commands.cache"),
    ("plot", "tff_mf.commands.plot"),
    ("account", "tff_mf.commands.account"),
    ("audit", "tff_mf.commands.audit"),
    ("calibrate-bands", "tff_mf.commands.calibrate_bands"),
    ("plan", "tff_mf.commands.plan"),
)


def build_parser() -> argparse.ArgumentParser:
  from tff_mf import __version__  # pylint: disable=g-import-not-at-top
  parser = clitools.ArgumentParser(
      prog="tff-mf",
      description="Matrix-factorization mechanisms for differentially private federated "
                  "learning: factorize workloads, inspect the matrix cache, plot, and account "
                  "for privacy. `tff-mf COMMAND --help` describes each command.")
  parser.add_argument("--version", action="version", version=f"tff-mf {__version__}")
  subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
  for _, module in COMMANDS:
    importlib.import_module(module).register(subparsers)
  return parser


def main(argv: Optional[List[str]] = None) -> int:
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  parser = build_parser()
  args = parser.parse_args(argv)
  if args.command is None:
    parser.print_help()
    return 0
  # Ctrl-C stops at once, one line, exit 130; a second Ctrl-C during clean-up exits at once.
  with interrupt.handled(defer=False, prog=f"tff-mf {args.command}",
                         stop_line=_stop_line(args.command)):
    return _run(args)


def _stop_line(command: str) -> str:
  """The one line a command prints when Ctrl-C stops it."""
  module = importlib.import_module(dict(COMMANDS)[command])
  return f"tff-mf {command}: {getattr(module, 'INTERRUPTED', 'interrupted; nothing was written')}"


def _require_extras(command: str) -> None:
  """A command whose module lists ``EXTRAS`` (``tff_mf.optional``) stops at once, in one line,
  where one of them is not installed."""
  from tff_mf import optional  # pylint: disable=g-import-not-at-top
  for extra in getattr(importlib.import_module(dict(COMMANDS)[command]), "EXTRAS", ()):
    optional.require(extra)


def _run(args: argparse.Namespace) -> int:
  try:
    _require_extras(args.command)
    return int(args.func(args) or 0)
  except (ValueError, OSError, MemoryError) as e:  # user-facing errors: one line, no traceback
    message = (clitools.flag_message(e, flags=vars(args)).splitlines()[0] if str(e)
               else type(e).__name__)
    print(f"tff-mf {args.command}: error: {message}", file=sys.stderr)
    return 2
  except KeyboardInterrupt:
    print(_stop_line(args.command), file=sys.stderr)
    return interrupt.EXIT_CODE


if __name__ == "__main__":
  sys.exit(main())
