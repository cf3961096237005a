"""Lower bounds on a planner candidate's expected error before its factorization exists
(numpy core; no TensorFlow).

A candidate's error at the target is rmse = z·‖B‖_F/√n, B·C = A its factorization of the
training workload A and z its calibrated noise multiplier. For every factorization:

1. ‖A‖_* ≤ ‖B‖_F·‖C‖_F (Hölder's inequality for Schatten norms), ‖A‖_* the nuclear norm
   (the sum of A's singular values; the SVD bound of Li & Miklau 2012, arXiv:1212.2309).
2. The reported ε is the least of the valid analyses' bounds (``tff_mf.mechanisms.privacy``),
   each the ε of a Gaussian mechanism (subsampled or not) at z divided by a scale s(C), and
   non-increasing in that multiplier (the assumption the calibration's search rests on). If
   an analysis's ε at multiplier u was evaluated above the target (or bounded below above
   it), its bound at the calibrated z is within the target only if z > u·s(C).
   - The Gaussian at z/sens (and, under cyclic Poisson sampling, at z/sens with every
     eligible round joined): the schema allows the q disjoint patterns {j, j + q, …} that
     cover the n rounds (q = n/k cohorts or bins for the epoch kinds, q = b classes for
     min_sep, q = n for single). With orthogonal contributions in the rounds of one pattern,
     C's output moves by √(Σ_j ‖C[:, j]‖²) over the pattern, so any valid sensitivity is at
     least the largest of these over the q patterns, at least ‖C‖_F/√q.
   - The amplified banded analysis (Choquette-Choo et al. 2023, arXiv:2306.08153, Thm 4):
     ε = f(z/γ(C)), γ(C) the largest column norm, at least ‖C‖_F/√n; f is bounded below by
     dp_accounting's optimistic PLD of the same composition (Doroshenko et al. 2022,
     arXiv:2207.04380), which lies below the exact ε, itself below the pessimistic PLD the
     analysis reports.
   - Fixed-bin balls-in-bins and random allocation: a bound on the true ε, below every
     valid analysis's (``component_epsilon``, the mixture's component): a user's output law
     is a mixture P = Σ_π w_π·P_π over its secret pattern π, so for every event E,
     P(E) − e^ε·Q(E) ≥ w_π·(P_π(E) − e^{ε + log(1/w_π)}·Q(E)), and
     δ_P(ε) ≥ w_π·δ_{P_π}(ε + log(1/w_π)). With orthogonal contributions in the pattern's
     rounds (zero elsewhere) P_π is a Gaussian shift of norm √(Σ_{j∈π} ‖C[:, j]‖²): a bin
     (w = 1/b, at least ‖C‖_F/√b for the largest), or m epochs' rounds of random allocation
     (w = b^{-m}, at least ‖C‖_F·√(m/n) for the best); so z ≥ u·‖C‖_F/√q with q = b, n/m,
     whatever the analysis, and these bounds combine by their largest.
   - MMCC (arXiv:2310.15526) has no such bound before C exists: a schema option where it
     may account a candidate gets none.
3. So z ≥ min over the analyses of u_a·‖C‖_F/√q_a, and rmse ≥ min_a u_a·√(n/q_a) · ‖A‖_*/n:
   ``unit(option)·‖A‖_*/n``, the same for every family, before anything is factorized.
4. Once C exists, under cyclic Poisson sampling (min_sep b, rate p < 1, no cap), a bound on
   the true ε at z, so below every valid analysis's, MMCC's included
   (``true_lower_epsilon``, from C's ``order_norms``; at most a second where MMCC takes
   minutes). A user of residue class r joins each of its rounds independently with
   probability p, and may contribute a unit vector in a direction of its own in each round
   (an adversary that fixes them in advance). The coordinates along each direction are
   then an independent Poisson-subsampled Gaussian of sensitivity ‖C[:, j]‖, so the true ε
   is at least their composition's; keeping only the m largest columns of the class
   (post-processing), each at the m-th largest norm s_(m) (more noise), at least
   f_m(z/s_(m)), f_m the m-fold composition at rate p, bounded below by its optimistic PLD.
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

# A bound is multiplied by this before it is compared, so that rounding in its own product
# and in ‖A‖_* (relative 1e-13 here) can only weaken it.
SAFETY = 1.0 - 1e-9
# The loosest tolerance on B·C = A (entrywise, relative to max(1, max|A|)) that the
# library's factorization checks accept (1e-8 by default, 1e-6 for a post-processed one).
PRODUCT_ATOL = 1e-6
# The optimistic PLD's grid (a coarser grid gives a lower, still valid, estimate). Rounding
# down moves each of m folds' losses by up to one step: ``true_lower_epsilon`` takes at most
# 1/m (an m = 2048 fold at p = 0.005, u = 0.45: 5.85 at 1e-2, 16.6 at 1/m, 17.1 exact).
OPTIMISTIC_INTERVAL = 1e-2


def nuclear_norm(workload) -> float:
  """A lower bound on ‖B‖_F·‖C‖_F for every factorization B·C of a
  ``tff_mf.factorization.workloads.WorkloadSpec``'s A that passes the library's check
  (``tff_mf.checks.product``: every entry of B·C − A within PRODUCT_ATOL·max(1, max|A|)): ‖A‖_*
  less n^1.5·PRODUCT_ATOL·max|A|, the most such an E can have (‖E‖_* ≤ √n·‖E‖_F ≤
  n^1.5·max|E|). ‖A‖_* in closed form for the prefix sum S,
  Σ_k 1/(2 sin((2k − 1)π/(4n + 2))) (the singular values of the all-ones lower triangle),
  else the sum of the dense A's singular values."""
  n = workload.n
  if workload.kind == "prefix_sum":
    k = np.arange(1, n + 1, dtype=np.float64)
    exact = float(np.sum(1.0 / (2.0 * np.sin((2.0 * k - 1.0) * math.pi / (4.0 * n + 2.0)))))
    largest = 1.0
  else:
    a = workload.build()
    exact = float(np.sum(np.linalg.svd(a, compute_uv=False)))
    largest = float(np.max(np.abs(a)))
  return max(0.0, exact - n ** 1.5 * PRODUCT_ATOL * max(1.0, largest))


