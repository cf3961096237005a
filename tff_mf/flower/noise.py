"""Round i's noise row σ·(N·Z)[i] of a resolved mechanism, in numpy (no flwr, no TF).

N = A⁻¹·B (C⁻¹ for square C) of the factorization the core resolved (Denisov et al. 2022,
arXiv:2202.08312, Algorithm 1 and App I); Z is drawn row by row from a secret seed pair as
the TF aggregator draws it (``tff_mf.flower.philox``), so a Flower run and a TFF run with
the same seed and mechanism add the same noise. A linear-noise mechanism runs its
``LinearStream`` (k model-sized rows of state, float64); any other matrix mechanism
regenerates the Z rows that row i of N needs. Going past round n raises.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import scipy.linalg

from tff_mf import checks
from tff_mf import entropy
from tff_mf import mechanisms
from tff_mf.flower import philox

# Second word of a pinned seed pair: the TF layer's tag ("mf_noise"), so a pinned integer
# seed gives both layers the same Z.
SEED_TAG = 0x6D665F6E6F697365


def seed_pair(noise_seed: Optional[int]) -> np.ndarray:
  """The int64 [2] seed pair: the pinned seed's, else a fresh secret from OS entropy."""
  value = entropy.new_seed("noise-seed") if noise_seed is None else checks.seed(noise_seed)
  return np.array([value, SEED_TAG], dtype=np.int64)


class NoiseRows:
  """σ·(N·Z)[i] for i = 0, 1, …, n − 1, from a seed pair; ``state``/``restore`` carry it.

  Attributes:
    n: rounds. linear: whether the mechanism's ``LinearStream`` produces the rows.
  """

  def __init__(self, resolved: mechanisms.Resolved, shapes: Sequence[Tuple[int, ...]],
               seed: np.ndarray):
    if resolved.factorization is None or resolved.encoder is None:
      raise checks.CheckError(f"mechanism {resolved.mechanism.name!r} has no matrix "
                              "factorization to add noise for; the Flower layer runs matrix "
                              "mechanisms (and independent noise)")
    self.n = resolved.n
    self.shapes = [tuple(int(x) for x in s) for s in shapes]
    self.sizes = [int(np.prod(s, dtype=np.int64)) for s in self.shapes]
    self.d = int(sum(self.sizes))
    self.seed = np.asarray(seed, np.int64).copy()
    self.stream = resolved.stream
    self.linear = self.stream is not None
    f = resolved.factorization
    self.matrix = None if self.linear else (
        f.noise_matrix() if f.m != f.n else
        scipy.linalg.solve_triangular(f.c, np.eye(f.n), lower=True))
    self.round = 0
    self.stream_state = np.zeros((self.stream.k, self.d)) if self.linear else None

  def z_row(self, j: int) -> np.ndarray:
    """Z̃[j] flat (float64 of the float32 draw)."""
    return np.concatenate([p.ravel() for p in philox.standard_normal_row(
        self.seed, j, self.shapes)]).astype(np.float64)

  def next(self, stddev: float) -> List[np.ndarray]:
    """The next round's σ·(N·Z)[i] as float64 arrays shaped like the model (then i += 1)."""
    i = self.round
    if i >= self.n:
      raise checks.CheckError(f"round {i + 1} is past the n={self.n} rounds this mechanism "
                              "was built for; build one for more rounds")
    if self.linear:
      y, self.stream_state = self.stream.step(self.stream_state, self.z_row(i), i)
    else:
      row = self.matrix[i]
      y = np.zeros(self.d)
      for j in np.flatnonzero(row):
        y += row[j] * self.z_row(int(j))
    self.round = i + 1
    return self.split(float(stddev) * y)

  def split(self, flat: np.ndarray) -> List[np.ndarray]:
    parts = np.split(flat, np.cumsum(self.sizes)[:-1])
    return [p.reshape(s) for p, s in zip(parts, self.shapes)]

  def state(self) -> Dict[str, np.ndarray]:
    out = {"noise_seed": self.seed.copy(), "noise_round": np.array([self.round], np.int64)}
    if self.linear:
      out["noise_stream_state"] = self.stream_state.copy()
    return out

  def restore(self, state) -> None:
    seed = np.asarray(state["noise_seed"], np.int64)
    if seed.shape != (2,):
      raise checks.CheckError(f"the saved noise seed has shape {seed.shape}, expected (2,)")
    self.seed = seed.copy()
    self.round = int(np.asarray(state["noise_round"])[0])
    if self.linear:
      s = np.asarray(state["noise_stream_state"], np.float64)
      if s.shape != self.stream_state.shape:
        raise checks.CheckError(f"the saved noise stream state has shape {s.shape}, this "
                                f"model's {self.stream_state.shape}")
      self.stream_state = s.copy()


# The TF query's tag of the count noise stream (adaptive clipping): fold_in(seed, tag), then i.
COUNT_NOISE_TAG = -1


def count_noise(seed: np.ndarray, i: int) -> float:
  """The unit-variance normal the TF adaptive-clipping query adds to round i's count."""
  return philox.standard_normal_float64(
      philox.fold_in(philox.fold_in(seed, COUNT_NOISE_TAG), int(i)))
