"""One vocabulary on every tool (issue 37, item 5): docs/vocabulary.md against every tool's help.

Each tool's ``--help`` runs in a clean-shell subprocess (``userenv``) and must list exactly the
flags the table gives it; each flag's default (from the tool's parser, as ``--help`` shows it)
must be the table's; the former-spellings column is ``clitools.RENAMED``. An old spelling is
refused in one line naming the new one (no alias keeps it alive); ``--no_progress`` silences every
bar; the schema flags imply the schema, δ has one default, and ``account --sampling_prob``
alone uses the analysis a training run uses.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

import userenv
from tff_mf import cli
from tff_mf import clitools

REPO = userenv.REPO
TABLE = os.path.join(REPO, "docs", "vocabulary.md")
BINARY = os.path.join(REPO, "training", "run_stackoverflow.py")
# The table's tool names: (the command line of its --help, its parser builder and subcommand).
TFF_MF = ("factorize", "account", "audit", "plot", "calibrate-bands", "plan", "cache list",
          "cache verify")
MODULE_TOOLS = {"main_job": "training.main_job", "sweep": "training.sweep",
                "summarize": "training.summarize", "distributed serve": "training.distributed",
                "distributed check": "training.distributed", "pydocs": "stackoverflow.pydocs",
                "fixtures": "stackoverflow.fixtures"}
PROGS = dict({t: f"tff-mf {t}" for t in TFF_MF},
             **{t: f"python -m {m}" for t, m in MODULE_TOOLS.items()})


def _help_argv(tool):
  if tool in TFF_MF:
    return [sys.executable, "-m", "tff_mf.cli", *tool.split(), "--help"]
  if tool == "run_stackoverflow":
    return [sys.executable, BINARY, "--help"]
  sub = tool.split()[1:]
  return [sys.executable, "-m", MODULE_TOOLS[tool], *sub, "--help"]


def _parser(tool) -> argparse.ArgumentParser:
  """The argparse parser of ``tool`` (a subcommand's own parser)."""
  import importlib  # pylint: disable=g-import-not-at-top
  if tool in TFF_MF:
    parser, path = cli.build_parser(), tool.split()
  else:
    module, path = importlib.import_module(MODULE_TOOLS[tool]), tool.split()[1:]
    parser = module.build_parser()
  for name in path:
    sub = next(a for a in parser._actions  # pylint: disable=protected-access
               if isinstance(a, argparse._SubParsersAction))  # pylint: disable=protected-access
    parser = sub.choices[name]
  return parser


def _defaults(tool):
  """{flag: default as --help shows it} of ``tool`` (paths of this checkout spelled as in the
  table)."""
  out = {}
  if tool == "run_stackoverflow":
    from absl import flags  # pylint: disable=g-import-not-at-top
    from training import run_stackoverflow  # pylint: disable=g-import-not-at-top
    for flag in flags.FLAGS.get_flags_for_module(run_stackoverflow):
      out[flag.name] = clitools.describe_default(flag.default)
    return out
  for action in _parser(tool)._actions:  # pylint: disable=protected-access
    if isinstance(action, (argparse._HelpAction, argparse._VersionAction,
                            # pylint: disable=protected-access
                           argparse._SubParsersAction)) or not action.option_strings:  # pylint: disable=protected-access
      continue
    shown = "required" if action.required else clitools.describe_default(action.default)
    if sys.executable in shown:  # a command line: its words, unquoted (a clone path may hold
      shown = " ".join(shlex.split(shown))  # spaces, which shlex quotes)
    out[action.option_strings[0][2:]] = shown.replace(sys.executable, "python").replace(
        REPO + os.sep, "")
  return out


def _table():
  """{flag: (default cell, [tools], deprecated cell)} of docs/vocabulary.md; a row of several
  flags (``--progress``, ``--no_progress``) is one concept."""
  rows = {}
  with open(TABLE, encoding="utf-8") as f:
    for line in f:
      if not line.startswith("| `--"):
        continue
      cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
      assert len(cells) == 5, line
      flags = re.findall(r"`--(\w+)`", cells[0])
      tools = [t.strip() for t in cells[3].split(",")]
      for flag in flags:
        assert flag not in rows, f"--{flag}: two rows"
        rows[flag] = (cells[2], tools, cells[4], flags[0])
  return rows


def _table_default(cell: str, tool: str) -> str:
  """The default of ``tool`` in a default cell "X; tool: Y; ...": Y, else X."""
  common, *exceptions = cell.split("; ")
  for item in exceptions:
    name, _, value = item.partition(": ")
    if name == tool:
      return value
  return common


def _listed_flags(tool, text):
  """The flags ``tool``'s --help text lists (argparse: option lines; absl: ``--[no]flag:``)."""
  if tool == "run_stackoverflow":
    return set(re.findall(r"^  --(?:\[no\])?(\w+):", text, re.M))
  return set(re.findall(r"^  (?:-\w, )?--(\w+)", text, re.M)) - {"help", "version"}


TOOLS = TFF_MF + ("run_stackoverflow",) + tuple(MODULE_TOOLS)


def test_the_table_is_every_tools_help():
  """Every flag a tool's --help lists is in the table with that tool and its default, every
  table row's tools list it, and the former spellings are clitools.RENAMED's."""
  table = _table()
  listed_by = {}
  for tool in TOOLS:
    result = subprocess.run(_help_argv(tool), env=userenv.env(), cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, (tool, result.stderr[-2000:])
    listed = _listed_flags(tool, result.stdout)
    defaults = _defaults(tool)
    assert listed == set(defaults), (tool, listed ^ set(defaults))
    for flag in listed:
      assert flag in table, f"{tool}: --{flag} is not in docs/vocabulary.md"
      cell, tools, _, first = table[flag]
      assert tool in tools, f"--{flag}: the table does not name {tool}"
      if flag == first:  # --no_progress shares --progress's row and default
        assert _table_default(cell, tool) == defaults[flag], (tool, flag, cell, defaults[flag])
      listed_by.setdefault(flag, set()).add(tool)
    # Former spellings: listed at the end of the help, never as flags of their own.
    for old, (new, _) in clitools.RENAMED.get(PROGS.get(tool, ""), {}).items():
      assert f"--{old} (now --{new})" in " ".join(result.stdout.split()), (tool, old)
  for flag, (_, tools, _, first) in table.items():  # a shared row: its first flag's tools
    assert set(tools) == listed_by.get(first, set()), (flag, tools, listed_by.get(first))
  deprecated = {}
  for prog, aliases in clitools.RENAMED.items():
    tool = next(t for t, p in PROGS.items() if p == prog)
    for old, (new, _) in aliases.items():
      deprecated.setdefault(new, {}).setdefault(old, []).append(tool)
  for flag, (_, _, cell, first) in table.items():
    if flag != first:
      continue
    expected = {f"--{old}": sorted(tools) for old, tools in deprecated.get(flag, {}).items()}
    found = {old: sorted(t.strip() for t in tools.split(","))
             for old, tools in re.findall(r"`(--\w+)` \(([^)]*)\)", cell)}
    assert found == expected, (flag, cell)


def test_one_name_one_meaning_across_the_table():
  """The concepts the issue found under several names now have one flag each."""
  table = _table()
  assert "n" not in table and "strategy" not in table
  assert set(table["total_rounds"][1]) >= {"factorize", "account", "audit", "plot",
                                           "calibrate-bands", "run_stackoverflow", "main_job"}
  assert set(table["mechanism"][1]) >= {"factorize", "account", "audit", "run_stackoverflow"}
  # --momentum is the workload's β only; the server's β is --server_momentum everywhere.
  assert "audit" not in table["momentum"][1] and "audit" in table["server_momentum"][1]
  # One δ: 1e-6 wherever a tool has --delta, and in the library defaults behind them.
  from tff_mf import audit  # pylint: disable=g-import-not-at-top
  from tff_mf import checks  # pylint: disable=g-import-not-at-top
  from training import config as config_lib  # pylint: disable=g-import-not-at-top
  assert table["delta"][0] == clitools.describe_default(checks.DEFAULT_DELTA)
  assert audit.AuditOptions().delta == config_lib.TrainingConfig().delta == \
      checks.DEFAULT_DELTA == 1e-6
  # Every tool that draws a progress bar takes --progress/--no_progress.
  assert set(table["progress"][1]) >= {"factorize", "account", "audit", "plot",
                                       "calibrate-bands", "run_stackoverflow", "main_job",
                                       "sweep", "pydocs"}
  assert table["no_progress"][1] == table["progress"][1]


@pytest.mark.parametrize("argv, old, new", [
    (["factorize", "--n", "8", "--mechanism", "optimal"], "--n", "--total_rounds"),
    (["factorize", "--total_rounds", "8", "--strategy", "optimal"], "--strategy", "--mechanism"),
    (["account", "--n", "8", "--mechanism", "blt", "--noise_multiplier", "1"], "--n",
     "--total_rounds"),
    (["plot", "--n=8", "--output_dir", "x"], "--n", "--total_rounds"),
    (["calibrate-bands", "--total_rounds", "16", "--min_sep", "4", "--sampling_prob", "0.5",
      "--target_epsilon", "2", "--strategy", "banded"], "--strategy", "--mechanism"),
    (["audit", "--mechanism", "blt", "--momentum", "0.5"], "--momentum", "--server_momentum"),
])
def test_an_old_spelling_is_refused_in_one_line_naming_the_new(argv, old, new, capsys):
  with pytest.raises(SystemExit) as e:
    cli.build_parser().parse_args(argv)
  assert e.value.code == clitools.USAGE_ERROR
  err = capsys.readouterr().err.strip().splitlines()[-1]
  assert f"{old} was renamed {new}; use {new}" in err, err


def test_a_renamed_flag_says_what_it_meant_where_the_new_name_does_not(capsys):
  """audit's --momentum was the server momentum; factorize's --momentum is still the
  workload's β (never renamed there); account's --strategy stays the removed flag it was; the
  main job's --n was its table's rounds, pydocs' --cache_dir its dataset cache."""
  with pytest.raises(SystemExit):
    cli.build_parser().parse_args(["audit", "--mechanism", "blt", "--momentum", "0.5"])
  assert "(audit's --momentum was the server momentum)" in capsys.readouterr().err
  args = cli.build_parser().parse_args(["factorize", "--mechanism", "optimal",
                                        "--total_rounds", "8", "--momentum", "0.9"])
  assert args.momentum == 0.9 and capsys.readouterr().err == ""
  with pytest.raises(SystemExit):
    cli.build_parser().parse_args(["account", "--strategy", "blt", "--noise_multiplier", "1"])
  assert "--strategy was removed" in capsys.readouterr().err
  from training import main_job  # pylint: disable=g-import-not-at-top
  with pytest.raises(SystemExit):
    main_job.build_parser().parse_args(["--n", "16"])
  assert "--n was renamed --table_rounds; use --table_rounds (the main job's --n was the " \
      "rounds of the sqrt(L) table" in capsys.readouterr().err
  from stackoverflow import pydocs  # pylint: disable=g-import-not-at-top
  with pytest.raises(SystemExit):
    pydocs.build_parser().parse_args(["--cache_dir", "d"])
  assert "--cache_dir was renamed --data_dir" in capsys.readouterr().err


def _stderr_of(argv, capsys):
  assert cli.main(argv) == 0
  return capsys.readouterr().err


def _bars_on_and_off(name, argv, tmp_path, capsys):
  shown = _stderr_of(argv + ["--cache_dir", str(tmp_path / f"{name}-on")], capsys)
  assert "it/s" in shown or "s/it" in shown or "%|" in shown, (name, shown[-500:])
  quiet = _stderr_of(argv + ["--no_progress", "--cache_dir", str(tmp_path / f"{name}-off")],
                     capsys)
  assert quiet == "", (name, quiet[-500:])


def test_no_progress_turns_every_bar_off(tmp_path, capsys, monkeypatch):
  """factorize, plot and calibrate-bands refused --no_progress: factorize's and plot's bars
  could not be turned off, calibrate-bands drew none. Each now draws its solvers' bars by
  default and none with --no_progress (a fresh cache each time, so the solvers run)."""
  _bars_on_and_off("factorize", ["factorize", "--mechanism", "optimal", "--total_rounds", "24"],
                   tmp_path, capsys)
  _bars_on_and_off("plot", ["plot", "--total_rounds", "8", "--output_dir",
                            str(tmp_path / "png")], tmp_path, capsys)
  # calibrate-bands end to end takes half a minute here (slow test below): the flag reaches
  # the library call that draws its bars.
  from tff_mf.accounting import band_calibration  # pylint: disable=g-import-not-at-top
  from tff_mf import checks  # pylint: disable=g-import-not-at-top
  seen = []

  def calibrate_bands(*args, **kwargs):
    seen.append(kwargs["progress"])
    raise checks.CheckError("recorded")

  monkeypatch.setattr(band_calibration, "calibrate_bands", calibrate_bands)
  for flag in ([], ["--no_progress"], ["--json"]):
    assert cli.main(CALIBRATE_BANDS + flag) == 2
  assert seen == [True, False, False]
  capsys.readouterr()


CALIBRATE_BANDS = ["calibrate-bands", "--mechanism", "banded", "--total_rounds", "8",
                   "--min_sep", "2", "--sampling_prob", "0.5", "--target_epsilon", "8",
                   "--tolerance", "0.1"]


@pytest.mark.slow
def test_calibrate_bands_no_progress_end_to_end(tmp_path, capsys):
  """25-46 s on a loaded 2-core machine (the amplified banded calibrations)."""
  _bars_on_and_off("calibrate-bands", CALIBRATE_BANDS, tmp_path, capsys)


def test_main_job_table_bars_follow_no_progress(tmp_path, capsys, monkeypatch):
  """The main job took --no_progress but its √L table's solvers drew bars anyway: every
  factorization it asks for now gets the flag's value."""
  from tff_mf.factorization import cache  # pylint: disable=g-import-not-at-top
  from training import main_job  # pylint: disable=g-import-not-at-top
  asked = []
  real = cache.load_or_factorize

  def spy(spec, *args, **kwargs):
    asked.append(kwargs.get("progress"))
    return real(spec, *args, **kwargs)

  monkeypatch.setattr(cache, "load_or_factorize", spy)
  assert main_job.main(["--output_dir", str(tmp_path / "o"), "--table_rounds", "8",
                        "--skip_training", "--no_progress"]) == 0
  assert asked and not any(asked), asked
  assert capsys.readouterr().err == ""


def test_pydocs_passes_no_progress_to_its_bars(monkeypatch, capsys):
  from stackoverflow import pydocs  # pylint: disable=g-import-not-at-top
  seen = {}

  class Built:  # pylint: disable=too-few-public-methods
    directory, cache_hit = "d", True
    metadata = dict(fingerprint="f", num_clients=1, splits={}, content_sha256="s",
                    build_seconds=0.0)

  def build(data_dir, **kwargs):
    seen.update(kwargs, data_dir=data_dir)
    return Built()

  monkeypatch.setattr(pydocs, "build", build)
  assert pydocs.main(["--no_progress", "--data_dir", "x"]) == 0
  assert seen["progress"] is False and seen["data_dir"] == "x"
  capsys.readouterr()


def test_schema_flags_imply_the_schema_in_every_tool(tmp_path, capsys):
  """--min_sep alone was min_sep participation in account but an error in factorize (and in
  the training binary): now every tool infers the kind, and says where it came from."""
  assert cli.main(["factorize", "--mechanism", "blt", "--total_rounds", "16", "--min_sep", "4",
                   "--json", "--cache_dir", str(tmp_path)]) == 0
  record = json.loads(capsys.readouterr().out)
  assert record["participation"]["kind"] == "min_sep" and \
      record["participation_source"] == "--min_sep"
  assert cli.main(["factorize", "--mechanism", "optimal", "--total_rounds", "16", "--epochs",
                   "2", "--json", "--cache_dir", str(tmp_path)]) == 0
  assert json.loads(capsys.readouterr().out)["participation"]["kind"] == "fixed_epoch"
  for argv, kind in ((["--epochs", "2"], "fixed_epoch"), (["--min_sep", "4"], "min_sep"),
                     (["--sampling_prob", "0.5"], "min_sep"), ([], "single"),
                     (["--participation", "single"], "single")):
    assert clitools.implied_participation(
        *[dict(zip(argv[::2], argv[1::2])).get(f) for f in (
            "--participation", "--epochs", "--min_sep", "--max_participations",
            "--sampling_prob")]) == kind, argv
  # The training binary, through its own flag parsing (no TensorFlow).
  from absl import flags  # pylint: disable=g-import-not-at-top
  from training import run_stackoverflow  # pylint: disable=g-import-not-at-top
  try:
    clitools.parse_absl_flags(["run_stackoverflow.py", "--min-sep=4", "--sampling_prob=0.5",
                               "--total_rounds=16", "--noise_multiplier=1"])
    config = run_stackoverflow.config_from_flags()
    config.validate()
    assert config.participation == "min_sep" and config.min_sep == 4
  finally:
    flags.FLAGS.unparse_flags()


def test_account_sampling_prob_alone_uses_the_training_analysis(tmp_path, capsys):
  """account needed --amplification with --sampling_prob while training picks the analysis
  itself: alone, --sampling_prob now gives the bound a training run of the same C, schema
  and p reports (tff_mf.mechanisms.run_privacy), and the record says how it was chosen.
  δ, not given, is the one default 1e-6 and is stated."""
  from tff_mf.factorization import cache as cache_lib  # pylint: disable=g-import-not-at-top
  from tff_mf import mechanisms  # pylint: disable=g-import-not-at-top
  from tff_mf import participation  # pylint: disable=g-import-not-at-top
  base = ["account", "--mechanism", "banded", "--total_rounds", "16", "--min_sep", "4",
          "--sampling_prob", "0.5", "--noise_multiplier", "2", "--json", "--no_progress",
          "--cache_dir", str(tmp_path)]
  assert cli.main(base) == 0
  chosen = json.loads(capsys.readouterr().out)
  assert chosen["analysis"] == "amplified_banded" and chosen["delta"] == 1e-6
  assert chosen["amplification_source"].startswith("chosen as training chooses: amplified_banded")
  assert cli.main(base + ["--amplification", "amplified_banded"]) == 0
  explicit = json.loads(capsys.readouterr().out)
  assert explicit["epsilon"] == chosen["epsilon"]
  assert explicit["amplification_source"] == "--amplification"
  schema = participation.Participation("min_sep", min_sep=4, max_participations=4)
  c = cache_lib.load(chosen["cache_npz"]).c
  run = mechanisms.run_privacy(c, schema, 2.0, None, 1e-6, "exact", sampling_prob=0.5)
  assert run.epsilon == chosen["epsilon"] and run.bound == chosen["analysis"] == "amplified_banded"
  # p = 1 does not amplify: the unamplified bound, as a run reports it, p recorded.
  assert cli.main([("1" if a == "0.5" else a) for a in base]) == 0
  plain = json.loads(capsys.readouterr().out)
  assert plain["analysis"] == "none" and plain["sampling_prob"] == 1.0
  assert "chosen as training chooses: none" in plain["amplification_source"]
