"""Streaming noise for residual-form matrix mechanisms (the TensorFlow layer).

A matrix mechanism A = B·C (``docs/notation.md``) run as a residual query adds, in
round i, row i of N·Z with N = A⁻¹·B (C⁻¹ for square C) and Z i.i.d. Gaussian
(Denisov et al. 2022, arXiv:2202.08312, Algorithm 1 and App I; ``docs/mechanisms.md``
shows why the server optimizer then releases exactly −(A·G + B·Z)).

One interface, ``StreamingNoise``, three implementations:

- ``DenseNoise``: row i regenerates the Z rows it needs from (secret seed, row
  index) with a stateless RNG; time ∝ nonzeros of N[i], no state beyond the seed.
- ``LinearNoise``: a ``tff_mf.noise.streams.LinearStream`` (structured, banded, banded
  Toeplitz, BLT, independent noise): each Z row drawn once, k model-sized rows of
  state, O(k·d) work per round, the same recurrence as the numpy float64
  reference, evaluated in the variables' dtype with float64-computed tables.
- ``PrecomputedNoise``: all rows of N·Z computed up front for one pinned seed
  (small models, tests).

Every implementation is given the encoder C and computes the sensitivity of the
mechanism from it under the participation schema (``tff_mf.participation``); it
checks that the N it adds is C's inverse (N·C = I), so a stream can never add
less noise than the sensitivity it reports assumes. Going past round n raises.

Z row j of a model with variables v_0..v_{k−1} is
``stateless_normal(shape(v_t), seed=fold_in(fold_in(seed, j), t))`` (Philox pinned),
so every implementation, and the numpy reference ``standard_normal_matrix``, sees
the same Z for the same seed. Buffers are plain tensors, so TFF and ``tff.program``
checkpoint them; restoring continues the identical stream.
"""

from __future__ import annotations

import abc
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import scipy.linalg
import tensorflow as tf

from tff_mf import checks
from tff_mf import participation as participation_lib
from tff_mf.noise import keys
from tff_mf.noise import rows as rows_lib
from tff_mf.noise import streams

PHILOX = tf.random.Algorithm.PHILOX
# N·C = I is checked exactly up to this n, beyond with secret random vectors.
FULL_CHECK_MAX_N = 4096


class NoiseError(checks.CheckError):
  """Matrices, specs or seeds given to a streaming-noise implementation are invalid."""


def flat_specs(specs) -> List[tf.TensorSpec]:
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


def model_size(specs) -> int:
  return sum(int(np.prod(s.shape)) for s in flat_specs(specs))


def standard_normal_row(seed, row, specs) -> list:
  """Z̃[row] as a flat list of tensors shaped like ``specs`` (unit variance).

  ``seed`` is an int64 tensor of shape [2]; ``row`` an integer (tensor). The draw
  depends only on (seed, row, position of the variable), never on the round in
  which it is made.
  """
  seed = tf.convert_to_tensor(seed, tf.int64)
  row_seed = tf.random.experimental.stateless_fold_in(seed, tf.cast(row, tf.int64), alg=PHILOX)
  out = []
  for t, spec in enumerate(flat_specs(specs)):
    var_seed = tf.random.experimental.stateless_fold_in(row_seed, t, alg=PHILOX)
    out.append(tf.random.stateless_normal(spec.shape, seed=var_seed, dtype=spec.dtype, alg=PHILOX))
  return out


# Tag of the discrete Gaussian's draws: fold_in(fold_in(seed, tag), round), apart from the
# Z rows (fold_in(seed, j), j ≥ 0) and the count noise (tag −1).
DISCRETE_GAUSSIAN_TAG = -2


