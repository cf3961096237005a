"""``MatrixFactorizationQuery``: the DP matrix mechanism as a tensorflow_privacy DPQuery.

Round i (0-based) returns Σ_clients clip_ζ(update) + (N·Z)[i], with N = A⁻¹·B the
per-round noise matrix of a factorization A = B·C and Z i.i.d. N(0, σ²), σ = z·ζ
(Denisov et al. 2022, arXiv:2202.08312, Algorithm 1 and App I). A server optimizer
that applies the workload A (momentum β, learning rates η; Prop 4.2) to these
outputs releases A·(G + N·Z) = A·G + B·Z; see ``docs/mechanisms.md``.

State: ``MatrixFactorizationState(round_index, seed, buffers)``, all tensors;
checkpointing and restoring it continues the identical noise stream. The seed comes
from OS entropy (``RandomUniformInt`` with seed attributes 0, 0 draws its key from
/dev/urandom each time the initial state is computed) unless ``noise_seed`` pins
it. The state, hence any checkpoint of it, holds the secret seed: protect
checkpoints like the raw updates (``docs/threat_model.md``).

Privacy accounting. The stream reports the sensitivity sens of its encoder C under
the participation schema it was built for, computed from C itself. A whole run is
then ONE Gaussian mechanism with noise multiplier z/sens (Denisov et al. 2022,
Thm 4.1 for single participation; Choquette-Choo et al. 2023, arXiv:2211.06530,
Thm 2 for multiple participations). The query reports exactly that as
``PoissonSampledDpEvent(p, GaussianDpEvent(z/sens))`` with p = 1 in round 0 and
p = 0 afterwards (p = 0 is no privacy loss for both the PLD and RDP accountants),
so composing a run's events gives that single Gaussian. Reporting it in round 0 is
an upper bound at every intermediate round too, since the rows of C released by
round k have no larger sensitivity than C. (TFF traces ``get_noised_result`` once
and fixes its result type, hence the probability field rather than a switch to
``NoOpDpEvent``.) Amplification by sampling is not in the event: it can only lower
ε, and MMCC (``tff_mf.mmcc``) computes it separately.
"""

from __future__ import annotations

import collections
from typing import Optional

import dp_accounting
import numpy as np
import tensorflow as tf
import tensorflow_privacy as tfp

from tff_mf import checks
from tff_mf.tf import noise as noise_lib

MatrixFactorizationState = collections.namedtuple(
    "MatrixFactorizationState", ["round_index", "seed", "buffers"])

_SEED_LOW, _SEED_HIGH = -(2**62), 2**62


def single_participation_event(noise_multiplier: float) -> dp_accounting.DpEvent:
  """The whole run's guarantee (Denisov Thm 4.1): one Gaussian mechanism with multiplier z."""
  return dp_accounting.GaussianDpEvent(noise_multiplier)


