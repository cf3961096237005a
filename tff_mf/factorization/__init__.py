"""Factorizations A = B·C and their quality measures (numpy core, no TensorFlow).

Notation (``docs/notation.md``): A is the n x n workload, C the m x n encoder
("strategy"), B the n x m decoder, N = A⁻¹·B the per-round noise matrix. γ(C) is
C's largest column L2 norm, the single-participation sensitivity. Stored
factorizations are normalized to γ = 1 (Denisov et al. 2022, arXiv:2202.08312,
App I), which leaves B·C unchanged. Under a participation schema with sensitivity
sens(C) (``tff_mf.participation``), the error figures used across tff-mf are

- ``rmse`` = sens·‖B‖_F/√n, the root-mean-square error per round at unit noise, and
- ``max_error`` = sens·max_i ‖B[i, :]‖, the worst round's error at unit noise

(Choquette-Choo et al. 2023, arXiv:2306.08153, Sec 2); for single participation
L = γ²·‖B‖²_F = n·rmse² is Denisov et al.'s loss (Eq. 2).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Tuple

import numpy as np
import scipy.linalg

from tff_mf import checks

# Kept for callers that catch factorization problems specifically.
FactorizationError = checks.CheckError


def single_participation_loss(b: np.ndarray, c: np.ndarray) -> float:
  """L(B, C) = γ(C)²·‖B‖²_F (Denisov et al. 2022, Eq. 2)."""
  return checks.gamma(c) ** 2 * float(np.sum(np.square(b)))


def single_participation_sqrt_loss(b: np.ndarray, c: np.ndarray) -> float:
  """√L, the figure McMahan et al. Table 1 reports."""
  return float(np.sqrt(single_participation_loss(b, c)))


def rmse(b: np.ndarray, sens: float) -> float:
  """sens·‖B‖_F/√n."""
  return float(sens * np.linalg.norm(b) / np.sqrt(b.shape[0]))


def max_error(b: np.ndarray, sens: float) -> float:
  """sens·max_i ‖B[i, :]‖."""
  return float(sens * np.sqrt(np.max(np.sum(np.square(b), axis=1))))


def per_round_variance(b: np.ndarray, c: np.ndarray) -> np.ndarray:
  """Variance of round i's error for unit-variance noise at γ = 1: γ(C)²·‖B[i, :]‖².

  McMahan et al. Fig 1; Denisov et al. 2022, Fig 1.
  """
  return checks.gamma(c) ** 2 * np.sum(np.square(b), axis=1)


def lower_bound_prop_c1(a: np.ndarray) -> float:
  """Lower bound on L for any factorization of A (McMahan et al. App C, Prop C.1, Eq. 24).

  (1/n)·(Σ_{j=1}^{⌊(n+1)/2⌋} σ_{2j−1})², with σ the singular values of A in
  decreasing order.
  """
  s = np.linalg.svd(a, compute_uv=False)
  return float(np.sum(s[0::2]) ** 2 / a.shape[1])


def lower_bound_nuclear(a: np.ndarray) -> float:
  """The tighter bound ‖A‖²_*/n, valid for every factorization with n columns in C.

  L = ‖B‖²_F·max_j‖C_j‖² ≥ ‖B‖²_F‖C‖²_F/n ≥ (Σ σ_i(B)σ_i(C))²/n ≥ ‖BC‖²_*/n
  (Cauchy-Schwarz, then Horn's inequality). Prop C.1 drops every second term.
  """
  s = np.linalg.svd(a, compute_uv=False)
  return float(np.sum(s) ** 2 / a.shape[1])


def normalize(b: np.ndarray, c: np.ndarray):
  """(γB, C/γ, γ) with γ = γ(C), so that the returned C has γ = 1."""
  gamma = checks.gamma(c)
  if not np.isfinite(gamma) or gamma <= 0:
    raise checks.CheckError(f"C has invalid largest column norm γ = {gamma}")
  return b * gamma, c / gamma, gamma


def is_lower_triangular(x: np.ndarray, atol: float = 0.0) -> bool:
  return checks.is_lower_triangular(x, atol)


def post_process_prefix_decoder(a: np.ndarray, b_prefix: np.ndarray) -> np.ndarray:
  """B = A·S⁻¹·B_prefix: a prefix-sum decoder turned into one for workload A.

  S⁻¹ is the first-difference operator, so S⁻¹·B_prefix has rows
  B_prefix[i] − B_prefix[i−1] (Denisov et al. 2022, Sec 4, momentum and learning
  rates as post-processing).
  """
  diffs = np.diff(b_prefix, axis=0, prepend=np.zeros((1, b_prefix.shape[1])))
  return a @ diffs


@dataclasses.dataclass
class Factorization:
  """A = B·C, float64, normalized so that γ(C) = 1.

  Attributes:
    a: workload A, n x n.
    b: decoder B, n x m.
    c: encoder C, m x n (m = n for square strategies; m = 2n − 1 for the tree).
    strategy: how C was chosen (``optimal``, ``honaker_online``, ...).
    info: metadata (``relative_gap``, ``iterations``, ``seconds``,
      ``gamma_before_normalization``, ``sensitivity`` under the schema ...), JSON-serializable.
    extras: float64 parameters of the strategy family (structured pieces, Toeplitz
      coefficients, BLT buffers, ...), stored beside A, B, C in the cache.
  """
  a: np.ndarray
  b: np.ndarray
  c: np.ndarray
  strategy: str
  info: Dict[str, Any] = dataclasses.field(default_factory=dict)
  extras: Dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
  _sensitivity_reports: Dict[Any, Dict[str, Any]] = dataclasses.field(
      default_factory=dict, init=False, repr=False, compare=False)
  # (id of the C it was computed for, its Gram): ``gram_of_encoder``
  _gram: Optional[Tuple[int, Any]] = dataclasses.field(default=None, init=False, repr=False,
                                                       compare=False)

  @property
  def n(self) -> int:
    return int(self.a.shape[0])

  @property
  def m(self) -> int:
    return int(self.c.shape[0])

  @property
  def single_participation_loss(self) -> float:
    return single_participation_loss(self.b, self.c)

  @property
  def single_participation_sqrt_loss(self) -> float:
    return single_participation_sqrt_loss(self.b, self.c)

  @property
  def gamma(self) -> float:
    """γ(C), the largest column norm (1 once normalized). The sensitivity under a schema is
    ``sensitivity_report(schema)["value"]``, recorded as ``info["sensitivity"]``."""
    return checks.gamma(self.c)

  def sensitivity_report(self, schema) -> Dict[str, Any]:
    """``participation.sensitivity_report`` of C under ``schema``, computed once per schema
    (C is not to be modified in place once a report exists)."""
    from tff_mf import participation  # pylint: disable=g-import-not-at-top
    key = (schema, id(self.c))
    if key not in self._sensitivity_reports:
      self._sensitivity_reports[key] = participation.sensitivity_report(
          self.c, schema, gram=self.gram_of_encoder())
    return dict(self._sensitivity_reports[key])

  def gram_of_encoder(self):
    """C's ``participation.bounds.Gram`` (CᵀC computed on first use), shared by its
    sensitivity analyses under every schema."""
    from tff_mf.participation import bounds  # pylint: disable=g-import-not-at-top
    c = self.c
    if self._gram is None or self._gram[0] != id(c):
      self._gram = (id(c), bounds.Gram(c, column=self.encoder_column()))
    return self._gram[1]

  def encoder_column(self) -> Optional[np.ndarray]:
    """C's first column where C is known to be lower-triangular Toeplitz, else None."""
    return None

  def gram_bytes(self) -> int:
    return 0 if self._gram is None else self._gram[1].nbytes

  def resident_bytes(self) -> int:
    """The bytes of its matrices held in memory (A, B, C and a computed CᵀC)."""
    return int(self.a.nbytes + self.b.nbytes + self.c.nbytes + self.gram_bytes())

  def per_round_variance(self) -> np.ndarray:
    return per_round_variance(self.b, self.c)

  def noise_matrix(self) -> np.ndarray:
    """N = A⁻¹·B (n x m): round i of a residual-form query adds row i of N·Z.

    For square C this equals C⁻¹ (``docs/mechanisms.md``).
    """
    return scipy.linalg.solve_triangular(self.a, self.b, lower=True)

  def validate(self, atol: float = 1e-8, name: str = "factorization") -> "Factorization":
    """Every check of ``checks.factors``: shapes, dtype, triangularity, γ(C) = 1, B·C = A."""
    checks.factors(self.a, self.b, self.c, name=name, atol=atol)
    return self


def summary(f: Factorization, lower_bound: Optional[bool] = True) -> Dict[str, Any]:
  """A JSON-ready dict of the quality measures of ``f`` (single participation)."""
  out = {
      "strategy": f.strategy,
      "n": f.n,
      "m": f.m,
      "single_participation_loss": f.single_participation_loss,
      "single_participation_sqrt_loss": f.single_participation_sqrt_loss,
      "max_round_variance": float(np.max(f.per_round_variance())),
  }
  if lower_bound:
    out["lower_bound_prop_c1"] = lower_bound_prop_c1(f.a)
    out["lower_bound_nuclear"] = lower_bound_nuclear(f.a)
  out.update(f.info)
  return out
