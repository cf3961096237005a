"""Streaming noise for residual-form matrix mechanisms (TensorFlow layer).

A matrix mechanism A = B·C (``docs/notation.md``) run as a residual query adds,
in round i, row i of N·Z with N = A⁻¹·B (n x m) and Z (m x d) i.i.d. Gaussian
(Denisov et al. Algorithm 1 and App I, ``001_…``/``000_…``; see
``docs/mechanisms.md`` for why the server optimizer then releases exactly
−(A·G + B·Z)). For square C, N = C⁻¹.

Every implementation sits behind one interface, ``StreamingNoise``:

- ``DenseNoise``: row i regenerates the Z rows it needs from (secret seed, row
  index) with a stateless RNG; time ∝ nonzeros of N[i], memory O(d). This is
  the "compute (BZ)[i] afresh each round" of Denisov App I.
- ``StructuredNoise``: B̂ = D(h) + (U·Vᵀ) ⊙ U(h) (banded + low rank, Denisov
  App H, Algorithm 3) with O((h+r)·d) time and memory per round; Z rows are
  each drawn once and kept in a ring buffer, the low-rank sum in a whitened
  basis so that it needs no more than float32.
- ``PrecomputedNoise``: all rows of N·Z computed up front (small d, tests).

Z row j of a model with variables v_0..v_{k-1} is drawn as
``stateless_normal(shape(v_t), seed=fold_in(fold_in(seed, j), t))`` with the
Philox algorithm pinned, so every implementation (and a numpy reference, via
``standard_normal_row``) sees the same Z for the same seed. Z is drawn in the
variables' dtype (float32); coefficients are computed in float64. ``DenseNoise``
also accumulates in float64 and casts each noise row once to the variables'
dtype; ``StructuredNoise`` runs in the variables' dtype (see its docstring).

The state of a stream (its buffers) is a plain structure of tensors, so TFF and
``tff.program`` can checkpoint it; restoring continues the identical stream.
"""

from __future__ import annotations

import abc
from typing import Any, Sequence, Tuple

import numpy as np
import scipy.linalg
import tensorflow as tf

from tff_mf import factorization as fz

PHILOX = tf.random.Algorithm.PHILOX


class NoiseError(ValueError):
  """Matrices or specs given to a streaming-noise implementation are invalid."""


def flat_specs(specs) -> list:
  """The leaves of a (nested) TensorSpec structure, checked to be float and fully defined."""
  leaves = tf.nest.flatten(specs)
  if not leaves:
    raise NoiseError("record specs are empty; expected the model's trainable variable specs")
  out = []
  for k, s in enumerate(leaves):
    if not isinstance(s, tf.TensorSpec):
      raise NoiseError(f"record spec #{k} is {type(s).__name__}, expected tf.TensorSpec")
    if not s.shape.is_fully_defined():
      raise NoiseError(f"record spec #{k} has a partially unknown shape {s.shape}")
    if not s.dtype.is_floating:
      raise NoiseError(f"record spec #{k} has non-float dtype {s.dtype.name}")
    out.append(s)
  return out


def standard_normal_row(seed, row, specs) -> list:
  """Z̃[row] as a flat list of tensors shaped like ``specs`` (unit variance).

  ``seed`` is an int64 tensor of shape [2]; ``row`` an integer (tensor). The
  draw depends only on (seed, row, position of the variable), never on the
  round in which it is made.
  """
  seed = tf.convert_to_tensor(seed, tf.int64)
  row_seed = tf.random.experimental.stateless_fold_in(seed, tf.cast(row, tf.int64), alg=PHILOX)
  out = []
  for t, spec in enumerate(flat_specs(specs)):
    var_seed = tf.random.experimental.stateless_fold_in(row_seed, t, alg=PHILOX)
    out.append(tf.random.stateless_normal(spec.shape, seed=var_seed, dtype=spec.dtype, alg=PHILOX))
  return out


