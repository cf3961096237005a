"""A = B·C held as three first columns, for Toeplitz C and Toeplitz A (numpy core).

When the workload A (prefix sum S, momentum at a constant learning rate) and the encoder C
(banded Toeplitz, BLT) are lower-triangular Toeplitz, so is B = A·C⁻¹, and each is its
first column: T(x) denotes the lower-triangular Toeplitz matrix with first column x, and
T(x)·T(y) = T((x ∗ y)[:n]). ``ToeplitzFactorization`` keeps a = A[:, 0], β = B[:, 0] and
c = C[:, 0] (O(n) memory); every figure (γ, ‖B‖_F, row norms, the sensitivity under
single and min-sep participation, ``participation.toeplitz_sensitivity_report``) comes
from them, and the dense a, b, c are built only when a caller reads them.

B·C = A holds exactly iff (β ∗ c)[:n] = a, since every entry of B·C − A is one of those n
differences. ``check_product`` computes the convolution by FFT, whose computed entries are
within ``FFT_ERROR_FACTOR``·u·log₂(2n)·‖β‖₂·‖c‖₂ of the exact ones (u = 2⁻⁵³; the
standard backward-error bound of FFT convolution, Higham 2002, "Accuracy and Stability of
Numerical Algorithms", Sec 24.1), and accepts when the largest difference is at most the
dense check's tolerance (``atol``·max(1, max|a|)) plus that bound.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional

import numpy as np
import scipy.signal

from tff_mf import checks
from tff_mf import factorization as fz
from tff_mf import participation as participation_lib
from tff_mf import toeplitz_view
from tff_mf.factorization import toeplitz_ops

# Constant of the FFT convolution error bound (generous: the proven constant is about 5).
FFT_ERROR_FACTOR = 16.0
# From this n on, the matrices of a ToeplitzFactorization are views of their columns (below
# it the dense n x n float64 matrices take under 128 MB, and dense code keeps BLAS speed).
VIEW_MIN_N = 4096
# The names of the three first columns in a cache entry (instead of A, B, C).
COLUMNS = ("A_column", "B_column", "C_column")


class ToeplitzFactorization(fz.Factorization):
  """A ``Factorization`` whose A, B, C are lower-triangular Toeplitz, kept as first columns.

  ``a``, ``b``, ``c`` are read-only n x n views of the columns from ``VIEW_MIN_N`` rounds
  (``tff_mf.toeplitz_view``, O(n) memory), dense below; the figures, the sensitivity and the
  checks use the columns.
  """

  def __init__(self, a_column, b_column, c_column, strategy: str,
               info: Optional[Dict[str, Any]] = None,
               extras: Optional[Dict[str, np.ndarray]] = None):  # pylint: disable=super-init-not-called
    self.columns = {name: np.ascontiguousarray(x, dtype=np.float64)
                    for name, x in zip(COLUMNS, (a_column, b_column, c_column))}
    self.strategy = strategy
    self.info = dict(info or {})
    self.extras = dict(extras or {})
    self._sensitivity_reports: Dict[Any, Dict[str, Any]] = {}
    self._gram = None
    self._dense: Dict[str, np.ndarray] = {}

  def __repr__(self) -> str:
    return f"ToeplitzFactorization(strategy={self.strategy!r}, n={self.n})"

  def _matrix(self, name: str) -> np.ndarray:
    """The matrix: from ``VIEW_MIN_N`` rounds a read-only Toeplitz view of its column
    (``toeplitz_view``: O(n) memory; code that knows the structure finds the column again,
    other code reads every entry, though BLAS cannot multiply a view), below it dense."""
    if name not in self._dense:
      column = self.columns[name]
      self._dense[name] = (toeplitz_view.view(column) if self.n >= VIEW_MIN_N
                           else toeplitz_ops.lower_toeplitz(column))
    return self._dense[name]

  a = property(lambda self: self._matrix("A_column"))
  b = property(lambda self: self._matrix("B_column"))
  c = property(lambda self: self._matrix("C_column"))

  @property
  def n(self) -> int:
    return int(self.columns["A_column"].shape[0])

  @property
  def m(self) -> int:
    return self.n

  @property
  def gamma(self) -> float:
    return float(math.sqrt(np.max(self.column_norms_sq())))

  def column_norms_sq(self) -> np.ndarray:
    from tff_mf.participation import bounds  # pylint: disable=g-import-not-at-top
    return bounds.toeplitz_column_norms_sq(self.columns["C_column"])

  def decoder_row_norms_sq(self) -> np.ndarray:
    """‖B[i, :]‖² = Σ_{l ≤ i} β_l²."""
    return np.cumsum(np.square(self.columns["B_column"]))

  def decoder_frobenius_sq(self) -> float:
    """‖B‖_F² = Σ_l (n − l)·β_l² (β_l sits in n − l rows of B)."""
    weights = np.arange(self.n, 0, -1, dtype=np.float64)
    return float(np.sum(weights * np.square(self.columns["B_column"])))

  @property
  def single_participation_loss(self) -> float:
    return self.gamma ** 2 * self.decoder_frobenius_sq()

  @property
  def single_participation_sqrt_loss(self) -> float:
    return float(np.sqrt(self.single_participation_loss))

  def per_round_variance(self) -> np.ndarray:
    return self.gamma ** 2 * self.decoder_row_norms_sq()

  def sensitivity_report(self, schema) -> Dict[str, Any]:
    """The dense C's report, from the first column where that is exact
    (``participation.toeplitz_sensitivity_report``); else the dense C's where it fits in
    memory; else (min-sep) the structured upper bound of ``toeplitz_bounds``."""
    key = (schema, id(self.columns["C_column"]))
    if key not in self._sensitivity_reports:
      self._sensitivity_reports[key] = self._sensitivity_report(schema)
    return dict(self._sensitivity_reports[key])

  def _sensitivity_report(self, schema) -> Dict[str, Any]:
    coef = self.columns["C_column"]
    report = participation_lib.toeplitz_sensitivity_report(coef, schema)
    if report is not None:
      return report
    try:
      checks.dense_matrices_fit(self.n, 8, "the dense sensitivity analysis")
    except checks.CheckError:
      report = participation_lib.toeplitz_upper_bound_report(coef, schema)
      if report is None:
        raise
      return report
    return participation_lib.sensitivity_report(self.c, schema, gram=self.gram_of_encoder())

  def resident_bytes(self) -> int:
    """The bytes held in memory: the first columns, the dense matrices built from them and
    a computed CᵀC."""
    return int(sum(x.nbytes for x in self.columns.values())
               + sum(x.nbytes for x in self._dense.values() if x.flags.owndata)
               + self.gram_bytes())

  def encoder_column(self) -> np.ndarray:
    return self.columns["C_column"]

  def noise_matrix(self) -> np.ndarray:
    """N = A⁻¹·B = C⁻¹, dense (its first column is C⁻¹·e_0)."""
    return toeplitz_ops.lower_toeplitz(inverse_column(self.columns["C_column"]))

  def validate(self, atol: float = 1e-8, name: str = "factorization") -> "ToeplitzFactorization":
    """Shapes, finiteness, a_0 ≠ 0, γ(C) = 1 and B·C = A (``check_product``)."""
    check_columns(self.columns, name)
    checks.normalized(self.columns["C_column"][:, None], f"{name}: C")
    check_product(self.columns, name, atol)
    return self


def check_columns(columns: Dict[str, np.ndarray], name: str) -> int:
  """Three finite float64 first columns of one length n, with A's diagonal non-zero; n."""
  for label in COLUMNS:
    x = columns.get(label)
    if not isinstance(x, np.ndarray) or x.ndim != 1 or x.dtype != np.float64:
      raise checks.CheckError(f"{name}: {label} must be a 1-D float64 array")
    if not np.all(np.isfinite(x)):
      raise checks.CheckError(f"{name}: {label} has non-finite entries")
  n = columns["A_column"].shape[0]
  if n < 1 or any(columns[label].shape != (n,) for label in COLUMNS):
    raise checks.CheckError(f"{name}: the first columns differ in length "
                            f"{[columns[label].shape for label in COLUMNS]}")
  if columns["A_column"][0] == 0:
    raise checks.CheckError(f"{name}: A is singular (its diagonal is 0)")
  return n


