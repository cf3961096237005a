"""``tff-mf account``: flags, unchanged single-participation outputs, strict JSON, one-line
errors for every bad input, and edge inputs in bounded memory and time (subprocesses)."""

import decimal
import hashlib
import json
import math
import os
import re
import subprocess
import sys
import time

import dp_accounting
import numpy as np
import pytest

from tff_mf import accounting
from tff_mf.factorization import cache
from tff_mf import cli
from tff_mf.accounting import mmcc
from tff_mf.factorization import strategies
from tff_mf.factorization import workloads
from tff_mf.commands import account as account_cmd

import statcheck
import userenv

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DELTA = "1e-6"
FAST_MMCC = ["--no_progress", "--processes", "1"]


def _strict(text):
  def refuse(constant):
    raise AssertionError(f"non-strict JSON constant {constant}")
  return json.loads(text, parse_constant=refuse)


def _run(argv, capsys):
  rc = cli.main(["account"] + argv)
  captured = capsys.readouterr()
  return rc, captured.out, captured.err


def _json(argv, capsys):
  rc, out, err = _run(argv + ["--json"], capsys)
  assert rc == 0, err
  return _strict(out)


def _gaussian_delta(multiplier, eps):
  return float(statcheck.gaussian_delta(multiplier, eps))


# ----------------------------------------------------------------------------- outputs


def test_single_participation_outputs_are_unchanged(capsys):
  """The keys of before, and with --accountant pld the very same numbers (dp_accounting)."""
  out = _json(["--noise_multiplier", "4.2", "--delta", DELTA, "--accountant", "pld"], capsys)
  acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
  acc.compose(dp_accounting.GaussianDpEvent(4.2))
  assert out["epsilon"] == acc.get_epsilon(1e-6)
  for key in ("epsilon", "delta", "noise_multiplier", "accountant", "participation", "theorem"):
    assert key in out
  assert out["participation"] == "single" and out["accountant"] == "pld"
  out = _json(["--noise_multiplier", "4.2", "--delta", DELTA, "--accountant", "rdp"], capsys)
  rdp = dp_accounting.rdp.RdpAccountant(orders=list(accounting.RDP_ORDERS))
  rdp.compose(dp_accounting.GaussianDpEvent(4.2))
  assert out["epsilon"] == rdp.get_epsilon(1e-6)


def test_default_is_the_exact_accountant(capsys):
  out = _json(["--noise_multiplier", "2", "--delta", DELTA], capsys)
  assert out["accountant"] == "exact" and out["exact"] is True
  assert _gaussian_delta(2.0, out["epsilon"]) <= 1e-6 * (1 + 1e-9)
  assert _gaussian_delta(2.0, out["epsilon"] * (1 - 1e-7)) > 1e-6
  rc, text, _ = _run(["--noise_multiplier", "2", "--delta", DELTA], capsys)
  assert rc == 0 and re.search(r"^epsilon: [0-9.]+$", text, re.M)


@pytest.mark.parametrize("accountant", ["exact", "pld"])
def test_target_epsilon(accountant, capsys):
  out = _json(["--target_epsilon", "1.5", "--delta", DELTA, "--accountant", accountant], capsys)
  z = out["noise_multiplier"]
  assert out["epsilon"] <= 1.5 and out["target_epsilon"] == 1.5 and out["tolerance"] == 1e-3
  # Independent references: the analytic Gaussian (exact), dp_accounting's PLD called directly.
  if accountant == "exact":
    assert _exact(z) <= 1.5 < _exact(z * (1 - 1e-3))
  else:
    def pld(multiplier):
      acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
      acc.compose(dp_accounting.GaussianDpEvent(multiplier))
      return acc.get_epsilon(1e-6)
    assert pld(z) <= 1.5 < pld(z * (1 - 1e-3))


def test_gaussian_mechanism_under_mmcc(capsys):
  argv = ["--total_rounds", "4", "--sampling_prob", "0.5", "--noise_multiplier", "2", "--delta",
          DELTA]
  new = _json(["--mechanism", "identity", "--amplification", "mmcc"] + argv + FAST_MMCC, capsys)
  direct = mmcc.mmcc_epsilon(mmcc.identity_matrix(4), 0.5, 2.0, 1e-6, workers=1)
  assert new["epsilon"] <= direct * (1 + 1e-12) and new["mechanism"] == "gaussian"
  assert new["accountant"] == "mmcc" and new["analysis"] == "mmcc"
  for key in ("epsilon", "delta", "noise_multiplier", "sampling_prob", "mmcc"):
    assert key in new


@pytest.mark.parametrize("flag, names", [
    ("--strategy", "--mechanism"), ("--mmcc", "--amplification mmcc"),
    ("--workers", "--processes")])
def test_removed_flags_name_their_replacement(flag, names, capsys):
  _assert_one_line_error([flag, "identity", "--noise_multiplier", "2", "--delta", DELTA],
                         re.escape(f"{flag} was removed: use {names}"), capsys)


def test_mmcc_matrices_keep_names_that_say_what_they_are(capsys):
  """tree_restart and the truncated √S of MMCC App E, under their own names."""
  common = ["--total_rounds", "16", "--noise_multiplier", "2", "--delta", DELTA, "--participation",
            "min_sep", "--min_sep", "4", "--amplification", "mmcc", "--sampling_prob", "0.25"]
  new = _json(["--mechanism", "tree_restart", "--height", "3"] + common + FAST_MMCC, capsys)
  direct = mmcc.mmcc_epsilon(mmcc.tree_restart_matrix(16, 3), 0.0625, 2.0, 1e-6, min_sep=4,
                             workers=1)
  assert new["amplified_epsilon"] == pytest.approx(direct, rel=1e-12)
  assert new["sampling_prob"] == 0.25 and new["participation"] == "min_sep-b4-k4"
  sqrt = _json(["--mechanism", "truncated_sqrt_prefix", "--bands", "4"] + common + FAST_MMCC,
               capsys)
  assert sqrt["matrix"].startswith("truncated_sqrt_prefix") and sqrt["bands"] == 4