def standard_normal_matrix(seed, rows: int, specs) -> np.ndarray:
  """Z̃ (rows x d) in float64, each row the concatenation of ``standard_normal_row`` (eager).

  For tests and ``PrecomputedNoise``: the numpy reference of the TF stream.
  """
  seed = tf.constant(np.asarray(seed, dtype=np.int64))
  out = []
  for j in range(rows):
    parts = standard_normal_row(seed, j, specs)
    out.append(np.concatenate([np.asarray(p, dtype=np.float64).ravel() for p in parts]))
  return np.stack(out)


def seed_pair(noise_seed: int) -> np.ndarray:
  """The int64 [2] seed tensor value for a pinned integer seed."""
  if isinstance(noise_seed, bool) or not isinstance(noise_seed, (int, np.integer)):
    raise NoiseError(f"noise_seed must be an integer, got {noise_seed!r}")
  if not 0 <= int(noise_seed) < 2**63:
    raise NoiseError(f"noise_seed must be in [0, 2**63), got {noise_seed}")
  return np.array([int(noise_seed), 0x6D665F6E6F697365], dtype=np.int64)  # "mf_noise"


def _check_noise_matrix(noise_matrix) -> np.ndarray:
  """A float64 n x m noise matrix N with m >= n; lower triangular and non-singular when square."""
  nm = _check_matrix(noise_matrix, "noise matrix N")
  n, m = nm.shape
  if m < n:
    raise NoiseError(f"noise matrix N has {m} columns for {n} rounds; expected m >= n")
  if m == n:
    _check_lower_triangular_nonsingular(nm, "noise matrix N")
  return nm


def _check_matrix(x, name: str) -> np.ndarray:
  x = np.asarray(x)
  if x.ndim != 2:
    raise NoiseError(f"{name} must be a 2-D matrix, got shape {x.shape}")
  if not np.issubdtype(x.dtype, np.number):
    raise NoiseError(f"{name} must be numeric, got dtype {x.dtype}")
  x = x.astype(np.float64)
  if not np.all(np.isfinite(x)):
    raise NoiseError(f"{name} has non-finite entries")
  return x


def _check_lower_triangular_nonsingular(x: np.ndarray, name: str) -> None:
  if x.shape[0] != x.shape[1]:
    raise NoiseError(f"{name} must be square, got shape {x.shape}")
  upper = np.triu(x, 1)
  if np.any(upper != 0):
    i, j = np.argwhere(upper != 0)[0]
    raise NoiseError(f"{name} must be lower triangular; entry [{i}, {j}] = {x[i, j]:g} "
                     "is above the diagonal")
  diag = np.abs(np.diag(x))
  scale = max(float(np.max(np.abs(x))), 1e-300)
  if np.any(diag <= 1e-12 * scale):
    i = int(np.argmin(diag))
    raise NoiseError(f"{name} is singular: diagonal entry [{i}, {i}] = {x[i, i]:g}")


def encoder_is_causal(c: np.ndarray) -> bool:
  """C (m x n, rows in release order) only reads rounds already seen: C[r, j] = 0 for j > r."""
  return fz.is_lower_triangular(c, atol=1e-12 * max(1.0, float(np.max(np.abs(c)))))


