"""``MatrixFactorizationQuery``: the DP matrix mechanism as a tensorflow_privacy DPQuery.

Round i (0-based) returns Σ_clients clip_ζ(update) + (N·Z)[i], with N = A⁻¹·B the
per-round noise matrix of a normalized factorization A = B·C (γ(C) = 1) and Z
i.i.d. N(0, σ²), σ = noise multiplier × ζ (Denisov et al. Algorithm 1 line 11
and App I, ``001_…``/``000_…``). A server optimizer that applies the workload A
(momentum β, learning rates η; Prop 4.2) to these outputs releases
A·(G + N·Z) = A·G + B·Z; see ``docs/mechanisms.md``.

State: ``MatrixFactorizationState(round_index, seed, buffers)``, all tensors;
checkpointing and restoring it continues the identical noise stream. The seed
comes from OS entropy (``RandomUniformInt`` with seed attributes 0, 0 draws
its key from /dev/urandom each time the initial state is computed) unless
``noise_seed`` pins it. The state — hence any checkpoint of it — holds the
secret seed: protect checkpoints like the raw updates.

Privacy accounting (Denisov et al. Thm 4.1): for single participation the whole
run of n rounds is ONE Gaussian mechanism with noise multiplier z on a query of
ℓ2-sensitivity ζ·γ(C) = ζ. The query reports that as
``PoissonSampledDpEvent(p, GaussianDpEvent(z))`` with p = 1 in round 0 and
p = 0 in every later round (a sampled-with-probability-0 mechanism is a no-op;
both PLD and RDP accountants treat p = 0 as no privacy loss and p = 1 as the
plain Gaussian). Composing the events of a run therefore gives exactly the
Thm 4.1 guarantee. Reporting the full guarantee in round 0 is an upper bound at
every intermediate round too, because the rows of C released by round k have
column norms at most γ(C) = 1. The event type cannot switch from Gaussian to
``NoOpDpEvent`` at run time (TFF traces ``get_noised_result`` once and fixes
its result type), hence the probability field. This accounting assumes every
client contributes to at most one round.
"""

from __future__ import annotations

import collections
from typing import Optional

import dp_accounting
import numpy as np
import scipy.linalg
import tensorflow as tf
import tensorflow_privacy as tfp

from tff_mf import factorization as fz
from tff_mf.tf import noise as noise_lib

MatrixFactorizationState = collections.namedtuple(
    "MatrixFactorizationState", ["round_index", "seed", "buffers"])

_SEED_LOW, _SEED_HIGH = -(2**62), 2**62


def _check_positive_float(value, name):
  if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
    raise ValueError(f"{name} must be a number, got {value!r}")
  value = float(value)
  if not np.isfinite(value) or value <= 0:
    raise ValueError(f"{name} must be positive and finite, got {value}")
  return value


def _check_noise_multiplier(value):
  if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
    raise ValueError(f"noise_multiplier must be a number, got {value!r}")
  value = float(value)
  if not np.isfinite(value) or value < 0:
    raise ValueError(f"noise_multiplier must be non-negative and finite, got {value}")
  return value


def single_participation_event(noise_multiplier: float) -> dp_accounting.DpEvent:
  """The whole run's guarantee (Denisov Thm 4.1): one Gaussian mechanism with multiplier z."""
  return dp_accounting.GaussianDpEvent(noise_multiplier)


