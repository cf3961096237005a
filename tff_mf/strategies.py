"""How A = B·C is chosen: one entry point for every strategy (numpy core).

``factorize(spec)`` builds the workload A of ``spec`` and returns a normalized
``Factorization`` (γ(C) = 1, Denisov et al. App I). Strategies:

- ``optimal``: fixed point φ of Denisov Eq. 5 with the Eq. 8 certificate
  (``tff_mf.families.dense``).
- ``honaker_online`` / ``honaker_full``: binary tree C_T with the streaming /
  full Honaker decoders (McMahan Sec 2.1, Prop 2.1). For a workload A other
  than S the decoder is post-processed, B = A·S⁻¹·B_tree (Denisov Table 1).
- ``identity``: C = I, B = A (independent noise each round).
- ``structured``: banded + low-rank B̂ with C = B̂⁻¹·A (Denisov App H,
  ``tff_mf.structured``).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Optional

import numpy as np

from tff_mf import factorization as fz
from tff_mf import tree
from tff_mf import workloads

STRATEGIES = ("optimal", "honaker_online", "honaker_full", "identity", "structured")
DEFAULT_TARGET_GAP = 1e-6


@dataclasses.dataclass(frozen=True)
class FactorizationSpec:
  """Everything that determines a factorization; its fields form the cache key."""
  workload: workloads.WorkloadSpec
  strategy: str = "optimal"
  target_gap: float = DEFAULT_TARGET_GAP  # optimal: relative duality gap to reach
  max_iterations: int = 10_000  # optimal: iteration limit
  allow_unconverged: bool = False  # optimal: opt-in to return a result above target_gap
  bands: int = 0  # structured: h
  rank: int = 0  # structured: r

  @property
  def n(self) -> int:
    return self.workload.n

  def validate(self) -> None:
    if self.strategy not in STRATEGIES:
      raise ValueError(f"unknown strategy {self.strategy!r}; expected one of {STRATEGIES}")
    if self.strategy == "optimal" and not (0 < self.target_gap < 1):
      raise ValueError(f"target_gap must be in (0, 1), got {self.target_gap}")
    if self.strategy == "structured" and (self.bands < 1 or self.rank < 0):
      raise ValueError(
          f"structured needs bands >= 1 and rank >= 0, got bands={self.bands}, rank={self.rank}")


def factorize(spec: FactorizationSpec, progress: bool = False) -> fz.Factorization:
  """Computes the factorization described by ``spec`` (normalized, validated)."""
  spec.validate()
  a = spec.workload.build()
  n = a.shape[0]
  start = time.perf_counter()
  info = {}
  if spec.strategy == "identity":
    b, c = a.copy(), np.eye(n)
  elif spec.strategy in ("honaker_online", "honaker_full"):
    c = tree.tree_encoder(n)
    if spec.strategy == "honaker_online":
      b_tree = tree.honaker_online_decoder(n)
    else:
      b_tree = tree.honaker_full_decoder(n)
    b = post_process_prefix_decoder(a, b_tree)
  elif spec.strategy == "optimal":
    from tff_mf.families import dense  # pylint: disable=g-import-not-at-top
    result = dense.solve(a, target_gap=spec.target_gap, max_iterations=spec.max_iterations,
                           allow_unconverged=spec.allow_unconverged, progress=progress)
    b, c = result.b, result.c
    info.update(result.info)
  elif spec.strategy == "structured":
    from tff_mf import structured  # pylint: disable=g-import-not-at-top
    result = structured.fit(a, bands=spec.bands, rank=spec.rank, progress=progress,
                            target_gap=spec.target_gap, max_iterations=spec.max_iterations,
                            allow_unconverged=spec.allow_unconverged)
    b, c = result.b, result.c
    info.update(result.info)
  else:  # pragma: no cover - validate() rejects this
    raise ValueError(spec.strategy)
  b, c, gamma = fz.normalize(b, c)
  info["sensitivity_before_normalization"] = gamma
  info.setdefault("seconds", time.perf_counter() - start)
  return fz.Factorization(a=a, b=b, c=c, strategy=spec.strategy, info=info).validate()


def post_process_prefix_decoder(a: np.ndarray, b_prefix: np.ndarray) -> np.ndarray:
  """B = A·S⁻¹·B_prefix: turns a prefix-sum decoder into one for workload A.

  S⁻¹ is the first-difference operator, so S⁻¹·B_prefix has rows
  B_prefix[i] − B_prefix[i−1] (Denisov et al. Sec 4, "momentum as
  post-processing").
  """
  diffs = np.diff(b_prefix, axis=0, prepend=np.zeros((1, b_prefix.shape[1])))
  return a @ diffs
