"""One vocabulary for every command line of tff-mf: ``tff-mf`` and the training tools.

Every tool (argparse or absl) goes through this module, so that

- ``--flag_name`` and ``--flag-name`` are the same flag (``normalize_argv``; the help and
  the docs spell flags with underscores), and ``--no_flag`` turns a boolean off;
- a mistyped flag, value, mechanism or strategy name is a one-line error naming the
  closest valid spelling (``closest``, difflib), exit status 2 (``USAGE_ERROR``);
- ``--help`` exits 0, and every flag's help states its default (``HelpFormatter``);
- a float flag refuses NaN and ±inf at parse time, naming the flag (``finite_float``; absl's
  float flags in ``parse_absl_flags``): no tool gives them a meaning;
- the shared concepts have one flag each: ``add_progress_flags``, ``add_cache_dir_flag``,
  ``add_accountant_flag``, ``add_rounds_flag``, ``add_delta_flag``; ``--workers`` always
  means TFF worker addresses and ``--processes`` local processes;
- a renamed flag (``RENAMED``) is refused in one line naming its new spelling (and what it
  meant in that tool where the new name alone does not say it), exit status 2: a name never
  changes meaning, and no alias keeps an old one alive;
- the schema flags imply their participation kind where ``--participation`` is not given
  (``implied_participation``).

The table of every flag, its meaning, default and tools is docs/vocabulary.md.

Imports neither TensorFlow nor absl at module level.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import sys
from typing import Dict, Iterable, List, Optional, Sequence

from tff_mf.checks import closest  # the one spelling helper (re-used by every tool)

USAGE_ERROR = 2  # exit status of a usage error (a bad flag, value or name), as argparse's
HELP_FLAGS = ("--help", "-h", "--helpshort", "--helpfull", "-?")
# The flag of a Python argument whose name differs (the rounds n are --total_rounds).
FLAG_OF_ARGUMENT = {"n": "total_rounds", "samples": "bound_samples"}

# Former spellings, per tool (the prog of its parser): {old flag: (canonical flag, what the
# old spelling meant there, when the canonical name alone does not say it)}. Each is refused
# in one line naming the canonical flag, only in the tools where it meant that flag's concept.
_ROUNDS_ALIAS = {"n": ("total_rounds", "")}
RENAMED: Dict[str, Dict[str, tuple]] = {
    "tff-mf factorize": {**_ROUNDS_ALIAS, "strategy": ("mechanism", "")},
    "tff-mf account": dict(_ROUNDS_ALIAS),
    "tff-mf plot": dict(_ROUNDS_ALIAS),
    "tff-mf calibrate-bands": {**_ROUNDS_ALIAS, "strategy": ("mechanism", "")},
    "tff-mf audit": {**_ROUNDS_ALIAS,
                     "momentum": ("server_momentum", "audit's --momentum was the server "
                                                     "momentum")},
    "python -m stackoverflow.pydocs": {
        "cache_dir": ("data_dir", "pydocs' --cache_dir was the docstring-dataset cache, not the "
                                  "factorization cache")},
    "python -m training.main_job": {
        "n": ("table_rounds", "the main job's --n was the rounds of the sqrt(L) table, not "
                              "the training rounds (--total_rounds)")},
}


# ----------------------------------------------------------------------------- spelling


def did_you_mean(word: str, choices: Iterable[str], prefix: str = "") -> str:
  """``"; did you mean X?"`` for the closest spelling of ``word``, or ``""``."""
  match = closest(word, choices)
  return f"; did you mean {prefix}{match}?" if match else ""


def normalize_argv(argv: Sequence[str], known: Iterable[str],
                   absl_booleans: Iterable[str] = ()) -> List[str]:
  """``argv`` with every known ``--flag-name[=v]`` spelled ``--flag_name[=v]``.

  ``known``: the flag names (without dashes, underscore spelling). ``absl_booleans``:
  absl boolean flags, whose ``--no_name``/``--no-name`` become absl's ``--noname``.
  Values and everything after ``--`` are left alone; unknown flags too (the parser then
  reports them with the closest spelling).
  """
  known = set(known)
  booleans = set(absl_booleans)
  out: List[str] = []
  for i, token in enumerate(argv):
    if token == "--":
      out.extend(argv[i:])
      break
    if token.startswith("--") and len(token) > 2 and not any(c.isspace() for c in token):
      name, eq, value = token[2:].partition("=")
      canonical = name.replace("-", "_")
      if canonical in known:
        token = f"--{canonical}{eq}{value}"
      elif canonical.startswith("no_") and canonical[3:] in booleans:
        token = f"--no{canonical[3:]}{eq}{value}"
    out.append(token)
  return out


def one_line(text: object) -> str:
  """A message on one line (whitespace runs collapsed)."""
  return " ".join(str(text).split())


def flag_message(error: BaseException, flags: Iterable[str] = ()) -> str:
  """``error``'s message for a command-line user: each Python argument its remedy names
  (``error.arguments``, e.g. ``tff_mf.checks.CheckError``) spelled as the flag
  (``allow_x=True`` as ``--allow_x``, ``max_iterations`` as ``--max_iterations``), and a
  message that starts with the name of one of the command's ``flags`` ("delta must be in
  (0, 1)", from a check that names its argument) starting with the flag ("--delta ...")."""
  text = str(error)
  for name in getattr(error, "arguments", ()):
    flag = FLAG_OF_ARGUMENT.get(name, name)
    text = re.sub(rf"(?<![-\w]){re.escape(name)}=True\b", f"--{flag}", text)
    text = re.sub(rf"(?<![-\w]){re.escape(name)}\b", f"--{flag}", text)
  first = re.match(r"[A-Za-z_]\w*(?=[ =])", text)
  if first and first.group(0) in set(flags):
    name = first.group(0)
    text = f"--{FLAG_OF_ARGUMENT.get(name, name)}" + text[len(name):]
  return text