def discrete_gaussian_row(seed, round_index, size: int, sigma: float):
  """int64 [size] i.i.d. N_ℤ(0, σ²) of one round from the secret seed (stateless Philox).

  The numpy sampler's algorithm (``tff_mf.noise.discrete_gaussian.candidates``: a discrete Laplace
  proposal accepted with probability exp(−(|Y| − σ²/t)²/(2σ²)), Canonne, Kamath, Steinke 2020,
  arXiv:2004.00010, Alg. 3) with TensorFlow's stateless uniforms keyed by (seed, round,
  attempt): rejection rounds over the pending coordinates until all are accepted (an
  in-graph error after ``MAX_ATTEMPTS``, never a truncated draw). Deterministic given the
  seed; not bit-identical to the numpy stream (another generator).
  """
  from tff_mf.noise import discrete_gaussian as dg  # pylint: disable=g-import-not-at-top
  t = float(dg.proposal_scale(sigma))
  sigma = float(sigma)
  base = tf.random.experimental.stateless_fold_in(
      tf.random.experimental.stateless_fold_in(
          tf.convert_to_tensor(seed, tf.int64), tf.constant(DISCRETE_GAUSSIAN_TAG, tf.int64),
          alg=PHILOX), tf.cast(round_index, tf.int64), alg=PHILOX)

  def body(attempt, values, pending):
    u = tf.random.stateless_uniform(
        tf.stack([3, tf.size(pending)]), dtype=tf.float64, alg=PHILOX,
        seed=tf.random.experimental.stateless_fold_in(base, tf.cast(attempt, tf.int64),
                                                      alg=PHILOX))
    y = tf.floor(-t * tf.math.log1p(-u[0])) - tf.floor(-t * tf.math.log1p(-u[1]))
    accept = u[2] < tf.exp(-tf.square(tf.abs(y) - sigma**2 / t) / (2.0 * sigma**2))
    values = tf.tensor_scatter_nd_update(values, tf.boolean_mask(pending, accept)[:, None],
                                         tf.cast(tf.boolean_mask(y, accept), tf.int64))
    return attempt + 1, values, tf.boolean_mask(pending, tf.logical_not(accept))

  _, values, pending = tf.while_loop(
      lambda attempt, values, pending: tf.logical_and(tf.size(pending) > 0,
                                                      attempt < dg.MAX_ATTEMPTS),
      body, (tf.constant(0), tf.zeros([size], tf.int64), tf.range(size, dtype=tf.int64)),
      shape_invariants=(tf.TensorShape([]), tf.TensorShape([size]), tf.TensorShape([None])))
  done = tf.debugging.assert_equal(
      tf.size(pending), 0, message=f"{checks.IN_GRAPH_PREFIX}discrete Gaussian sampler: "
      f"coordinates still pending after {dg.MAX_ATTEMPTS} rejection rounds")
  with tf.control_dependencies([done]):
    return tf.identity(values)


def standard_normal_matrix(seed, rows: int, specs) -> np.ndarray:
  """Z̃ (rows x d) in float64, each row the concatenation of ``standard_normal_row`` (eager)."""
  seed = tf.constant(np.asarray(seed, dtype=np.int64))
  out = []
  for j in range(rows):
    parts = standard_normal_row(seed, j, specs)
    out.append(np.concatenate([np.asarray(p, dtype=np.float64).ravel() for p in parts]))
  return np.stack(out)


def seed_pair(noise_seed: keys.Seed) -> np.ndarray:
  """The int64 [2] seed tensor value of a pinned seed: (seed, tag) for an integer, a pair
  (a full key) as it is (``tff_mf.noise.keys``)."""
  try:
    return keys.seed_pair(keys.pinned(noise_seed))
  except checks.CheckError as e:
    raise NoiseError(str(e)) from None


def _check_inverse(n_matrix_rows: np.ndarray, c: np.ndarray, what: str, probe: bool) -> None:
  """N·C = I (exactly, or on secret random vectors when ``probe``)."""
  n = c.shape[1]
  if probe:
    r = np.random.default_rng(np.random.SeedSequence()).standard_normal((n, 8))
    err = float(np.max(np.abs(n_matrix_rows(c @ r) - r)))
  else:
    err = float(np.max(np.abs(n_matrix_rows(c) - np.eye(n))))
  if not err <= 1e-7:
    raise NoiseError(f"{what} does not add C⁻¹·Z for the encoder C it was given "
                     f"(N·C differs from I by {err:.3g}): its noise would not match its "
                     "sensitivity")


