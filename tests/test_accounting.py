"""Single-participation accounting (Denisov et al. Thm 4.1) and ``tff-mf account``."""

import argparse
import json
import subprocess
import sys

import pytest

import userenv

from tff_mf import accounting
from tff_mf.commands import account as account_cmd

DELTA = 1e-6


@pytest.mark.parametrize("z", [0.7, 1.0, 2.5, 8.0])
def test_pld_is_an_upper_bound_close_to_exact_and_below_rdp(z):
  pld = accounting.epsilon(z, DELTA, "pld")
  rdp = accounting.epsilon(z, DELTA, "rdp")
  exact = accounting.gaussian_epsilon_exact(z, DELTA)
  assert exact <= pld <= exact * 1.001 + 1e-9
  assert pld <= rdp
  # δ at the reported ε is within the budget (Balle & Wang exact formula).
  assert accounting.gaussian_delta_exact(z, pld) <= DELTA * (1 + 1e-6)


def test_epsilon_decreases_with_noise():
  eps = [accounting.epsilon(z, DELTA) for z in (0.8, 1.6, 3.2, 6.4)]
  assert all(a > b for a, b in zip(eps, eps[1:]))


def test_known_value_gaussian_mechanism():
  # z = 1, δ = 1e-5: the analytic Gaussian mechanism gives ε ≈ 4.36 (Balle & Wang 2018).
  exact = accounting.gaussian_epsilon_exact(1.0, 1e-5)
  assert abs(accounting.gaussian_delta_exact(1.0, exact) - 1e-5) < 1e-12
  assert 4.3 < exact < 4.45


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
@pytest.mark.parametrize("target", [0.5, 2.0])
def test_calibration_returns_the_smallest_noise(accountant, target):
  tol = 1e-3
  z = accounting.calibrate_noise_multiplier(target, DELTA, accountant, tolerance=tol)
  assert accounting.epsilon(z, DELTA, accountant) <= target
  assert accounting.epsilon(z - tol * z, DELTA, accountant) > target


def test_calibration_absolute_tolerance():
  z = accounting.calibrate_noise_multiplier(1.0, DELTA, tolerance=0.01, relative=False)
  assert accounting.epsilon(z, DELTA) <= 1.0 < accounting.epsilon(z - 0.01, DELTA)


@pytest.mark.parametrize("delta", [0.0, 1.0, -1e-6, 2.0, float("nan"), "x"])
def test_bad_delta(delta):
  with pytest.raises(ValueError, match="delta"):
    accounting.epsilon(1.0, delta)


@pytest.mark.parametrize("z", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_noise_multiplier(z):
  with pytest.raises(ValueError, match="noise_multiplier"):
    accounting.epsilon(z, DELTA)


def test_bad_accountant_and_target():
  with pytest.raises(ValueError, match="accountant"):
    accounting.epsilon(1.0, DELTA, "moments")
  with pytest.raises(ValueError, match="target_epsilon"):
    accounting.calibrate_noise_multiplier(0.0, DELTA)
  with pytest.raises(ValueError, match="target_epsilon"):
    accounting.calibrate_noise_multiplier(-1.0, DELTA)


def _cli(argv, capsys):
  parser = argparse.ArgumentParser()
  account_cmd.register(parser.add_subparsers(dest="command"))
  args = parser.parse_args(["account"] + argv)
  assert args.func(args) == 0
  return json.loads(capsys.readouterr().out)


def test_cli_epsilon_json(capsys):
  out = _cli(["--noise-multiplier", "2", "--delta", "1e-6", "--json"], capsys)
  for key in ("epsilon", "delta", "noise_multiplier", "accountant"):
    assert key in out
  assert out["accountant"] == "pld" and out["noise_multiplier"] == 2.0
  assert out["epsilon"] == pytest.approx(accounting.epsilon(2.0, 1e-6))
  out = _cli(["--noise-multiplier", "2", "--delta", "1e-6", "--accountant", "rdp", "--json"],
             capsys)
  assert out["accountant"] == "rdp"


def test_cli_target_epsilon_json(capsys):
  out = _cli(["--target-epsilon", "1.5", "--delta", "1e-6", "--json"], capsys)
  assert out["epsilon"] <= 1.5 and out["target_epsilon"] == 1.5
  assert accounting.epsilon(out["noise_multiplier"] * (1 - 1e-3), 1e-6) > 1.5


def test_cli_mmcc_json(capsys):
  out = _cli(["--mmcc", "--strategy", "identity", "--n", "4", "--sampling-prob", "0.5",
              "--noise-multiplier", "2", "--delta", "1e-6", "--json", "--no-progress",
              "--workers", "1"], capsys)
  for key in ("epsilon", "delta", "noise_multiplier", "accountant", "sampling_prob"):
    assert key in out
  assert out["accountant"] == "mmcc"


def test_cli_errors():
  parser = argparse.ArgumentParser()
  account_cmd.register(parser.add_subparsers(dest="command"))
  for argv in (["--delta", "1e-6"],  # neither z nor target
               ["--delta", "1e-6", "--noise-multiplier", "1", "--target-epsilon", "1"],
               ["--delta", "1e-6", "--noise-multiplier", "1", "--strategy", "identity"],
               ["--mmcc", "--delta", "1e-6", "--noise-multiplier", "1", "--sampling-prob", "0.1"],
               ["--mmcc", "--delta", "1e-6", "--noise-multiplier", "1", "--strategy",
                "tree_restart", "--n", "8", "--sampling-prob", "0.1"]):
    args = parser.parse_args(["account"] + argv)
    with pytest.raises(ValueError):
      args.func(args)


def test_cli_matrix_file(tmp_path, capsys):
  """--matrix reads a cached factorization (tff_mf.cache) and uses its normalized C."""
  from tff_mf import cache, strategies, workloads
  spec = strategies.FactorizationSpec(
      workload=workloads.WorkloadSpec(kind="prefix_sum", n=4), strategy="honaker_online")
  f, entry = cache.load_or_factorize(spec, cache_dir=str(tmp_path))
  out = _cli(["--mmcc", "--matrix", entry.npz_path, "--sampling-prob", "0.25",
              "--noise-multiplier", "8", "--delta", "1e-6", "--json", "--no-progress",
              "--workers", "1"], capsys)
  assert out["n"] == 4 and out["m"] == f.c.shape[0]
  assert out["sensitivity"] == pytest.approx(1.0)
  from tff_mf import mmcc
  assert out["epsilon"] == pytest.approx(mmcc.mmcc_epsilon(
      mmcc.binary_tree_matrix(4), 0.25, 8.0, 1e-6, workers=1), rel=1e-9)


def test_no_tensorflow_imported():
  code = ("import sys; import tff_mf.accounting, tff_mf.mmcc, tff_mf.commands.account; "
          "assert 'tensorflow' not in sys.modules, 'tensorflow imported'")
  subprocess.run([sys.executable, "-c", code], check=True, cwd=userenv.REPO, env=userenv.env())


def test_json_output_is_strict_json_even_for_unbounded_epsilon(capsys):
  account_cmd._print({"epsilon": float("inf"), "delta": 1e-6}, as_json=True)
  record = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(c))
  assert record == {"epsilon": "inf", "delta": 1e-6}
