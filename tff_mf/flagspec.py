"""One description of a command-line flag, declared where its concept lives.

A participation kind declares the flags of its parameters (``tff_mf.participation``), a
factorization family those of its own (``tff_mf.factorization.families``); every tool, argparse
or absl, defines its flags from these descriptions (``tff_mf.clitools.add_flag``,
``clitools.define_absl_flag``), so that a new parameter reaches every tool with no edit outside
its class. Imports nothing of tff-mf.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Tuple


@dataclasses.dataclass(frozen=True)
class Flag:
  """A flag: ``--name`` of Python type ``type`` (int, float or str), shown as ``metavar``,
  with ``help`` (what it means; the tool appends its default); ``owners`` are the kinds or
  strategies that take it, named first in the help; ``choices`` the accepted spellings (if
  limited) and ``convert`` what a given value becomes (default: ``type``)."""
  name: str
  type: type
  metavar: str
  help: str
  owners: Tuple[str, ...] = ()
  choices: Tuple[str, ...] = ()
  convert: Optional[Callable[[str], Any]] = None

  @property
  def text(self) -> str:
    """The help as every tool shows it: the owners, then what it means."""
    return f"{', '.join(self.owners)}: {self.help}" if self.owners else self.help


def merged(flags) -> Tuple[Flag, ...]:
  """One ``Flag`` per name, in first-seen order, its owners the union of the declarations'
  (which must agree on type, metavar and help)."""
  out = {}
  for flag in flags:
    seen = out.get(flag.name)
    if seen is None:
      out[flag.name] = flag
      continue
    if (seen.type, seen.metavar, seen.help) != (flag.type, flag.metavar, flag.help):
      raise ValueError(f"flag --{flag.name} is declared twice with different meanings")
    out[flag.name] = dataclasses.replace(seen, owners=seen.owners + tuple(
        o for o in flag.owners if o not in seen.owners))
  return tuple(out.values())