class StreamingNoise(abc.ABC):
  """Round i's noise row (N·Z)[i] for Z ~ N(0, σ²) regenerated from a secret seed.

  Attributes:
    n: rounds the mechanism is built for (rows of N).
    m: rows of Z (columns of N).
    participation: the schema the sensitivity is for.
    sensitivity: sens(C) under ``participation``, computed from C.
    sensitivity_report: {value, exact, method} of that computation.
  """

  def __init__(self, c: np.ndarray, participation: participation_lib.Participation,
               sensitivity_report: Optional[Dict[str, Any]] = None):
    c = checks.matrix(c, "encoder C")
    n = c.shape[1]
    if c.shape[0] < n:
      raise NoiseError(f"encoder C has {c.shape[0]} rows for {n} rounds (rank below n)")
    checks.lower_triangular(c, "encoder C (rows in release order)", square=False,
                            atol=1e-12 * max(1.0, float(np.max(np.abs(c)))))
    if not isinstance(participation, participation_lib.Participation):
      raise NoiseError(f"participation must be a tff_mf.participation schema, got "
                       f"{participation!r}")
    participation.check(n)
    self.n, self.m = int(n), int(c.shape[0])
    self.participation = participation
    self._c = c
    # ``sensitivity_report``: participation.sensitivity_report of this same C and schema,
    # when the caller (tff_mf.mechanisms) computed it already.
    if sensitivity_report is None:
      sensitivity_report = participation_lib.sensitivity_report(c, participation)
    self.sensitivity_report = dict(sensitivity_report)
    self.sensitivity = float(self.sensitivity_report["value"])
    if not np.isfinite(self.sensitivity) or self.sensitivity <= 0:
      raise NoiseError(f"encoder C has invalid sensitivity {self.sensitivity}")

  def encoder(self) -> np.ndarray:
    """C (m x n, float64): whose inverse this stream adds."""
    return self._c.copy()

  @abc.abstractmethod
  def noise_matrix(self) -> np.ndarray:
    """N (n x m, float64) for unit-variance Z: the reference for tests."""

  @abc.abstractmethod
  def initial_state(self, specs) -> Tuple[Any, ...]:
    """The stream state before round 0 (a tuple of tensors; () when stateless)."""

  def noise_row(self, seed, round_index, stream_state, specs, stddev: float):
    """(flat list of noise tensors for round ``round_index``, new stream state).

    ``seed``: int64 [2] tensor; ``round_index``: int32 scalar tensor; ``stddev``:
    σ = noise multiplier × clip. Raises (at run time) for a round at or past n.
    """
    past_end = tf.debugging.assert_less(
        tf.cast(round_index, tf.int64), tf.constant(self.n, tf.int64), summarize=1,
        message=f"{checks.IN_GRAPH_PREFIX}{self.describe()}: round index (first value) is past "
                f"the n={self.n} rounds this mechanism was built for (second value); build one "
                "for more rounds")
    with tf.control_dependencies([past_end]):
      i = tf.identity(tf.cast(round_index, tf.int64))
    return self._noise_row(seed, i, stream_state, flat_specs(specs), float(stddev))

  @abc.abstractmethod
  def _noise_row(self, seed, i, stream_state, specs, stddev):
    """``noise_row`` for a round index already checked to be below n."""

  def state_rows(self) -> int:
    """How many model-sized rows the stream state holds."""
    return 0

  def state_bytes(self, specs) -> int:
    """Bytes of stream state carried between rounds (excluding round index and seed)."""
    d = sum(int(np.prod(s.shape)) * s.dtype.size for s in flat_specs(specs))
    return self.state_rows() * d

  def describe(self) -> str:
    return type(self).__name__