def test_the_former_amplification_name_banded_is_refused_naming_the_new(capsys):
  argv = ["--mechanism", "tree_restart", "--height", "3", "--total_rounds", "16", "--min_sep",
          "4", "--sampling_prob", "0.5", "--noise_multiplier", "2", "--delta", DELTA,
          "--pld_discretization", "1e-2", "--json"]
  rc, out, err = _run(argv + ["--amplification", "banded"], capsys)
  assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1
  assert "--amplification banded was renamed --amplification amplified_banded" in err


def test_banded_with_target_epsilon(capsys):
  out = _json(["--mechanism", "tree_restart", "--height", "3", "--total_rounds", "16", "--min_sep",
               "4", "--amplification", "amplified_banded", "--sampling_prob", "0.5",
               "--target_epsilon", "1",
               "--delta", DELTA, "--pld_discretization", "1e-3", "--tolerance", "1e-2"], capsys)
  z = out["noise_multiplier"]
  assert out["epsilon"] <= 1.0 and out["analysis"] == "amplified_banded"
  assert out["compositions"] == 4
  acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-3)
  acc.compose(dp_accounting.PoissonSampledDpEvent(0.5, dp_accounting.GaussianDpEvent(z)), 4)
  assert acc.get_epsilon(1e-6) <= 1.0
  acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-3)
  acc.compose(dp_accounting.PoissonSampledDpEvent(
      0.5, dp_accounting.GaussianDpEvent(z * 0.99)), 4)
  assert acc.get_epsilon(1e-6) > 1.0


@pytest.fixture(scope="module")
def cached_tree(tmp_path_factory):
  """A cached honaker_online factorization for n = 4 (C = the normalized binary tree)."""
  spec = strategies.FactorizationSpec(
      workload=workloads.WorkloadSpec(kind="prefix_sum", n=4), strategy="honaker_online")
  f, entry = cache.load_or_factorize(spec, cache_dir=str(tmp_path_factory.mktemp("cache")))
  return f, entry


def test_matrix_file(cached_tree, capsys):
  f, entry = cached_tree
  out = _json(["--matrix", entry.npz_path, "--noise_multiplier", "3", "--delta", DELTA], capsys)
  assert out["participation"] == "single" and out["sensitivity"] == pytest.approx(1.0)
  reference = statcheck.gaussian_epsilon(3.0, 1e-6)  # stored C: sensitivity 1 (rounded up)
  assert reference <= out["epsilon"] <= reference * (1 + 1e-10)
  out = _json(["--matrix", entry.npz_path, "--amplification", "mmcc", "--sampling_prob", "0.25",
               "--noise_multiplier", "8", "--delta", DELTA, "--total_rounds", "4"] + FAST_MMCC,
              capsys)
  assert out["n"] == 4 and out["m"] == f.c.shape[0] and out["min_sep"] == 1
  assert out["amplified_epsilon"] == pytest.approx(mmcc.mmcc_epsilon(
      mmcc.binary_tree_matrix(4), 0.25, 8.0, 1e-6, workers=1), rel=1e-9)


# ----------------------------------------------------------------------------- bad inputs


def _rewrite_entry(entry, c):
  """Replaces the entry's C (keeping A, B) and re-signs the sidecar, so only C is wrong."""
  with np.load(entry.npz_path) as data:
    arrays = {k: data[k] for k in data.files}
  arrays["C"] = c
  with open(entry.npz_path, "wb") as out:
    np.savez(out, **arrays)
  with open(entry.npz_path, "rb") as fin:
    sha = hashlib.sha256(fin.read()).hexdigest()
  with open(entry.json_path) as fin:
    metadata = json.load(fin)
  metadata["npz_sha256"] = sha
  with open(entry.json_path, "w") as out:
    json.dump(metadata, out)


@pytest.fixture
def broken_entry(tmp_path):
  spec = strategies.FactorizationSpec(
      workload=workloads.WorkloadSpec(kind="prefix_sum", n=4), strategy="honaker_online")
  _, entry = cache.load_or_factorize(spec, cache_dir=str(tmp_path))
  return entry


@pytest.mark.parametrize("kind,match", [
    ("complex", "complex"), ("upper", "lower triangular"), ("garbage", "corrupt"),
    ("plain", "no sidecar"), ("missing", "does not exist")])
def test_bad_matrix_files(broken_entry, tmp_path, kind, match, capsys):
  path = broken_entry.npz_path
  with np.load(path) as data:
    c = data["C"].copy()
  if kind == "complex":
    _rewrite_entry(broken_entry, c.astype(np.complex128))
  elif kind == "upper":
    c[0, 1] = 0.5
    _rewrite_entry(broken_entry, c)
  elif kind == "garbage":
    with open(path, "r+b") as out:
      out.write(b"not a zip file")
  elif kind == "plain":
    path = str(tmp_path / "plain.npz")
    np.savez(path, C=c)
  else:
    path = str(tmp_path / "nothing.npz")
  _assert_one_line_error(["--matrix", path, "--noise_multiplier", "1", "--delta", DELTA],
                         match, capsys)


