"""The ``tff-mf`` console script: one subcommand per module in ``tff_mf.commands``.

Each command module defines ``register(subparsers)``, which adds its parser and
sets ``func`` to a callable taking the parsed arguments and returning an exit
code. Command modules import nothing heavy at module level, so that
``tff-mf factorize`` on a cache hit answers in about a second.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import List, Optional

# Subcommand name -> module (in the order `tff-mf --help` lists them).
COMMANDS = (
    ("factorize", "tff_mf.commands.factorize"),
    ("cache", "tff_mf.commands.cache"),
    ("plot", "tff_mf.commands.plot"),
    ("account", "tff_mf.commands.account"),
)


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="tff-mf",
      description="Optimal matrix-factorization mechanisms for DP federated learning.")
  subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
  subparsers.required = True
  for _, module in COMMANDS:
    importlib.import_module(module).register(subparsers)
  return parser


def main(argv: Optional[List[str]] = None) -> int:
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  parser = build_parser()
  args = parser.parse_args(argv)
  try:
    return int(args.func(args) or 0)
  except (ValueError, OSError) as e:  # user-facing errors: one clear line, no traceback
    print(f"tff-mf {args.command}: error: {e}", file=sys.stderr)
    return 2


if __name__ == "__main__":
  sys.exit(main())