class DenseNoise(StreamingNoise):
  """Row i = Σ_j N[i, j]·σ·Z̃[j], each Z̃[j] regenerated from (seed, j) (Denisov App I).

  ``noise_matrix`` defaults to C⁻¹ (square C); for a C with more rows than rounds
  (the binary tree) pass N = A⁻¹·B, which must satisfy N·C = I. N is stored in CSR
  form with float64 values; accumulation is in float64, cast once per row.
  """

  def __init__(self, c: np.ndarray, noise_matrix: Optional[np.ndarray] = None,
               participation: participation_lib.Participation = participation_lib.SINGLE,
               sensitivity_report: Optional[Dict[str, Any]] = None):
    super().__init__(c, participation, sensitivity_report)
    if noise_matrix is None:
      if self.m != self.n:
        raise NoiseError(f"encoder C is {self.m} x {self.n}; pass its noise matrix N = A⁻¹·B")
      checks.lower_triangular(self._c, "encoder C", nonsingular=True)
      nm = scipy.linalg.solve_triangular(self._c, np.eye(self.n), lower=True)
    else:
      nm = checks.matrix(noise_matrix, "noise matrix N")
      if nm.shape != (self.n, self.m):
        raise NoiseError(f"noise matrix N is {nm.shape}, expected {(self.n, self.m)} for C "
                         f"{self._c.shape}")
    _check_inverse(lambda x: nm @ x, self._c, "noise matrix N", probe=self.n > FULL_CHECK_MAX_N)
    nonzero = nm != 0  # N·C = I: no row of N is zero, no round adds no noise
    self._n_matrix = nm
    self._row_ptr = np.concatenate([[0], np.cumsum(np.sum(nonzero, axis=1))]).astype(np.int64)
    self._cols = np.nonzero(nonzero)[1].astype(np.int32)
    self._vals = nm[nonzero]  # row-major order matches np.nonzero

  @classmethod
  def from_factorization(cls, f, participation=participation_lib.SINGLE) -> "DenseNoise":
    """From a ``tff_mf.factorization.Factorization`` (N = A⁻¹·B)."""
    return cls(f.c, noise_matrix=f.noise_matrix() if f.m != f.n else None,
               participation=participation)

  def noise_matrix(self) -> np.ndarray:
    return self._n_matrix.copy()

  def row_nonzeros(self, i: int) -> int:
    return int(self._row_ptr[i + 1] - self._row_ptr[i])

  def initial_state(self, specs):
    return ()

  def _noise_row(self, seed, i, stream_state, specs, stddev):
    row_ptr = tf.constant(self._row_ptr)
    cols = tf.constant(self._cols)
    vals = tf.constant(self._vals * stddev)  # float64
    start, end = row_ptr[i], row_ptr[i + 1]
    acc0 = [tf.zeros(s.shape, tf.float64) for s in specs]

    def body(k, acc):
      z = standard_normal_row(seed, cols[k], specs)
      return k + 1, [a + vals[k] * tf.cast(zz, tf.float64) for a, zz in zip(acc, z)]

    _, acc = tf.while_loop(lambda k, acc: k < end, body, (start, acc0), parallel_iterations=1)
    return [tf.cast(a, s.dtype) for a, s in zip(acc, specs)], stream_state

  def describe(self):
    return f"DenseNoise(n={self.n}, m={self.m}, nnz={self._vals.size})"


def _dtype_groups(specs) -> List[Tuple[Any, List[int], int]]:
  """The variables (TensorSpecs, or arrays) by dtype, in order of first appearance: (dtype,
  their indices, their total size): the layout of ``LinearNoise``'s state rows."""
  groups: Dict[Any, List[int]] = {}
  for t, spec in enumerate(specs):
    groups.setdefault(spec.dtype, []).append(t)
  return [(dtype, members, sum(int(np.prod(specs[t].shape)) for t in members))
          for dtype, members in groups.items()]


def join_variable_rows(parts: Sequence[np.ndarray]) -> List[np.ndarray]:
  """A ``LinearNoise`` state row as an earlier tff-mf kept it (one array per variable) in this
  layout (``_dtype_groups``): one flat vector per dtype, that dtype's variables concatenated in
  order. The same values, so a checkpointed run resumes the identical stream."""
  parts = [np.asarray(part) for part in parts]
  return [np.concatenate([parts[t].reshape(-1) for t in members])
          for _, members, _ in _dtype_groups(parts)]


