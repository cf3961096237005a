"""Single-participation privacy accounting (numpy core + dp_accounting, no TensorFlow).

Denisov et al. Thm 4.1 (``001_…``, Sec 4): when every user contributes to at
most one round, a matrix-factorization run whose encoder C is normalized to
γ(C) = 1 (App I, ``000_…``) has exactly the privacy of ONE Gaussian mechanism
with sensitivity 1 and noise standard deviation z (the noise multiplier), under
the replace-with-zero notion of DP (App J, Def J.1, ``000_…``). So ε(δ) of a
whole run is ε(δ) of that Gaussian mechanism.

Two accountants:
- ``"pld"`` (default): dp_accounting's privacy-loss-distribution accountant
  with pessimistic discretization (its ε is an upper bound, and the tightest of
  the two);
- ``"rdp"``: Rényi DP converted to (ε, δ), looser.

``calibrate_noise_multiplier`` searches for the smallest z whose ε does not
exceed a target, to a stated tolerance, always rounding to the safe side.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

ACCOUNTANTS = ("pld", "rdp")

# PLD discretization of the privacy loss (dp_accounting's default). Coarser is
# still an upper bound, only looser.
PLD_DISCRETIZATION = 1e-4

# Rényi orders for the RDP accountant: dense at small orders, geometric above.
RDP_ORDERS = tuple(np.concatenate([
    np.linspace(1.01, 8.0, 100), np.geomspace(8.0, 10000.0, 200)[1:]]).tolist())

# Search range for calibration.
_MIN_NOISE_MULTIPLIER = 1e-3
_MAX_NOISE_MULTIPLIER = 1e6


def check_delta(delta: float, name: str = "delta") -> float:
  """Raises ValueError unless 0 < δ < 1."""
  try:
    delta = float(delta)
  except (TypeError, ValueError):
    raise ValueError(f"{name} must be a number in (0, 1), got {delta!r}") from None
  if not (0.0 < delta < 1.0) or not math.isfinite(delta):
    raise ValueError(f"{name} must be in (0, 1), got {delta}")
  return delta


def check_noise_multiplier(noise_multiplier: float,
                           name: str = "noise_multiplier") -> float:
  """Raises ValueError unless z is a finite positive number."""
  try:
    z = float(noise_multiplier)
  except (TypeError, ValueError):
    raise ValueError(f"{name} must be a positive number, got {noise_multiplier!r}") from None
  if not math.isfinite(z) or z <= 0.0:
    raise ValueError(f"{name} must be a positive finite number, got {noise_multiplier}")
  return z


def check_accountant(accountant: str) -> str:
  if accountant not in ACCOUNTANTS:
    raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {accountant!r}")
  return accountant


def epsilon(noise_multiplier: float, delta: float, accountant: str = "pld") -> float:
  """ε(δ) of a single-participation run with noise multiplier z (Denisov Thm 4.1).

  The run is one Gaussian mechanism with sensitivity 1 and noise std z (C
  normalized to γ = 1). Both accountants return an upper bound on the true ε.
  """
  z = check_noise_multiplier(noise_multiplier)
  delta = check_delta(delta)
  check_accountant(accountant)
  import dp_accounting  # pylint: disable=g-import-not-at-top
  event = dp_accounting.GaussianDpEvent(z)
  if accountant == "pld":
    acc = dp_accounting.pld.PLDAccountant(
        value_discretization_interval=PLD_DISCRETIZATION)
  else:
    acc = dp_accounting.rdp.RdpAccountant(orders=list(RDP_ORDERS))
  acc.compose(event)
  eps = float(acc.get_epsilon(delta))
  return max(eps, 0.0)


def gaussian_delta_exact(noise_multiplier: float, eps: float) -> float:
  """Exact δ(ε) of the Gaussian mechanism (Balle & Wang 2018, Thm 8).

  δ = Φ(1/(2z) − εz) − e^ε·Φ(−1/(2z) − εz). Used to cross-check the accountants.
  """
  from scipy import stats  # pylint: disable=g-import-not-at-top
  z = check_noise_multiplier(noise_multiplier)
  a = 1.0 / (2.0 * z)
  return float(stats.norm.cdf(a - eps * z) - math.exp(eps) * stats.norm.cdf(-a - eps * z))


def gaussian_epsilon_exact(noise_multiplier: float, delta: float,
                           tolerance: float = 1e-12) -> float:
  """Exact ε(δ) of the Gaussian mechanism (inverts ``gaussian_delta_exact``).

  Bisection on the decreasing map ε ↦ δ(ε); returns the upper end of the
  final bracket, so the value is never below the true ε.
  """
  z = check_noise_multiplier(noise_multiplier)
  delta = check_delta(delta)
  if gaussian_delta_exact(z, 0.0) <= delta:
    return 0.0
  lo, hi = 0.0, 1.0
  while gaussian_delta_exact(z, hi) > delta:
    lo, hi = hi, 2.0 * hi
  while hi - lo > tolerance * max(1.0, hi):
    mid = 0.5 * (lo + hi)
    if gaussian_delta_exact(z, mid) > delta:
      lo = mid
    else:
      hi = mid
  return hi


def calibrate_noise_multiplier(target_epsilon: float, delta: float,
                               accountant: str = "pld",
                               tolerance: float = 1e-3,
                               relative: bool = True) -> float:
  """Smallest z (to ``tolerance``) with ε(z, δ) ≤ target_epsilon.

  Bisection on the monotone map z ↦ ε(z). The returned z always satisfies
  ε(z) ≤ target; z − tol does not (tol = tolerance·z when ``relative``, else
  the absolute ``tolerance``), so z over-shoots the exact answer by less than
  tol: the safe side.
  """
  try:
    target = float(target_epsilon)
  except (TypeError, ValueError):
    raise ValueError(f"target_epsilon must be a positive number, got {target_epsilon!r}") from None
  if not math.isfinite(target) or target <= 0.0:
    raise ValueError(f"target_epsilon must be a positive finite number, got {target_epsilon}")
  delta = check_delta(delta)
  check_accountant(accountant)
  if not (tolerance > 0.0) or not math.isfinite(tolerance):
    raise ValueError(f"tolerance must be positive, got {tolerance}")

  def ok(z):
    return epsilon(z, delta, accountant) <= target

  def exact_ok(z):
    return gaussian_delta_exact(z, target) <= delta

  # Both accountants upper-bound the exact Gaussian ε, so a z that fails the
  # exact test fails theirs too: bracket with the cheap exact formula first.
  hi = 1.0
  while not exact_ok(hi):
    hi *= 2.0
    if hi > _MAX_NOISE_MULTIPLIER:
      raise ValueError(
          f"no noise multiplier up to {_MAX_NOISE_MULTIPLIER:g} reaches epsilon "
          f"{target} at delta {delta}")
  lo = hi / 2.0
  while exact_ok(lo):
    hi, lo = lo, lo / 2.0
    if lo < _MIN_NOISE_MULTIPLIER:
      break
  for _ in range(60):  # exact bisection to 1e-6 relative: lo fails, hi passes
    if hi - lo <= 1e-6 * hi:
      break
    mid = 0.5 * (lo + hi)
    if exact_ok(mid):
      hi = mid
    else:
      lo = mid
  # lo fails the exact test, hence the accountant's. Find an accountant-passing hi.
  step = 1.01
  hi = lo * step
  while not ok(hi):
    lo, hi = hi, hi * step
    step = step ** 2
    if hi > _MAX_NOISE_MULTIPLIER:
      raise ValueError(
          f"no noise multiplier up to {_MAX_NOISE_MULTIPLIER:g} reaches epsilon "
          f"{target} at delta {delta}")
  if lo < _MIN_NOISE_MULTIPLIER:
    return float(hi)
  # Invariant: ε(lo) > target ≥ ε(hi).
  while True:
    tol = tolerance * hi if relative else tolerance
    if hi - lo <= tol:
      return float(hi)
    mid = 0.5 * (lo + hi)
    if ok(mid):
      hi = mid
    else:
      lo = mid


def summary(noise_multiplier: float, delta: float, accountant: str = "pld",
            target_epsilon: Optional[float] = None) -> dict:
  """JSON-ready record of a single-participation guarantee."""
  eps = epsilon(noise_multiplier, delta, accountant)
  out = {
      "epsilon": eps,
      "delta": float(delta),
      "noise_multiplier": float(noise_multiplier),
      "accountant": accountant,
      "participation": "single",
      "theorem": "Denisov et al. 2022 Thm 4.1 (C normalized to sensitivity 1)",
  }
  if target_epsilon is not None:
    out["target_epsilon"] = float(target_epsilon)
  return out