def _assert_one_line_error(argv, match, capsys):
  try:
    rc, out, err = _run(argv, capsys)
  except SystemExit as e:  # argparse's own errors (bad types, missing values)
    captured = capsys.readouterr()
    rc, out, err = e.code, captured.out, captured.err
  lines = err.strip().splitlines()
  assert rc == 2 and out == "", (rc, out, err)
  assert len(lines) == 1 and lines[0].startswith("tff-mf account: error: "), err
  assert re.search(match, lines[0]), lines[0]


MECH = ["--mechanism", "gaussian", "--total_rounds", "4"]
Z = ["--noise_multiplier", "1"]


@pytest.mark.parametrize("argv,match", [
    (["--noise_multiplier", "-1", "--delta", DELTA], "noise_multiplier must be positive"),
    (["--noise_multiplier", "nan", "--delta", DELTA], "--noise_multiplier: must be a finite"),
    (["--noise_multiplier", "inf", "--delta", DELTA], "--noise_multiplier: must be a finite"),
    (["--noise_multiplier", "0", "--delta", DELTA], "noise_multiplier must be positive"),
    (Z + ["--delta", "0"], r"delta must be in \(0, 1\)"),
    (Z + ["--delta", "1"], r"delta must be in \(0, 1\)"),
    (Z + ["--delta=-1e-6"], r"delta must be in \(0, 1\)"),
    (Z + ["--delta", "-1e-6"], "argument --delta: expected one argument"),
    (Z + ["--delta", "x"], "invalid float value"),
    (Z + ["--delta", DELTA, "--participation", "weekly"], "unknown value .weekly."),
    (Z + ["--delta", "nan"], "--delta: must be a finite"),
    (["--target_epsilon", "-1", "--delta", DELTA], "target_epsilon must be positive"),
    (["--target_epsilon", "inf", "--delta", DELTA], "--target_epsilon: must be a finite"),
    (["--target_epsilon", "nan", "--delta", DELTA], "--target_epsilon: must be a finite"),
    (["--target_epsilon", "1", "--delta", DELTA, "--tolerance", "0"], "tolerance"),
    (["--target_epsilon", "1", "--delta", DELTA, "--tolerance", "nan"], "tolerance"),
    (Z + ["--target_epsilon", "1", "--delta", DELTA], "exactly one of"),
    (["--delta", DELTA], "exactly one of"),
    (MECH + Z + ["--delta", DELTA, "--amplification", "amplified_banded", "--sampling_prob", "0"],
     r"sampling_prob must be in \(0, 1\]"),
    (MECH + Z + ["--delta", DELTA, "--amplification", "amplified_banded", "--sampling_prob", "1.5"],
     r"sampling_prob must be in \(0, 1\]"),
    (MECH + Z + ["--delta", DELTA, "--amplification", "amplified_banded", "--sampling_prob", "nan"],
     "--sampling_prob: must be a finite"),
    (MECH + Z + ["--delta", DELTA, "--amplification", "mmcc", "--sampling_prob", "-0.1"],
     r"sampling_prob must be in \(0, 1\]"),
    (MECH + Z + ["--delta", DELTA, "--amplification", "mmcc"], "needs --sampling_prob"),
    (["--mechanism", "gaussian", "--total_rounds", "0"] + Z + ["--delta", DELTA],
     "positive integer"),
    (["--mechanism", "gaussian"] + Z + ["--delta", DELTA], "needs --total_rounds"),
    (["--mechanism", "nope", "--total_rounds", "4"] + Z + ["--delta", DELTA], "unknown mechanism"),
    (["--mechanism", "optiml", "--total_rounds", "4"] + Z + ["--delta", DELTA],
     "did you mean optimal?"),
    (["--mechanism", "none", "--total_rounds", "4"] + Z + ["--delta", DELTA], "no noise"),
    (["--mechanism", "tree_restart", "--total_rounds", "8"] + Z + ["--delta", DELTA], "--height"),
    (["--mechanism", "tree_restart", "--total_rounds", "8", "--height", "0"] + Z + ["--delta",
                                                                                    DELTA],
     "positive integer"),
    (["--total_rounds", "4"] + Z + ["--delta", DELTA], "--total_rounds needs --mechanism"),
    (MECH + Z + ["--delta", DELTA, "--participation", "fixed_epoch", "--epochs", "3"],
     "must divide the number of rounds"),
    (MECH + Z + ["--delta", DELTA, "--participation", "min_sep"], "needs --min_sep"),
    (MECH + Z + ["--delta", DELTA, "--participation", "min_sep", "--epochs", "2"], "--epochs"),
    (Z + ["--delta", DELTA, "--participation", "min_sep", "--min_sep", "2"],
     "needs the encoder C"),
    (["--mechanism", "binary_tree", "--total_rounds", "8", "--min_sep", "4", "--amplification",
      "amplified_banded", "--sampling_prob", "0.1"] + Z + ["--delta", DELTA], "non-zero bands"),
    (MECH + Z + ["--delta", DELTA, "--participation", "single", "--amplification", "mmcc",
                 "--sampling_prob", "0.5"], "min_sep schema"),
    (MECH + Z + ["--delta", DELTA, "--non_adaptive"], "--non_adaptive"),
    (MECH + Z + ["--delta", DELTA, "--amplification", "amplified_banded", "--sampling_prob", "0.5",
                 "--pld_discretization", "-1"], "pld_discretization"),
    (MECH + Z + ["--delta", DELTA, "--bands", "3"], "--bands"),
    (MECH + Z + ["--delta", DELTA, "--target_epsilonn", "1"], "did you mean --target_epsilon?"),
    (MECH + Z + ["--delta", DELTA, "--accountant", "pdl"], "did you mean pld?"),
    (["--mechanism", "tree_restart", "--total_rounds", "8", "--height", "2", "--bands", "2"] + Z
     + ["--delta", DELTA], "--bands"),
    (["--mechanism", "gaussian", "--total_rounds", "100000000"] + Z + ["--delta", DELTA], "memory"),
])
def test_bad_inputs_are_one_line_errors(argv, match, capsys):
  _assert_one_line_error(argv, match, capsys)


