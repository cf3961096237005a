"""One vocabulary on every command line (tff_mf.clitools): every tool's parser walked.

The tools: ``tff-mf`` (every subcommand), the training binary (absl), the main job, the
sweep, summarize and distributed. A concept spelled two ways, a flag without help or
without its default, a long enum, or ``--help`` exiting non-zero fails here; so do a
mistyped flag or name without the closest spelling, and a tool refusing ``--flag-name``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

import pytest

import userenv
from tff_mf import accounting
from tff_mf.factorization import cache
from tff_mf import cli
from tff_mf import clitools
from tff_mf import participation
from tff_mf import registry
from tff_mf.factorization import strategies
from training import config as config_lib
from training import distributed
from training import main_job
from training import run_stackoverflow
from training import summarize
from training import sweep

REPO = userenv.REPO
BINARY = os.path.join(REPO, "training", "run_stackoverflow.py")
ARGPARSE_TOOLS = {"tff-mf": cli.build_parser, "main_job": main_job.build_parser,
                  "sweep": sweep.build_parser, "summarize": summarize.build_parser,
                  "distributed": distributed.build_parser}
MAX_LISTED_CHOICES = 12
# Spellings of one concept that must not appear beside the canonical flag names.
SYNONYMS = {
    "progress": ("noprogress", "quiet", "show_progress", "progress_bar", "no_progress_bar"),
    "cache_dir": ("cache", "cachedir", "cache_directory", "matrix_cache", "factorization_cache"),
    "participation": ("schema", "participation_schema", "schedule_kind"),
    "min_sep": ("minsep", "separation", "min_separation", "b_min_sep"),
    "sampling_prob": ("sampling_rate", "sample_prob", "sampling_probability", "q"),
    "max_participations": ("max_participation", "participations"),
    "accountant": ("accounting", "epsilon_accountant"),
    "noise_multiplier": ("z", "sigma", "noise"),
    "target_epsilon": ("epsilon", "target_eps", "eps"),
    "root_output_dir": ("root_dir", "output_root"),
}


def _argparse_parsers():
  """(tool, parser) for every parser and subparser of the argparse tools."""
  out = []

  def walk(name, parser):
    out.append((name, parser))
    for action in parser._actions:  # pylint: disable=protected-access
      if isinstance(action, argparse._SubParsersAction):  # pylint: disable=protected-access
        for sub_name, sub in action.choices.items():
          walk(f"{name} {sub_name}", sub)

  for tool, build in ARGPARSE_TOOLS.items():
    walk(tool, build())
  return out


def _flag_actions(parser):
  for action in parser._actions:  # pylint: disable=protected-access
    if isinstance(action, (argparse._HelpAction, argparse._VersionAction,
                            # pylint: disable=protected-access
                           argparse._SubParsersAction)):  # pylint: disable=protected-access
      continue
    yield action


def _absl_flags():
  """{name: Flag} of the training binary (its module's flags)."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  return {f.name: f for f in flags.FLAGS.get_flags_for_module(run_stackoverflow)}


def _all_flag_names():
  """{flag name: [where]} over every tool, and the raw option strings."""
  names, raw = {}, []
  for tool, parser in _argparse_parsers():
    for action in _flag_actions(parser):
      for option in action.option_strings:
        raw.append((tool, option))
        names.setdefault(option.lstrip("-"), []).append(tool)
  for name in _absl_flags():
    raw.append(("run_stackoverflow.py", f"--{name}"))
    names.setdefault(name, []).append("run_stackoverflow.py")
  return names, raw


def test_every_parser_one_spelling_per_concept_help_and_defaults():
  """Walks every tool's parser (argparse and absl)."""
  names, raw = _all_flag_names()
  assert len(names) > 60 and "run_stackoverflow.py" in names["mechanism"]
  # One spelling on every surface: underscores, no flag that differs from another only in
  # its separators, no synonym of a concept beside its canonical name.
  for tool, option in raw:
    if option.startswith("--"):
      assert "-" not in option[2:], f"{tool}: {option} is spelled with hyphens"
  squashed = {}
  for name in names:
    squashed.setdefault(name.replace("_", ""), set()).add(name)
  assert not [v for v in squashed.values() if len(v) > 1]
  for canonical, others in SYNONYMS.items():
    for other in others:
      assert other not in names, f"--{other} ({names[other]}) spells --{canonical}"
  # --workers: TFF worker addresses; --processes: local processes (an int).
  for tool, parser in _argparse_parsers():
    for action in _flag_actions(parser):
      if "--workers" in action.option_strings:
        assert action.type is None and "host:port" in action.help, tool
      if "--processes" in action.option_strings:
        assert action.type is int, tool
      if "--accountant" in action.option_strings:
        assert tuple(action.choices) == accounting.ACCOUNTANTS, tool
        assert action.default == accounting.DEFAULT_ACCOUNTANT, tool
      if "--participation" in action.option_strings:
        assert tuple(action.choices) == participation.SPELLINGS, tool
      if "--engine" in action.option_strings:
        assert tuple(action.choices) == config_lib.ENGINES, tool
        assert action.default == config_lib.DEFAULT_ENGINE, tool
      if "--progress" in action.option_strings or "--no_progress" in action.option_strings:
        assert {"--progress", "--no_progress"} <= set(parser._option_string_actions), tool  # pylint: disable=protected-access
  absl = _absl_flags()
  assert "host:port" in absl["workers"].help and absl["progress"].boolean
  assert tuple(absl["accountant"].parser.enum_values) == accounting.ACCOUNTANTS
  assert absl["accountant"].default == accounting.DEFAULT_ACCOUNTANT
  assert tuple(absl["participation"].parser.enum_values) == participation.SPELLINGS
  # Every tool that trains takes --engine, with one default (auto: compiled on one machine).
  for tool in ("run_stackoverflow.py", "main_job", "sweep"):
    assert tool in names["engine"], tool
  assert tuple(absl["engine"].parser.enum_values) == config_lib.ENGINES
  assert absl["engine"].default == config_lib.DEFAULT_ENGINE == "auto"
  # Help text and the default on every flag; no long enum listed in the help.
  for tool, parser in _argparse_parsers():
    formatter = parser._get_formatter()  # pylint: disable=protected-access
    assert isinstance(formatter, clitools.HelpFormatter), tool
    for action in _flag_actions(parser):
      shown = formatter._get_help_string(action)  # pylint: disable=protected-access
      flag = action.option_strings[0] if action.option_strings else action.dest
      assert action.help and len(action.help) > 8, f"{tool} {flag}: no help"
      assert "default" in shown or "required" in shown, f"{tool} {flag}: no default shown"
      assert action.choices is None or len(action.choices) <= MAX_LISTED_CHOICES, (tool, flag)
    text = parser.format_help()
    assert not re.search(r"\{[^}]*(,[^}]*){%d,}\}" % MAX_LISTED_CHOICES, text), tool
  for name, flag in absl.items():
    assert flag.help and len(flag.help) > 8, f"--{name}: no help"
    assert flag.default is not None or "default" in flag.help, f"--{name}: no default shown"
    assert len(getattr(flag.parser, "enum_values", ()) or ()) <= MAX_LISTED_CHOICES, name
  # --help exits 0 everywhere.
  for tool, parser in _argparse_parsers():
    with pytest.raises(SystemExit) as e:
      parser.parse_args(["--help"])
    assert e.value.code == 0, tool
  result = subprocess.run([sys.executable, BINARY, "--help"], env=userenv.env(), cwd=REPO,
                          capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  assert "--mechanism" in result.stdout and result.stdout.count("aliases:") == 1


def test_mechanism_aliases_listed_once_in_a_short_line():
  line = clitools.mechanism_help()
  for name in registry.mechanism_names():
    assert line.count(f" {name}") >= 1
  for spelling in set(registry.all_spellings()) - set(registry.MECHANISMS):
    assert len(re.findall(rf"[ /,]{spelling}[/=]", line)) == 1, spelling
  assert len(line) < 600


def _one_line_usage_error(call, capsys):
  with pytest.raises(SystemExit) as e:
    call()
  err = capsys.readouterr().err
  lines = err.strip().splitlines()
  assert e.value.code == 2 and len(lines) == 1, err
  return lines[0]


@pytest.mark.parametrize("tool, argv, expect", [
    ("tff-mf", ["acount"], "did you mean account?"),
    ("tff-mf", ["account", "--delta", "1e-6", "--target_epsilonn", "1"],
     "did you mean --target_epsilon?"),
    ("tff-mf", ["account", "--delta", "1e-6", "--accountant", "pdl"], "did you mean pld?"),
    ("tff-mf", ["factorize", "--mechanism", "blt", "--total_rounds", "8", "--participaton",
                "single"],
     "did you mean --participation?"),
    ("tff-mf", ["cache", "list", "--cache-dri", "x"], "did you mean --cache_dir?"),
    ("main_job", ["--no-progres"], "did you mean --no_progress?"),
    ("sweep", ["--grid", "table3_search", "--dryrun"], "did you mean --dry_run?"),
    ("summarize", ["--root_output_dir", "x", "--accountant", "exakt"], "did you mean exact?"),
    ("distributed", ["chek"], "did you mean check?"),
])
def test_a_typo_is_one_line_with_the_closest_spelling(tool, argv, expect, capsys):
  line = _one_line_usage_error(lambda: ARGPARSE_TOOLS[tool]().parse_args(argv), capsys)
  assert expect in line and ": error: " in line, line


def test_names_typos_get_the_closest_spelling(capsys):
  assert cli.main(["factorize", "--mechanism", "optiml", "--total_rounds", "8"]) == 2
  assert "did you mean optimal?" in capsys.readouterr().err
  assert cli.main(["account", "--mechanism", "bltt", "--total_rounds", "8", "--noise_multiplier",
                   "1", "--delta", "1e-6"]) == 2
  assert "did you mean blt?" in capsys.readouterr().err
  assert sweep.main(["--grid", "table3_serch", "--dry_run"]) == 2
  assert "did you mean table3_search?" in capsys.readouterr().err


def test_both_spellings_are_accepted(capsys):
  """--flag_name and --flag-name give the same result (argparse tools here; absl below)."""
  outputs = []
  for argv in (["--noise_multiplier", "2", "--delta", "1e-6", "--json"],
               ["--noise-multiplier", "2", "--delta", "1e-6", "--json"]):
    assert cli.main(["account"] + argv) == 0
    outputs.append(capsys.readouterr().out)
  assert outputs[0] == outputs[1] and json.loads(outputs[0])["accountant"] == "exact"
  for build in (sweep.build_parser,):
    a = build().parse_args(["--grid", "g", "--dry-run", "--root-output-dir", "r",
                            "--no-progress", "--extra-flags=--total-rounds=2"])
    b = build().parse_args(["--grid", "g", "--dry_run", "--root_output_dir", "r",
                            "--no_progress", "--extra_flags=--total-rounds=2"])
    assert vars(a) == vars(b) and a.dry_run and not a.progress and a.root_output_dir == "r"
  assert sweep.parse_extra_flags(a.extra_flags) == ["--total_rounds=2"]
  args = main_job.build_parser().parse_args(["--skip-training", "--cache-dir", "c"])
  assert args.skip_training and args.cache_dir == "c" and args.progress
  argv = ["--no-progress", "--no_progress", "--noise-multiplier=2", "--", "--total-rounds"]
  assert clitools.normalize_argv(argv, ["noise_multiplier", "total_rounds"], ["progress"]) == [
      "--noprogress", "--noprogress", "--noise_multiplier=2", "--", "--total-rounds"]


def test_binary_flag_errors_are_one_line_with_the_closest_spelling(tmp_path):
  """absl: both spellings reach the configuration check; typos of flags and values get the
  closest spelling, exit 2, before TensorFlow is imported."""
  env = userenv.env(home=tmp_path)
  cases = [(["--target-epsilonn=1"], "unknown flag --target-epsilonn; did you mean "
                                     "--target_epsilon?"),
           (["--dataset=pydoc"], "--dataset: unknown value 'pydoc'; did you mean pydocs?"),
           (["--no-progress", "--mechanism=optiml", "--noise-multiplier=1",
             f"--root-output-dir={tmp_path / 'runs'}"],
            "--mechanism='optiml' is not a trainable mechanism; did you mean optimal?")]
  for argv, expect in cases:
    result = subprocess.run([sys.executable, BINARY, *argv], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and expect in lines[0], result.stderr
  assert not (tmp_path / "runs").exists()


def test_every_float_flag_refuses_nan_and_inf_naming_the_flag(tmp_path, capsys):
  """NaN or ±inf in a float flag: one line naming the flag, at parse time, in every tool."""
  checked = 0
  for tool, parser in _argparse_parsers():
    for action in _flag_actions(parser):
      if action.type not in (float, clitools.finite_float) or not action.option_strings:
        continue
      flag = action.option_strings[0]
      for value in ("nan", "inf", "-inf"):
        line = _one_line_usage_error(lambda: parser.parse_args([f"{flag}={value}"]), capsys)  # pylint: disable=cell-var-from-loop
        assert f"argument {flag}: must be a finite number, got '{value}'" in line, (tool, line)
      checked += 1
  assert checked >= 20
  assert ARGPARSE_TOOLS["tff-mf"]().parse_args(
      ["account", "--noise_multiplier", "2.5", "--delta", "1e-6"]).noise_multiplier == 2.5
  from absl import flags  # pylint: disable=g-import-not-at-top
  values = flags.FlagValues()
  flags.DEFINE_float("target_quantile", 0.5, "q", flag_values=values)
  for value in ("nan", "-inf"):
    line = _one_line_usage_error(
        lambda: clitools.parse_absl_flags(["tool", f"--target-quantile={value}"], values),  # pylint: disable=cell-var-from-loop
        capsys)
    assert line == f"tool: error: --target_quantile must be a finite number, got {value} " \
                   "(see --help)", line
  # The training binary, as a user types it (the case).
  result = subprocess.run([sys.executable, BINARY, "--dataset=synthetic", "--target_quantile",
                           "nan", "--clip_norm=adaptive", "--noise_multiplier=1"],
                          env=userenv.env(home=tmp_path), cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
  lines = result.stderr.strip().splitlines()
  assert result.returncode == 2 and len(lines) == 1, result.stderr
  assert "--target_quantile must be a finite number, got nan" in lines[0], lines


def test_remedies_name_the_flag_on_a_command_line_and_the_argument_in_python(tmp_path,
                                                                             capsys):
  """An unconverged optimal factorization and a count released without noise: the command
  line's error names --allow_unconverged (and --max_iterations, --target_gap) or
  --clipped_count_stddev, the Python error allow_unconverged=True or allow_no_noise=True."""
  from tff_mf.factorization import dense_run  # pylint: disable=g-import-not-at-top
  from tff_mf.commands import factorize  # pylint: disable=g-import-not-at-top
  argv = ["factorize", "--mechanism", "optimal", "--total_rounds", "32", "--participation",
          "fixed_epoch",
          "--epochs", "2", "--max_iterations", "2", "--json", "--cache_dir", str(tmp_path)]
  assert cli.main(argv) == 2  # 2 iterations stop far above the 1e-6 gap on any CPU
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1 and "did not reach relative duality gap" in lines[0], lines
  for flag in ("--max_iterations", "--target_gap", "--allow_unconverged"):
    assert flag in lines[0], lines[0]
  assert "=True" not in lines[0] and " max_iterations" not in lines[0], lines[0]
  spec = factorize.spec_from_args(cli.build_parser().parse_args(argv))
  with pytest.raises(dense_run.NotConvergedError) as e:
    cache.load_or_factorize(spec, cache_dir=str(tmp_path))
  assert "allow_unconverged=True" in str(e.value) and "--" not in str(e.value)
  # The training binary has no allow_no_noise: its flag check refuses a noiseless count.
  result = subprocess.run([sys.executable, BINARY, "--dataset=synthetic", "--clip_norm=adaptive",
                           "--noise_multiplier=1", "--clipped_count_stddev=0",
                           f"--root_output_dir={tmp_path / 'runs'}"],
                          env=userenv.env(home=tmp_path), cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
  lines = result.stderr.strip().splitlines()
  assert result.returncode == 2 and len(lines) == 1, result.stderr
  assert "--clipped_count_stddev=0 releases the count" in lines[0], lines
  assert "allow_no_noise" not in lines[0], lines
  assert not (tmp_path / "runs").exists()
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_mf.spec import MechanismSpec  # pylint: disable=g-import-not-at-top
  from tff_mf.tf import aggregators  # pylint: disable=g-import-not-at-top
  setup = aggregators.build_mechanism(MechanismSpec.from_args(
      "gaussian", total_rounds=4, noise_multiplier=1.0, clients_per_round=2, clip_norm="adaptive",
      clipped_count_stddev=0.0))
  with pytest.raises(ValueError) as e:  # when TFF builds the aggregator
    setup.aggregation_factory.create(tff.TensorType(np.float32, [3]))
  assert "pass allow_no_noise=True to accept that" in str(e.value)
  assert clitools.flag_message(e.value).endswith("pass --allow_no_noise to accept that")


@pytest.mark.parametrize("argv,line", [
    (["account", "--noise_multiplier", "4", "--delta", "2"], "--delta must be in (0, 1), got 2"),
    (["account", "--noise_multiplier", "0", "--delta", "1e-6"],
     "--noise_multiplier must be positive, got 0"),
    (["calibrate-bands", "--total_rounds", "16", "--min_sep", "4", "--sampling_prob", "0.5",
      "--target_epsilon", "-2", "--delta", "1e-6"], "--target_epsilon must be positive"),
    (["factorize", "--mechanism", "optimal", "--total_rounds", "16", "--max_iterations", "0"],
     "--max_iterations must be a positive integer, got 0"),
])
def test_a_check_that_names_its_argument_names_the_flag_on_a_command_line(argv, line, tmp_path,
                                                                           capsys):
  """A library check names its Python argument ("delta must be in (0, 1)"); the command line's
  user typed the flag, and the one-line error starts with it."""
  cache_dir = [] if argv[0] == "account" else ["--cache_dir", str(tmp_path)]
  assert cli.main(argv + cache_dir) == 2
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1 and f"error: {line}" in lines[0], lines


# ----------------------------------------------------------------------------- account


def _account_json(argv, capsys):
  rc = cli.main(["account", "--delta", "1e-6", "--json", "--no_progress"] + argv)
  captured = capsys.readouterr()
  assert rc == 0, captured.err
  return json.loads(captured.out)


def test_account_mechanism_builds_then_reuses_the_cached_factorization(tmp_path, capsys,
                                                                       monkeypatch):
  argv = ["--mechanism", "blt", "--total_rounds", "32", "--min_sep", "4", "--noise_multiplier", "2",
          "--cache_dir", str(tmp_path)]
  first = _account_json(argv, capsys)
  assert first["cache_hit"] is False and first["mechanism"] == "blt"
  entries = cache.list_entries(str(tmp_path))
  assert len(entries) == 1 and first["cache_npz"] == entries[0]["npz_path"]
  stat = os.stat(first["cache_npz"])

  def no_factorization(*args, **kwargs):
    raise AssertionError("factorized again")

  monkeypatch.setattr(strategies, "factorize", no_factorization)
  second = _account_json(argv[:-2] + ["--cache-dir", str(tmp_path)], capsys)
  assert second["cache_hit"] is True and second["epsilon"] == first["epsilon"]
  assert len(cache.list_entries(str(tmp_path))) == 1
  assert os.stat(second["cache_npz"]).st_mtime_ns == stat.st_mtime_ns
  # The C accounted for is the one factorize writes for the same request.
  assert cli.main(["factorize", "--mechanism", "blt", "--total_rounds", "32", "--participation",
                   "min_sep", "--min_sep", "4", "--cache_dir", str(tmp_path), "--json"]) == 0
  assert json.loads(capsys.readouterr().out)["path"] == first["cache_npz"]


def test_every_mechanism_accounts_in_one_command(tmp_path, capsys):
  for name in registry.mechanism_names(private=True):
    extra = ["--height", "2"] if name == "tree_restart" else []
    if registry.mechanism(name).momentum_workload:  # its C needs the run's β
      extra = ["--momentum", "0.9"]
    out = _account_json(["--mechanism", name, "--total_rounds", "8", "--min_sep", "2",
                         "--noise_multiplier", "2", "--cache_dir", str(tmp_path)] + extra,
                        capsys)
    assert out["epsilon"] > 0 and out["participation"] == "min_sep-b2-k4", name
  rc = cli.main(["account", "--mechanism", "none", "--total_rounds", "8", "--noise_multiplier", "1",
                 "--delta", "1e-6"])
  assert rc == 2 and "no noise" in capsys.readouterr().err


def test_factorize_takes_mechanism_names(tmp_path, capsys):
  def factorize(*argv):
    rc = cli.main(["factorize", "--total_rounds", "8", "--cache_dir", str(tmp_path), "--json",
                   *argv])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err

  rc, out, _ = factorize("--mechanism", "opt_momentum", "--workload", "momentum")
  record = json.loads(out)
  assert rc == 0 and record["strategy"] == "optimal" and record["workload"] == "momentum"
  rc, out, _ = factorize("--mechanism", "dp_ftrl")
  assert rc == 0 and json.loads(out)["strategy"] == "honaker_online"
  rc, _, err = factorize("--mechanism", "opt_prefix_sum", "--workload", "momentum")
  assert rc == 2 and "prefix sum" in err
  rc, _, err = factorize("--mechanism", "tree_restart")
  assert rc == 2 and "no factorization" in err and len(err.strip().splitlines()) == 1
