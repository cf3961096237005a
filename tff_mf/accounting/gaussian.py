"""The Gaussian mechanism's privacy curve, exactly and on bounded PLD grids (numpy core).

Shared by ``tff_mf.accounting`` and ``tff_mf.accounting.mmcc``:

- ``gaussian_delta_exact`` / ``gaussian_epsilon_exact``: δ(ε) and ε(δ) of the Gaussian
  mechanism (Balle & Wang 2018, arXiv:1805.06530, Thm 8), evaluated in log space so
  that huge ε and tiny noise never overflow; ε is bisected on an error-padded δ and
  the upper end of the bracket returned, so it is never below the true value;
- ``pld_discretization_for`` / ``pld_gaussian_epsilon``: dp_accounting's pessimistic
  privacy-loss distributions on a grid coarsened so that memory stays bounded (a
  coarser pessimistic grid is still an upper bound, only a looser one).
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import Optional, Tuple

import numpy as np
from scipy import special

from tff_mf import checks


class AccountingError(checks.CheckError):
  """An analysis that does not apply to the inputs, or a privacy-loss distribution that
  cannot be represented within the memory bounds (the message says why)."""


# PLD discretization of the privacy loss (dp_accounting's default). Coarser is
# still an upper bound, only looser.
PLD_DISCRETIZATION = 1e-4
# Largest number of privacy-loss grid points one PLD may have (one round, and the
# composed PLD of the amplified banded analysis); beyond, the grid is coarsened. The
# Poisson-subsampled Gaussian gets fewer: dp_accounting builds it point by point
# (about 25 µs a point and adjacency, so about 13 s at the cap).
PLD_MAX_POINTS = 1 << 20
PLD_MAX_POINTS_SAMPLED = 1 << 18
# Largest composed PLD (the amplified banded analysis composes ⌈n/b⌉ rounds by FFT).
PLD_MAX_COMPOSED_POINTS = 1 << 22
# Coarsest grid step dp_accounting's connect-the-dots construction handles (it takes
# exp of the step); a privacy loss needing a coarser one is refused with a clean error.
PLD_MAX_DISCRETIZATION = 100.0

# Relative tolerance of the exact Gaussian ε bisection.
EXACT_TOLERANCE = 1e-12
# Error allowance of the log-space δ(ε): each log Φ value is taken to carry a
# relative error up to this (scipy's log_ndtr is accurate to a few ulp; the tests
# compare with 50-digit mpmath values), plus the rounding of its argument and sums.
_LOG_NDTR_RTOL = 1e-13
_ULP = float(np.finfo(np.float64).eps)


def _multiplier(noise_multiplier: float, sensitivity: float) -> float:
  """z / sens, the multiplier of the unit-sensitivity Gaussian (0 when it underflows)."""
  return (checks.noise_multiplier(noise_multiplier)
          / checks.positive_float(sensitivity, "sensitivity"))


# ----------------------------------------------------------------------------- exact


def _log1mexp(x: float) -> float:
  """log(1 − eˣ) for x < 0, accurately (Mächler 2012)."""
  if x > -math.log(2.0):
    return math.log(-math.expm1(x))
  return math.log1p(-math.exp(x))


def gaussian_log_delta(multiplier: float, eps: float, upper: bool) -> float:
  """log δ(ε) of the Gaussian mechanism with sensitivity 1 and noise std ``multiplier``.

  Balle & Wang 2018 (arXiv:1805.06530), Thm 8: δ = Φ(a − εz) − e^ε·Φ(−a − εz),
  a = 1/(2z), written as log δ = log Φ(a − εz) + log(1 − r) with log r = ε +
  log Φ(−a − εz) − log Φ(a − εz) ≤ 0. With ``upper``, every term is moved by its
  floating-point error allowance in the direction that raises δ, so the value is an
  upper bound on the true log δ(ε).
  """
  z = multiplier
  if eps == math.inf:
    return -math.inf
  a = 0.5 / z
  b = eps * z
  log_t1 = float(special.log_ndtr(a - b))
  if log_t1 == -math.inf:  # Φ(a − εz) underflows: δ ≤ Φ(a − εz) is below every double
    return -math.inf
  log_t2 = eps + float(special.log_ndtr(-a - b))
  d = log_t2 - log_t1
  if not upper:
    return log_t1 + _log1mexp(min(d, -1e-300)) if d < 0 else -math.inf
  # Error allowances: the arguments a ∓ εz carry ~4 ulp of |a| + |εz|, which log Φ
  # amplifies by its slope φ/Φ ≤ |x| + 1; log_ndtr itself is taken to be within
  # _LOG_NDTR_RTOL; each sum adds a few ulp of its terms.
  arg_err = 4 * _ULP * (abs(a) + abs(b))
  err_t1 = _LOG_NDTR_RTOL * abs(log_t1) + arg_err * (abs(a - b) + 1.0)
  err_t2 = (_LOG_NDTR_RTOL * abs(log_t2 - eps) + arg_err * (a + b + 1.0)
            + 4 * _ULP * abs(eps))
  err_d = err_t1 + err_t2 + 4 * _ULP * (abs(log_t2) + abs(log_t1))
  d_low = min(d - err_d, -err_d)
  if d_low == -math.inf or log_t2 == -math.inf:
    return log_t1 + err_t1
  return log_t1 + err_t1 + _log1mexp(d_low)


def gaussian_delta_exact(noise_multiplier: float, eps: float, sensitivity: float = 1.0) -> float:
  """δ(ε) of the Gaussian mechanism (Balle & Wang 2018, arXiv:1805.06530, Thm 8).

  Evaluated in log space (no overflow for huge ε or tiny z); the best estimate, not
  the error-padded bound ``gaussian_epsilon_exact`` bisects on.
  """
  z = _multiplier(noise_multiplier, sensitivity)
  eps = checks.finite_float(eps, "eps") if eps != math.inf else eps
  if eps < 0:
    raise checks.CheckError(f"eps must be non-negative, got {eps:g}")
  if z == 0.0:
    return 1.0
  return math.exp(gaussian_log_delta(z, eps, upper=False))


def gaussian_epsilon_exact(noise_multiplier: float, delta: float,
                           tolerance: float = EXACT_TOLERANCE,
                           sensitivity: float = 1.0) -> float:
  """Exact ε(δ) of the Gaussian mechanism with multiplier z / sensitivity.

  Bisection on ε ↦ δ(ε) (decreasing) with the error-padded upper bound on δ; returns
  the upper end of the final bracket, so the value is never below the true ε. Bounded
  time (at most ~1100 + 60 evaluations of two log Φ values) and no allocation for any
  input; returns ``inf`` only when the true ε exceeds the largest double.
  """
  z = _multiplier(noise_multiplier, sensitivity)
  delta = checks.delta(delta)
  tolerance = checks.in_range(tolerance, "tolerance", 0.0, 1.0, low_open=True, high_open=True)
  if z == 0.0 or 0.5 / z == math.inf:
    return math.inf
  log_delta = math.log(delta)

  def ok(eps):
    return gaussian_log_delta(z, eps, upper=True) <= log_delta

  if ok(0.0):
    return 0.0
  lo, hi = 0.0, 1.0
  while not ok(hi):
    lo, hi = hi, 2.0 * hi
    if hi == math.inf:
      return math.inf
  while hi - lo > tolerance * hi:
    mid = 0.5 * (lo + hi)
    if mid <= lo or mid >= hi:
      break
    if ok(mid):
      hi = mid
    else:
      lo = mid
  return hi


# ----------------------------------------------------------------------------- PLD


def pld_discretization_for(multiplier: float, sampling_prob: float = 1.0, compositions: int = 1,
                           discretization: float = PLD_DISCRETIZATION,
                           max_points: Optional[int] = None) -> float:
  """The PLD grid step to use: ``discretization``, coarsened so no PLD exceeds max_points.

  The single round's privacy-loss range comes from dp_accounting's own connect-the-dots
  bounds; the range of the composition from dp_accounting's own Chernoff truncation
  bounds, evaluated on a coarse PLD, is kept within ``PLD_MAX_COMPOSED_POINTS``. A
  coarser pessimistic grid still gives an upper bound on ε, only a looser one.
  ``max_points`` (one round) defaults to ``PLD_MAX_POINTS`` without sampling and
  ``PLD_MAX_POINTS_SAMPLED`` with it (dp_accounting builds the subsampled PLD one grid
  point at a time). Raises AccountingError when even a grid step of
  ``PLD_MAX_DISCRETIZATION`` does not fit.
  """
  from dp_accounting.pld import common  # pylint: disable=g-import-not-at-top
  from dp_accounting.pld import privacy_loss_distribution as pld_lib  # pylint: disable=g-import-not-at-top
  from dp_accounting.pld import privacy_loss_mechanism as plm  # pylint: disable=g-import-not-at-top
  if max_points is None:
    max_points = PLD_MAX_POINTS if sampling_prob >= 1.0 else PLD_MAX_POINTS_SAMPLED
  if sampling_prob >= 1.0:  # k Gaussians compose exactly into one at multiplier / √k
    multiplier, compositions = multiplier / math.sqrt(compositions), 1
  adjacencies = [plm.AdjacencyType.REMOVE]
  if sampling_prob < 1.0:
    adjacencies.append(plm.AdjacencyType.ADD)
  width = 0.0
  for adjacency in adjacencies:
    bounds = plm.GaussianPrivacyLoss(multiplier, sensitivity=1.0, sampling_prob=sampling_prob,
                                     adjacency_type=adjacency).connect_dots_bounds()
    width = max(width, float(bounds.epsilon_upper) - float(bounds.epsilon_lower))
  interval = max(float(discretization), 1.05 * width / max_points)
  if compositions > 1 and interval <= PLD_MAX_DISCRETIZATION:
    coarse = max(interval, width / 2048)
    pld = pld_lib.from_gaussian_mechanism(multiplier, value_discretization_interval=coarse,
                                          sampling_prob=sampling_prob)
    span = 0.0
    for pmf in (pld._pmf_remove, pld._pmf_add):  # pylint: disable=protected-access
      probs = getattr(pmf, "_probs", None)
      if probs is None:  # not dense: the untruncated composition
        span = max(span, compositions * width)
        continue
      lo, hi = common.compute_self_convolve_bounds(probs, compositions, 1e-15)
      span = max(span, (hi - lo + 3) * coarse)
    interval = max(interval, 1.1 * span / max(max_points, PLD_MAX_COMPOSED_POINTS))
  if not (math.isfinite(width) and interval <= PLD_MAX_DISCRETIZATION):
    raise AccountingError(
        f"the PLD accountant cannot represent {compositions} composition(s) of the Gaussian "
        f"mechanism with multiplier {multiplier:.3g} (privacy-loss range {width:.3g}) on a grid "
        f"of at most {max_points} points with step at most {PLD_MAX_DISCRETIZATION:g}")
  return interval


def pld_gaussian_epsilon(multiplier: float, delta: float, sampling_prob: float = 1.0,
                         compositions: int = 1, discretization: float = PLD_DISCRETIZATION,
                         max_points: Optional[int] = None) -> Tuple[float, float]:
  """(ε, grid step) of ``compositions``-fold Poisson-subsampled Gaussian, dp_accounting PLD.

  Pessimistic connect-the-dots discretization (an upper bound), composed as dp_accounting's
  ``PLDAccountant`` composes ``PoissonSampledDpEvent(p, GaussianDpEvent(multiplier))``
  ``compositions`` times, the single round built by ``gaussian_pld``; the grid step is
  ``pld_discretization_for``'s, so memory stays bounded (about max_points floats per
  PLD) for every multiplier.
  """
  from dp_accounting.pld import privacy_loss_distribution as pld_lib  # pylint: disable=g-import-not-at-top
  interval = pld_discretization_for(multiplier, sampling_prob, compositions, discretization,
                                    max_points)
  with warnings.catch_warnings(), np.errstate(all="ignore"):
    # Huge losses overflow a ratio inside dp_accounting; it then returns inf (valid).
    warnings.simplefilter("ignore", RuntimeWarning)
    if sampling_prob >= 1.0:  # as dp_accounting's PLDAccountant composes k Gaussians
      pld = gaussian_pld(multiplier / math.sqrt(int(compositions)), interval)
    else:
      pld = gaussian_pld(multiplier, interval, sampling_prob).self_compose(int(compositions))
    pld = pld_lib.identity(value_discretization_interval=interval).compose(pld)
    eps = float(pld.get_epsilon_for_delta(delta))
  if math.isnan(eps):
    raise AccountingError("the PLD accountant returned NaN")
  return max(eps, 0.0), interval


def gaussian_pld(multiplier: float, interval: float, sampling_prob: float = 1.0):
  """dp_accounting's pessimistic connect-the-dots PLD of the Poisson-subsampled Gaussian
  (``from_gaussian_mechanism(multiplier, value_discretization_interval=interval,
  sampling_prob=sampling_prob)``), its hockey-stick divergences evaluated at every grid
  point at once (``_fast_gaussian_class``) instead of one privacy-loss inversion per point:
  the same construction and the same formulas, elementwise."""
  from dp_accounting.pld import privacy_loss_distribution as pld_lib  # pylint: disable=g-import-not-at-top
  from dp_accounting.pld import privacy_loss_mechanism as plm  # pylint: disable=g-import-not-at-top
  cls = _fast_gaussian_class()

  def pmf(adjacency):
    loss = cls(multiplier, sampling_prob=sampling_prob, adjacency_type=adjacency)
    return pld_lib._create_pld_pmf_from_monotone_privacy_loss(  # pylint: disable=protected-access
        loss, pessimistic_estimate=True, value_discretization_interval=interval,
        use_connect_dots=True)

  if sampling_prob >= 1.0:
    return pld_lib.PrivacyLossDistribution(pmf(plm.AdjacencyType.REMOVE))
  return pld_lib.PrivacyLossDistribution(pmf(plm.AdjacencyType.REMOVE),
                                         pmf(plm.AdjacencyType.ADD))


@functools.lru_cache(maxsize=None)
def _fast_gaussian_class():
  from dp_accounting.pld import privacy_loss_mechanism as plm  # pylint: disable=g-import-not-at-top

  class FastGaussianPrivacyLoss(plm.GaussianPrivacyLoss):
    """dp_accounting's (subsampled) Gaussian privacy loss whose ``get_delta_for_epsilon``
    inverts the privacy loss of a whole array of ε at once: dp_accounting's own formulas
    (``inverse_privacy_loss`` for ADD and REMOVE, ``common.log_a_times_exp_b_plus_c``),
    written elementwise, with its special cases (ε at the boundary ±log(1 − q) within
    ``math.isclose``'s relative 1e-9, ε = 0, ε beyond the boundary)."""

    def get_delta_for_epsilon(self, epsilon):
      if self.adjacency_type == plm.AdjacencyType.REPLACE or np.ndim(epsilon) == 0:
        return super().get_delta_for_epsilon(epsilon)
      eps = np.asarray(epsilon, dtype=float)
      deltas = np.zeros_like(eps, dtype=float)
      q = self.sampling_prob
      if q == 1.0:
        inverse = np.full(eps.shape, True)
      elif self.adjacency_type == plm.AdjacencyType.ADD:
        inverse = eps < -math.log1p(-q)
      else:
        inverse = eps > math.log1p(-q)
        deltas[~inverse] = -np.expm1(eps[~inverse])
      x = self._inverse_losses(eps[inverse])
      deltas[inverse] = (self.mu_upper_cdf(x)
                         - np.exp(eps[inverse] + self.mu_lower_log_cdf(x)))
      return np.clip(deltas, 0, 1)

    def _inverse_losses(self, losses: np.ndarray) -> np.ndarray:
      """``inverse_privacy_loss`` of each entry of ``losses``."""
      add = self.adjacency_type == plm.AdjacencyType.ADD
      q, s, var = self.sampling_prob, self.sensitivity, self._standard_deviation**2
      if q == 1.0:
        unsampled = losses
      else:
        edge = -math.log(1 - q) if add else math.log(1 - q)
        close = np.abs(losses - edge) <= 1e-9 * np.maximum(np.abs(losses), abs(edge))
        if np.any(losses[~close] > edge) if add else np.any(losses[~close] <= edge):
          raise ValueError(f"privacy loss beyond the subsampled boundary {edge}")
        b = -losses if add else losses
        a, c = 1 / q, 1 - 1 / q
        d = b + np.log(a)
        log_c = np.log(-c)
        if np.any((log_c >= d) & ~close & (b != 0)):
          raise ValueError("a exp(b) + c must be positive")
        with np.errstate(all="ignore"):
          value = np.where(b == 0, np.log(a + c), d + np.log1p(-np.exp(log_c - d)))
        unsampled = -value if add else value
        unsampled = np.where(close, math.inf if add else -math.inf, unsampled)
      x = -0.5 * s - unsampled * var / s
      return s + x if add else x

  return FastGaussianPrivacyLoss