def convolution_error_bound(x: np.ndarray, y: np.ndarray) -> float:
  """A bound on the error of each entry of ``fftconvolve(x, y)`` (module docstring)."""
  size = 2 * max(x.shape[0], y.shape[0])
  return (FFT_ERROR_FACTOR * np.finfo(np.float64).eps * math.log2(size)
          * float(np.linalg.norm(x)) * float(np.linalg.norm(y)))


def check_product(columns: Dict[str, np.ndarray], name: str, atol: float = 1e-8) -> float:
  """B·C = A on every entry, from the first columns (exact up to the FFT bound); the error."""
  a, beta, c = (columns[label] for label in COLUMNS)
  n = a.shape[0]
  err = float(np.max(np.abs(scipy.signal.fftconvolve(beta, c)[:n] - a)))
  tol = atol * max(1.0, float(np.max(np.abs(a)))) + convolution_error_bound(beta, c)
  if not err <= tol:
    raise checks.CheckError(f"{name}: B·C differs from A by {err:.3g} (tolerance {tol:.3g}, "
                            "Toeplitz first columns)")
  return err


def inverse_column(c: np.ndarray) -> np.ndarray:
  """C⁻¹·e_0 for the lower-triangular Toeplitz C with first column c (c trimmed of its
  trailing zeros: O(n·b) for b bands)."""
  return toeplitz_ops.inverse_column(np.trim_zeros(c, "b"), c.shape[0])


