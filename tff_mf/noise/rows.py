"""Round i's noise row σ·(N·Z)[i] of a resolved mechanism, in numpy (no flwr, no TF): the one
numpy noise source every framework but TensorFlow's draws from (the TF kernel,
``tff_mf.tf.noise``, is its bit-exact twin with ``exact=True``).

N = A⁻¹·B (C⁻¹ for square C) of the factorization the core resolved (Denisov et al. 2022,
arXiv:2202.08312, Algorithm 1 and App I); Z is drawn row by row from a secret seed pair as
the TF aggregator draws it (``tff_mf.noise.philox``), so a Flower run and a TFF run with
the same seed and mechanism add the same noise. A linear-noise mechanism runs its
``LinearStream`` (k model-sized rows of state, float64); any other matrix mechanism
regenerates the Z rows that row i of N needs. Going past round n raises.

``exact=True`` reproduces the TF aggregator's arithmetic as well as its draws: Z through the
C library (``philox``), a stream's recurrence in float32 with the coefficients cast as TF
casts them and each sum taken left to right (``tf.add_n``), a dense row accumulated in
float64 in the order of N's nonzeros and cast once. Its rows are then the TF query's bit
for bit on the same machine, for the same factorization (N's last bits come from the BLAS
that solved for it: load both from the same cache).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import scipy.linalg

from tff_mf import checks
from tff_mf.noise import philox
from tff_mf.noise import keys


def seed_pair(noise_seed: Optional[keys.Seed]) -> np.ndarray:
  """The int64 [2] seed pair (``tff_mf.noise.keys``): a pinned integer's (seed, tag), as the
  TF layer's, so both add the same Z; else both words a fresh secret from OS entropy."""
  return keys.seed_pair(noise_seed)


class NoiseRows:
  """σ·(N·Z)[i] for i = 0, 1, …, n − 1, from a seed pair; ``state``/``restore`` carry it.
  ``resolved``: a ``tff_mf.mechanisms.Resolved`` (its factorization, stream and n).

  Attributes:
    n: rounds. linear: whether the mechanism's ``LinearStream`` produces the rows.
  """

  def __init__(self, resolved, shapes: Sequence[Tuple[int, ...]],
               seed: np.ndarray, exact: bool = False):
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
    self.exact = bool(exact)
    # Which coefficients the TF kernel applies (nonzero in some round), fixed at build time.
    self._support = self.stream.support() if self.linear and self.exact else None
    self.round = 0
    self.stream_state = (np.zeros((self.stream.k, self.d),
                                  np.float32 if self.exact else np.float64)
                         if self.linear else None)

  def z_row(self, j: int) -> np.ndarray:
    """Z̃[j] flat: float32 with ``exact``, else float64 of the float32 draw."""
    z = np.concatenate([p.ravel() for p in philox.standard_normal_row(
        self.seed, j, self.shapes, self.exact)])
    return z if self.exact else z.astype(np.float64)

  def next(self, stddev: float) -> List[np.ndarray]:
    """The next round's σ·(N·Z)[i] shaped like the model (then i += 1): float64 arrays, or
    with ``exact`` TF's float32 rows."""
    i = self.round
    if i >= self.n:
      raise checks.CheckError(f"round {i + 1} is past the n={self.n} rounds this mechanism "
                              "was built for; build one for more rounds")
    stddev = float(stddev)
    if self.linear and self.exact:
      y, self.stream_state = _tf_stream_step(self.stream, self._support, self.stream_state,
                                             self.z_row(i), i, stddev)
    elif self.linear:
      y, self.stream_state = self.stream.step(self.stream_state, self.z_row(i), i)
      y = stddev * y
    elif self.exact:  # as tff_mf.tf.noise.DenseNoise: float64 a + (N[i, j]·σ)·Z̃[j], cast once
      row = self.matrix[i]
      y = np.zeros(self.d)
      for j in np.flatnonzero(row):
        y += (row[j] * stddev) * self.z_row(int(j)).astype(np.float64)
      y = y.astype(np.float32)
    else:
      row = self.matrix[i]
      y = np.zeros(self.d)
      for j in np.flatnonzero(row):
        y += row[j] * self.z_row(int(j))
      y = stddev * y
    self.round = i + 1
    return self.split(y)

  def split(self, flat: np.ndarray) -> List[np.ndarray]:
    parts = np.split(flat, np.cumsum(self.sizes)[:-1])
    return [p.reshape(s) for p, s in zip(parts, self.shapes)]

  def state(self) -> Dict[str, np.ndarray]:
    out = {"noise_seed": self.seed.copy(), "noise_round": np.array([self.round], np.int64),
           "noise_exact": np.array([self.exact], np.int64)}
    if self.linear:
      out["noise_stream_state"] = self.stream_state.copy()
    return out

  def restore(self, state) -> None:
    seed = np.asarray(state["noise_seed"], np.int64)
    if seed.shape != (2,):
      raise checks.CheckError(f"the saved noise seed has shape {seed.shape}, expected (2,)")
    self.seed = seed.copy()
    exact = bool(np.asarray(state.get("noise_exact", [0]))[0])
    if exact != self.exact:
      raise checks.CheckError(f"the saved run drew its noise with exact={exact}, this one with "
                              f"exact={self.exact}; continue it as it was started")
    self.round = int(np.asarray(state["noise_round"])[0])
    if self.linear:
      s = np.asarray(state["noise_stream_state"], self.stream_state.dtype)
      if s.shape != self.stream_state.shape:
        raise checks.CheckError(f"the saved noise stream state has shape {s.shape}, this "
                                f"model's {self.stream_state.shape}")
      self.stream_state = s.copy()


