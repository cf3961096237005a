"""The random-allocation accountant: tff_mf.accounting.random_allocation."""

import itertools
import math
import subprocess
import sys

import numpy as np
import pytest
from scipy import special

import userenv
from tff_mf import accounting
from tff_mf import checks
from tff_mf import mechanisms
from tff_mf import participation
from tff_mf.accounting import random_allocation as ra

DELTA = 1e-6


def toeplitz(coef, n):
  coef = np.asarray(coef, dtype=np.float64)
  c = np.zeros((n, n))
  for d, v in enumerate(coef[:n]):
    c += v * np.eye(n, k=-d)
  return c / np.max(np.linalg.norm(c, axis=0))


def unamplified(c, k, z):
  sens = participation.sensitivity(c, participation.random_allocation(k))
  return sens, accounting.epsilon(z, DELTA, sensitivity=sens)


def quadrature_divergences(c, alpha, z, points=90):
  """D_α(Q‖P) and D_α(P‖Q) of the one-epoch pair (k = 1) for a 2-round C, by Gauss–Hermite
  quadrature in the plane (an independent, deterministic evaluation)."""
  x, w = special.roots_hermitenorm(points)
  w = w / np.sqrt(2 * np.pi)
  y = np.stack(np.meshgrid(x, x, indexing="ij"), -1).reshape(-1, 2) * z
  weights = np.outer(w, w).ravel()
  means = c.T  # m_t = C e_t
  log_l = special.logsumexp(y @ means.T / z ** 2 - 0.5 * np.sum(means ** 2, 1) / z ** 2,
                            axis=1) - math.log(2)
  remove = math.log(np.sum(weights * np.exp(alpha * log_l))) / (alpha - 1)
  add = math.log(np.sum(weights * np.exp(-(alpha - 1) * log_l))) / (alpha - 1)
  return remove, add