class MatrixFactorizationQuery(tfp.SumAggregationDPQuery):
  """Clip each record to global ℓ2 norm ζ, sum, add this round's noise row (N·Z)[i].

  Args:
    noise: a ``tff_mf.tf.noise.StreamingNoise`` (dense, linear, precomputed); its
      ``sensitivity`` (computed from its encoder C) sets the reported guarantee.
    l2_norm_clip: ζ > 0.
    noise_multiplier: z > 0; σ = z·ζ. z = 0 (no noise, ε = ∞) only with
      ``allow_no_noise=True``.
    record_specs: the (nested) ``tf.TensorSpec`` structure of one client update.
    noise_seed: pin the secret seed (tests, reproduction); None = OS entropy.
  """

  def __init__(self, noise: noise_lib.StreamingNoise, *, l2_norm_clip: float,
               noise_multiplier: float, record_specs, noise_seed: Optional[int] = None,
               allow_no_noise: bool = False):
    if not isinstance(noise, noise_lib.StreamingNoise):
      raise TypeError(f"noise must be a StreamingNoise, got {type(noise).__name__}")
    self._clip = checks.positive_float(l2_norm_clip, "l2_norm_clip")
    self._noise_multiplier = checks.noise_multiplier(noise_multiplier, allow_zero=allow_no_noise)
    self._record_specs = record_specs
    self._flat_specs = noise_lib.flat_specs(record_specs)
    self._noise = noise
    self._seed = None if noise_seed is None else noise_lib.seed_pair(noise_seed)
    if isinstance(noise, noise_lib.PrecomputedNoise):
      if self._seed is None:
        raise checks.CheckError("PrecomputedNoise serves one pinned seed: pass the same "
                                "noise_seed")
      if not np.array_equal(self._seed, noise.seed):
        raise checks.CheckError("noise_seed differs from the seed the PrecomputedNoise rows "
                                "were built for")
      if noise.model_size != noise_lib.model_size(record_specs):
        raise checks.CheckError(f"precomputed noise rows have {noise.model_size} entries, the "
                                f"record specs {noise_lib.model_size(record_specs)}")

  # -- constructors -----------------------------------------------------------
  @classmethod
  def from_factorization(cls, factorization, *, l2_norm_clip: float, noise_multiplier: float,
                         record_specs, noise_seed: Optional[int] = None,
                         implementation: str = "dense", participation=None,
                         allow_no_noise: bool = False) -> "MatrixFactorizationQuery":
    """Dense or precomputed noise N = A⁻¹·B for a factorization, after checking all of it
    (``checks.factors``: triangularity, γ(C) = 1 and B·C = A on every entry)."""
    from tff_mf import participation as participation_lib  # pylint: disable=g-import-not-at-top
    f = factorization
    checks.factors(np.asarray(f.a), np.asarray(f.b), np.asarray(f.c),
                   name=f"factorization {getattr(f, 'strategy', '')!r}")
    schema = participation or participation_lib.SINGLE
    n_matrix = f.noise_matrix() if f.m != f.n else None
    if implementation == "dense":
      noise = noise_lib.DenseNoise(f.c, n_matrix, schema)
    elif implementation == "precomputed":
      if noise_seed is None:
        raise checks.CheckError("implementation='precomputed' needs a pinned noise_seed")
      noise = noise_lib.PrecomputedNoise(f.c, noise_seed, record_specs, n_matrix, schema)
    else:
      raise checks.CheckError(f"unknown implementation {implementation!r}; expected 'dense' or "
                              "'precomputed' (streams: pass a LinearNoise)")
    return cls(noise, l2_norm_clip=l2_norm_clip, noise_multiplier=noise_multiplier,
               record_specs=record_specs, noise_seed=noise_seed, allow_no_noise=allow_no_noise)

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

  @property
  def effective_noise_multiplier(self) -> float:
    """z/sens: the multiplier of the single Gaussian mechanism a whole run is."""
    return self._noise_multiplier / self._noise.sensitivity

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
      raise checks.CheckError(f"MatrixFactorizationQuery: {what} does not match the record specs the "
                       f"query was built for: {e}") from e
    for k, (x, s) in enumerate(zip(tf.nest.flatten(template), self._flat_specs)):
      shape = tf.TensorShape(x.shape)
      if not shape.is_compatible_with(s.shape) or tf.as_dtype(x.dtype) != s.dtype:
        raise checks.CheckError(
            f"MatrixFactorizationQuery: {what} leaf #{k} is {tf.as_dtype(x.dtype).name}"
            f"{shape}, the record specs say {s.dtype.name}{s.shape}")

  def initial_sample_state(self, template=None):
    if template is not None:
      self._check_structure(template, "the value type")
    return super().initial_sample_state(self._record_specs)

  def preprocess_record(self, params, record):
    self._check_structure(record, "the client update")
    flat = tf.nest.flatten(record)
    finite = [tf.debugging.assert_all_finite(
        x, message=f"{checks.IN_GRAPH_PREFIX}MatrixFactorizationQuery: client update leaf #{k} "
        "contains NaN or Inf") for k, x in enumerate(flat)]
    with tf.control_dependencies(finite):
      clipped, _ = tf.clip_by_global_norm(flat, tf.cast(params, tf.float32))
    return tf.nest.pack_sequence_as(record, clipped)

  def get_noised_result(self, sample_state, global_state):
    i = global_state.round_index
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
        event=dp_accounting.GaussianDpEvent(
            tf.constant(self.effective_noise_multiplier, tf.float64)))
    return result, new_state, event

  def derive_metrics(self, global_state):
    return collections.OrderedDict(round_index=global_state.round_index)