def class_norm(c, min_sep: int) -> float:
  """max_r √(Σ_{j ≡ r mod b} ‖C[:, j]‖²): at most the sensitivity of C when a user joins
  every round of its residue class (``tff_mf.accounting.analyses.poisson_sensitivity``,
  whose sum over the class's Gram entries includes these diagonal ones); O(n²), or O(n) for
  a lower-triangular Toeplitz view (``column_squares``)."""
  squares = column_squares(c)
  return math.sqrt(max(float(np.sum(squares[r::min_sep])) for r in range(min_sep)))


def column_squares(c) -> np.ndarray:
  """‖C[:, j]‖² for every column j: O(n²), or O(n) for a lower-triangular Toeplitz view
  (column j's norm is a prefix of its first column's)."""
  from tff_mf import toeplitz_view  # pylint: disable=g-import-not-at-top
  from tff_mf.participation import bounds  # pylint: disable=g-import-not-at-top
  column = toeplitz_view.column_of(c)
  if column is not None:
    return bounds.toeplitz_column_norms_sq(np.asarray(column, dtype=np.float64))
  return np.sum(np.square(np.asarray(c, dtype=np.float64)), axis=0)


def partition_size(schema, n: int) -> int:
  """q: the schema allows the q disjoint patterns {j, j + q, …} (j < q) covering the n
  rounds (``tff_mf.participation`` kinds); n (single rounds) where nothing larger is known."""
  epochs = getattr(schema, "epochs", None)  # cohorts, bins, or one round per epoch
  if epochs:
    return n // epochs
  if schema.poisson:  # min_sep: the residue classes mod b
    cap = schema.max_participations
    if cap is None or cap >= -(-n // schema.min_sep):
      return schema.min_sep
  return n


def threshold(epsilon: Callable[[float], float], target: float, low: float = 1e-4,
              high: float = 1e4, steps: int = 40) -> float:
  """The largest multiplier u found (bisection in log u) whose ``epsilon(u)`` was evaluated
  above ``target``; 0.0 where none was (no bound). An evaluation that fails counts as not
  above (it proves nothing)."""
  def above(u):
    try:
      return bool(epsilon(u) > target)
    except (ValueError, ArithmeticError):
      return False
  if not above(low):
    return 0.0
  if above(high):
    return high
  for _ in range(steps):
    mid = math.sqrt(low * high)
    if above(mid):
      low = mid
    else:
      high = mid
  return low


def optimistic_composed_epsilon(multiplier: float, delta: float, sampling_prob: float,
                                compositions: int,
                                interval: float = OPTIMISTIC_INTERVAL) -> float:
  """A lower bound on the exact ε(δ) of the ``compositions``-fold Poisson-subsampled Gaussian
  (dp_accounting's PLD with optimistic rounding, ``pessimistic_estimate=False``, on a grid of
  step ``interval``)."""
  import dp_accounting  # pylint: disable=g-import-not-at-top
  pld = dp_accounting.pld.privacy_loss_distribution.from_gaussian_mechanism(
      standard_deviation=multiplier, sampling_prob=sampling_prob,
      pessimistic_estimate=False, value_discretization_interval=interval,
      use_connect_dots=False)
  from tff_mf.accounting import mmcc  # pylint: disable=g-import-not-at-top
  with warnings.catch_warnings(), np.errstate(all="ignore"):
    warnings.simplefilter("ignore", RuntimeWarning)
    composed = pld.self_compose(int(compositions)) if compositions > 1 else pld
    return mmcc.optimistic_epsilon(composed, delta)


def order_counts(k: int) -> List[int]:
  """The numbers m of a class's largest columns the true-ε bound composes: 1, 2, 4, … below
  k, and k (every round of the class)."""
  k = max(1, int(k))
  return [1 << i for i in range(k.bit_length()) if (1 << i) < k] + [k]


def true_bound_applies(schema, n: int, sampling_prob: Optional[float]) -> bool:
  """Whether the cyclic Poisson bound on the true ε holds (the module docstring's 4): min_sep
  at a rate p < 1 with no cap below ⌈n/b⌉ participations (a cap that binds is not Poisson
  sampling: ``tff_mf.accounting.analyses.sampling_min_sep``)."""
  if not (schema.poisson and sampling_prob is not None and 0.0 < sampling_prob < 1.0):
    return False
  cap = getattr(schema, "max_participations", None)
  return cap is None or cap >= -(-n // schema.min_sep)


def order_norms(c, min_sep: int) -> List[Tuple[int, float]]:
  """[(m, s_(m))]: for every m of ``order_counts``, the largest over the residue classes mod b
  of the class's m-th largest column norm ‖C[:, j]‖; O(n²), or O(n log n) for a
  lower-triangular Toeplitz view (``column_squares``)."""
  squares = column_squares(c)
  b = int(min_sep)
  k = -(-squares.size // b)
  padded = np.zeros(k * b)
  padded[:squares.size] = squares
  ranked = -np.sort(-padded.reshape(k, b), axis=0)  # column r: class r's, largest first
  return [(m, math.sqrt(float(np.max(ranked[m - 1])))) for m in order_counts(k)]


def true_lower_epsilon(norms, z: float, sampling_prob: float, delta: float,
                       target: Optional[float] = None) -> float:
  """A lower bound on the true ε(δ) at noise multiplier z of a C with ``order_norms`` under
  cyclic Poisson sampling at rate p (the module docstring's 4), so on every valid analysis's:
  the largest f_m(z/s_(m)) (optimistic PLD), the largest m first, stopping once above
  ``target``. An evaluation that fails proves nothing and is passed over."""
  best = 0.0
  for m, s in sorted(norms, reverse=True):
    if s <= 0.0:
      continue
    try:
      best = max(best, optimistic_composed_epsilon(z / s, delta, sampling_prob, m,
                                                   min(OPTIMISTIC_INTERVAL, 1.0 / m)))
    except (ValueError, ArithmeticError):
      continue
    if target is not None and best > target:
      break
  return best


def thresholds(schema, n: int, sampling_prob: Optional[float], *, amplified: bool,
               mmcc_possible: bool, target: float, delta: float,
               accountant: str) -> Dict[str, float]:
  """{analysis: u}: a multiplier at which each analysis that may account a candidate under
  the schema option has ε above ``target`` (evaluated; ``verified`` checks it again), or
  {"unbounded": 0.0} where one without a lower bound may (fixed-bin, random allocation,
  MMCC). ``amplified``: an amplified analysis applies
  (``tff_mf.mechanisms.amplification_applies``); ``mmcc_possible``: MMCC may account a
  candidate (cyclic Poisson sampling, MMCC not skipped)."""
  if amplified and has_components(schema):
    return {name: threshold(lambda u, w=log_w: component_epsilon(u, delta, w), target)
            for name, log_w, _ in mixture_components(schema, n, delta)}
  if amplified and (not schema.poisson or mmcc_possible):
    return {"unbounded": 0.0}
  out = {"gaussian": threshold(lambda u: _gaussian(u, delta, accountant), target)}
  if amplified:
    rounds = -(-n // schema.min_sep)
    out["amplified_banded"] = threshold(
        lambda u: optimistic_composed_epsilon(u, delta, sampling_prob, rounds), target,
        low=0.1, high=20.0, steps=12)
  return out


def verified(found: Dict[str, float], schema, n: int, sampling_prob: Optional[float], *,
             target: float, delta: float, accountant: str) -> bool:
  """Whether each stored threshold still has its analysis's ε (or lower bound) above
  ``target``: one evaluation each, so that a stored bound proves what it says."""
  try:
    checks_ = {"gaussian": lambda u: _gaussian(u, delta, accountant),
               "amplified_banded": lambda u: optimistic_composed_epsilon(
                   u, delta, sampling_prob, -(-n // getattr(schema, "min_sep", 1)))}
    if has_components(schema):
      checks_ = {name: functools.partial(_component_at, delta=delta, log_weight=log_w)
                 for name, log_w, _ in mixture_components(schema, n, delta)}
    return (set(found) <= set(checks_) | {"unbounded"}
            and all(k == "unbounded" or (u > 0 and checks_[k](u) > target)
                    for k, u in found.items()))
  except (ValueError, ArithmeticError, TypeError):
    return False


def unit(found: Dict[str, float], schema, n: int) -> Tuple[float, str]:
  """(L, why): every candidate under the option has rmse ≥ L·‖A‖_*/n at the target (the
  module docstring's 3), from its ``thresholds``."""
  if "unbounded" in found:
    return 0.0, ("an amplified analysis without a lower bound here (fixed-bin, random "
                 "allocation or MMCC) may account it")
  components = {name: (q, found[name]) for name, _, q in mixture_components(schema, n)
                if name in found}
  if components:  # bounds on the true ε: every one holds, so the largest does
    name, (q, u) = max(components.items(), key=lambda kv: kv[1][1] * math.sqrt(n / kv[1][0]))
    return u * math.sqrt(n / q), (
        f"every valid analysis's epsilon is above the target below z = {u:.6g}*s, s the "
        f"shift of one component of the mixture over the secret pattern ({name}), "
        f"s >= ||C||_F/sqrt({q:g})")
  q = partition_size(schema, n)
  parts = {"gaussian": found["gaussian"] * math.sqrt(n / q)}
  why = (f"a Gaussian at z/sens has epsilon above the target below z = "
         f"{found['gaussian']:.6g}*sens, sens >= ||C||_F/sqrt({q})")
  if "amplified_banded" in found:
    parts["amplified_banded"] = found["amplified_banded"]
    why += (f"; the amplified banded analysis (Thm 4) above it below z = "
            f"{found['amplified_banded']:.6g}*gamma(C), gamma(C) >= ||C||_F/sqrt(n)")
  return min(parts.values()), why


def _gaussian(u: float, delta: float, accountant: str) -> float:
  from tff_mf.accounting import analyses  # pylint: disable=g-import-not-at-top
  return analyses.gaussian_epsilon(u, delta, accountant, 1.0)


def error_lower_bound(unit_: float, nuclear: float, n: int) -> float:
  """rmse ≥ this for every factorization under the option (``unit``'s L)."""
  return SAFETY * unit_ * nuclear / n


# Margin in log δ above the Gaussian's log δ evaluation error (log Φ to about 1e-13
# relative, tff_mf.accounting.gaussian): a component proves ε > target only beyond it.
COMPONENT_LOG_MARGIN = 1e-6


def component_epsilon(multiplier: float, delta: float, log_weight: float) -> float:
  """A lower bound on the true ε(δ) of a mixture P vs Q that has a component of weight
  w = e^{log_weight} equal to Q shifted by a Gaussian mean of norm 1/``multiplier`` (in
  noise standard deviations): the largest ε found (bisection) with
  w·δ_G(ε + log(1/w)) > δ, δ_G the Gaussian's exact curve (Balle & Wang 2018,
  arXiv:1805.06530, Thm 8), beyond ``COMPONENT_LOG_MARGIN``; 0.0 where even ε = 0 fails."""
  from tff_mf.accounting import gaussian  # pylint: disable=g-import-not-at-top
  floor = math.log(delta) + COMPONENT_LOG_MARGIN

  def holds(eps):
    return log_weight + gaussian.gaussian_log_delta(multiplier, eps - log_weight,
                                                    upper=False) > floor
  if not holds(0.0):
    return 0.0
  lo, hi = 0.0, 1.0
  while holds(hi):
    lo, hi = hi, 2.0 * hi
    if hi > 1e6:
      return lo
  for _ in range(60):
    mid = 0.5 * (lo + hi)
    lo, hi = (mid, hi) if holds(mid) else (lo, mid)
  return lo


def _component_at(u: float, *, delta: float, log_weight: float) -> float:
  return component_epsilon(u, delta, log_weight)


def has_components(schema) -> bool:
  """Whether the schema's amplified analyses (fixed-bin, random allocation: a user in a secret
  pattern of rounds) get the mixture-component bound on the true ε (``mixture_components``)."""
  return bool(schema.allocation_amplified)


def mixture_components(schema, n: int, delta: float = 0.0) -> List[Tuple[str, float, float]]:
  """[(name, log w, q)]: the components of the schema's mixture over a user's secret pattern
  that ``component_epsilon`` bounds (the module docstring's 2), w their weight and q such
  that the best one's shift is at least ‖C‖_F/√q: fixed-bin's bin (w = 1/b, q = b); random
  allocation's rounds in m epochs (w = b^{-m}, q = n/m) for every m with w > δ (a smaller
  weight proves nothing; ``delta`` 0: every m). Empty for other schemas."""
  if not has_components(schema):
    return []
  b = n // schema.epochs
  if schema.marks_fixed_bin:  # one secret bin for the whole run
    return [("bin", -math.log(b), float(b))]
  return [(f"epochs_{m}", -m * math.log(b), n / m) for m in range(1, schema.epochs + 1)
          if m * math.log(b) < -math.log(delta or 1e-300)]


def component_shifts(c, schema, n: int) -> Dict[str, float]:
  """{component name: the largest shift √(Σ_{j∈π} ‖C[:, j]‖²) over its patterns π}
  (``mixture_components``): the largest bin's (residue classes mod b), or the rounds of
  largest column norm of the m epochs (blocks of b consecutive rounds) where that is
  largest."""
  b = n // schema.epochs
  if schema.marks_fixed_bin:
    return {"bin": class_norm(c, b)}
  squares = column_squares(c)
  best = np.sort(np.max(squares[:schema.epochs * b].reshape(schema.epochs, b), axis=1))[::-1]
  return {name: math.sqrt(float(np.sum(best[:int(round(n / q))])))
          for name, _, q in mixture_components(schema, n)}


def component_lower_epsilon(shifts: Dict[str, float], z: float, schema, n: int,
                            delta: float) -> float:
  """A lower bound on every valid analysis's ε(δ) at noise multiplier z, from the
  components' largest shifts (``component_shifts``): the largest ``component_epsilon``."""
  return max([component_epsilon(z / shifts[name], delta, log_w)
              for name, log_w, _ in mixture_components(schema, n, delta) if shifts.get(name)],
             default=0.0)