def add_n_blocks(first: int, count: int) -> List[List[int]]:
  """How TensorFlow's graph runs a ``tf.add_n`` of ``count`` products, the kernel's products
  number ``first`` to ``first + count − 1`` in creation order: their positions (0 to
  count − 1) in the blocks summed. Grappler's arithmetic optimizer sorts the inputs of the
  commutative AddN by node name, the products being named ``mul``, ``mul_1``, … in the order
  the kernel creates them (so ``mul_10`` comes before ``mul_2``); the CPU kernel then sums the
  first block (r inputs, r = count mod 8, or 8 when that is 0, 9 when it is 1) left to right
  and adds each further block of 8, itself summed left to right, to that total (``AddNOp``:
  ``Add<r>Functor``, then ``Add8pFunctor``)."""
  ordered = sorted(range(count), key=lambda e: "mul" if first + e == 0 else f"mul_{first + e}")
  head = count % 8 or 8
  if head == 1 and count > 1:
    head = 9
  return [ordered[:head]] + [ordered[s:s + 8] for s in range(head, count, 8)]


def _add_n(first: int, terms: List[np.ndarray], like: np.ndarray) -> np.ndarray:
  """A ``tf.add_n`` of ``terms``, the kernel's products ``first``, ``first + 1``, … (creation
  order), as TensorFlow sums them (``add_n_blocks``)."""
  if not terms:
    return np.zeros_like(like)
  out = None
  for block in add_n_blocks(first, len(terms)):
    part = terms[block[0]]
    for j in block[1:]:
      part = part + terms[j]
    out = part if out is None else out + part
  return out


def _tf_stream_step(stream, sup, state: np.ndarray, z: np.ndarray, i: int, stddev: float):
  """``tff_mf.tf.noise.LinearNoise``'s round in numpy float32: the tables cast to float32
  (the output's scaled by σ in float64 first), every coefficient that is nonzero in some
  round (``sup``: ``stream.support()``, fixed at build time as TF's kernel fixes it) applied,
  each sum in the order the TF graph takes it (``_add_n``). ``state``: k x d float32."""
  f, g, w_old, w_new, c = stream.tables(i)
  f32, g32 = f.astype(np.float32), g.astype(np.float32)
  w_old32, w_new32 = (w_old * stddev).astype(np.float32), (w_new * stddev).astype(np.float32)
  c32 = np.float32(c * stddev)
  made = 0  # the kernel's products so far (their names' numbers)
  new = [None] * stream.k
  for l in range(stream.k):
    m = stream.copies[l]
    if m >= 0:
      new[l] = state[m]
      continue
    terms = [f32[l, m] * state[m] for m in range(stream.k) if sup["f"][l, m]]
    if sup["g"][l]:
      terms.append(g32[l] * z)
    new[l] = _add_n(made, terms, z)
    made += len(terms)
  terms = [w_old32[m] * state[m] for m in range(stream.k) if sup["w_old"][m]]
  terms += [w_new32[m] * new[m] for m in range(stream.k) if sup["w_new"][m]]
  if sup["c"]:
    terms.append(c32 * z)
  return _add_n(made, terms, z), np.stack(new) if stream.k else state


# The TF query's tag of the count noise stream (adaptive clipping): fold_in(seed, tag), then i.
COUNT_NOISE_TAG = -1


def count_noise(seed: np.ndarray, i: int) -> float:
  """The unit-variance normal the TF adaptive-clipping query adds to round i's count."""
  return philox.standard_normal_float64(
      philox.fold_in(philox.fold_in(seed, COUNT_NOISE_TAG), int(i)))
