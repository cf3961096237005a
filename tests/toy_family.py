"""A family that exists only to test the family protocol (``tff_mf.factorization.families``).

C is the lower-triangular Toeplitz matrix whose first b diagonals are r^j, j < b (r = ½ for
``toy_geometric``), and B = A·C⁻¹. It is not a published mechanism; it is registered at run
time by tests/test_query_federated.py, which then factorizes, caches, accounts and trains it
without any other file knowing its name. ``toy_ratio`` declares a parameter of its own, the
ratio r (tests/test_mechanisms.py: it flows from a ``MechanismSpec`` to ``factorize``;
tests/test_flag_table.py: its flag reaches every tool).
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

from tff_mf import checks
from tff_mf.factorization import families
from tff_mf import participation

VERSION = "1"

DEFAULT_RATIO = 0.5


def _ratio_defaults(n, schema):
  return dict(families.separation_bands(n, schema), ratio=DEFAULT_RATIO)


def check_ratio(value, name: str) -> float:
  return checks.in_range(value, name, 0.0, 1.0, low_open=True, high_open=True)


STRATEGIES = {
    "toy_geometric": families.Declaration(
        parameters=("bands",), defaults=families.separation_bands,
        participations=participation.KINDS, peak_matrices=4, check_spec=families.check_bands),
    "toy_ratio": families.Declaration(
        parameters=("bands", "ratio"), defaults=_ratio_defaults,
        participations=participation.KINDS, peak_matrices=4, check_spec=families.check_bands,
        own_parameters={"ratio": check_ratio},
        own_parameter_flags={"ratio": (float, "R", "ratio r of the taps r^j, in (0, 1)")}),
}


def coefficients(bands: int, ratio: float = DEFAULT_RATIO) -> np.ndarray:
  return ratio ** np.arange(bands, dtype=np.float64)


def _encoder(taps: np.ndarray, n: int) -> np.ndarray:
  column = np.zeros(n)
  column[:min(n, taps.size)] = taps[:n]
  return scipy.linalg.toeplitz(column, np.zeros(n))


def factorize(a: np.ndarray, spec, context) -> families.FamilyResult:
  del context
  taps = coefficients(spec.bands, getattr(spec, "ratio", DEFAULT_RATIO))
  c = _encoder(taps, a.shape[0])
  b = scipy.linalg.solve_triangular(c, a.T, lower=True, trans="T").T  # B = A·C⁻¹
  return families.FamilyResult(b=b, c=c, info={"bands": spec.bands},
                               extras={"toy_coefficients": taps})


def check_extras(f) -> None:
  gamma = float(np.asarray(f.extras["normalization"])[0])
  err = float(np.max(np.abs(_encoder(f.extras["toy_coefficients"], f.n) / gamma - f.c)))
  if err > 1e-12:
    raise checks.CheckError(f"toy coefficients do not rebuild C (error {err:.3g})")
