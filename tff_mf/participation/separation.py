"""Maxima over index sets with a minimum separation (numpy core, no TensorFlow).

The dynamic program behind min-sep sensitivities (Choquette-Choo et al. 2023,
arXiv:2306.08153, Alg. 3 and the two stages of Alg. 4): the largest sum of at most k
entries of a vector whose indices are pairwise at least ``sep`` apart. Used by
``tff_mf.participation`` on dense CᵀC and by ``tff_mf.factorization.toeplitz_ops`` on its band.
"""

from __future__ import annotations

from typing import Tuple

import numpy as np


def separated_max(w: np.ndarray, sep: int, k: int) -> np.ndarray:
  """max Σ_{t∈P} w[..., t] over sets P of ≤ k indices pairwise ≥ sep apart (last axis).

  Dynamic program of arXiv:2306.08153 Alg. 3, vectorized over leading axes; O(n·k). Where
  the cap cannot bind (k ≥ ⌈n/sep⌉, the most indices sep apart that fit), its fixed point in
  one backward pass, O(n): F[i] = max(w[i] + F[i + sep], F[i + 1]), the same maxima of the
  same sums (each set's sum taken from its last index back, in both), bit for bit.
  """
  w = np.asarray(w, dtype=np.float64)
  n = w.shape[-1]
  if k >= -(-n // sep):
    return _uncapped_max(w, sep)
  return _capped_max(w, sep, k)


def _capped_max(w: np.ndarray, sep: int, k: int) -> np.ndarray:
  """``separated_max`` by k rounds of the capped dynamic program (any k)."""
  n = w.shape[-1]
  f = np.zeros(w.shape[:-1] + (n + sep,))
  for _ in range(k):
    g = np.zeros_like(f)
    g[..., :n] = np.maximum(w + f[..., sep:sep + n], f[..., :n])
    f = np.flip(np.maximum.accumulate(np.flip(g, -1), axis=-1), -1)
  return f[..., 0]


def _uncapped_max(w: np.ndarray, sep: int) -> np.ndarray:
  """``separated_max`` without a cap: one backward pass over the last axis."""
  n = w.shape[-1]
  rows = np.ascontiguousarray(np.moveaxis(w, -1, 0))
  f = np.zeros((n + sep,) + w.shape[:-1])
  for i in range(n - 1, -1, -1):
    f[i] = np.maximum(rows[i] + f[i + sep], f[i + 1])
  return f[0]


def separated_argmax(w: np.ndarray, sep: int, k: int) -> Tuple[float, Tuple[int, ...]]:
  """``separated_max`` of a vector and a set attaining it."""
  w = np.asarray(w, dtype=np.float64)
  n = w.shape[0]
  tables = [np.zeros(n + sep + 1)]
  for _ in range(k):
    f = tables[-1]
    g = np.zeros(n + sep + 1)
    g[:n] = np.maximum(w + f[sep:sep + n], f[:n])
    tables.append(np.maximum.accumulate(g[::-1])[::-1])
  chosen = []
  i, j = 0, k
  while j > 0 and i < n:
    if tables[j][i] <= 0:
      break
    if w[i] + tables[j - 1][i + sep] >= tables[j][i] and w[i] > 0:
      chosen.append(i)
      i += sep
      j -= 1
    elif tables[j - 1][i] >= tables[j][i]:
      j -= 1
    else:
      i += 1
  return float(tables[k][0]), tuple(chosen)