def test_collision_dynamic_program_matches_enumeration():
  for bins, beta in ((3, 0.7), (4, 2.0), (1, 0.3)):
    values = ra.log_collision_mgf(beta, bins, 6)
    for balls in range(7):
      brute = [math.exp(beta * sum(n * (n - 1) / 2 for n in np.bincount(p, minlength=bins)))
               for p in itertools.product(range(bins), repeat=balls)] if balls else [1.0]
      assert values[balls] == pytest.approx(math.log(np.mean(brute)), rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("c", [np.eye(2), np.array([[1.0, 0.0], [0.6, 0.8]])])
def test_bounds_dominate_the_exact_divergences(c):
  """Both directions' bounds are ≥ the divergences themselves (quadrature, k = 1, b = 2);
  for C = I the collision bound is the exact remove divergence."""
  z = 1.0
  orders = [2, 3, 4, 6]
  bounds = ra.rdp(c, 1, z, orders=orders)
  for i, alpha in enumerate(orders):
    remove, add = quadrature_divergences(c, alpha, z)
    assert min(bounds["remove_collisions"][i], bounds["remove_decoupled"][i]) >= remove - 1e-9
    assert bounds["add"][i] >= add - 1e-9
    if np.array_equal(c, np.eye(2)):
      assert bounds["remove_collisions"][i] == pytest.approx(remove, rel=1e-8)


def test_remove_bounds_dominate_enumeration_over_epochs():
  """Correlated C over k = 3 epochs of b = 2: the exact remove-direction moment
  E exp(Σ_{i<j} 1_{π_i}ᵀX1_{π_j}/z²) by enumerating every allocation of α users is below
  both bounds; the pair moment of the chain is exact for k ≤ 2 and an upper bound beyond."""
  c = toeplitz(0.8 ** np.arange(6), 6)
  x = c.T @ c
  k, b, z = 3, 2, 1.5
  patterns = [np.array([e * b + t for e, t in enumerate(p)])
              for p in itertools.product(range(b), repeat=k)]
  pair = np.array([[x[np.ix_(p, q)].sum() for q in patterns] for p in patterns])
  orders = [2, 3, 4]
  bounds = ra.rdp(c, k, z, orders=orders)
  for i, alpha in enumerate(orders):
    moments = [math.exp(sum(pair[u[a], u[bb]] for a in range(alpha)
                            for bb in range(a + 1, alpha)) / z ** 2)
               for u in itertools.product(range(len(patterns)), repeat=alpha)]
    exact = math.log(np.mean(moments)) / (alpha - 1)
    assert bounds["remove_collisions"][i] >= exact - 1e-12
    assert bounds["remove_decoupled"][i] >= exact - 1e-12
  gram = ra._gram(c, k, b)  # pylint: disable=protected-access
  assert ra.log_pair_moment(gram, 0.7) >= math.log(np.mean(np.exp(0.7 * pair))) - 1e-12
  c2 = toeplitz(0.8 ** np.arange(4), 4)
  pats = [np.array([t, b + u]) for t in range(b) for u in range(b)]
  x2 = c2.T @ c2
  pair2 = np.array([[x2[np.ix_(p, q)].sum() for q in pats] for p in pats])
  assert ra.log_pair_moment(ra._gram(c2, 2, b), 0.7) == pytest.approx(  # pylint: disable=protected-access
      math.log(np.mean(np.exp(0.7 * pair2))), rel=1e-9)


def feldman_shenfeld_rdp(alpha, b, k, z):
  """Feldman & Shenfeld 2025 (arXiv:2502.08202) for C = I, k-fold: remove exactly, add by
  their bound 1/z² + log E exp(pairs of α − 1 balls / z²)/(α − 1), from enumeration."""
  def log_pairs_mgf(balls):
    vals = [math.exp(sum(n * (n - 1) / 2 for n in np.bincount(p, minlength=b)) / z ** 2)
            for p in itertools.product(range(b), repeat=balls)] if balls else [1.0]
    return math.log(np.mean(vals))
  remove = k * log_pairs_mgf(alpha) / (alpha - 1)
  add = k * (1 / z ** 2 + log_pairs_mgf(alpha - 1) / (alpha - 1))
  return remove, add


def test_identity_against_feldman_shenfeld_and_a_lower_bound():
  """C = I (DP-SGD with random allocation): remove direction equals Feldman–Shenfeld's exact
  value, add direction below their bound, so ε is at most theirs; ε lies between a proven
  lower bound and the unamplified bound, clearly amplified."""
  b, k, z = 4, 2, 1.0
  c = np.eye(b * k)
  orders = list(range(2, 9))
  bounds = ra.rdp(c, k, z, orders=orders)
  theirs = []
  for i, alpha in enumerate(orders):
    remove, add = feldman_shenfeld_rdp(alpha, b, k, z)
    assert bounds["remove_collisions"][i] == pytest.approx(remove, rel=1e-10)
    assert bounds["add"][i] <= add
    theirs.append(max(remove, add))
  from dp_accounting.rdp import rdp_privacy_accountant  # pylint: disable=g-import-not-at-top
  eps_theirs, _ = rdp_privacy_accountant.compute_epsilon(orders, theirs, DELTA)
  eps = ra.epsilon(c, k, z, DELTA, orders=orders, pld=False)["epsilon"]
  assert eps <= eps_theirs
  # The default orders, against the bracket.
  c = np.eye(64)
  for k, z in ((4, 1.0), (4, 2.0), (1, 1.0)):
    sens, plain = unamplified(c, k, z)
    eps = ra.epsilon(c, k, z, DELTA, sensitivity=sens, pld=False)["epsilon"]
    low = ra.lower_bound(c, k, z, DELTA)
    assert low <= eps <= plain
    assert eps < 0.6 * plain


@pytest.mark.parametrize("coef, n, k", [
    ([1.0, 0.5, 0.25], 16, 2),  # banded Toeplitz (3 bands)
    (0.7 ** np.arange(16), 16, 4),  # BLT-like: every band, geometric decay
    (1.0 / np.sqrt(np.arange(1, 13)), 12, 3),  # square root of the prefix sum
])
def test_toeplitz_between_lower_bound_and_unamplified(coef, n, k):
  c = toeplitz(coef, n)
  for z in (1.0, 4.0):
    sens, plain = unamplified(c, k, z)
    record = accounting.epsilon_for(c, participation.random_allocation(k), z, DELTA,
                                    "amplified_allocation")
    low = ra.lower_bound(c, k, z, DELTA)
    assert record["epsilon"] == min(record["amplified_epsilon"], plain)
    assert record["unamplified_epsilon"] == plain
    assert low <= record["amplified_epsilon"] and low <= record["epsilon"] <= plain


def test_bad_inputs_are_one_line_errors():
  c = np.eye(8)
  cases = [(-np.eye(8), 2, "non-negative"), (np.ones((8, 8)), 2, "lower-triangular"),
           (c, 3, "must divide"), (np.ones((8, 4)), 2, "square"), (c, 0, "epochs")]
  for matrix, k, words in cases:
    with pytest.raises(checks.CheckError) as e:
      ra.epsilon(matrix, k, 1.0, DELTA)
    assert words in str(e.value) and "\n" not in str(e.value)
  with pytest.raises(checks.CheckError, match="random_allocation participation .*, not min_sep"):
    accounting.epsilon_for(c, participation.min_sep(2), 1.0, DELTA, "amplified_allocation")
  with pytest.raises(checks.CheckError, match="sampling_prob does not apply"):
    accounting.epsilon_for(c, participation.random_allocation(2), 1.0, DELTA,
                           "amplified_allocation", sampling_prob=0.5)


@pytest.mark.slow  # C = I: about 20 evaluations of the PLD bound (tests/test_allocation_pld.py)
def test_run_record_names_the_random_allocation_bound_and_calibrates_with_it():
  c, schema = np.eye(64), participation.random_allocation(4)
  record = mechanisms.run_privacy(c, schema, 2.0, None, DELTA, "exact")
  assert record.bound == "amplified_allocation"
  assert "arXiv:2601.21636" in record.analysis
  by_analysis = {r["analysis"]: r["epsilon"] for r in record.details["candidates"]}
  assert set(by_analysis) == {"none", "amplified_allocation"}
  assert record.epsilon == by_analysis["amplified_allocation"] < by_analysis["none"]
  calibrated = mechanisms.run_privacy(c, schema, None, 2.0, DELTA, "exact")
  assert calibrated.bound == "amplified_allocation"
  assert 0.99 * 2.0 <= calibrated.epsilon <= 2.0
  plain_z = accounting.calibrate_noise_multiplier(2.0, DELTA, sensitivity=2.0)
  assert calibrated.noise_multiplier < 0.8 * plain_z


def test_account_cli_random_allocation(tmp_path):
  base = [sys.executable, "-m", "tff_mf.cli", "account", "--mechanism", "gaussian",
          "--total_rounds", "32",
          "--delta", "1e-6", "--noise_multiplier", "2", "--cache_dir", str(tmp_path)]
  ok = subprocess.run(base + ["--participation", "random_allocation", "--epochs", "4",
                              "--amplification", "amplified_allocation", "--json"],
                      capture_output=True, text=True, env=userenv.env(), check=False)
  assert ok.returncode == 0, ok.stderr
  import json  # pylint: disable=g-import-not-at-top
  record = json.loads(ok.stdout)
  assert record["analysis"] == "amplified_allocation" and record["bound"] == "amplified"
  assert record["epsilon"] < record["unamplified_epsilon"]
  # C = I: the random-allocation PLD (arXiv:2602.17284), below the Renyi bound.
  assert record["random_allocation"]["method"] == "pld" and record["accountant"] == "pld"
  assert record["epsilon"] < record["random_allocation"]["renyi_epsilon"]
  assert "arXiv:2602.17284" in record["privacy_statement"]["analysis"]
  for extra, words in ((["--epochs", "4", "--sampling_prob", "0.5"], "does not apply"),
                       (["--participation", "min_sep", "--min_sep", "2", "--epochs", "4"],
                        "needs --participation random_allocation"),
                       ([], "needs --epochs")):
    bad = subprocess.run(base + ["--amplification", "amplified_allocation"] + extra,
                         capture_output=True, text=True, env=userenv.env(), check=False)
    lines = bad.stderr.strip().splitlines()
    assert bad.returncode != 0 and len(lines) == 1 and words in lines[0], bad.stderr


def test_each_direction_is_converted_at_its_own_order():
  """(ε, δ) under add/remove bounds each direction on its own: ε is the larger of the two
  directions' ε, each at its best order, never above converting the per-order maximum."""
  from dp_accounting.rdp import rdp_privacy_accountant  # pylint: disable=g-import-not-at-top
  n, k, z, delta = 256, 4, 2.0, 1e-8
  c = np.eye(n)
  out = ra.epsilon(c, k, z, delta, orders=ra.ORDERS, pld=False)
  bounds = ra.rdp(c, k, z, orders=ra.ORDERS)
  joint, _ = rdp_privacy_accountant.compute_epsilon(
      [float(a) for a in bounds["orders"]], [float(v) for v in bounds["rdp"]], delta)
  each = [rdp_privacy_accountant.compute_epsilon(
      [float(a) for a in bounds["orders"]], [float(v) for v in bounds[key]], delta)[0]
      for key in ("remove", "added")]
  assert out["epsilon"] == pytest.approx(max(each), rel=1e-12)
  assert out["epsilon"] < joint  # the two directions' best orders differ here
  assert out["orders"]["remove"] != out["orders"]["add"]


def _allocation_gram(c, k, z):
  n = c.shape[0]
  b = n // k
  pis = [tuple(e * b + t for e, t in enumerate(p)) for p in itertools.product(range(b), repeat=k)]
  m = np.stack([c[:, list(p)].sum(axis=1) for p in pis], axis=1)
  return m.T @ m / z ** 2, pis


def test_the_comparison_pair_dominates_the_allocation_moments():
  """Kahane's inequality on the integer moments E_P W^α (exact enumeration over allocations):
  the comparison covariance (ΣA)·11ᵀ + B·Σ_e [same round in epoch e] is ≥ G entrywise,
  positive semi-definite, and its moments are larger."""
  rng = np.random.default_rng(7)
  c = np.tril(rng.uniform(0.0, 1.0, (6, 6)))
  k, z = 2, 0.8
  g, pis = _allocation_gram(c, k, z)
  gram = ra._gram(c, k, 3)
  common, hidden = gram.cross + float(np.sum(gram.within)), float(np.max(gram.excess))
  same = np.array([[sum(p[e] == q[e] for e in range(k)) for q in pis] for p in pis])
  bigger = (common + hidden * same) / z ** 2
  assert np.all(bigger >= g * (1 - 1e-12))
  assert np.linalg.eigvalsh(bigger).min() >= -1e-9
  size = len(pis)
  for alpha in (2, 3, 4):
    moments = []
    for cov in (g, bigger):
      vals = [sum(cov[t[i], t[j]] for i in range(alpha) for j in range(i + 1, alpha))
              for t in itertools.product(range(size), repeat=alpha)]
      moments.append(np.mean(np.exp(vals)))
    assert moments[0] <= moments[1]


def test_a_near_diagonal_c_gets_the_comparison_pld_between_its_bounds():
  n, k, z = 32, 4, 2.0
  c = np.eye(n) + 0.05 * np.eye(n, k=-1)
  sens = participation.sensitivity(c, participation.random_allocation(k))
  out = ra.epsilon(c, k, z, DELTA, sensitivity=sens)
  assert "pld" in out and 0 < out["pld"]["common"] < out["pld"]["hidden"]
  renyi = ra.epsilon(c, k, z, DELTA, sensitivity=sens, pld=False)
  assert out["epsilon"] <= renyi["epsilon"]
  assert ra.lower_bound(c, k, z, DELTA) <= out["epsilon"] <= unamplified(c, k, z)[1]