def test_n_mismatch_and_two_sources(cached_tree, capsys):
  _, entry = cached_tree
  _assert_one_line_error(["--matrix", entry.npz_path, "--total_rounds", "8"] + Z + ["--delta",
                                                                                    DELTA],
                         "does not match", capsys)
  _assert_one_line_error(["--matrix", entry.npz_path, "--mechanism", "gaussian"] + Z
                         + ["--delta", DELTA], "one of --matrix and --mechanism", capsys)


# ----------------------------------------------------------------------------- strict JSON


def test_json_is_strict_for_unbounded_and_nested_values(capsys):
  out = _json(["--noise_multiplier", "1e-200", "--delta", DELTA], capsys)
  assert out["epsilon"] == "inf"  # ε ≈ 5e399 exceeds every double: an honest upper bound
  account_cmd._print({"epsilon": float("inf"), "x": {"y": [np.float64("-inf"), np.int64(3)]}},
                     as_json=True)
  assert _strict(capsys.readouterr().out) == {"epsilon": "inf", "x": {"y": ["-inf", 3]}}
  with pytest.raises(ValueError, match="NaN"):
    account_cmd._print({"epsilon": float("nan")}, as_json=True)


def test_help_describes_every_flag_with_its_default():
  parser = cli.build_parser()
  sub = next(a for a in parser._actions if a.dest == "command").choices["account"]
  formatter = sub._get_formatter()
  for action in sub._actions:
    if action.dest == "help":
      continue
    shown = formatter._get_help_string(action)
    assert action.help and ("default" in shown or "required" in shown), action.dest
  text = sub.format_help()
  assert "arXiv:2306.08153" in text and "arXiv:2310.15526" in text
  assert not re.search(r"\b00[0-9]_", text)


def test_no_tensorflow_imported():
  code = ("import sys; import tff_mf.accounting, tff_mf.accounting.mmcc, tff_mf.commands.account; "
          "assert 'tensorflow' not in sys.modules, 'tensorflow imported'")
  subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, env=userenv.env())


# ----------------------------------------------------------------------------- edge inputs


# The child limits its own address space before it runs the tool: a preexec_fn would run
# Python between fork and exec, where the gRPC threads of a test process that imported
# TensorFlow may write to the child's stderr ("Kick failed: eventfd_write").
_LIMITED = ("import resource, runpy, sys; limit = 4 << 30; "
            "resource.setrlimit(resource.RLIMIT_AS, (limit, limit)); "
            "sys.argv = ['tff-mf'] + sys.argv[1:]; "
            "runpy.run_module('tff_mf.cli', run_name='__main__', alter_sys=True)")


def _account(argv, timeout=60):
  """Runs `tff-mf account ARGV` in a subprocess limited to 4 GiB of address space."""
  start = time.perf_counter()
  proc = subprocess.run([sys.executable, "-c", _LIMITED, "account"] + argv,
                        cwd=REPO, env=userenv.env(), capture_output=True, text=True,
                        timeout=timeout)
  return proc, time.perf_counter() - start


Z_TINY = 1e-3


def _exact(multiplier, delta=float(DELTA)):
  return statcheck.gaussian_epsilon(multiplier, delta)


def _rdp_classic(z, delta=float(DELTA)):
  """Mironov 2017 (arXiv:1702.07476, Prop 3): min over the accountant's orders α of
  α/(2z²) + log(1/δ)/(α − 1). dp_accounting's conversion is never looser at an order; it
  skips orders α ≤ 1.01 (numerically unstable there), so they are skipped here too."""
  return min(a / (2 * z * z) + math.log(1 / delta) / (a - 1)
             for a in accounting.RDP_ORDERS if a > 1.01)


def _amplified_bounds(c, rounds_joined, p, z, delta=float(DELTA)):
  """[lower, upper] for ε of Poisson sampling (each eligible round with probability p).

  Upper: the unamplified Gaussian at z/‖C·1_π‖ for the worst eligible pattern π (C ≥ 0,
  so joining every eligible round is the worst). Lower: with probability p^k the user
  joins all k rounds of π, so the output law P ≥ p^k·N(C·1_π, z²I) and δ_P(ε) ≥
  p^k·δ_G(ε + k·log(1/p)), i.e. ε ≥ ε_G(δ/p^k) − k·log(1/p).
  """
  sens = max(float(np.linalg.norm(c[:, list(pattern)].sum(axis=1))) for pattern in rounds_joined)
  k = len(rounds_joined[0])
  return (_exact(z / sens, delta / p**k) - k * math.log(1 / p),
          _exact(z / sens, delta) * (1 + 1e-9))


def _tree_encoder_normalized(n):
  """C_T over n = 2^h leaves (one row per node), divided by √(h + 1): γ = 1."""
  rows = [[1.0 if s <= j < s + w else 0.0 for j in range(n)]
          for w in (2**h for h in range(int(math.log2(n)) + 1)) for s in range(0, n, w)]
  return np.array(rows) / math.sqrt(math.log2(n) + 1)


def _restart_blocks(n, leaves):
  c = np.zeros((0, n))
  for start in range(0, n, leaves):
    block = np.zeros((2 * leaves - 1, n))
    block[:, start:start + leaves] = _tree_encoder_normalized(leaves)
    c = np.vstack([c, block])
  return c