def from_columns(a_column: np.ndarray, b_column: np.ndarray, c_column: np.ndarray,
                 strategy: str, info: Dict[str, Any],
                 extras: Dict[str, np.ndarray]) -> ToeplitzFactorization:
  """The normalized factorization (γ·β, c/γ) of an unnormalized (β, c), γ = ‖c‖₂ (C's first
  column is its largest; Denisov et al. 2022, arXiv:2202.08312, App I); the extras get the
  ``normalization`` γ as ``families.FamilyResult.normalized`` gives them."""
  gamma = float(math.sqrt(np.max(np.cumsum(np.square(c_column)))))
  if not np.isfinite(gamma) or gamma <= 0:
    raise checks.CheckError(f"C has invalid largest column norm γ = {gamma}")
  return ToeplitzFactorization(
      a_column, b_column * gamma, c_column / gamma, strategy,
      info=dict(info, gamma_before_normalization=gamma),
      extras=dict(extras, normalization=np.array([gamma])))


def check_noise(f: ToeplitzFactorization, h: np.ndarray, order: int, stream,
                atol: float = 1e-8) -> None:
  """The noise C⁻¹·Z the family streams is that of f's C, without an n x n matrix.

  ``h`` is C⁻¹·e_0 as the family's parameters give it, satisfying a linear recurrence of
  order at most ``order`` after its first entry (banded: b − 1, BLT: m). Checks
  (c ∗ h)[:n] = e_0 (so T(h) = C⁻¹ on every entry, up to the FFT bound of the module
  docstring), and that the family's time-invariant ``stream`` (``strategies.stream``) outputs
  h on the impulse Z = e_0 for its first 2·(k + order) + 2 rounds, k its state rows. Its
  impulse response obeys a recurrence of order k (Cayley–Hamilton), so the difference of
  the two obeys one of order k + order and, zero on that many consecutive rounds, is zero
  at every round: the stream realizes T(h) = C⁻¹ exactly (in exact arithmetic).
  """
  c = f.columns["C_column"]
  n = f.n
  identity = scipy.signal.fftconvolve(c, h)[:n]
  identity[0] -= 1.0
  err = float(np.max(np.abs(identity)))
  tol = atol + convolution_error_bound(c, h)
  if not err <= tol:
    raise checks.CheckError(f"the stored parameters' C⁻¹ is not the inverse of C (error "
                            f"{err:.3g}, tolerance {tol:.3g})")
  if stream.time_varying:
    raise checks.CheckError(f"{f.strategy}: a Toeplitz C streams its noise with time-invariant "
                            "tables")
  rounds = min(n, 2 * (stream.k + order) + 2)
  state = np.zeros((stream.k, 1))
  impulse = np.zeros(1)
  scale = max(1.0, float(np.max(np.abs(h[:rounds]))))
  for i in range(rounds):
    impulse[0] = 1.0 if i == 0 else 0.0
    y, state = stream.step(state, impulse, i)
    if not abs(float(y[0]) - h[i]) <= atol * scale:
      raise checks.CheckError(f"{f.strategy}: the stream's noise differs from C⁻¹ at lag {i} "
                              f"({float(y[0]):.6g} vs {h[i]:.6g})")