class LinearNoise(StreamingNoise):
  """A ``LinearStream`` recurrence (``tff_mf.noise.streams``) in TensorFlow: O(k·d) state.

  Each round draws Z[i] from (seed, i), updates the k state rows and outputs y_i
  exactly as ``LinearStream.step`` does in float64 — the same tables, cast to the
  variables' dtype. Copied state rows are passed by reference (no copy), and
  coefficients that are zero in every round are left out at trace time.

  Each sum is taken over products rounded to the variables' dtype, in the order TensorFlow's
  graph takes a ``tf.add_n`` of them (``tff_mf.noise.rows.add_n_blocks``). The kernel
  (``jit_compile=True``, the default) is one XLA loop per call that reads each state row once
  and writes the output and the computed rows. Every product and every partial sum passes
  through an integer xor with a zero no compiler can see (``_barrier``): XLA cannot contract
  a product with its add into a fused multiply-add (one rounding: other last bits), and where
  a runtime runs the function without XLA (TFF's), Grappler cannot regroup the sums, or
  rewrite across a scaling of the row outside the kernel (adaptive clipping). So the TFF
  process, the compiled engine and the numpy rows (``tff_mf.noise.rows``, ``exact=True``) add
  the same noise, bit for bit. ``jit_compile=False``: the graph kernel (one ``tf.add_n`` of
  the products a sum; the same bits where Grappler leaves it as it is), for comparison.
  """

  def __init__(self, stream: streams.LinearStream, c: np.ndarray,
               participation: participation_lib.Participation = participation_lib.SINGLE,
               jit_compile: bool = True, sensitivity_report: Optional[Dict[str, Any]] = None):
    if not isinstance(stream, streams.LinearStream):
      raise NoiseError(f"stream must be a tff_mf.noise.streams.LinearStream, got "
                       f"{type(stream).__name__}")
    super().__init__(c, participation, sensitivity_report)
    if stream.n != self.n or self.m != self.n:
      raise NoiseError(f"{stream.name} has {stream.n} rounds, encoder C is {self._c.shape}")
    _check_inverse(stream.run, self._c, stream.name, probe=self.n > FULL_CHECK_MAX_N)
    self.stream = stream
    self.jit_compile = bool(jit_compile)
    self._support = stream.support()
    self._computed = [int(l) for l in stream.computed_rows]
    self._kernels = {}

  def noise_matrix(self) -> np.ndarray:
    return self.stream.noise_matrix()

  def state_rows(self) -> int:
    return self.stream.k

  def initial_state(self, specs):
    """k rows, each a tuple of one flat vector per dtype of the variables (``_dtype_groups``:
    that dtype's variables concatenated in order), which the kernel reads as they are; a
    copied row is passed on by reference."""
    groups = _dtype_groups(flat_specs(specs))
    return tuple(tuple(tf.zeros([size], dtype) for dtype, _, size in groups)
                 for _ in range(self.stream.k))

  def _tables(self, i, stddev):
    s = self.stream
    t = i if s.time_varying else tf.constant(0, tf.int64)
    rows = self._computed
    f = tf.gather(tf.constant(s.f[:, rows, :] if rows else np.zeros((s.f.shape[0], 0, s.k))), t)
    g = tf.gather(tf.constant(s.g[:, rows] if rows else np.zeros((s.g.shape[0], 0))), t)
    return (f, g, tf.gather(tf.constant(s.w_old * stddev), t),
            tf.gather(tf.constant(s.w_new * stddev), t), tf.gather(tf.constant(s.c * stddev), t))

  def _noise_row(self, seed, i, stream_state, specs, stddev):
    """The kernel once per dtype group, on that group's Z and state vectors: its ops are
    elementwise with scalar coefficients, so every entry is the one the kernel computes on its
    variable alone, in one call per group (a model's many small ops cost more than their
    arithmetic)."""
    z = standard_normal_row(seed, i, specs)
    tables = self._tables(i, stddev)
    zero = tf.bitwise.right_shift(tf.abs(i), 62)  # 0 for any round (i < n < 2⁶²), at run time
    kernel, copies, k = self._kernel_fn(), self.stream.copies, self.stream.k
    line = lambda p: p if p.shape.rank == 1 else tf.reshape(p, [-1])
    groups = _dtype_groups(specs)
    out, new_rows = [None] * len(specs), [[None] * len(groups) for _ in range(k)]
    for g, (dtype, members, _) in enumerate(groups):
      old = [row[g] for row in stream_state]
      parts = [line(z[t]) for t in members]
      y, computed = kernel(parts[0] if len(parts) == 1 else tf.concat(parts, 0), old,
                           *[tf.cast(x, dtype) for x in tables], zero)
      sizes = [int(np.prod(specs[t].shape)) for t in members]
      for t, part in zip(members, tf.split(y, sizes) if len(members) > 1 else [y]):
        out[t] = part if specs[t].shape.rank == 1 else tf.reshape(part, specs[t].shape)
      for l in range(k):
        new_rows[l][g] = old[copies[l]] if copies[l] >= 0 else computed[self._computed.index(l)]
    return out, tuple(tuple(row) for row in new_rows)

  def _kernel_fn(self):
    fused = self.jit_compile
    if fused not in self._kernels:
      sup, rows, copies = self._support, self._computed, self.stream.copies
      k = self.stream.k

      def kernel(z, old, f, g, w_old, w_new, c, zero):
        made = [0]  # products so far: the graph names them mul, mul_1, … in this order

        def combine(terms):
          if not terms:
            return tf.zeros_like(z)
          if fused:
            out = _graph_sum(made[0], [_barrier(a * x, zero) for a, x in terms], zero)
          else:
            out = tf.add_n([a * x for a, x in terms])
          made[0] += len(terms)
          return out

        new = [old[copies[l]] if copies[l] >= 0 else None for l in range(k)]
        computed = []
        for j, l in enumerate(rows):
          terms = [(f[j, m], old[m]) for m in range(k) if sup["f"][l, m]]
          if sup["g"][l]:
            terms.append((g[j], z))
          new[l] = combine(terms)
          computed.append(new[l])
        terms = [(w_old[m], old[m]) for m in range(k) if sup["w_old"][m]]
        terms += [(w_new[m], new[m]) for m in range(k) if sup["w_new"][m]]
        if sup["c"]:
          terms.append((c, z))
        return combine(terms), computed

      self._kernels[fused] = tf.function(kernel, jit_compile=fused, autograph=False)
    return self._kernels[fused]

  def describe(self):
    return f"LinearNoise({self.stream.name}, n={self.n}, state rows={self.stream.k})"


