"""One table of flags (issue 47 item 1): the schema flags are declared by the participation
kinds, the family parameters by the families, and every tool defines its flags from them.

A family parameter of its own (tests/toy_family.py's ``ratio``) reaches ``tff-mf factorize``,
``account`` and ``audit`` and the training config with no edit outside its family.
"""

import json
import os

import pytest

from tff_mf import cli
from tff_mf import participation
from tff_mf import registry
from tff_mf import spec as spec_lib
from tff_mf.accounting import band_calibration
from tff_mf.commands import factorize as factorize_command
from training import config as config_lib
from training import run_stackoverflow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = ("factorize", "account", "audit")


def _subparser(name):
  parser = cli.build_parser()
  [action] = [a for a in parser._actions if a.choices and name in a.choices]  # pylint: disable=protected-access
  return action.choices[name]


def _options(name):
  return {o: a for a in _subparser(name)._actions for o in a.option_strings}  # pylint: disable=protected-access


@pytest.fixture
def toy_ratio():
  registry.register(
      registry.Strategy("toy_ratio", "toy_family", "toy ratio", "Toeplitz C with taps r^j",
                        "none (a test family)"),
      registry.Mechanism("toy_ratio", (), "toy ratio", "the toy family with its ratio",
                         "toy_ratio", "training", "dense_rows", registry.PARTICIPATIONS))
  yield
  registry.unregister(strategy_name="toy_ratio", mechanism_name="toy_ratio")


def test_the_schema_flags_come_from_the_kinds_and_mean_the_same_everywhere():
  """Each kind's parameter is one flag, its help naming exactly the kinds that take it, and
  every tool (argparse and absl) defines it with that type and help."""
  table = {f.name: f for f in participation.flags()}
  assert list(table) == ["participation", "epochs", "min_sep", "max_participations"]
  for name, flag in table.items():
    if name == "participation":
      continue
    takers = tuple(k for k in participation.KINDS if name in participation.CLASSES[k].takes)
    assert flag.owners == takers and flag.type is int
  absl = run_stackoverflow.FLAGS
  for name, flag in table.items():
    for tool in TOOLS:
      action = _options(tool)[f"--{name}"]
      assert action.help.startswith(flag.text), (tool, name)
      assert (tuple(action.choices) == participation.SPELLINGS if flag.choices
              else action.type is int), (tool, name)
    assert flag.text in absl[name].help, name
  assert tuple(absl["participation"].parser.enum_values) == participation.SPELLINGS


def test_a_family_parameter_reaches_every_tool_from_its_declaration(toy_ratio, tmp_path,
                                                                    capsys):
  """toy_ratio's ``ratio`` is declared in tests/toy_family.py only; factorize, account and
  audit take --ratio, factorize computes C with it, account resolves the mechanism with it,
  and the training config carries it into the run's spec."""
  [flag] = [f for f in spec_lib.family_flags() if f.name == "ratio"]
  assert flag.type is float and flag.owners == ("toy_ratio",)
  for tool in TOOLS:
    action = _options(tool)["--ratio"]
    assert action.help.startswith("toy_ratio: ratio r") and action.default is None, tool
  cache = str(tmp_path)
  argv = ["factorize", "--mechanism", "toy_ratio", "--total_rounds", "6", "--ratio", "0.25",
          "--cache_dir", cache, "--json"]
  assert cli.main(argv) == 0
  record = json.loads(capsys.readouterr().out)
  assert record["strategy"] == "toy_ratio"
  args = _subparser("factorize").parse_args(argv[1:])
  assert factorize_command.spec_from_args(args).ratio == 0.25
  assert cli.main(["account", "--mechanism", "toy_ratio", "--total_rounds", "6", "--ratio",
                   "0.25", "--noise_multiplier", "2", "--delta", "1e-5", "--cache_dir", cache,
                   "--json"]) == 0
  assert json.loads(capsys.readouterr().out)["epsilon"] > 0
  # A mechanism that does not take it refuses it in one line, in every tool.
  assert cli.main(["factorize", "--mechanism", "blt", "--total_rounds", "6", "--ratio", "0.25",
                   "--cache_dir", cache]) == 2
  assert "--ratio does not apply" in capsys.readouterr().err
  # The training config carries it into the run's spec, and only then into its fingerprint.
  config = config_lib.TrainingConfig(mechanism="toy_ratio", total_rounds=6, clients_per_round=2,
                                     noise_multiplier=1.0, family_params=(("ratio", 0.25),))
  assert config.spec.params["ratio"] == 0.25
  assert config.public_dict()["family_params"] == {"ratio": 0.25}
  assert "family_params" not in config_lib.TrainingConfig().public_dict()


def test_the_clipping_k_and_mechanism_flags_come_from_the_spec_and_mean_the_same_everywhere():
  """--clip_norm and the adaptive estimator's flags (``spec.CLIPPING_FLAGS``), K
  (``spec.CLIENTS_PER_ROUND_FLAG``) and --mechanism (``spec.MECHANISM_FLAG``) are declared once:
  each tool's help starts with the declaration's; a tool reads the type and names its own
  (audit's K and clip norm are any numbers, calibrate-bands takes its two banded mechanisms)."""
  absl = run_stackoverflow.FLAGS
  for flag in spec_lib.CLIPPING_FLAGS:
    assert flag.text in absl[flag.name].help, flag.name
  assert absl["clip_norm"].default == "1.0" and absl["clipped_count_stddev"].default is None
  for flag in (spec_lib.CLIENTS_PER_ROUND_FLAG, spec_lib.MECHANISM_FLAG):
    assert flag.text in absl[flag.name].help, flag.name
  uses = {"mechanism": ("factorize", "account", "audit", "calibrate-bands"),
          "clients_per_round": ("audit", "plan"), "clip_norm": ("audit",)}
  for name, tools in uses.items():
    [flag] = [f for f in (spec_lib.MECHANISM_FLAG, spec_lib.CLIENTS_PER_ROUND_FLAG,
                          *spec_lib.CLIPPING_FLAGS) if f.name == name]
    for tool in tools:
      assert _options(tool)[f"--{name}"].help.startswith(flag.text), (tool, name)
  audit = _options("audit")
  assert audit["--clients_per_round"].type("2.5") == 2.5 and audit["--clip_norm"].default == 1.0
  assert _options("plan")["--clients_per_round"].type is int
  assert tuple(_options("calibrate-bands")["--mechanism"].choices) == band_calibration.STRATEGIES
  # The spec of parsed flags (spec.from_flags) is the keyword constructor's.
  args = _subparser("audit").parse_args(["--mechanism", "blt", "--noise_multiplier", "0.5",
                                         "--clients_per_round", "3.5", "--buffers", "2"])
  given = spec_lib.from_flags(vars(args), total_rounds=args.n, sampling_prob=None, delta=None)
  assert given == spec_lib.MechanismSpec.from_args(
      "blt", total_rounds=8, noise_multiplier=0.5, clients_per_round=3.5, clip_norm=1.0,
      momentum=0.0, buffers=2)