# Each expectation is (lower, upper) from an independent computation: the analytic
# Gaussian ε (statcheck, 50-digit mpmath), Mironov's RDP conversion, or the mixture bound of
# _amplified_bounds. Targets check the returned z: ε_exact(z) ≤ target < ε_exact(z − tol).
EDGE_CASES = [
    (["--noise_multiplier", "1e-3"],
     lambda: (_exact(Z_TINY), _exact(Z_TINY) * (1 + 1e-9))),
    (["--noise_multiplier", "1e-3", "--accountant", "pld"],
     lambda: (_exact(Z_TINY), _exact(Z_TINY) * (1 + 1e-4))),
    (["--noise_multiplier", "1e-3", "--accountant", "rdp"],
     lambda: (_exact(Z_TINY), _rdp_classic(Z_TINY))),
    (["--noise_multiplier", "1e-6", "--accountant", "pld"], "exact accountant gives epsilon"),
    (["--target_epsilon", "1000"], ("target", 1000.0, 2e-3)),
    # Slow (about 16 s of PLD calibration); huge targets stay in the default suite with the
    # default accountant (above), and the PLD accountant at tiny noise.
    pytest.param(["--target_epsilon", "1e6", "--accountant", "pld"], ("target", 1e6, 1e-2),
                 marks=pytest.mark.slow),
    (["--mechanism", "binary_tree", "--total_rounds", "4", "--amplification", "mmcc",
      "--sampling_prob", "0.25", "--noise_multiplier", "1e-3"] + FAST_MMCC,
     lambda: _amplified_bounds(_tree_encoder_normalized(4), [(0, 1, 2, 3)], 0.25, Z_TINY)),
    (["--mechanism", "binary_tree", "--total_rounds", "4", "--amplification", "mmcc",
      "--sampling_prob",
      "0.25", "--noise_multiplier", "1e-5"] + FAST_MMCC, "unamplified bound is epsilon"),
    (["--mechanism", "tree_restart", "--height", "3", "--total_rounds", "16", "--min_sep", "4",
      "--amplification", "amplified_banded", "--sampling_prob", "0.5", "--noise_multiplier", "1e-3"],
     lambda: _amplified_bounds(_restart_blocks(16, 4), [tuple(range(r, 16, 4)) for r in range(4)],
                               0.5, Z_TINY)),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("argv,expect", EDGE_CASES)
def test_edge_inputs_in_bounded_memory_and_time(argv, expect):
  """Tiny z (1e-3 used to ask for ~76 GiB) and huge targets (ε ≥ 710 overflowed):
  a number within independent bounds, or a clean one-line error, within 4 GiB and 60 s."""
  proc, seconds = _account(argv + ["--delta", DELTA, "--json"])
  assert seconds < 60, seconds
  if isinstance(expect, str):
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and expect in lines[0], proc.stderr
    return
  assert proc.returncode == 0, proc.stderr
  out = _strict(proc.stdout)
  if isinstance(expect, tuple):
    _, target, tol = expect
    z = out["noise_multiplier"]
    assert _exact(z) <= target < _exact(z * (1 - tol)), z
    return
  lower, upper = expect()
  assert lower <= out["epsilon"] <= upper, (lower, out["epsilon"], upper)


# ----------------------------------------------------------------------------- below the bound

_SLACK = ["--mechanism", "truncated_sqrt_prefix", "--bands", "4", "--total_rounds", "32",
          "--min_sep", "4",
          "--amplification", "mmcc", "--sampling_prob", "0.25", "--delta", DELTA] + FAST_MMCC


def test_lower_bound_and_estimate_are_labeled_and_below_the_bound(capsys):
  """--lower_bound: a proven lower bound ≤ the printed ε, and slack = ε / lower; the
  Monte-Carlo estimate is a separate, labeled field and never the run's ε."""
  from tff_mf.accounting import mixture_pair  # pylint: disable=g-import-not-at-top
  noise = ["--noise_multiplier", "2"]
  out = _json(_SLACK + noise + ["--lower_bound", "--monte_carlo_samples", "5000"], capsys)
  plain = _json(_SLACK + noise, capsys)
  assert out["epsilon"] == plain["epsilon"]  # the run's ε is untouched
  assert 0 < out["lower_bound_epsilon"] <= out["epsilon"]
  assert out["slack"] == pytest.approx(out["epsilon"] / out["lower_bound_epsilon"], rel=1e-12)
  assert "proven lower bound" in out["lower_bound_method"]
  c = mmcc.truncated_sqrt_prefix_matrix(32, 4)
  direct = mixture_pair.lower_bound(c, 0.25, out["noise_multiplier"], 1e-6, min_sep=4)
  assert out["lower_bound_epsilon"] == pytest.approx(direct.epsilon, rel=1e-9)
  estimate = out["monte_carlo_estimate"]
  assert "ESTIMATE" in estimate["label"] and "not a bound" in estimate["label"]
  assert estimate["samples"] == 5000 and estimate["epsilon_estimate"] > 0
  assert "epsilon" not in estimate  # its number is never under the name of the run's ε
  rc, text, _ = _run(_SLACK + noise + ["--lower_bound"], capsys)
  assert rc == 0 and re.search(r"^lower_bound_epsilon: ", text, re.M)
  assert re.search(r"^slack: ", text, re.M) and "monte_carlo_estimate" not in text


def test_lower_bound_at_the_calibrated_noise(capsys):
  """With --target_epsilon the lower bound is taken at the z printed: lower ≤ ε ≤ target."""
  argv = ["--mechanism", "truncated_sqrt_prefix", "--bands", "2", "--total_rounds", "8",
          "--min_sep", "2",
          "--amplification", "mmcc", "--sampling_prob", "0.5", "--delta", DELTA,
          "--target_epsilon", "3", "--tolerance", "0.05", "--lower_bound"] + FAST_MMCC
  out = _json(argv, capsys)
  assert 0 < out["lower_bound_epsilon"] <= out["epsilon"] <= 3.0
  assert out["slack"] >= 1.0


def test_lower_bound_of_random_allocation(capsys):
  """Balls-in-bins (random allocation): the proven lower bound of tff_mf.accounting.random_allocation
  below the printed ε; Monte-Carlo accounting is not offered there."""
  from tff_mf.accounting import random_allocation  # pylint: disable=g-import-not-at-top
  argv = ["--mechanism", "banded_toeplitz", "--total_rounds", "16", "--participation",
          "random_allocation",
          "--epochs", "2", "--amplification", "amplified_allocation", "--noise_multiplier", "2",
          "--delta", DELTA]
  out = _json(argv + ["--lower_bound"], capsys)
  assert 0 < out["lower_bound_epsilon"] <= out["epsilon"] <= out["unamplified_epsilon"]
  assert "random_allocation.lower_bound" in out["lower_bound_method"]
  from tff_mf.factorization import cache  # pylint: disable=g-import-not-at-top
  c = np.array(cache.load(out["cache_npz"]).c)  # stored as first columns (Toeplitz)
  direct = random_allocation.lower_bound(c, 2, 2.0, 1e-6)
  assert out["lower_bound_epsilon"] == pytest.approx(direct, rel=1e-12)
  _assert_one_line_error(argv + ["--monte_carlo_samples", "5000"],
                         r"--monte_carlo_samples only the first; not random_allocation", capsys)


@pytest.mark.parametrize("argv, match", [
    (["--mechanism", "gaussian", "--total_rounds", "4", "--noise_multiplier", "1", "--delta", DELTA,
      "--lower_bound"],
     r"--lower_bound needs --amplification mmcc, amplified_banded, amplified_allocation or "
     r"amplified_fixed_bin"),
    (["--mechanism", "gaussian", "--total_rounds", "4", "--noise_multiplier", "1", "--delta", DELTA,
      "--monte_carlo_samples", "5000"], r"--monte_carlo_samples needs --amplification"),
    (_SLACK + ["--noise_multiplier", "2", "--monte_carlo_samples", "10"],
     r"--monte_carlo_samples must be an integer >= 1000"),
    (_SLACK + ["--noise_multiplier", "2", "--lower_bound", "--non_adaptive"],
     r"--lower_bound needs a non-negative lower-triangular C"),
])
def test_lower_bound_bad_combinations_are_one_line_errors(argv, match, capsys):
  _assert_one_line_error(argv, match, capsys)


# ----------------------------------------------------------------------------- the workload


def test_mechanism_workload_follows_the_run_as_training_builds_it(tmp_path, capsys):
  """opt_momentum's C is for the run's momentum workload: ``--momentum β`` alone selects it (as
  training's --server_momentum does), and without β the ambiguity is refused in one line
  (it used to account the prefix-sum C: a different epsilon than training's)."""
  from tff_mf import mechanisms  # pylint: disable=g-import-not-at-top
  from tff_mf import participation  # pylint: disable=g-import-not-at-top
  from tff_mf import registry  # pylint: disable=g-import-not-at-top
  base = ["--mechanism", "opt_momentum", "--total_rounds", "16", "--participation", "fixed_epoch",
          "--epochs", "2", "--noise_multiplier", "2", "--delta", DELTA,
          "--cache_dir", str(tmp_path)]
  _assert_one_line_error(base, "give the run's --momentum BETA", capsys)
  # --workload momentum alone names no beta (factorize's default is no run's): refused too.
  _assert_one_line_error(base + ["--workload", "momentum"], "give the run's --momentum BETA",
                         capsys)
  record = _json(base + ["--momentum", "0.9"], capsys)
  assert record["workload"] == "momentum"
  explicit = _json(base + ["--workload", "momentum", "--momentum", "0.9"], capsys)
  assert explicit["cache_npz"] == record["cache_npz"] and explicit["cache_hit"]  # the same C
  assert explicit["epsilon"] == record["epsilon"]
  # Training's record for the same run: its workload from β, the same C and epsilon.
  schema = participation.fixed_epoch(2)
  resolved = mechanisms.resolve(registry.mechanism("opt_momentum"),
                                mechanisms.training_workload(16, 0.9, "constant", None), schema,
                                cache_dir=str(tmp_path))
  trained = mechanisms.privacy(resolved, 2.0, None, float(DELTA), "exact")
  assert record["epsilon"] == trained.epsilon
  plain = _json(base + ["--workload", "prefix_sum"], capsys)  # a run without momentum
  assert plain["workload"] == "prefix_sum" and plain["epsilon"] != record["epsilon"]


def test_discrete_gaussian_epsilon_and_refusals(capsys):
  """--noise_distribution discrete_gaussian: the zCDP ε (Cor 13 of arXiv:2004.00010) above the
  continuous Gaussian's exact ε at the same z/sens, a calibrated z at most the target, the
  statement naming it; sampling and other mechanisms refused in one line."""
  from tff_mf.noise import discrete_gaussian as dg  # pylint: disable=g-import-not-at-top
  base = ["--noise_distribution", "discrete_gaussian", "--delta", DELTA]
  record = _json(base + ["--noise_multiplier", "1.5", "--mechanism", "banded",
                         "--total_rounds", "16", "--bands", "4", "--epochs", "2"], capsys)
  assert record["analysis"] == "discrete_gaussian"
  sens = record["encoder_sensitivity"]
  assert record["epsilon"] == pytest.approx(dg.epsilon(1.5, 1e-6, sens), rel=1e-12)
  assert record["epsilon"] >= statcheck.gaussian_epsilon(1.5 / record["sensitivity"], 1e-6)
  assert "discrete Gaussian" in record["privacy_statement"]["text"]
  calibrated = _json(base + ["--target_epsilon", "2"], capsys)
  assert calibrated["epsilon"] <= 2.0
  # --tolerance applies: the z printed is within it of the smallest valid z.
  tight = _json(base + ["--target_epsilon", "2", "--tolerance", "1e-7"], capsys)
  assert tight["epsilon"] <= 2.0 and tight["tolerance"] == 1e-7
  assert dg.epsilon(tight["noise_multiplier"] / (1 + 1e-7), 1e-6, 1.0) > 2.0
  rc, out, err = _run(base + ["--target_epsilon", "2", "--tolerance", "0"], capsys)
  assert rc == 2 and out == "" and "--tolerance must be in (0, 1)" in err
  for extra, words in ((["--mechanism", "blt", "--total_rounds", "16"], "every past sum"),
                       (["--sampling_prob", "0.5", "--min_sep", "2", "--mechanism", "banded",
                         "--total_rounds", "16"], "without amplification")):
    rc, out, err = _run(base + ["--noise_multiplier", "1"] + extra, capsys)
    assert rc == 2 and out == "" and words in err and len(err.strip().splitlines()) == 1


# ----------------------------------------------------------------------------- issue 46, items 8-9

DISCRETE = ["--noise_distribution", "discrete_gaussian", "--delta", DELTA]


@pytest.fixture(scope="module")
def discrete_matrices(tmp_path_factory):
  """Cached n = 8 factorizations: BLT and the binary tree (no run streams them with integer
  noise) and a 2-banded C (one that does)."""
  cache_dir = str(tmp_path_factory.mktemp("dg_cache"))
  out = {}
  for strategy, params in (("blt", {"buffers": 2}), ("honaker_online", {}),
                           ("banded", {"bands": 2})):
    spec = strategies.FactorizationSpec(
        workload=workloads.WorkloadSpec(kind="prefix_sum", n=8), strategy=strategy, **params)
    out[strategy] = cache.load_or_factorize(spec, cache_dir=cache_dir)[1].npz_path
  return out


def test_discrete_gaussian_refuses_a_matrix_no_run_can_use(discrete_matrices, capsys):
  """Issue 46, item 8: --matrix <a BLT .npz> was accounted with integer noise though training
  refuses --mechanism blt with it. The rule is training's (discrete_gaussian.MECHANISMS):
  refused in one line naming the strategy and why; a banded C is accounted as before."""
  from tff_mf.noise import discrete_gaussian as dg  # pylint: disable=g-import-not-at-top
  for strategy in ("blt", "honaker_online"):
    _assert_one_line_error(DISCRETE + Z + ["--matrix", discrete_matrices[strategy]],
                           rf"\(strategy {strategy}\) with --noise_distribution "
                           "discrete_gaussian",
                           capsys)
    rc, _, err = _run(DISCRETE + Z + ["--matrix", discrete_matrices[strategy]], capsys)
    assert "integer noise" in err and "--mechanism banded" in err
  record = _json(DISCRETE + Z + ["--matrix", discrete_matrices["banded"], "--participation",
                                  "single"], capsys)
  assert record["epsilon"] == dg.epsilon(1.0, 1e-6, record["encoder_sensitivity"])
  # The continuous Gaussian still accounts any matrix.
  assert _json(["--delta", DELTA] + Z + ["--matrix", discrete_matrices["blt"]], capsys)["epsilon"]
  _assert_one_line_error(DISCRETE + Z + ["--mechanism", "truncated_sqrt_prefix", "--bands", "2",
                                         "--total_rounds", "8"], "MMCC's own matrices", capsys)


@pytest.mark.parametrize("accountant", ["rdp", "pld", "exact"])
def test_discrete_gaussian_refuses_an_accountant_it_does_not_use(accountant, capsys):
  """Issue 46, item 8: --accountant rdp was silently replaced by zCDP. Any --accountant given
  with the discrete Gaussian is refused in one line; left out, the record names zcdp, and
  the continuous Gaussian takes every accountant as before."""
  _assert_one_line_error(DISCRETE + Z + ["--accountant", accountant],
                         f"--accountant {accountant} does not apply to --noise_distribution "
                         "discrete_gaussian", capsys)
  assert _json(DISCRETE + Z, capsys)["accountant"] == "zcdp"
  assert _json(["--delta", DELTA, "--accountant", accountant] + Z, capsys)["accountant"] == \
      accountant


@pytest.mark.parametrize("extra", [
    [], ["--accountant", "pld"], ["--accountant", "rdp"],
    ["--noise_distribution", "discrete_gaussian"]])
def test_a_noise_multiplier_past_float64_is_refused_alike(extra, capsys):
  """Issue 46, item 8: --noise_multiplier 1e300 printed epsilon 0.0 for the discrete Gaussian
  (rho underflowed) and raised OverflowError for the continuous PLD and RDP accountants.
  Every distribution and accountant refuses it in one line; 1e100 is accounted."""
  _assert_one_line_error(["--noise_multiplier", "1e300", "--delta", DELTA] + extra,
                         r"--noise_multiplier 1e\+300 is above 1e\+100", capsys)
  record = _json(["--noise_multiplier", "1e100", "--delta", DELTA] + extra, capsys)
  assert record["epsilon"] >= 0.0


def _exact_cor13(rho, delta, alpha, eps):
  """Cor. 13 of arXiv:2004.00010 in 400-digit decimal arithmetic: (ε at order α, δ at ε and α);
  ``rho`` a Decimal, the rest floats (converted exactly)."""
  with decimal.localcontext() as ctx:
    ctx.prec = 400
    delta, alpha, eps = (decimal.Decimal(v) for v in (delta, alpha, eps))
    log_keep = (1 - 1 / alpha).ln()  # 400 digits: exact enough where 1/α is ~1e-150
    at = alpha * rho + log_keep - (delta.ln() + alpha.ln()) / (alpha - 1)
    d = ((alpha - 1) * (alpha * rho - eps) - (alpha - 1).ln() + alpha * log_keep).exp()
    return at, d


@pytest.mark.parametrize("z", ["1e3", "1e6", "1e8", "1e100"])
@pytest.mark.parametrize("delta", ["1e-6", "1e-100", "1e-320"])
def test_discrete_gaussian_epsilon_is_a_proven_upper_bound_at_large_z(z, delta, capsys):
  """Issue 46, item 8: an ε printed for the discrete Gaussian is Cor. 13's bound at the printed
  order or above it (checked in 400-digit arithmetic at the true, unfloored ρ), and 0 only
  where Cor. 13 at that order proves (0, δ)-DP. At δ = 1e-320 the conversion used to read
  log(1/δ) = log(inf) and print 0.0 for every z."""
  record = _json(["--noise_distribution", "discrete_gaussian", "--noise_multiplier", z,
                  "--delta", delta], capsys)
  eps, alpha = record["epsilon"], record["order"]
  with decimal.localcontext() as ctx:
    ctx.prec = 400
    ratio = (decimal.Decimal(record["encoder_sensitivity"])
             * (1 + decimal.Decimal(record["rounding_inflation"])) / decimal.Decimal(z))
    rho = ratio**2 / 2
  at, d_zero = _exact_cor13(rho, float(delta), alpha, 0.0)
  assert eps >= at
  if eps == 0.0:
    assert d_zero <= decimal.Decimal(float(delta))
  text = _run(["--noise_distribution", "discrete_gaussian", "--noise_multiplier", z,
               "--delta", delta], capsys)[1]
  assert re.search(r"^epsilon: ", text, re.M)
  if delta == "1e-320" and z != "1e100":
    assert eps > 0.0


MONTE_CARLO = ["--mechanism", "gaussian", "--total_rounds", "8", "--participation",
               "balls_in_bins", "--epochs", "2", "--amplification", "monte_carlo_bound",
               "--noise_multiplier", "2", "--delta", "1e-2", "--bound_samples", "20000",
               "--failure_probability", "0.01", "--accountant_seed", "9"]
SEED_CONDITION = ("for an accountant seed fixed before any result was seen; trying several "
                  "seeds and keeping the smallest epsilon voids this")


def test_monte_carlo_epsilon_carries_beta_and_the_seed_condition(capsys):
  """Issue 46, item 9: rerunning with new --accountant_seed values until a small ε appears
  voids β. Every place the Monte-Carlo ε is printed (each ε line, the statement's guarantee
  and its table, the analysis words, the JSON record) states β and that the seed was fixed
  before looking."""
  rc, text, err = _run(MONTE_CARLO, capsys)
  assert rc == 0, err
  beta = "holds with probability >= 1 - 0.01 over the accountant's own sampling"
  for key in ("epsilon", "amplified_epsilon"):
    line = [l for l in text.splitlines() if l.startswith(f"{key}: ")][0]
    assert beta in line and SEED_CONDITION in line, line
  guarantee = [l for l in text.splitlines() if "Guarantee:" in l][0]
  assert beta in guarantee and SEED_CONDITION in guarantee
  assert text.count(SEED_CONDITION) >= 5  # ε lines, label, guarantee, table row, analysis
  record = _json(MONTE_CARLO, capsys)
  assert record["failure_probability"] == 0.01
  assert SEED_CONDITION in record["epsilon_label"]
  statement_text = record["privacy_statement"]["text"]
  assert beta in statement_text and SEED_CONDITION in statement_text


@pytest.mark.parametrize("former,new,kind", [("random_allocation", "amplified_allocation",
                                              "random_allocation"),
                                             ("balls_in_bins", "amplified_fixed_bin",
                                              "balls_in_bins")])
def test_the_former_amplification_names_of_a_kind_are_refused_naming_the_new(
    former, new, kind, capsys):
  """Kinds and analyses no longer share names: --amplification random_allocation and
  balls_in_bins name participation kinds only, and are refused in one line naming the new."""
  argv = ["--mechanism", "gaussian", "--total_rounds", "16", "--participation", kind,
          "--epochs", "4", "--noise_multiplier", "2", "--delta", DELTA, "--json"]
  rc, out, err = _run(argv + ["--amplification", former], capsys)
  assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1
  assert f"--amplification {former} was renamed --amplification {new}" in err
  assert "participation kind" in err
  rc, out, err = _run(argv + ["--amplification", new], capsys)
  assert rc == 0, err
  assert json.loads(out)["analysis"] == new


def test_a_matrix_shared_by_every_schema_needs_its_schema_named(discrete_matrices, capsys):
  """banded's C serves every schema from one cache entry (the single-participation one, which
  a min_sep run reads too): accounting it without naming the schema would account single
  participation for a run that joined k times; refused in one line, accounted once named."""
  _assert_one_line_error(["--delta", DELTA] + Z + ["--matrix", discrete_matrices["banded"]],
                         "serves every schema", capsys)
  single = _json(["--delta", DELTA] + Z + ["--matrix", discrete_matrices["banded"],
                                           "--participation", "single"], capsys)
  twice = _json(["--delta", DELTA] + Z + ["--matrix", discrete_matrices["banded"],
                                          "--participation", "fixed_epoch", "--epochs", "2"],
                capsys)
  assert twice["epsilon"] > single["epsilon"]

