"""Strategy families: each module owns the math of one family of encoders C (numpy core).

A family module exposes ``VERSION`` (part of cache keys), ``factorize(a, spec,
context) -> FamilyResult`` (an unnormalized B, C with B·C = A, JSON-ready info and
the float64 parameters the cache stores beside A, B and C), optionally
``check_extras(factorization)`` (its parameters rebuild its matrices) and, when the
family streams its noise, ``stream(extras, a) -> tff_mf.streams.LinearStream``
rebuilding the stream from those parameters, and ``CACHED = False`` when mechanisms
should rebuild it rather than load it from the cache (closed forms).
``tff_mf.registry.STRATEGIES`` names each strategy's family and ``tff_mf.strategies``
dispatches to the modules, then normalizes and validates what a family returns. This package module holds only the
types the families share.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Optional

import numpy as np

from tff_mf import checks


@dataclasses.dataclass
class FamilyResult:
  """What a family computes for one workload A (not yet normalized)."""
  b: np.ndarray
  c: np.ndarray
  info: Dict[str, Any] = dataclasses.field(default_factory=dict)
  extras: Dict[str, np.ndarray] = dataclasses.field(default_factory=dict)

  def normalized(self) -> "FamilyResult":
    """(γ·B, C/γ) with γ = γ(C): C's largest column norm becomes 1 (Denisov et al. 2022,
    arXiv:2202.08312, App I). The extras keep describing the unnormalized C; γ is added
    to them as ``normalization`` so the stream is rebuilt for the normalized C."""
    gamma = checks.gamma(self.c)
    if not np.isfinite(gamma) or gamma <= 0:
      raise checks.CheckError(f"C has invalid largest column norm γ = {gamma}")
    info = dict(self.info, gamma_before_normalization=gamma)
    extras = dict(self.extras, normalization=np.array([gamma]))
    return FamilyResult(b=self.b * gamma, c=self.c / gamma, info=info, extras=extras)


@dataclasses.dataclass(frozen=True)
class Context:
  """What a family may need besides A: the optimal decoder for A (structured)."""
  optimal: Optional[Callable[[], Any]] = None
  progress: bool = False