class MatrixFactorizationQuery(tfp.SumAggregationDPQuery):
  """Clip each record to global ℓ2 norm ζ, sum, add this round's noise row (N·Z)[i].

  Args:
    noise: a ``tff_mf.tf.noise.StreamingNoise`` (dense, structured, precomputed)
      for a normalized mechanism (``noise.sensitivity`` = γ(C) = 1).
    l2_norm_clip: ζ > 0.
    noise_multiplier: z ≥ 0; σ = z·ζ.
    record_specs: the (nested) ``tf.TensorSpec`` structure of one client update.
    noise_seed: pin the secret seed (tests, reproduction); None = OS entropy.
  """

  def __init__(self, noise: noise_lib.StreamingNoise, *, l2_norm_clip: float,
               noise_multiplier: float, record_specs, noise_seed: Optional[int] = None):
    if not isinstance(noise, noise_lib.StreamingNoise):
      raise TypeError(f"noise must be a StreamingNoise, got {type(noise).__name__}")
    self._clip = _check_positive_float(l2_norm_clip, "l2_norm_clip")
    self._noise_multiplier = _check_noise_multiplier(noise_multiplier)
    if abs(noise.sensitivity - 1.0) > 1e-6:
      raise ValueError(
          f"the mechanism is not normalized: γ(C) = {noise.sensitivity:.9g}, expected 1 "
          "(normalize the factorization, tff_mf.factorization.normalize)")
    self._record_specs = record_specs
    self._flat_specs = noise_lib.flat_specs(record_specs)
    self._noise = noise
    self._seed = None if noise_seed is None else noise_lib.seed_pair(noise_seed)
    if isinstance(noise, noise_lib.PrecomputedNoise):
      if self._seed is None:
        raise ValueError("PrecomputedNoise serves one pinned seed: pass the same noise_seed")
      if not np.array_equal(self._seed, noise.seed):
        raise ValueError("noise_seed differs from the seed the PrecomputedNoise rows were built for")
      d_query = sum(int(np.prod(s.shape)) for s in self._flat_specs)
      if noise._rows.shape[1] != d_query:  # pylint: disable=protected-access
        raise ValueError(f"precomputed noise rows have {noise._rows.shape[1]} entries, "  # pylint: disable=protected-access
                         f"the record specs {d_query}")

  # -- constructors -----------------------------------------------------------
  @classmethod
  def from_factorization(cls, factorization: fz.Factorization, *, l2_norm_clip: float,
                         noise_multiplier: float, record_specs, noise_seed: Optional[int] = None,
                         implementation: str = "dense") -> "MatrixFactorizationQuery":
    """Dense or precomputed noise N = A⁻¹·B for a validated, normalized factorization."""
    check_factorization(factorization)
    if implementation == "dense":
      noise = noise_lib.DenseNoise.from_factorization(factorization)
    elif implementation == "precomputed":
      if noise_seed is None:
        raise ValueError("implementation='precomputed' needs a pinned noise_seed")
      noise = noise_lib.PrecomputedNoise.from_factorization(factorization, noise_seed,
                                                            record_specs)
    else:
      raise ValueError(f"unknown implementation {implementation!r}; expected 'dense' or "
                       "'precomputed' (structured noise: pass a StructuredNoise)")
    return cls(noise, l2_norm_clip=l2_norm_clip, noise_multiplier=noise_multiplier,
               record_specs=record_specs, noise_seed=noise_seed)

  @classmethod
  def from_encoder(cls, c: np.ndarray, *, l2_norm_clip: float, noise_multiplier: float,
                   record_specs, noise_seed: Optional[int] = None) -> "MatrixFactorizationQuery":
    """Square lower-triangular C with γ(C) = 1: N = C⁻¹ (the server applies A)."""
    c = np.asarray(c)
    if c.ndim != 2 or c.shape[0] != c.shape[1]:
      raise ValueError(f"encoder C must be a square matrix, got shape {c.shape}")
    c = noise_lib._check_matrix(c, "encoder C")  # pylint: disable=protected-access
    noise_lib._check_lower_triangular_nonsingular(c, "encoder C")  # pylint: disable=protected-access
    gamma = fz.sensitivity(c)
    n_matrix = scipy.linalg.solve_triangular(c, np.eye(c.shape[0]), lower=True)
    return cls(noise_lib.DenseNoise(n_matrix, sensitivity=gamma), l2_norm_clip=l2_norm_clip,
               noise_multiplier=noise_multiplier, record_specs=record_specs,
               noise_seed=noise_seed)

  # -- properties -------------------------------------------------------------
  @property
  def noise(self) -> noise_lib.StreamingNoise:
    return self._noise

  @property
  def total_rounds(self) -> int:
    return self._noise.n

  @property
  def noise_multiplier(self) -> float:
    return self._noise_multiplier

  @property
  def l2_norm_clip(self) -> float:
    return self._clip

  @property
  def stddev(self) -> float:
    return self._noise_multiplier * self._clip

  # -- DPQuery ----------------------------------------------------------------
  def initial_global_state(self):
    if self._seed is None:
      seed = tf.raw_ops.RandomUniformInt(
          shape=tf.constant([2], tf.int32), minval=tf.constant(_SEED_LOW, tf.int64),
          maxval=tf.constant(_SEED_HIGH, tf.int64), seed=0, seed2=0)
    else:
      seed = tf.constant(self._seed)
    return MatrixFactorizationState(
        round_index=tf.constant(0, tf.int32), seed=seed,
        buffers=self._noise.initial_buffers(self._flat_specs))

  def derive_sample_params(self, global_state):
    del global_state
    return tf.constant(self._clip, tf.float32)

  def _check_structure(self, template, what):
    try:
      tf.nest.assert_same_structure(template, self._record_specs, check_types=False)
    except (ValueError, TypeError) as e:
      raise ValueError(f"MatrixFactorizationQuery: {what} does not match the record specs the "
                       f"query was built for: {e}") from e
    for k, (x, s) in enumerate(zip(tf.nest.flatten(template), self._flat_specs)):
      shape = tf.TensorShape(x.shape)
      if not shape.is_compatible_with(s.shape) or tf.as_dtype(x.dtype) != s.dtype:
        raise ValueError(
            f"MatrixFactorizationQuery: {what} leaf #{k} is {tf.as_dtype(x.dtype).name}"
            f"{shape}, the record specs say {s.dtype.name}{s.shape}")

  def initial_sample_state(self, template=None):
    if template is not None:
      self._check_structure(template, "the value type")
    return super().initial_sample_state(self._record_specs)

  def preprocess_record(self, params, record):
    self._check_structure(record, "the client update")
    flat = tf.nest.flatten(record)
    checks = [tf.debugging.assert_all_finite(
        x, message=f"MatrixFactorizationQuery: client update leaf #{k} contains NaN or Inf")
              for k, x in enumerate(flat)]
    with tf.control_dependencies(checks):
      clipped, _ = tf.clip_by_global_norm(flat, tf.cast(params, tf.float32))
    return tf.nest.pack_sequence_as(record, clipped)

  def get_noised_result(self, sample_state, global_state):
    i = global_state.round_index
    n = self._noise.n
    past_end = tf.debugging.assert_less(
        i, tf.constant(n, tf.int32), summarize=1,
        message=(f"MatrixFactorizationQuery: round index (first value) is past the n={n} rounds "
                 "this matrix was built for (second value); build a factorization for more "
                 "rounds"))
    with tf.control_dependencies([past_end]):
      noise_flat, buffers = self._noise.noise_row(
          global_state.seed, i, global_state.buffers, self._flat_specs, self.stddev)
    flat = tf.nest.flatten(sample_state)
    result = tf.nest.pack_sequence_as(
        sample_state, [x + tf.cast(z, x.dtype) for x, z in zip(flat, noise_flat)])
    new_state = MatrixFactorizationState(round_index=i + 1, seed=global_state.seed,
                                         buffers=buffers)
    event = dp_accounting.PoissonSampledDpEvent(
        sampling_probability=tf.where(tf.equal(i, 0), tf.constant(1.0, tf.float64),
                                      tf.constant(0.0, tf.float64)),
        event=dp_accounting.GaussianDpEvent(tf.constant(self._noise_multiplier, tf.float64)))
    return result, new_state, event

  def derive_metrics(self, global_state):
    return collections.OrderedDict(round_index=global_state.round_index)