def usage_error(prog: str, message: str) -> None:
  """Prints ``prog: error: message`` (one line) and exits with ``USAGE_ERROR``."""
  print(f"{prog}: error: {one_line(message)}", file=sys.stderr)
  sys.exit(USAGE_ERROR)


# ----------------------------------------------------------------------------- argparse


def finite_float(text: str) -> float:
  """``type=float`` of every argparse flag here: a number, refused when NaN or ±inf."""
  try:
    value = float(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
  if not math.isfinite(value):
    raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
  return value


def describe_default(value) -> str:
  if value is None:
    return "none"
  if value is True:
    return "on"
  if value is False:
    return "off"
  if isinstance(value, (list, tuple)):
    return " ".join(map(str, value)) or "none"
  return str(value)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
  """Keeps descriptions as written and appends ``(default: X)`` (or ``(required)``) to
  every flag whose help does not state it already."""

  def _get_help_string(self, action):
    text = action.help or ""
    if isinstance(action, (argparse._HelpAction, argparse._VersionAction,
                            # pylint: disable=protected-access
                           argparse._SubParsersAction)):  # pylint: disable=protected-access
      return text
    if not action.option_strings:  # positionals
      return text
    if action.required:
      return text if "required" in text else f"{text} (required)"
    if "default" in text or action.default is argparse.SUPPRESS:
      return text
    return f"{text} (default: {describe_default(action.default).replace('%', '%%')})"


class ArgumentParser(argparse.ArgumentParser):
  """argparse with the vocabulary of this module.

  Accepts ``--flag_name`` and ``--flag-name``; errors are one line with the closest valid
  spelling, exit status 2; ``removed`` maps a flag that no longer exists to the message
  that names its replacement (a one-line error when given), and so do the former spellings
  of ``RENAMED[prog]``, which the epilog lists. Subparsers are of this class.
  """

  def __init__(self, *args, removed: Optional[Dict[str, str]] = None, **kwargs):
    kwargs.setdefault("allow_abbrev", False)
    kwargs.setdefault("formatter_class", HelpFormatter)
    super().__init__(*args, **kwargs)
    # flag -> the one-line refusal that names what replaces it
    self.removed = {name: f"--{name} was removed: {why}" for name, why in (removed or {}).items()}
    for old, (new, meaning) in RENAMED.get(self.prog, {}).items():
      self.removed.setdefault(old, f"--{old} was renamed --{new}; use --{new}" +
                              (f" ({meaning})" if meaning else ""))
    renamed = RENAMED.get(self.prog, {})
    if renamed:
      listed = "; ".join(f"--{old} (now --{new})" for old, (new, _) in renamed.items())
      self.epilog = ((self.epilog + "\n\n") if self.epilog else "") + \
          f"former spellings, refused: {listed}"
    self.register("type", float, finite_float)  # argument groups share the registry

  def long_flags(self) -> List[str]:
    return [s for s in self._option_string_actions if s.startswith("--")]

  def parse_known_args(self, args=None, namespace=None):
    args = list(sys.argv[1:] if args is None else args)
    known = self.long_flags()
    args = normalize_argv(args, [s[2:] for s in known] + list(self.removed))
    for token in args:
      if token == "--":
        break
      name = token.split("=", 1)[0][2:].replace("-", "_")
      if token.startswith("--") and name in self.removed and f"--{name}" not in known:
        self.error(self.removed[name])
    namespace, extras = super().parse_known_args(args, namespace)
    if extras:
      self.error(self._unknown(extras[0]))
    return namespace, extras

  def _unknown(self, token: str) -> str:
    if token.startswith("-"):
      name = token.split("=", 1)[0]
      hint = did_you_mean(name.lstrip("-"), [s[2:] for s in self.long_flags()], prefix="--")
      return f"unknown flag {name}{hint}"
    return f"unexpected argument {token!r}"

  def _check_value(self, action, value):
    if action.choices is not None and value not in action.choices:
      choices = [str(c) for c in action.choices]
      raise argparse.ArgumentError(
          action, f"unknown value {value!r}{did_you_mean(value, choices)} (expected one of "
                  f"{', '.join(choices)})")

  def error(self, message):
    usage_error(self.prog, f"{message} (see {self.prog} --help)")


# ----------------------------------------------------------------------------- shared flags


def add_progress_flags(parser, default: bool = True, what: str = "progress bars on stderr",
                       note: str = ""):
  """``--progress`` / ``--no_progress`` (dest ``progress``), as in every tool with a bar."""
  group = parser.add_mutually_exclusive_group()
  group.add_argument("--progress", dest="progress", action="store_true", default=default,
                     help=f"show {what} (default: {describe_default(default)}{note})")
  group.add_argument("--no_progress", dest="progress", action="store_false",
                     help=f"do not show {what} (default: {describe_default(not default)})")


def add_rounds_flag(parser, default: Optional[int] = None, required: bool = False,
                    what: str = "", dest: str = "n"):
  """``--total_rounds`` (dest ``n``; ``tff_mf.spec.WORKLOAD_FLAGS``): the number of rounds n,
  the size of A, B and C, as training's ``--total_rounds``; its old spelling ``--n`` is refused,
  naming it."""
  from tff_mf import spec  # pylint: disable=g-import-not-at-top
  add_flag(parser, spec.workload_flag("total_rounds"), default=default, required=required,
           note=what, dest=dest)


def add_delta_flag(parser, required: bool = False, what: str = ""):
  """``--delta``: δ of the (ε, δ) guarantee (``tff_mf.spec.PRIVACY_FLAGS``),
  ``tff_mf.checks.DEFAULT_DELTA`` unless required."""
  from tff_mf.checks import DEFAULT_DELTA  # pylint: disable=g-import-not-at-top
  from tff_mf import spec  # pylint: disable=g-import-not-at-top
  if required:
    add_flag(parser, spec.privacy_flag("delta"), required=True, note=f"{what} (required)")
  else:
    add_flag(parser, spec.privacy_flag("delta"), default=DEFAULT_DELTA,
             default_text=f"{DEFAULT_DELTA:g}", note=what)


def add_target_epsilon_flag(parser):
  """``--target_epsilon`` (required) of the tools that calibrate each candidate to it."""
  from tff_mf import spec  # pylint: disable=g-import-not-at-top
  add_flag(parser, spec.privacy_flag("target_epsilon"), required=True,
           note="; here each candidate's (required)")


def implied_participation(participation: Optional[str], epochs=None, min_sep=None,
                          max_participations=None, sampling_prob=None,
                          default: Optional[str] = "single") -> Optional[str]:
  """The participation kind of a command line: ``--participation`` if given, else the kind
  the schema flags imply (``--epochs``: fixed_epoch; ``--min_sep``, ``--max_participations``
  or ``--sampling_prob``: min_sep), else ``default``. The same rule in every tool."""
  if participation is not None:
    return participation
  if epochs is not None:
    return "fixed_epoch"
  if min_sep is not None or max_participations is not None or sampling_prob is not None:
    return "min_sep"
  return default


def participation_source(participation: Optional[str], epochs=None, min_sep=None,
                         max_participations=None, sampling_prob=None) -> Optional[str]:
  """The flag ``implied_participation`` took the kind from (None: its default)."""
  if participation is not None:
    return "--participation"
  for flag, value in (("epochs", epochs), ("min_sep", min_sep),
                      ("max_participations", max_participations),
                      ("sampling_prob", sampling_prob)):
    if value is not None:
      return f"--{flag}"
  return None


def add_flag(group, flag, default=None, default_text: Optional[str] = None,
             note: str = "", required: bool = False, spelling: Optional[str] = None,
             dest: Optional[str] = None, kind: Optional[type] = None,
             choices: Sequence[str] = ()) -> None:
  """Defines a ``tff_mf.flagspec.Flag`` on an argparse group: its help, then ``note`` (what
  the flag means in this tool), then its default (``default_text``, else ``default``) or
  ``required``; ``spelling``: the tool's name for it (``spec.MOMENTUM_SPELLING``), ``dest``
  the attribute it sets; ``kind`` and ``choices``: the type and names this tool reads where
  they are its own (``tff-mf audit``'s clip norm is a number, calibrate-bands takes two
  mechanisms)."""
  if kind is not None:
    flag = dataclasses.replace(flag, type=kind, convert=None)
  if choices:
    flag = dataclasses.replace(flag, choices=tuple(choices))
  shown = f" (default: {default_text})" if default_text is not None else ""
  kwargs = dict(choices=flag.choices) if flag.choices else dict(metavar=flag.metavar)
  if required:
    kwargs["required"] = True
  else:
    kwargs["default"] = default
  if dest is not None:
    kwargs["dest"] = dest
  group.add_argument(f"--{spelling or flag.name}", type=flag.convert or _argparse_type(flag.type),
                     help=f"{flag.text}{note}{shown}", **kwargs)


def schema_flag(name: str):
  """The ``tff_mf.flagspec.Flag`` of schema flag ``--name`` (``tff_mf.participation.flags``)."""
  from tff_mf import participation  # pylint: disable=g-import-not-at-top
  [flag] = [f for f in participation.flags() if f.name == name]
  return flag


def _argparse_type(kind):
  # No type for text: argparse passes a string default through its type, which would turn a
  # default that knows it is one (a str subclass) into a plain str.
  return finite_float if kind is float else None if kind is str else kind


def add_schema_flags(group, default_text: Optional[Dict[str, str]] = None,
                     notes: Optional[Dict[str, str]] = None) -> None:
  """``--participation`` and the parameters of every kind (``tff_mf.participation.flags``),
  each with this tool's default in words (``default_text``) and note (``notes``)."""
  from tff_mf import participation  # pylint: disable=g-import-not-at-top
  for flag in participation.flags():
    add_flag(group, flag, default_text=(default_text or {}).get(flag.name),
             note=(notes or {}).get(flag.name, ""))


def add_family_flags(group) -> None:
  """The family parameters (``tff_mf.spec.family_flags``: bands, rank, buffers and every
  family's own), each default none (the family's default)."""
  from tff_mf import spec  # pylint: disable=g-import-not-at-top
  for flag in spec.family_flags():
    add_flag(group, flag)


def define_absl_flag(flag, module_name: str, default=None, note: str = "",
                     flag_values=None) -> None:
  """Defines a ``tff_mf.flagspec.Flag`` as an absl flag of module ``module_name`` (the tool's
  ``__name__``: its ``--help`` lists it) (an enum when it has choices), with ``note`` after its
  help; absl shows the default."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  values = flag_values if flag_values is not None else flags.FLAGS
  if module_name == "__main__":  # absl files a script's own flags under its path
    module_name = sys.argv[0]
  text = f"{flag.text}{note}"
  if default is None and "default" not in text:
    text += " (default: none)"
  if flag.choices:
    flags.DEFINE_enum(flag.name, default, list(flag.choices), text, flag_values=values,
                      module_name=module_name)
    return
  define = {int: flags.DEFINE_integer, float: flags.DEFINE_float}.get(flag.type,
                                                                       flags.DEFINE_string)
  define(flag.name, default, text, flag_values=values, module_name=module_name)


def add_cache_dir_flag(parser):
  """``--cache_dir``: the factorization cache (``tff_mf.factorization.cache``)."""
  parser.add_argument("--cache_dir", default=None, metavar="DIR",
                      help="factorization cache directory (default: $TFF_MF_CACHE or "
                           "~/.cache/tff_mf)")


def add_accountant_flag(parser, what: str = ""):
  """``--accountant`` (``tff_mf.spec.PRIVACY_FLAGS``): every accountant of
  ``tff_mf.accounting``, its default; ``what``: what it accounts in this tool."""
  from tff_mf import accounting  # pylint: disable=g-import-not-at-top
  from tff_mf import spec  # pylint: disable=g-import-not-at-top
  add_flag(parser, spec.privacy_flag("accountant"), default=accounting.DEFAULT_ACCOUNTANT,
           default_text=accounting.DEFAULT_ACCOUNTANT,
           note=f"; here {what}" if what else "")


# ----------------------------------------------------------------------------- names


def mechanism_help(trainable: Optional[bool] = None) -> str:
  """The mechanism names once, then their aliases in one short line (from the registry)."""
  from tff_mf import registry  # pylint: disable=g-import-not-at-top
  names = registry.mechanism_names(trainable=trainable)
  aliases = []
  for name in names:
    extra = registry.mechanism(name).aliases
    if extra:
      aliases.append(f"{'/'.join(extra)}={name}")
  return f"names: {', '.join(names)}; aliases: {', '.join(aliases)}"


def resolve_mechanism(name: str, flag: str = "--mechanism", trainable: Optional[bool] = None):
  """The registry mechanism spelled ``name``; a one-line RegistryError with the closest
  spelling otherwise."""
  from tff_mf import registry  # pylint: disable=g-import-not-at-top
  spellings = [s for s in registry.all_spellings()
               if trainable is None or registry.mechanism(s).trainable == trainable]
  if name not in spellings:
    raise registry.RegistryError(
        f"{flag}: unknown mechanism {name!r}{did_you_mean(name, spellings)} "
        f"({mechanism_help(trainable)})")
  return registry.mechanism(name)


# ----------------------------------------------------------------------------- absl


_ABSL_VALUE_ERROR = re.compile(r"flag --([A-Za-z0-9_]+)=(.*?): ")


def parse_absl_flags(argv: Sequence[str], flag_values=None) -> List[str]:
  """absl's flag parsing with this module's vocabulary; returns the remaining argv.

  ``--help`` prints the usage and every flag with its default, and exits 0; a bad flag
  or value is one line on stderr with the closest valid spelling, exit status 2.
  """
  from absl import app  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  flag_values = flags.FLAGS if flag_values is None else flag_values
  prog = os.path.basename(argv[0]) if argv else "program"
  args = list(argv[1:])
  head = args[:args.index("--")] if "--" in args else args
  if any(a in HELP_FLAGS for a in head):
    if "--helpfull" in head:
      print(flag_values.get_help())
    else:
      app.usage(shorthelp=True, writeto_stdout=True)
    sys.exit(0)
  all_flags = flag_values._flags()  # pylint: disable=protected-access
  booleans = [name for name, f in all_flags.items() if f.boolean]
  args = normalize_argv(args, all_flags, booleans)
  try:
    remaining = flag_values([argv[0] if argv else prog] + args)
  except flags.UnrecognizedFlagError as e:
    name = e.flagname.replace("-", "_")
    usage_error(prog, f"unknown flag --{e.flagname}{did_you_mean(name, all_flags, '--')} "
                      f"(see --help)")
  except flags.Error as e:
    message = one_line(e)
    match = _ABSL_VALUE_ERROR.search(message)
    if match and match.group(1) in all_flags:
      enum_values = getattr(all_flags[match.group(1)].parser, "enum_values", None)
      if enum_values:
        message = (f"--{match.group(1)}: unknown value {match.group(2)!r}"
                   f"{did_you_mean(match.group(2), enum_values)} (expected one of "
                   f"{', '.join(enum_values)})")
    usage_error(prog, message)
  for name, flag in sorted(all_flags.items()):
    if (isinstance(flag.parser, flags.FloatParser) and isinstance(flag.value, float)
        and not math.isfinite(flag.value)):
      usage_error(prog, f"--{name} must be a finite number, got {flag.value} (see --help)")
  return remaining
