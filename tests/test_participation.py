"""Participation schemas and sensitivity against brute force over every pattern (n ≤ 12).

For a pattern P the true squared sensitivity is the SDP sup Σ_{s,t∈P} X_st⟨x_s, x_t⟩ over
‖x_t‖ ≤ 1 (Choquette-Choo et al. 2023, arXiv:2211.06530, Sec 2). The brute force here
brackets it from below by explicit contributions (±1/0 scalars over every sign vector,
all-equal and mutually orthogonal unit vectors, random unit vectors refined by block
coordinate ascent), independently of the module's own enumeration.
"""

import itertools
import math
import zlib
import json

import numpy as np
import pytest

from tff_mf import checks
from tff_mf import participation as pa
from tff_mf.participation import separation


def brute_patterns(schema, n):
  """Every pattern (not only maximal ones), enumerated from the definitions."""
  if schema.kind == 'single':
    return [(t,) for t in range(n)]
  if schema.kind == 'fixed_epoch':
    b = n // schema.epochs
    return [tuple(range(j, n, b)) for j in range(b)]
  if schema.kind == 'random_allocation':  # one round in each block of b = n/k rounds
    b = n // schema.epochs
    return [p for p in itertools.product(range(n), repeat=schema.epochs)
            if all(t // b == j for j, t in enumerate(p))]
  k = schema.max_participations or n
  out = []
  for size in range(1, k + 1):
    for p in itertools.combinations(range(n), size):
      if all(q - r >= schema.min_sep for r, q in zip(p[:-1], p[1:])):
        out.append(p)
  return out


def scalar_brute(x, patterns):
  """max over patterns and contributions in {−1, 0, 1}: sᵀ X_P s."""
  best = 0.0
  for p in patterns:
    block = x[np.ix_(p, p)]
    for signs in itertools.product((1.0, -1.0), repeat=len(p)):
      s = np.array(signs)
      best = max(best, float(s @ block @ s))
  return best


def vector_ascent(x, patterns, rng, starts=8, sweeps=60):
  """Best of random unit-vector contributions, each refined by block coordinate ascent."""
  best = 0.0
  for p in patterns:
    block = x[np.ix_(p, p)]
    size = len(p)
    for _ in range(starts):
      v = rng.normal(size=(size, size))
      v /= np.linalg.norm(v, axis=1, keepdims=True)
      for _ in range(sweeps):
        for t in range(size):
          # X_tt ≥ 0: the maximizer of X_tt‖x‖² + 2⟨x, g⟩ over the ball is g/‖g‖.
          g = block[t] @ v - block[t, t] * v[t]
          if np.linalg.norm(g) > 0:
            v[t] = g / np.linalg.norm(g)
      best = max(best, float(np.sum(block * (v @ v.T))))
  return best


def explicit_lower(x, patterns):
  """All-equal and mutually orthogonal unit contributions: max(1ᵀX_P1, tr X_P)."""
  return max(max(float(np.sum(x[np.ix_(p, p)])), float(np.trace(x[np.ix_(p, p)])))
             for p in patterns)


SCHEMAS = [pa.single(), pa.fixed_epoch(2), pa.fixed_epoch(3), pa.fixed_epoch(4),
           pa.min_sep(1, 3), pa.min_sep(2, 2), pa.min_sep(3), pa.min_sep(4, 2), pa.min_sep(5, 3),
           pa.random_allocation(2), pa.random_allocation(3)]


def random_c(kind, n, rng):
  if kind == "signed_lower":
    return np.tril(rng.normal(size=(n, n)))
  if kind == "signed_dense":
    return rng.normal(size=(n, n))
  if kind == "nonneg_lower":
    return np.tril(rng.uniform(size=(n, n)))
  if kind == "tall":  # more noise rows than rounds (like the binary tree)
    return rng.normal(size=(n + 5, n))
  raise ValueError(kind)


def _applies(schema, n):
  """Schemas defined for n rounds: k | n for the epoch kinds, b ≤ n for min_sep."""
  if schema.kind in ("fixed_epoch", "random_allocation"):
    return n % schema.epochs == 0
  return schema.kind != "min_sep" or schema.min_sep <= n


@pytest.mark.parametrize("kind", ["signed_lower", "signed_dense", "nonneg_lower", "tall"])
@pytest.mark.parametrize("schema,n", [(s, n) for s in SCHEMAS for n in (6, 12) if _applies(s, n)],
                         ids=lambda x: x.describe() if hasattr(x, "describe") else str(x))
def test_upper_bound_and_exactness_against_brute_force(schema, kind, n):
  # A seed stable across processes (str hashes are salted per process).
  rng = np.random.default_rng(zlib.crc32(f"{schema.describe()}/{kind}/{n}".encode()))
  c = random_c(kind, n, rng)
  x = c.T @ c
  patterns = brute_patterns(schema, n)
  report = pa.sensitivity_report(c, schema)
  value_sq = report["value"] ** 2
  brute = max(scalar_brute(x, patterns) if len(patterns) * 2**max(map(len, patterns)) < 5e4
              else 0.0,
              vector_ascent(x, patterns, rng, starts=3, sweeps=30),
              explicit_lower(x, patterns))
  # Upper bound everywhere.
  assert value_sq >= brute * (1 - 1e-12)
  # The reported lower bound is attained (never above the brute-force SDP lower bound's
  # own bracket: it comes from explicit contributions, so it is ≤ the true value ≤ value).
  assert report["lower"] <= report["value"] * (1 + 1e-12)
  if report["exact"]:
    assert value_sq == pytest.approx(brute, rel=1e-9)
  # Exact where the docstring claims it.
  if schema.kind == 'single':
    assert report["exact"] and report["value"] == pytest.approx(np.sqrt(np.max(np.diag(x))))
  if kind == "nonneg_lower" and not schema.kind == 'min_sep':
    assert report["exact"]
    assert value_sq == pytest.approx(max(float(np.sum(x[np.ix_(p, p)])) for p in patterns))
  if kind == "nonneg_lower" and schema.kind == 'min_sep':
    # Few patterns at n ≤ 12: enumeration makes the non-negative case exact too.
    assert report["exact"]


@pytest.mark.parametrize("n,bands,sep,k", [(12, 3, 3, 2), (12, 3, 4, None), (10, 1, 1, 3),
                                           (12, 4, 4, 3), (9, 2, 5, None)])
def test_min_sep_exact_for_banded_signed_c(n, bands, sep, k):
  rng = np.random.default_rng(n * 100 + bands * 10 + sep)
  c = np.tril(rng.normal(size=(n, n))) * (np.tri(n) - np.tri(n, k=-bands))
  schema = pa.min_sep(sep, k)
  report = pa.sensitivity_report(c, schema)
  assert report["exact"] and report["method"] == "disjoint_supports"
  diag = np.sum(c * c, axis=0)
  expected = max(float(np.sum(diag[list(p)])) for p in brute_patterns(schema, n))
  assert expected <= report["value"] ** 2 <= expected * (1 + 1e-11)
  # Orthogonal unit contributions attain it, so it also bounds the vector brute force.
  x = c.T @ c
  assert report["value"] ** 2 >= vector_ascent(x, brute_patterns(schema, n)[:40],
                                               rng, 2, 20) * (1 - 1e-12)


def test_fixed_epoch_orthogonal_columns_exact_trace():
  n, k = 12, 3
  b = n // k
  rng = np.random.default_rng(3)
  # X with same-pattern off-diagonals zero: a random Gram with those entries removed, made PD.
  g = rng.normal(size=(n, n))
  x = g @ g.T / n
  for j in range(b):
    p = list(range(j, n, b))
    block = np.diag(np.diag(x[np.ix_(p, p)]))
    x[np.ix_(p, p)] = block
  x += (abs(np.linalg.eigvalsh(x)[0]) + 0.1) * np.eye(n)
  c = np.linalg.cholesky(x[::-1, ::-1]).T[::-1, ::-1]
  c_exact = c.copy()
  # Orthogonality is exact in X but only up to rounding in CᵀC; the report stays exact.
  report = pa.sensitivity_report(c_exact, pa.fixed_epoch(k))
  traces = [float(np.trace(x[np.ix_(p, p)])) for p in brute_patterns(pa.fixed_epoch(k), n)]
  assert report["exact"]
  assert max(traces) <= report["value"] ** 2 <= max(traces) * (1 + 1e-11)
  # Exactly orthogonal columns (C = diag): method pattern_traces.
  d = np.diag(rng.uniform(0.5, 1.5, size=n))
  rep = pa.sensitivity_report(d, pa.fixed_epoch(k))
  assert rep["method"] == "pattern_traces" and rep["exact"]
  assert rep["value"] ** 2 == pytest.approx(max(
      float(np.sum(np.diag(d)[list(range(j, n, b))] ** 2)) for j in range(b)))


def test_fixed_epoch_signed_block_is_an_upper_bound_not_exact():
  # One pattern {0, 1} (n = 2, k = 2): X = [[1, -.5], [-.5, 1]] ... plus a third column
  # in a 3-round pattern where no sign vector attains Σ|X_st|.
  x = np.array([[1.0, -0.5, -0.5], [-0.5, 1.0, -0.5], [-0.5, -0.5, 1.0]]) + 1e-3 * np.eye(3)
  c = np.linalg.cholesky(x[::-1, ::-1]).T[::-1, ::-1]
  report = pa.sensitivity_report(c, pa.fixed_epoch(3))
  # True SDP value: x_t at 120° in a plane gives 3·1.001 + 6·0.25 = 4.503; Σ|X| = 6.003;
  # 3·λ_max = 3·1.501 = 4.503 — the spectral bound is tight here.
  assert report["value"] ** 2 == pytest.approx(4.503, rel=1e-9)
  assert report["method"] == "abs_bound"
  ascent = vector_ascent(x, [(0, 1, 2)], np.random.default_rng(0))
  assert report["value"] ** 2 >= ascent * (1 - 1e-12)


def test_min_sep_nonbanded_large_n_uses_alg4_upper_bound():
  n = 64
  rng = np.random.default_rng(5)
  c = np.tril(rng.normal(size=(n, n)))
  schema = pa.min_sep(4, 3)
  report = pa.sensitivity_report(c, schema)
  assert report["method"] in ("alg4_bound", "enumerated_patterns")
  assert report["value"] >= report["lower"]
  # Upper bound against contributions on random admissible patterns.
  x = c.T @ c
  pats = []
  while len(pats) < 50:
    p = tuple(sorted(rng.choice(n, size=3, replace=False)))
    if all(q - r >= 4 for r, q in zip(p[:-1], p[1:])):
      pats.append(p)
  assert report["value"] ** 2 >= vector_ascent(x, pats, rng, 2, 20) * (1 - 1e-12)


def test_single_is_max_column_norm_and_tall_c():
  rng = np.random.default_rng(0)
  c = rng.normal(size=(9, 5))
  assert pa.sensitivity(c, pa.single()) == pytest.approx(np.max(np.linalg.norm(c, axis=0)))
  assert pa.sensitivity(c, pa.fixed_epoch(1)) == pytest.approx(pa.sensitivity(c, pa.single()))
  assert pa.sensitivity(c, pa.min_sep(2, 1)) == pytest.approx(pa.sensitivity(c, pa.single()))


def test_identity_sensitivities():
  n = 12
  eye = np.eye(n)
  assert pa.sensitivity(eye, pa.fixed_epoch(4)) == pytest.approx(2.0)
  assert pa.sensitivity(eye, pa.min_sep(3, 2)) == pytest.approx(np.sqrt(2))
  assert pa.sensitivity(eye, pa.min_sep(5)) == pytest.approx(np.sqrt(3))  # rounds 0, 5, 10


def test_separated_max_without_a_binding_cap_is_the_capped_dp_bit_for_bit():
  """Where k ≥ ⌈n/sep⌉ the cap cannot bind and ``separated_max`` runs one backward pass: the
  same value as k rounds of the capped dynamic program (arXiv:2306.08153 Alg. 3), to the
  last bit, for vectors and stacks of rows, signed or not."""
  rng = np.random.default_rng(7)
  for trial in range(120):
    n = int(rng.integers(1, 30))
    sep = int(rng.integers(1, n + 3))
    k = -(-n // sep) + int(rng.integers(0, 3))
    w = rng.normal(size=[(n,), (3, n), (2, 3, n)][trial % 3]) * rng.choice([1e-3, 1.0, 1e5])
    if trial % 4 == 0:
      w = np.abs(w)
    np.testing.assert_array_equal(separation.separated_max(w, sep, k),
                                  separation._capped_max(w, sep, k))  # pylint: disable=protected-access


def test_separated_max_matches_enumeration():
  rng = np.random.default_rng(1)
  for _ in range(20):
    n = int(rng.integers(1, 12))
    sep = int(rng.integers(1, 5))
    k = int(rng.integers(1, 5))
    w = rng.uniform(size=n)
    best = 0.0
    for size in range(1, k + 1):
      for p in itertools.combinations(range(n), size):
        if all(q - r >= sep for r, q in zip(p[:-1], p[1:])):
          best = max(best, float(np.sum(w[list(p)])))
    value, chosen = separation.separated_argmax(w, sep, k)
    assert value == pytest.approx(best)
    assert float(separation.separated_max(w, sep, k)) == pytest.approx(best)
    assert len(chosen) <= k and np.sum(w[list(chosen)]) == pytest.approx(best)
    assert all(q - r >= sep for r, q in zip(chosen[:-1], chosen[1:]))


def test_patterns_enumeration():
  assert pa.single().patterns(3) == [(0,), (1,), (2,)]
  assert pa.fixed_epoch(3).patterns(6) == [(0, 2, 4), (1, 3, 5)]
  pats = pa.min_sep(3, 2).patterns(7)
  assert (0, 3) in pats and (3, 6) in pats and (0, 6) in pats
  assert all(len(p) == 2 for p in pats)
  # Maximality: every admissible pattern is a subset of a listed one.
  for p in brute_patterns(pa.min_sep(2), 9):
    assert any(set(p) <= set(q) for q in pa.min_sep(2).patterns(9))
  with pytest.raises(checks.CheckError, match="more than 10"):
    pa.min_sep(1, 3).patterns(12, limit=10)


def test_describe_as_dict_roundtrip():
  for schema in SCHEMAS:
    d = schema.as_dict()
    json.dumps(d)
    assert pa.from_dict(d) == schema
    assert d["kind"] == schema.kind
    assert isinstance(schema.describe(), str)
  assert pa.fixed_epoch(4).as_dict() == {"kind": "fixed_epoch", "label": "fixed_epoch-k4",
                                         "epochs": 4}
  assert pa.from_args("min_sep", 16, min_sep=5) == pa.min_sep(5, 4)
  assert pa.from_args("min_sep", 16, min_sep=4, max_participations=2) == pa.min_sep(4, 2)
  assert pa.from_args("fixed_epoch", 16, epochs=4).rounds_per_epoch(16) == 4
  assert pa.from_args("single", 16) == pa.single()
  assert hash(pa.fixed_epoch(2)) == hash(pa.fixed_epoch(2))


@pytest.mark.parametrize("args,match", [
    (("fixed_epoch", 10, 3, None, None), "must divide"),
    (("fixed_epoch", 10, None, None, None), "needs epochs"),
    (("fixed_epoch", 10, 0, None, None), "epochs must be a positive integer"),
    (("fixed_epoch", 4, 8, None, None), "exceeds"),
    (("fixed_epoch", 10, 2, 3, None), "takes only epochs"),
    (("min_sep", 10, None, 0, 2), "min_sep must be a positive integer"),
    (("min_sep", 10, None, None, 2), "needs min_sep"),
    (("min_sep", 10, None, 11, None), "exceeds"),
    (("min_sep", 10, None, 2, 0), "max_participations must be a positive integer"),
    (("min_sep", 10, 2, 2, None), "takes only min_sep, max_participations"),
    (("single", 10, 2, None, None), "takes no parameters"),
    (("poisson", 10, None, None, None), "unknown participation"),
    (("single", 0, None, None, None), "rounds n"),
    (("fixed_epoch", 10.5, 2, None, None), "rounds n"),
])
def test_from_args_refusals(args, match):
  with pytest.raises(checks.CheckError, match=match) as err:
    pa.from_args(*args)
  assert "\n" not in str(err.value)


def test_check_bands():
  pa.min_sep(4, 2).check_bands(4, "banded")
  pa.single().check_bands(100, "banded")
  with pytest.raises(checks.CheckError, match="bands=5 exceed min_sep=4"):
    pa.min_sep(4, 2).check_bands(5, "banded")
  assert pa.fixed_epoch(4).separation(16) == 4 and pa.min_sep(3).separation(16) == 3
  with pytest.raises(checks.CheckError, match="unknown participation"):
    pa.Participation("poisson")


def test_sensitivity_refusals():
  c = np.eye(6)
  with pytest.raises(checks.CheckError, match="must divide"):
    pa.sensitivity(c, pa.fixed_epoch(4))
  with pytest.raises(checks.CheckError, match="expected n=5"):
    pa.sensitivity(c, pa.single(), n=5)
  with pytest.raises(checks.CheckError, match="participation schema"):
    pa.sensitivity(c, "single")
  with pytest.raises(checks.CheckError, match="non-finite"):
    pa.sensitivity(np.full((2, 2), np.nan), pa.single())
  with pytest.raises(checks.CheckError, match="min_sep must be a positive integer"):
    pa.min_sep(0)
  with pytest.raises(checks.CheckError, match="exceeds"):
    pa.sensitivity(c, pa.min_sep(7))


def _toeplitz(coef):
  n = len(coef)
  i, j = np.indices((n, n))
  return np.where(i >= j, np.asarray(coef)[np.maximum(i - j, 0)], 0.0)


@pytest.mark.parametrize("seed", range(6))
def test_min_sep_exact_for_nonincreasing_nonnegative_toeplitz(seed):
  """Non-negative, non-increasing Toeplitz C: the earliest pattern is the worst (exact, O(n·k)).

  X ≥ 0, so the true value is max_P Σ_{s,t∈P} X_st over every admissible pattern
  (equal contributions attain it; Σ X_st⟨x_s, x_t⟩ ≤ Σ X_st for unit x): brute force.
  """
  rng = np.random.default_rng(seed)
  n = int(rng.integers(7, 13))
  sep = int(rng.integers(1, 5))
  k = [None, 2, 3][seed % 3]
  coef = np.sort(rng.uniform(0.0, 1.0, n))[::-1]
  coef[rng.uniform(size=n) < 0.2] = 0.0
  coef = np.sort(coef)[::-1]
  coef[0] = 1.0
  c = _toeplitz(coef)
  schema = pa.min_sep(sep, k)
  report = pa.sensitivity_report(c, schema)
  x = c.T @ c
  truth = max(float(np.sum(x[np.ix_(p, p)])) for p in brute_patterns(schema, n))
  if report["method"] != "disjoint_supports":
    assert report["method"] == "toeplitz_earliest_pattern"
  assert report["exact"]
  assert truth <= report["value"] ** 2 <= truth * (1 + 1e-11)


@pytest.mark.parametrize("fault", ["increasing", "negative"])
def test_min_sep_toeplitz_near_misses_keep_a_valid_upper_bound(fault):
  """One coefficient increasing or one negative: not the exact path, and still ≥ the truth."""
  n, sep, k = 12, 2, 4
  coef = 0.8 ** np.arange(n)
  if fault == "increasing":
    coef[5] = coef[3]  # c_4 < c_5: no longer non-increasing
  else:
    coef[3] = -0.3
  c = _toeplitz(coef)
  schema = pa.min_sep(sep, k)
  report = pa.sensitivity_report(c, schema)
  assert report["method"] != "toeplitz_earliest_pattern"
  x = c.T @ c
  patterns = brute_patterns(schema, n)
  rng = np.random.default_rng(7)
  brute = max(scalar_brute(x, patterns), vector_ascent(x, patterns[:60], rng, 2, 20))
  assert report["value"] ** 2 >= brute


def test_min_sep_toeplitz_path_matches_the_issue_example_and_beats_alg4():
  """BLT-like C (n = 48, b = 8, k = 4): the earliest pattern (0, 8, 16, 24) attains the value.

  The Alg. 4 bound of arXiv:2306.08153 (what jax_privacy's
  ``get_min_sep_sensitivity_upper_bound`` computes) is larger; the exact value is the
  quadratic form of the earliest pattern.
  """
  n = 48
  coef = 0.55 * 0.9 ** np.arange(n) + 0.45 * 0.5 ** np.arange(n)
  c = _toeplitz(coef)
  schema = pa.min_sep(8, 4)
  report = pa.sensitivity_report(c, schema)
  assert report["method"] == "toeplitz_earliest_pattern" and report["exact"]
  x = c.T @ c
  p = [0, 8, 16, 24]
  earliest = float(np.sum(x[np.ix_(p, p)]))
  assert earliest <= report["value"] ** 2 <= earliest * (1 + 1e-11)
  # A non-Toeplitz copy (one entry off the diagonal structure) takes the general bound.
  d = c.copy()
  d[30, 2] *= 1.0 + 1e-9
  general = pa.sensitivity_report(d, schema)
  assert general["method"] in ("alg4_bound", "enumerated_patterns")
  assert general["value"] >= report["value"] * 1.02  # Alg. 4 is 3% looser here
  assert general["lower"] == pytest.approx(report["lower"], rel=1e-8)


# ----------------------------------------------------------------------------- random allocation


@pytest.mark.parametrize("kind", ["nonneg_lower", "signed_lower", "signed_dense", "tall"])
@pytest.mark.parametrize("n,k", [(12, 3), (8, 4), (8, 2), (9, 3)])
def test_random_allocation_row_bound_is_an_upper_bound(monkeypatch, kind, n, k):
  """Without enumeration (limit 0): the Alg.-4-style and k·λ_max bounds stay upper bounds."""
  monkeypatch.setattr(pa.bounds, "RANDOM_ALLOCATION_ENUMERATION_LIMIT", 0)
  rng = np.random.default_rng(zlib.crc32(f"bib/{kind}/{n}/{k}".encode()))
  c = random_c(kind, n, rng)
  x = c.T @ c
  schema = pa.random_allocation(k)
  patterns = brute_patterns(schema, n)
  report = pa.sensitivity_report(c, schema)
  brute = max(scalar_brute(x, patterns), vector_ascent(x, patterns, rng, starts=2, sweeps=30),
              explicit_lower(x, patterns))
  assert report["method"] in ("row_bound", "row_bound_attained", "block_chain_dp")
  assert report["value"] ** 2 >= brute * (1 - 1e-12)
  assert report["lower"] ** 2 <= brute * (1 + 1e-9)  # attained by explicit contributions
  if report["exact"]:
    assert report["value"] ** 2 == pytest.approx(brute, rel=1e-9)
  if kind == "nonneg_lower":  # the true value is max_P 1ᵀX_P1: the bound is within 2x of it
    true = max(float(np.sum(x[np.ix_(p, p)])) for p in patterns)
    assert true * (1 - 1e-12) <= report["value"] ** 2 <= 2 * true


def _sqrt_psd(x):
  w, v = np.linalg.eigh(x)
  return (v * np.sqrt(np.maximum(w, 0.0))) @ v.T


@pytest.mark.parametrize("kind", ["nonneg_lower", "signed_lower", "signed_dense", "tall",
                                  "near_identity"])
def test_random_allocation_skips_lambda_max_only_where_it_cannot_win(monkeypatch, kind):
  """λ_max is skipped when a Rayleigh quotient (≤ λ_max) already puts k·λ_max at or above
  the row bound: the report is the one that always decomposes X. Near the identity (X =
  I + small signed E) k·λ_max is the smaller bound, and is still used."""
  monkeypatch.setattr(pa.bounds, "RANDOM_ALLOCATION_ENUMERATION_LIMIT", 0)
  n, k = 32, 16
  rng = np.random.default_rng(zlib.crc32(f"rayleigh/{kind}".encode()))
  if kind == "near_identity":
    e = rng.uniform(-0.01, 0.01, size=(n, n))
    c = _sqrt_psd(np.eye(n) + 0.5 * (e + e.T))
  else:
    c = random_c(kind, n, rng)
  schema = pa.random_allocation(k)
  report = pa.sensitivity_report(c, schema)
  with monkeypatch.context() as m:
    m.setattr(pa.bounds, "_rayleigh_at_least", lambda x, level: False)
    always = pa.sensitivity_report(c, schema)
  assert report == always
  if kind == "near_identity":
    lam = np.linalg.eigvalsh(c.T @ c)[-1]
    assert report["method"] == "row_bound"
    assert report["value"] ** 2 == pytest.approx(k * lam, rel=1e-9)


@pytest.mark.parametrize("signed", [False, True])
@pytest.mark.parametrize("n,k,bands", [(12, 3, 5), (12, 4, 4), (16, 4, 2), (10, 5, 3)])
def test_random_allocation_chain_dp_for_banded_c(n, k, bands, signed):
  """C with ≤ b + 1 bands: rounds of blocks ≥ 2 apart never share a row, so the dynamic
  program over the blocks is exact for non-negative C and an upper bound for signed C."""
  rng = np.random.default_rng(n * 1000 + k * 10 + bands + signed)
  band = np.tri(n) - np.tri(n, k=-bands)
  c = (rng.normal(size=(n, n)) if signed else rng.uniform(size=(n, n))) * band
  schema = pa.random_allocation(k)
  report = pa.sensitivity_report(c, schema)
  assert report["method"] == "block_chain_dp"
  x = c.T @ c
  patterns = brute_patterns(schema, n)
  if not signed:
    true = max(float(np.sum(x[np.ix_(p, p)])) for p in patterns)
    assert report["exact"] and report["value"] ** 2 == pytest.approx(true, rel=1e-11)
  else:
    brute = max(scalar_brute(x, patterns), explicit_lower(x, patterns))
    assert report["value"] ** 2 >= brute * (1 - 1e-12)
    assert report["value"] ** 2 <= max(float(np.sum(np.abs(x[np.ix_(p, p)]))) for p in patterns) \
        * (1 + 1e-11)


def test_random_allocation_identity_and_edges():
  # C = I: √k; one epoch: the largest column; one round per epoch: the single pattern.
  assert pa.sensitivity(np.eye(12), pa.random_allocation(3)) == pytest.approx(np.sqrt(3))
  c = np.tril(np.ones((6, 6)))
  assert pa.sensitivity(c, pa.random_allocation(1)) == pytest.approx(np.sqrt(6))
  report = pa.sensitivity_report(c, pa.random_allocation(6))
  assert report["exact"] and report["value"] ** 2 == pytest.approx(np.sum(c.T @ c))
  # Between fixed_epoch (a subset of its patterns) and min_sep 1 with k rounds (a superset).
  rng = np.random.default_rng(3)
  c = np.tril(rng.uniform(size=(12, 12)))
  bib = pa.sensitivity(c, pa.random_allocation(3))
  assert pa.sensitivity(c, pa.fixed_epoch(3)) <= bib * (1 + 1e-12)
  assert bib <= pa.sensitivity(c, pa.min_sep(1, 3)) * (1 + 1e-12)


def test_random_allocation_schema_and_cyclic_poisson_spelling():
  s = pa.from_args("random_allocation", 12, epochs=3)
  assert s == pa.random_allocation(3) and s.label == "random_allocation-k3"
  assert s.describe() == "random_allocation(epochs=3)" and pa.from_dict(s.as_dict()) == s
  assert s.max_participations_in(12) == 3 and s.separation(12) == 1
  assert s.rounds_per_epoch(12) == 4 and len(s.patterns(12)) == 4 ** 3
  assert s.sampler == "random allocation (a new round each epoch)"
  with pytest.raises(checks.CheckError, match="must divide"):
    pa.from_args("random_allocation", 10, epochs=3)
  with pytest.raises(checks.CheckError, match="needs epochs"):
    pa.from_args("random_allocation", 12)
  with pytest.raises(checks.CheckError, match="takes only epochs"):
    pa.from_args("random_allocation", 12, epochs=3, min_sep=2)
  # cyclic Poisson is the sampler of min_sep: the same schema, the same cache key.
  cyclic = pa.from_args("cyclic_poisson", 12, min_sep=4)
  assert cyclic == pa.from_args("min_sep", 12, min_sep=4) and cyclic.sampler == "cyclic Poisson"
  assert pa.from_dict({"kind": "cyclic_poisson", "min_sep": 4}) == pa.min_sep(4)


def test_min_sep_toeplitz_takes_the_smaller_of_alg4_and_the_structured_bounds():
  """Alternating signs (n = 48, min_sep 2, k = 4): the majorant of |f| bounds |CᵀC| by a
  non-negative Toeplitz Gram whose earliest pattern is attained here, below Alg. 4; the report
  takes the smaller valid bound and names it."""
  n, sep, k = 48, 2, 4
  coef = np.zeros(n)
  coef[:8] = [1.0, -0.9, 0.9, -0.9, 0.9, -0.9, 0.9, -0.9]
  c = _toeplitz(coef)
  x = c.T @ c
  alg4 = math.sqrt(separation.separated_max(separation.separated_max(np.abs(x), sep, k), sep, k))
  report = pa.sensitivity_report(c, pa.min_sep(sep, k))
  assert report["method"] == "toeplitz_majorant_bound_attained" and report["exact"]
  assert report["value"] < alg4 * 0.99
  assert report["value"] >= report["lower"]