def check_factorization(f: fz.Factorization) -> None:
  """Rejects malformed factorizations with a message naming the problem.

  A lower triangular and non-singular, C lower triangular in release order and
  of full column rank, γ(C) = 1, B·C = A (``factorization.validate_factors``).
  """
  if not isinstance(f, fz.Factorization):
    raise TypeError(f"expected a tff_mf.factorization.Factorization, got {type(f).__name__}")
  from tff_mf import workloads  # pylint: disable=g-import-not-at-top
  try:
    workloads.validate_workload(f.a, name="workload A")
  except workloads.WorkloadError as e:
    raise ValueError(str(e)) from e
  c = noise_lib._check_matrix(f.c, "encoder C")  # pylint: disable=protected-access
  if c.shape[0] == c.shape[1]:
    noise_lib._check_lower_triangular_nonsingular(c, "encoder C")  # pylint: disable=protected-access
  elif not noise_lib.encoder_is_causal(c):
    raise ValueError("encoder C is not lower triangular in release order: a row reads a round "
                     "after its own index")
  elif np.linalg.matrix_rank(c) < c.shape[1]:
    raise ValueError("encoder C is singular (rank below n)")
  try:
    fz.validate_factors(np.asarray(f.a, np.float64), np.asarray(f.b, np.float64), c,
                        atol=1e-6, name=f"factorization '{f.strategy}'")
  except fz.FactorizationError as e:
    raise ValueError(str(e)) from e