# Integer types of a float's width: the bits ``_barrier`` passes through.
_BITS = {tf.float16: tf.int16, tf.bfloat16: tf.int16, tf.float32: tf.int32,
         tf.float64: tf.int64}


def _barrier(x, zero):
  """x, its bits xored with ``zero`` (0, a run-time value): an integer step no compiler can
  fold, so none contracts a product with the add that takes it into a fused multiply-add
  (which rounds once) or regroups a sum across it."""
  bits = _BITS[x.dtype]
  return tf.bitcast(tf.bitwise.bitwise_xor(tf.bitcast(x, bits), tf.cast(zero, bits)), x.dtype)


def _graph_sum(first: int, terms, zero):
  """Σ terms in the order TensorFlow's graph runs ``tf.add_n`` of the kernel's products
  ``first``, ``first + 1``, … (``tff_mf.noise.rows.add_n_blocks``), each partial sum behind a
  barrier: where the kernel runs without XLA (TFF's runtime), Grappler cannot regroup the
  chain (into an AddN of another order, or across a scaling outside the kernel)."""
  out = None
  for block in rows_lib.add_n_blocks(first, len(terms)):
    part = terms[block[0]]
    for j in block[1:]:
      part = _barrier(part + terms[j], zero)
    out = part if out is None else _barrier(out + part, zero)
  return out


class PrecomputedNoise(StreamingNoise):
  """All n rows of N·Z̃ computed up front for one pinned seed (small models; tests).

  The rows are those ``DenseNoise`` regenerates for the same seed; the query
  checks at run time that its state carries that seed, so precomputed rows are
  never reused under another seed.
  """

  def __init__(self, c: np.ndarray, noise_seed: keys.Seed, specs,
               noise_matrix: Optional[np.ndarray] = None,
               participation: participation_lib.Participation = participation_lib.SINGLE,
               max_floats: int = 50_000_000):
    dense = DenseNoise(c, noise_matrix, participation)
    super().__init__(c, participation)
    specs = flat_specs(specs)
    d = sum(int(np.prod(s.shape)) for s in specs)
    if (self.n + self.m) * d > max_floats:
      raise NoiseError(f"precomputed noise would hold {(self.n + self.m) * d} floats; use "
                       "DenseNoise or LinearNoise for models this large")
    self.seed = seed_pair(noise_seed)
    self.model_size = d
    self._n_matrix = dense.noise_matrix()
    self._rows = self._n_matrix @ standard_normal_matrix(self.seed, self.m, specs)
    self._sizes = [int(np.prod(s.shape)) for s in specs]

  def noise_matrix(self) -> np.ndarray:
    return self._n_matrix.copy()

  def initial_state(self, specs):
    return ()

  def _noise_row(self, seed, i, stream_state, specs, stddev):
    check = tf.debugging.assert_equal(
        tf.convert_to_tensor(seed, tf.int64), tf.constant(self.seed),
        message=f"{checks.IN_GRAPH_PREFIX}PrecomputedNoise: the query's seed differs from the "
        "seed these rows were computed for; precomputed noise cannot serve another seed")
    with tf.control_dependencies([check]):
      row = tf.gather(tf.constant(self._rows * stddev), i)
    parts = tf.split(row, self._sizes) if len(self._sizes) > 1 else [row]
    return [tf.cast(tf.reshape(p, s.shape), s.dtype) for p, s in zip(parts, specs)], stream_state

  def describe(self):
    return f"PrecomputedNoise(n={self.n}, m={self.m})"


def implementations() -> Sequence[str]:
  return ("dense", "linear", "precomputed")


def state_summary(noise: StreamingNoise, specs) -> Dict[str, Any]:
  """JSON-ready description of a stream's state (rows and bytes)."""
  return {"noise_implementation": noise.describe(), "state_rows": noise.state_rows(),
          "state_bytes": noise.state_bytes(specs)}