class StreamingNoise(abc.ABC):
  """Round i's noise row (N·Z)[i], N = A⁻¹·B, for Z ~ N(0, σ²) seeded by a secret seed.

  Attributes:
    n: rounds the mechanism is built for (rows of N).
    m: rows of Z (columns of N).
    sensitivity: γ(C) of the mechanism this noise realizes (1 when normalized).
  """
  n: int
  m: int
  sensitivity: float

  @abc.abstractmethod
  def noise_matrix(self) -> np.ndarray:
    """N (n x m, float64) with unit-variance Z: the reference for tests."""

  @abc.abstractmethod
  def initial_buffers(self, specs) -> Tuple[Any, ...]:
    """The stream's buffers before round 0 (a tuple of tensors; () when stateless)."""

  @abc.abstractmethod
  def noise_row(self, seed, round_index, buffers, specs, stddev: float):
    """Returns (flat list of noise tensors for round ``round_index``, new buffers).

    ``seed``: int64 [2] tensor; ``round_index``: int32 scalar tensor in [0, n);
    ``stddev``: σ = noise multiplier × clip (a Python float).
    """

  def state_bytes(self, specs) -> int:
    """Bytes of buffer state carried between rounds (excluding round index and seed)."""
    d = sum(int(np.prod(s.shape)) * s.dtype.size for s in flat_specs(specs))
    return self.buffer_rows() * d

  def buffer_rows(self) -> int:
    """How many model-sized rows the buffers hold."""
    return 0

  def describe(self) -> str:
    return type(self).__name__


class DenseNoise(StreamingNoise):
  """Dense seeded regeneration: row i = Σ_j N[i, j]·σ·Z̃[j], Z̃[j] regenerated from (seed, j).

  Cost ∝ nonzeros of N[i] Gaussian draws of size d; state: none beyond the seed
  (Denisov et al. App I, ``000_…``). N is stored in CSR form (float64 values).
  """

  def __init__(self, noise_matrix: np.ndarray, sensitivity: float = 1.0):
    nm = _check_noise_matrix(noise_matrix)
    n, m = nm.shape
    nonzero = nm != 0
    empty = np.flatnonzero(~np.any(nonzero, axis=1))
    if empty.size:
      raise NoiseError(f"noise matrix N has an all-zero row {int(empty[0])}: that round would "
                       "add no noise")
    self.n, self.m = int(n), int(m)
    self.sensitivity = float(sensitivity)
    self._n_matrix = nm
    counts = np.sum(nonzero, axis=1)
    self._row_ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    rows, cols = np.nonzero(nonzero)
    del rows
    self._cols = cols.astype(np.int32)
    self._vals = nm[nonzero]  # row-major order matches np.nonzero

  @classmethod
  def from_factorization(cls, f: fz.Factorization) -> "DenseNoise":
    return cls(f.noise_matrix(), sensitivity=f.sensitivity)

  def noise_matrix(self) -> np.ndarray:
    return self._n_matrix.copy()

  def row_nonzeros(self, i: int) -> int:
    return int(self._row_ptr[i + 1] - self._row_ptr[i])

  def initial_buffers(self, specs):
    return ()

  def noise_row(self, seed, round_index, buffers, specs, stddev):
    specs = flat_specs(specs)
    row_ptr = tf.constant(self._row_ptr)
    cols = tf.constant(self._cols)
    vals = tf.constant(self._vals * float(stddev))  # float64
    i = tf.cast(round_index, tf.int64)
    start, end = row_ptr[i], row_ptr[i + 1]
    acc0 = [tf.zeros(s.shape, tf.float64) for s in specs]

    def body(k, acc):
      z = standard_normal_row(seed, cols[k], specs)
      coef = vals[k]
      return k + 1, [a + coef * tf.cast(zz, tf.float64) for a, zz in zip(acc, z)]

    _, acc = tf.while_loop(lambda k, acc: k < end, body, (start, acc0),
                           parallel_iterations=1)
    return [tf.cast(a, s.dtype) for a, s in zip(acc, specs)], buffers

  def describe(self):
    return f"DenseNoise(n={self.n}, m={self.m}, nnz={self._vals.size})"


def structured_decoder(bands_matrix: np.ndarray, u: np.ndarray, v: np.ndarray,
                       bands: int) -> np.ndarray:
  """B̂ = D(h) + (U·Vᵀ) ⊙ U(h) (Denisov et al. App H): U·Vᵀ below the h-th diagonal."""
  n = bands_matrix.shape[0]
  low = np.tril(np.asarray(u, np.float64) @ np.asarray(v, np.float64).T, -bands) if n else 0
  return np.asarray(bands_matrix, np.float64) + low


