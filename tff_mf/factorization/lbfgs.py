"""scipy's L-BFGS-B with the options and the convergence rule the Toeplitz-type families use
(numpy/scipy core, no TensorFlow).
"""

from __future__ import annotations

from typing import Tuple

import numpy as np
import scipy.optimize

# L-BFGS-B stops with a line-search failure once the objective is flat to rounding; the
# result counts as converged when the projected gradient of the objective, normalized by
# its initial value, is below this.
GRADIENT_TOLERANCE = 1e-6


def projected_gradient_norm(res, bounds) -> float:
  """max |projected gradient| of a scipy L-BFGS-B result (components pushing against an
  active bound count as zero)."""
  g = np.asarray(res.jac, dtype=np.float64).copy()
  if bounds is not None:
    lower = np.array([-np.inf if b[0] is None else b[0] for b in bounds])
    upper = np.array([np.inf if b[1] is None else b[1] for b in bounds])
    g[(res.x <= lower) & (g > 0)] = 0.0
    g[(res.x >= upper) & (g < 0)] = 0.0
  return float(np.max(np.abs(g))) if g.size else 0.0


def minimize(fun, x0: np.ndarray, bounds, max_iterations: int, tolerance: float):
  """scipy's L-BFGS-B on ``fun`` (value and gradient) with the Toeplitz families' options."""
  return scipy.optimize.minimize(
      fun, x0, jac=True, method="L-BFGS-B", bounds=bounds,
      options={"maxiter": int(max_iterations), "maxfun": 4 * int(max_iterations),
               "ftol": tolerance, "gtol": 1e-10, "maxcor": 20})


def outcome(res, bounds) -> Tuple[str, float, bool]:
  """(message, projected gradient norm, converged) of an L-BFGS-B result: converged when
  scipy says so or the projected gradient is below GRADIENT_TOLERANCE."""
  gradient = projected_gradient_norm(res, bounds)
  return str(res.message), gradient, bool(res.success) or gradient <= GRADIENT_TOLERANCE


def why_unconverged(message: str, gradient: float) -> str:
  """Why an L-BFGS-B run that ``outcome`` calls unconverged stopped, in one line."""
  return (f"L-BFGS-B stopped with {message} while the projected gradient was {gradient:.2g} "
          f"(converged means below {GRADIENT_TOLERANCE:g})")
