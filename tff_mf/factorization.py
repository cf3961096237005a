"""Factorizations A = B·C and their quality measures (numpy core, no TensorFlow).

Notation (``docs/notation.md``): A is the n x n workload, C the m x n encoder
("strategy"), B the n x m decoder. γ(C) is C's largest column L2 norm, the
single-participation sensitivity. Stored factorizations are normalized to
γ = 1 (Denisov et al. App I, ``000_…``), which leaves B·C unchanged.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional

import numpy as np


class FactorizationError(ValueError):
  """A factorization is malformed or does not reproduce its workload."""


def sensitivity(c: np.ndarray) -> float:
  """γ(C) = max_j ‖C[:, j]‖₂ (Denisov et al. Eq. 2; Thm 4.1)."""
  return float(np.sqrt(np.max(np.sum(np.square(c), axis=0))))


def loss(b: np.ndarray, c: np.ndarray) -> float:
  """L(B, C) = γ(C)² · ‖B‖²_F (Denisov et al. Eq. 2; McMahan et al. Eq. 4)."""
  return sensitivity(c) ** 2 * float(np.sum(np.square(b)))


def sqrt_loss(b: np.ndarray, c: np.ndarray) -> float:
  """√L, the figure McMahan et al. Table 1 reports."""
  return float(np.sqrt(loss(b, c)))


def per_round_variance(b: np.ndarray, c: np.ndarray) -> np.ndarray:
  """Variance of round i's released error for unit-variance noise at γ = 1.

  Row norms² of B scaled by γ(C)² (McMahan et al. Fig 1; Denisov et al. Fig 1).
  """
  return sensitivity(c) ** 2 * np.sum(np.square(b), axis=1)


def lower_bound_prop_c1(a: np.ndarray) -> float:
  """Lower bound on L for any factorization of A (McMahan et al. App C, Prop C.1, Eq. 24).

  (1/n)·(Σ_{j=1}^{⌊(n+1)/2⌋} σ_{2j-1})², with σ the singular values of A in
  decreasing order.
  """
  s = np.linalg.svd(a, compute_uv=False)
  n = a.shape[1]
  return float(np.sum(s[0::2]) ** 2 / n)


def lower_bound_nuclear(a: np.ndarray) -> float:
  """The tighter bound ‖A‖²_* / n, valid for every factorization with n columns in C.

  L = ‖B‖²_F·max_j‖C_j‖² ≥ ‖B‖²_F‖C‖²_F/n ≥ (Σ σ_i(B)σ_i(C))²/n ≥ ‖BC‖²_*/n
  (Cauchy-Schwarz, then Horn's inequality). Prop C.1 drops every second term.
  """
  s = np.linalg.svd(a, compute_uv=False)
  return float(np.sum(s) ** 2 / a.shape[1])


def normalize(b: np.ndarray, c: np.ndarray):
  """Rescales (B, C) -> (γB, C/γ) so that γ(C) = 1; returns (B, C, γ_before)."""
  gamma = sensitivity(c)
  if not np.isfinite(gamma) or gamma <= 0:
    raise FactorizationError(f"C has invalid sensitivity {gamma}")
  return b * gamma, c / gamma, gamma


def is_lower_triangular(x: np.ndarray, atol: float = 0.0) -> bool:
  """True when every entry above the diagonal is within ``atol`` of zero.

  For a non-square C (m x n, rows in release order) this checks x[i, j] = 0 for
  j > i, i.e. the row-index convention of the square case.
  """
  return bool(np.all(np.abs(np.triu(x, 1)) <= atol))


@dataclasses.dataclass
class Factorization:
  """A = B·C, float64, normalized so that γ(C) = 1.

  Attributes:
    a: workload A, n x n.
    b: decoder B, n x m.
    c: encoder C, m x n (m = n for square strategies; m = 2n-1 for the tree).
    strategy: how C was chosen (``optimal``, ``honaker_online``, ...).
    info: solver metadata (``relative_gap``, ``iterations``, ``seconds``,
      ``sensitivity_before_normalization`` ...), JSON-serializable.
  """
  a: np.ndarray
  b: np.ndarray
  c: np.ndarray
  strategy: str
  info: Dict[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def n(self) -> int:
    return int(self.a.shape[0])

  @property
  def m(self) -> int:
    return int(self.c.shape[0])

  @property
  def loss(self) -> float:
    return loss(self.b, self.c)

  @property
  def sqrt_loss(self) -> float:
    return sqrt_loss(self.b, self.c)

  @property
  def sensitivity(self) -> float:
    return sensitivity(self.c)

  def per_round_variance(self) -> np.ndarray:
    return per_round_variance(self.b, self.c)

  def noise_matrix(self) -> np.ndarray:
    """N = A⁻¹·B (n x m): round i of a residual-form query adds row i of N·Z.

    For square C this equals C⁻¹ (see docs/mechanisms.md).
    """
    from scipy.linalg import solve_triangular
    return solve_triangular(self.a, self.b, lower=True)

  def validate(self, atol: float = 1e-8, name: str = "factorization") -> "Factorization":
    """Checks shapes, dtype, finiteness, triangularity, γ(C) = 1 and B·C ≈ A."""
    validate_factors(self.a, self.b, self.c, atol=atol, name=name)
    return self


def validate_factors(a: np.ndarray, b: np.ndarray, c: np.ndarray,
                     atol: float = 1e-8, name: str = "factorization",
                     require_normalized: bool = True) -> None:
  """Raises FactorizationError naming the first problem found."""
  for label, x in (("A", a), ("B", b), ("C", c)):
    if not isinstance(x, np.ndarray) or x.ndim != 2:
      raise FactorizationError(f"{name}: {label} must be a 2-D array")
    if x.dtype != np.float64:
      raise FactorizationError(f"{name}: {label} must be float64, got {x.dtype}")
    if not np.all(np.isfinite(x)):
      raise FactorizationError(f"{name}: {label} has non-finite entries")
  n = a.shape[0]
  if a.shape != (n, n):
    raise FactorizationError(f"{name}: A must be square, got {a.shape}")
  m = c.shape[0]
  if c.shape != (m, n) or b.shape != (n, m):
    raise FactorizationError(
        f"{name}: shapes do not chain: A {a.shape}, B {b.shape}, C {c.shape} "
        f"(expected B n x m, C m x n with n={n})")
  if not is_lower_triangular(a):
    raise FactorizationError(f"{name}: A is not lower triangular")
  if m == n:
    if not is_lower_triangular(c, atol=1e-12):
      raise FactorizationError(f"{name}: C is not lower triangular")
    if not is_lower_triangular(b, atol=1e-10 * max(1.0, float(np.max(np.abs(b))))):
      raise FactorizationError(f"{name}: B is not lower triangular")
  if require_normalized and abs(sensitivity(c) - 1.0) > 1e-9:
    raise FactorizationError(
        f"{name}: C is not normalized (largest column norm {sensitivity(c):.12g}, expected 1)")
  err = float(np.max(np.abs(b @ c - a)))
  scale = max(1.0, float(np.max(np.abs(a))))
  if err > atol * scale:
    raise FactorizationError(f"{name}: B·C differs from A by {err:.3g} (tolerance {atol * scale:.3g})")


def summary(f: Factorization, lower_bound: Optional[bool] = True) -> Dict[str, Any]:
  """A JSON-ready dict of the quality measures of ``f``."""
  out = {
      "strategy": f.strategy,
      "n": f.n,
      "m": f.m,
      "loss": f.loss,
      "sqrt_loss": f.sqrt_loss,
      "max_round_variance": float(np.max(f.per_round_variance())),
  }
  if lower_bound:
    out["lower_bound_prop_c1"] = lower_bound_prop_c1(f.a)
    out["lower_bound_nuclear"] = lower_bound_nuclear(f.a)
  out.update(f.info)
  return out