def structured_pieces(b_hat: np.ndarray, bands: int, rank: int, rtol: float = 1e-8):
  """(D(h), U, V) with B̂ = D(h) + (U·Vᵀ) ⊙ U(h), recovered from a dense structured B̂.

  Cache entries store B̂ densely; its part below the h-th diagonal has rank r
  by construction (Denisov App H), so an exact factorization exists. V on the
  columns j ≤ n−p−h comes from the SVD of the fully known block of the last p
  rows; U[i] and the remaining V[j] then solve small least-squares problems on
  the known entries only. Raises NoiseError if the result does not reproduce
  B̂ to ``rtol`` (B̂ is then not banded + rank r).
  """
  b_hat = _check_matrix(b_hat, "structured decoder B̂")
  n = b_hat.shape[0]
  h, r = int(bands), int(rank)
  d_mat = np.tril(np.triu(b_hat, -(h - 1)))
  u = np.zeros((n, r))
  v = np.zeros((n, r))
  if r and n > h:
    p = min(n - h, max(r, n // 4))
    c = n - p - h + 1  # columns j < c are known in every row i >= n - p
    if c < r:
      p, c = n - h, 1
    block = b_hat[n - p:, :c]
    _, _, vt = np.linalg.svd(block, full_matrices=False)
    v[:c] = vt[:r].T if vt.shape[0] >= r else np.pad(vt.T, ((0, 0), (0, r - vt.shape[0])))
    for i in range(h, n):
      cols = min(i - h + 1, c)
      u[i] = np.linalg.lstsq(v[:cols], b_hat[i, :cols], rcond=None)[0]
    for j in range(c, n - h):
      rows = np.arange(j + h, n)
      v[j] = np.linalg.lstsq(u[rows], b_hat[rows, j], rcond=None)[0]
  rebuilt = structured_decoder(d_mat, u, v, h)
  err = float(np.max(np.abs(rebuilt - np.tril(b_hat))))
  scale = max(1.0, float(np.max(np.abs(b_hat))))
  if err > rtol * scale or np.any(np.triu(b_hat, 1) != 0):
    raise NoiseError(f"B̂ is not {h}-banded plus rank {r} below the band (reconstruction "
                     f"error {err:.3g})")
  return d_mat, u, v


class StructuredNoise(StreamingNoise):
  """Banded + low-rank B̂ (Denisov et al. App H, Algorithm 3) for a workload with banded inverse.

  With A⁻¹ lower triangular with w nonzero diagonals (w = 2 for the prefix sum
  S, 3 for momentum M), the residual noise matrix N = A⁻¹·B̂ is itself banded +
  low rank: N = D'(h') + (Ũ·Vᵀ) ⊙ U(h'), h' = h + w − 1, Ũ = A⁻¹·U, and D'
  the first h' diagonals of N. Round i's row is therefore

    (N·Z)[i] = Σ_{k<h'} N[i, i−k]·Z[i−k] + Ũ[i]·β_i,   β_i = Σ_{j ≤ i−h'} V[j]ᵀ·Z[j]

  (Algorithm 3, zero-indexed, applied to N instead of B̂). Each Z row is drawn
  once, from (seed, row), and kept in an h'-row ring buffer.

  β is not stored as is: ALS leaves U·Vᵀ free above the band, so U and V are
  large (entries ~10³ for n = 2048) and Ũ[i]·β_i cancels by 10²–10³, which
  float32 cannot carry. The stream keeps x_i = L_i⁻¹·β_i instead, where
  L_i·L_iᵀ = Σ_{j ≤ i−h'} V[j]ᵀV[j] + δ·I (Cholesky). Then
  x_i = (L_i⁻¹·L_{i−1})·x_{i−1} + L_i⁻¹·V[i−h']ᵀ·Z[i−h'] and the output is
  (Ũ[i]·L_i)·x_i: the same numbers in exact arithmetic, but each coordinate of
  x has variance ≤ 1, the transition L_i⁻¹·L_{i−1} has spectral norm ≤ 1 (the
  Gram matrices only grow), so rounding errors never grow, and the output
  weights have norm ‖N[i, :i−h'+1]‖, the size of the result: no cancellation.
  So the whole stream runs in the variables' dtype (float32) with coefficients
  computed in float64: (h' + r)·d numbers of state and O((h' + r + r²/2)·d)
  work per round, fused by XLA.

  The factors may be unnormalized: with C = B̂⁻¹·A and γ = γ(C) the stream
  realizes the normalized mechanism (γ·B̂, C/γ), so ``sensitivity`` is 1.
  """

  def __init__(self, bands_matrix: np.ndarray, u: np.ndarray, v: np.ndarray, bands: int,
               workload: np.ndarray, normalize: bool = True, max_inverse_bands: int = 4,
               jit_compile: bool = True):
    d_mat = _check_matrix(bands_matrix, "bands matrix D(h)")
    a = _check_matrix(workload, "workload A")
    n = d_mat.shape[0]
    _check_lower_triangular_nonsingular(a, "workload A")
    if a.shape != (n, n) or d_mat.shape != (n, n):
      raise NoiseError(f"bands matrix {d_mat.shape} and workload {a.shape} must both be "
                       f"{n} x {n}")
    if isinstance(bands, bool) or not isinstance(bands, (int, np.integer)) or not 1 <= bands <= n:
      raise NoiseError(f"bands h must be an integer in [1, n={n}], got {bands!r}")
    h = int(bands)
    u = _check_matrix(u, "low-rank factor U") if np.size(u) else np.zeros((n, 0))
    v = _check_matrix(v, "low-rank factor V") if np.size(v) else np.zeros((n, 0))
    if u.shape[0] != n or v.shape != u.shape:
      raise NoiseError(f"low-rank factors must both be {n} x r, got U {u.shape}, V {v.shape}")
    outside = np.tril(d_mat, -h)
    if np.any(outside != 0) or np.any(np.triu(d_mat, 1) != 0):
      raise NoiseError(f"bands matrix has entries outside its {h} lower diagonals")
    b_hat = structured_decoder(d_mat, u, v, h)
    _check_lower_triangular_nonsingular(b_hat, "structured decoder B̂")
    a_inv = scipy.linalg.solve_triangular(a, np.eye(n), lower=True)
    scale = max(1.0, float(np.max(np.abs(a_inv))))
    nz_diags = [k for k in range(n) if np.any(np.abs(np.diagonal(a_inv, -k)) > 1e-12 * scale)]
    w = max(nz_diags) + 1
    if w > max_inverse_bands:
      raise NoiseError(f"A⁻¹ has {w} nonzero diagonals; StructuredNoise needs a workload with "
                       "a banded inverse (prefix sum: 2, momentum: 3)")
    a_inv = np.tril(np.triu(a_inv, -(w - 1)))  # exactly w-banded
    c = scipy.linalg.solve_triangular(b_hat, a, lower=True)
    gamma = fz.sensitivity(c)
    if not np.isfinite(gamma) or gamma <= 0:
      raise NoiseError(f"C = B̂⁻¹·A has invalid sensitivity {gamma}")
    self.gamma_before_normalization = gamma
    g = gamma if normalize else 1.0
    self.sensitivity = gamma / g
    self.n, self.m = n, n
    self.bands, self.rank, self.inverse_bands = h, int(u.shape[1]), int(w)
    self.noise_bands = min(h + w - 1, n)  # h': band width of N = A⁻¹·B̂
    self.jit_compile = bool(jit_compile)
    self._combine = None
    self._b_hat = b_hat * g
    self._n_matrix = a_inv @ self._b_hat
    self._band, self._transition, self._inject, self._out_weights = self._coefficients(
        self._n_matrix, a_inv @ (u * g), v, self.noise_bands)

  @staticmethod
  def _coefficients(n_matrix, u_tilde, v, hp):
    """Per-round float64 tables: band [n, h'], transition [n, r, r], inject [n, r], out [n, r].

    N[i, j] = Ũ[i]·V[j] for j ≤ i − h' (checked), the rest of N is its h'-band.
    """
    n, r = u_tilde.shape
    band = np.zeros((n, hp))
    for k in range(hp):
      band[k:, k] = np.diagonal(n_matrix, -k)
    low = np.tril(u_tilde @ v.T, -hp)
    err = float(np.max(np.abs(np.tril(n_matrix, -hp) - low))) if n > hp else 0.0
    if err > 1e-8 * max(1.0, float(np.max(np.abs(n_matrix)))):
      raise NoiseError(f"A⁻¹·B̂ is not {hp}-banded plus rank {r} (error {err:.3g})")
    transition = np.zeros((n, r, r))
    inject = np.zeros((n, r))
    out = np.zeros((n, r))
    if r == 0 or n <= hp:
      return band, transition, inject, out
    delta = 1e-9 * max(float(np.max(np.sum(v**2, axis=0))), 1e-300)
    gram = delta * np.eye(r)
    chol_prev = np.sqrt(delta) * np.eye(r)
    for i in range(hp, n):
      v_in = v[i - hp]  # V[i − h'] joins β this round
      gram += np.outer(v_in, v_in)
      chol = np.linalg.cholesky(gram)
      transition[i] = scipy.linalg.solve_triangular(chol, chol_prev, lower=True)
      inject[i] = scipy.linalg.solve_triangular(chol, v_in, lower=True)
      out[i] = u_tilde[i] @ chol
      chol_prev = chol
    return band, transition, inject, out

  @classmethod
  def from_fit(cls, result, workload: np.ndarray, bands: int) -> "StructuredNoise":
    """From ``tff_mf.structured.fit``'s result (``.bands_matrix``, ``.u``, ``.v``)."""
    return cls(result.bands_matrix, result.u, result.v, bands, workload)

  def noise_matrix(self) -> np.ndarray:
    return self._n_matrix.copy()

  def decoder(self) -> np.ndarray:
    """The normalized B̂ this stream realizes."""
    return self._b_hat.copy()

  def buffer_rows(self) -> int:
    return self.noise_bands + self.rank

  def initial_buffers(self, specs):
    """(Z[i−h'..i−1], x rows): tuples of rows, each a tuple of variables.

    Rows are separate tensors so the ring buffer shifts by passing references,
    not by copying.
    """
    specs = flat_specs(specs)

    def rows(count):
      return tuple(tuple(tf.zeros(s.shape, s.dtype) for s in specs) for _ in range(count))

    return rows(self.noise_bands), rows(self.rank)

  def noise_row(self, seed, round_index, buffers, specs, stddev):
    specs = flat_specs(specs)
    r = self.rank
    zbuf, state = buffers
    i = tf.cast(round_index, tf.int64)
    band = tf.gather(tf.constant(self._band * float(stddev)), i)  # [h']: N[i, i−k]·σ
    transition = tf.gather(tf.constant(self._transition), i)  # [r, r]
    inject = tf.gather(tf.constant(self._inject), i)  # [r]
    out_weights = tf.gather(tf.constant(self._out_weights * float(stddev)), i)  # [r]
    z_new = standard_normal_row(seed, i, specs)
    combine = self._combine_fn()
    out, new_state = [], []
    for t, spec in enumerate(specs):
      coefficients = [tf.cast(x, spec.dtype) for x in (band, transition, inject, out_weights)]
      out_t, state_t = combine(z_new[t], [row[t] for row in zbuf], [row[t] for row in state],
                               *coefficients)
      out.append(out_t)
      new_state.append(state_t)
    new_zbuf = tuple(zbuf[1:]) + (tuple(z_new),)
    new_state = tuple(tuple(new_state[t][l] for t in range(len(specs))) for l in range(r))
    return out, (new_zbuf, new_state)

  def _combine_fn(self):
    """One round of the recursion per variable, fused by XLA when ``jit_compile`` (one pass
    over the buffers instead of one temporary per term)."""
    if self._combine is None:
      hp, r = self.noise_bands, self.rank

      def combine(z_new, zbuf, state, band, transition, inject, out_weights):
        z_old = zbuf[0]  # Z[i − h'], the row leaving the band this round
        new_state = [tf.add_n([transition[l, m] * state[m] for m in range(l + 1)]
                              + [inject[l] * z_old]) for l in range(r)]
        terms = [band[0] * z_new] + [band[k] * zbuf[hp - k] for k in range(1, hp)]
        terms += [out_weights[l] * new_state[l] for l in range(r)]
        return tf.add_n(terms), new_state

      self._combine = tf.function(combine, jit_compile=self.jit_compile, autograph=False)
    return self._combine

  def describe(self):
    return (f"StructuredNoise(n={self.n}, h={self.bands}, r={self.rank}, "
            f"inverse bands={self.inverse_bands})")


class PrecomputedNoise(StreamingNoise):
  """All n rows of N·Z̃ computed up front for one pinned seed (small d; tests).

  The rows are the same stream ``DenseNoise`` regenerates; the query asserts at
  run time that its state carries the pinned seed, so a precomputed stream is
  never reused under a different seed.
  """

  def __init__(self, noise_matrix: np.ndarray, noise_seed: int, specs, sensitivity: float = 1.0,
               max_floats: int = 50_000_000):
    nm = _check_noise_matrix(noise_matrix)
    n, m = nm.shape
    specs = flat_specs(specs)
    d = sum(int(np.prod(s.shape)) for s in specs)
    if (n + m) * d > max_floats:
      raise NoiseError(f"precomputed noise would hold {(n + m) * d} floats; use DenseNoise or "
                       "StructuredNoise for models this large")
    self.n, self.m = int(n), int(m)
    self.sensitivity = float(sensitivity)
    self.seed = seed_pair(noise_seed)
    self._n_matrix = nm
    self._rows = nm @ standard_normal_matrix(self.seed, m, specs)  # float64, n x d
    self._sizes = [int(np.prod(s.shape)) for s in specs]

  @classmethod
  def from_factorization(cls, f: fz.Factorization, noise_seed: int, specs) -> "PrecomputedNoise":
    return cls(f.noise_matrix(), noise_seed, specs, sensitivity=f.sensitivity)

  def noise_matrix(self) -> np.ndarray:
    return self._n_matrix.copy()

  def initial_buffers(self, specs):
    return ()

  def noise_row(self, seed, round_index, buffers, specs, stddev):
    specs = flat_specs(specs)
    check = tf.debugging.assert_equal(
        tf.convert_to_tensor(seed, tf.int64), tf.constant(self.seed),
        message="PrecomputedNoise: the query's seed differs from the seed these rows were "
        "computed for; precomputed noise cannot serve another seed")
    with tf.control_dependencies([check]):
      row = tf.gather(tf.constant((self._rows * float(stddev)).astype(np.float32)),
                      tf.cast(round_index, tf.int64))
    parts = tf.split(row, self._sizes) if len(self._sizes) > 1 else [row]
    return [tf.cast(tf.reshape(p, s.shape), s.dtype) for p, s in zip(parts, specs)], buffers

  def describe(self):
    return f"PrecomputedNoise(n={self.n}, m={self.m})"


def implementations() -> Sequence[str]:
  return ("dense", "structured", "precomputed")
