"""``MatrixFactorizationQuery``: the DP matrix mechanism as a tensorflow_privacy DPQuery.

Round i (0-based) returns Σ_clients clip_ζ(update) + (N·Z)[i], with N = A⁻¹·B the
per-round noise matrix of a factorization A = B·C and Z i.i.d. N(0, σ²), σ = z·ζ
(Denisov et al. 2022, arXiv:2202.08312, Algorithm 1 and App I). A server optimizer
that applies the workload A (momentum β, learning rates η; Prop 4.2) to these
outputs releases A·(G + N·Z) = A·G + B·Z; see ``docs/mechanisms.md``.

State: ``MatrixFactorizationState(round_index, seed, stream_state)``, all tensors;
checkpointing and restoring it continues the identical noise stream. Unless
``noise_seed`` pins it, the seed is new each time the initial state is computed: a fresh
draw hashed with a 126-bit secret key the query takes from OS entropy through HKDF
(``initial_seed``, ``tff_mf.entropy``). The state, hence any checkpoint of it, holds the secret seed: protect
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
ε, and MMCC (``tff_mf.accounting.mmcc``) computes it separately.
"""

from __future__ import annotations

import collections
import math
from typing import Optional, Tuple

import dp_accounting
import numpy as np
import tensorflow as tf
import tensorflow_privacy as tfp

from tff_mf import checks
from tff_mf import entropy
from tff_mf.tf import clipping
from tff_mf.tf import noise as noise_lib

MatrixFactorizationState = collections.namedtuple(
    "MatrixFactorizationState", ["round_index", "seed", "stream_state"])

_SEED_LOW, _SEED_HIGH = -(2**62), 2**62
_SEED_BUCKETS = 2**63 - 1  # the seed words: SipHash outputs mod 2⁶³ − 1


def seed_key() -> Tuple[int, int]:
  """A fresh 126-bit key (HKDF-SHA256 of OS entropy) for an unpinned query's seeds."""
  return entropy.new_key_pair("noise-seed-key")


def initial_seed(pinned: Optional[np.ndarray], key: Optional[Tuple[int, int]] = None):
  """The state's seed: the pinned pair, else a new one each time the initial state is
  computed: SipHash-2-4 keyed by ``key`` (``tf.strings.to_hash_bucket_strong``; Aumasson &
  Bernstein 2012, a PRF) of a fresh ``RandomUniformInt`` draw. The draw makes every
  ``initialize()`` different; it is not secret (TensorFlow's seed-(0, 0) ops draw from a
  Mersenne Twister seeded with 32 bits per process, ``tff_mf.entropy``), the key is."""
  if pinned is not None:
    return tf.constant(pinned)
  if key is None:
    raise ValueError("an unpinned seed needs the query's key (seed_key())")
  fresh = tf.strings.as_string(tf.raw_ops.RandomUniformInt(
      shape=tf.constant([2], tf.int32), minval=tf.constant(_SEED_LOW, tf.int64),
      maxval=tf.constant(_SEED_HIGH, tf.int64), seed=0, seed2=0))
  draw = tf.strings.join([fresh[0], fresh[1]], separator=":")
  return tf.strings.to_hash_bucket_strong(
      tf.strings.join([tf.stack([draw, draw]), tf.constant(["seed-0", "seed-1"])],
                      separator="|"), num_buckets=_SEED_BUCKETS, key=list(key))


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
    self._noise_multiplier = checks.noise_multiplier(
        noise_multiplier, allow_zero=allow_no_noise, no_noise_hint=checks.PYTHON_NO_NOISE_HINT)
    self._record_specs = record_specs
    self._flat_specs = noise_lib.flat_specs(record_specs)
    self._noise = noise
    self._seed = None if noise_seed is None else noise_lib.seed_pair(noise_seed)
    self._seed_key = seed_key() if noise_seed is None else None
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
    return MatrixFactorizationState(
        round_index=tf.constant(0, tf.int32), seed=initial_seed(self._seed, self._seed_key),
        stream_state=self._noise.initial_state(self._flat_specs))

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

  def _clipped(self, params, record, dtype=tf.float32):
    """(clipped leaves, global norm) of a checked, finite client update, clipped in ``dtype``."""
    self._check_structure(record, "the client update")
    flat = tf.nest.flatten(record)
    finite = clipping.assert_finite(flat, f"{checks.IN_GRAPH_PREFIX}{type(self).__name__}: ")
    with tf.control_dependencies(finite):
      return clipping.clip_by_global_norm([tf.cast(x, dtype) for x in flat],
                                          tf.cast(params, dtype))

  def preprocess_record(self, params, record):
    clipped, _ = self._clipped(params, record)
    return tf.nest.pack_sequence_as(record, clipped)

  def get_noised_result(self, sample_state, global_state):
    i = global_state.round_index
    noise_flat, stream_state = self._noise.noise_row(
        global_state.seed, i, global_state.stream_state, self._flat_specs, self.stddev)
    flat = tf.nest.flatten(sample_state)
    result = tf.nest.pack_sequence_as(
        sample_state, [x + tf.cast(z, x.dtype) for x, z in zip(flat, noise_flat)])
    new_state = MatrixFactorizationState(round_index=i + 1, seed=global_state.seed,
                                         stream_state=stream_state)
    event = dp_accounting.PoissonSampledDpEvent(
        sampling_probability=tf.where(tf.equal(i, 0), tf.constant(1.0, tf.float64),
                                      tf.constant(0.0, tf.float64)),
        event=dp_accounting.GaussianDpEvent(
            tf.constant(self.effective_noise_multiplier, tf.float64)))
    return result, new_state, event

  def derive_metrics(self, global_state):
    return collections.OrderedDict(round_index=global_state.round_index)


AdaptiveClipState = collections.namedtuple(
    "AdaptiveClipState", ["round_index", "seed", "stream_state", "clip"])

# Row tag of the count noise: Z rows use fold_in(seed, j) with j ≥ 0 (``noise.standard_normal_row``).
_COUNT_NOISE_TAG = -1


class AdaptiveClipMatrixFactorizationQuery(MatrixFactorizationQuery):
  """``MatrixFactorizationQuery`` whose clip norm ζ_i follows a private quantile estimate.

  Round i clips each update to ζ_i and adds ζ_i·(C⁻¹Z)[i] with Z ~ N(0, z²); the clip
  norm then moves geometrically toward the target quantile of the update norms from a
  noisy count of unclipped updates (Andrew et al. 2021, arXiv:1905.03871), as in
  ``tff_mf.accounting.adaptive_clipping`` (the float64 reference and the privacy split). The count
  noise is drawn from the run's secret seed (a stream apart from Z's rows), so a
  checkpoint resumes the identical clip sequence and noise. With learning rate 0 every
  round equals the fixed-clip query at ζ_0 bit for bit.

  Args:
    noise: the ``StreamingNoise`` of the mechanism.
    adaptive: a checked ``tff_mf.accounting.adaptive_clipping.AdaptiveClipping``.
    noise_multiplier: z of the MF noise (per unit of clip norm).
    clients_per_round: K, the expected number of updates per round (normalizes the count).
    participations: k, the most rounds one client joins under the schema (count sensitivity).
    record_specs, noise_seed, allow_no_noise: as for ``MatrixFactorizationQuery``.
  """

  def __init__(self, noise: noise_lib.StreamingNoise, *, adaptive, noise_multiplier: float,
               clients_per_round: float, participations: int, record_specs,
               noise_seed: Optional[int] = None, allow_no_noise: bool = False):
    super().__init__(noise, l2_norm_clip=adaptive.initial_clip_norm,
                     noise_multiplier=noise_multiplier, record_specs=record_specs,
                     noise_seed=noise_seed, allow_no_noise=allow_no_noise)
    from tff_mf.accounting import adaptive_clipping  # pylint: disable=g-import-not-at-top
    self._adaptive = adaptive
    self._clients = checks.positive_float(clients_per_round, "clients_per_round")
    self._participations = checks.positive_int(participations, "participations")
    self._count_stddev = float(adaptive.clipped_count_stddev)
    if self._count_stddev == 0.0 and not allow_no_noise:
      raise checks.CheckError("clipped_count_stddev = 0 releases the count of unclipped "
                              "updates without noise; pass allow_no_noise=True to accept that",
                              arguments=("clipped_count_stddev", "allow_no_noise"))
    mu_count = adaptive_clipping.count_mu(self._count_stddev, self._participations)
    self._count_multiplier = 0.0 if math.isinf(mu_count) else 1.0 / mu_count

  @property
  def count_noise_multiplier(self) -> float:
    """σ_b/(½·√k): the multiplier of the single Gaussian all count queries of a run are."""
    return self._count_multiplier

  def initial_global_state(self):
    base = super().initial_global_state()
    return AdaptiveClipState(round_index=base.round_index, seed=base.seed,
                             stream_state=base.stream_state,
                             clip=tf.constant(self._adaptive.initial_clip_norm, tf.float32))

  def derive_sample_params(self, global_state):
    return global_state.clip

  def initial_sample_state(self, template=None):
    values = super().initial_sample_state(template)
    return values, tf.constant(0.0, tf.float32)

  def preprocess_record(self, params, record):
    clipped, norm = self._clipped(params, record)
    unclipped = tf.cast(norm <= tf.cast(params, tf.float32), tf.float32) - 0.5
    return tf.nest.pack_sequence_as(record, clipped), unclipped

  def _count_noise(self, seed, i):
    count_seed = tf.random.experimental.stateless_fold_in(
        tf.random.experimental.stateless_fold_in(seed, tf.constant(_COUNT_NOISE_TAG, tf.int64),
                                                 alg=noise_lib.PHILOX),
        tf.cast(i, tf.int64), alg=noise_lib.PHILOX)
    return self._count_stddev * tf.random.stateless_normal(
        [], seed=count_seed, dtype=tf.float64, alg=noise_lib.PHILOX)

  def get_noised_result(self, sample_state, global_state):
    values, count = sample_state
    i, clip = global_state.round_index, global_state.clip
    clip0 = self._adaptive.initial_clip_norm
    # The stream runs at the constant scale z·ζ_0, so its state stays consistent; the row is
    # rescaled to ζ_i (a factor of exactly 1.0 while ζ_i = ζ_0).
    noise_flat, stream_state = self._noise.noise_row(
        global_state.seed, i, global_state.stream_state, self._flat_specs, self.stddev)
    scale = clip / tf.constant(clip0, tf.float32)
    flat = tf.nest.flatten(values)
    result = tf.nest.pack_sequence_as(
        values, [x + tf.cast(z, x.dtype) * tf.cast(scale, x.dtype)
                 for x, z in zip(flat, noise_flat)])
    noisy = tf.cast(count, tf.float64) + self._count_noise(global_state.seed, i)
    unclipped = tf.clip_by_value(noisy / self._clients + 0.5, 0.0, 1.0)
    new_clip = tf.cast(clip, tf.float64) * tf.exp(
        -self._adaptive.learning_rate * (unclipped - self._adaptive.target_quantile))
    new_state = AdaptiveClipState(round_index=i + 1, seed=global_state.seed,
                                  stream_state=stream_state, clip=tf.cast(new_clip, tf.float32))
    first = tf.where(tf.equal(i, 0), tf.constant(1.0, tf.float64), tf.constant(0.0, tf.float64))
    event = dp_accounting.ComposedDpEvent([
        dp_accounting.PoissonSampledDpEvent(
            sampling_probability=first, event=dp_accounting.GaussianDpEvent(
                tf.constant(self.effective_noise_multiplier, tf.float64))),
        dp_accounting.PoissonSampledDpEvent(
            sampling_probability=first, event=dp_accounting.GaussianDpEvent(
                tf.constant(self._count_multiplier, tf.float64)))])
    return result, new_state, event

  def derive_metrics(self, global_state):
    return collections.OrderedDict(round_index=global_state.round_index,
                                   clip_norm=global_state.clip)

SeededGaussianState = collections.namedtuple(
    "SeededGaussianState", ["l2_norm_clip", "stddev", "seed"])


class SeededGaussianSumQuery(tfp.GaussianSumQuery):
  """tensorflow_privacy's ``GaussianSumQuery`` (DP-FedAvg, McMahan et al. 2017,
  arXiv:1710.06963) with noise drawn from a seed in its state.

  The same clipping and the same noise N(0, σ²) per coordinate, the same
  ``GaussianDpEvent(σ/ζ)`` each round; only the generator differs: the noise of a
  round is ``tf.random.stateless_normal`` keyed by the state's seed, which is then
  split for the next round (TensorFlow's stateful RNG, which ``gaussian_fixed``
  uses, cannot be replayed). A run restarted from its seed, or from a checkpoint of
  the state, adds the very noise it added before, so a replayed round releases
  nothing new. The seed is secret: the state, hence any checkpoint, holds it. Without
  a pinned ``noise_seed`` every ``initialize()`` draws a new seed from OS entropy (as
  ``MatrixFactorizationQuery`` does), so two runs of one built process never share noise.
  """

  def __init__(self, l2_norm_clip: float, stddev: float, noise_seed: Optional[int] = None):
    super().__init__(l2_norm_clip=l2_norm_clip, stddev=stddev)
    self._seed = None if noise_seed is None else noise_lib.seed_pair(noise_seed)
    self._seed_key = seed_key() if noise_seed is None else None

  def preprocess_record_impl(self, params, record):
    """tensorflow_privacy's clipping with the rule's norm (``tff_mf.tf.clipping``): the same
    ops where the float32 norm is finite, no NaN where it overflows."""
    clipped, norm = clipping.clip_by_global_norm(tf.nest.flatten(record), params)
    return tf.nest.pack_sequence_as(record, clipped), norm

  def initial_global_state(self):
    return SeededGaussianState(tf.cast(self._l2_norm_clip, tf.float32),
                               tf.cast(self._stddev, tf.float32), initial_seed(self._seed,
                                                                          self._seed_key))

  def get_noised_result(self, sample_state, global_state):
    flat = tf.nest.flatten(sample_state)
    seeds = tf.random.experimental.stateless_split(global_state.seed, num=len(flat) + 1)
    noised = [x + tf.cast(tf.random.stateless_normal(tf.shape(x), seed=seeds[k],
                                                     stddev=global_state.stddev), x.dtype)
              for k, x in enumerate(flat)]
    event = dp_accounting.GaussianDpEvent(global_state.stddev / global_state.l2_norm_clip)
    new_state = SeededGaussianState(global_state.l2_norm_clip, global_state.stddev, seeds[-1])
    return tf.nest.pack_sequence_as(sample_state, noised), new_state, event


DiscreteGaussianState = collections.namedtuple(
    "DiscreteGaussianState", ["round_index", "seed", "sums", "outputs"])


class DiscreteGaussianQuery(MatrixFactorizationQuery):
  """The integer release with discrete Gaussian noise (``tff_mf.noise.discrete_gaussian``).

  Round t clips and sums the records (x_t), releases Y_t = round(γ·(C·x)_t) + N_t with
  N_t ~ N_ℤ(0, σ²), σ = z·γ·ζ (``noise.discrete_gaussian_row``), and returns
  s_t = (Y_t/γ − Σ_{k≥1} C[t, t−k]·s_{t−k})/C[t, t], computed from Y and earlier outputs
  only, cast to the records' dtype. A record is clipped to ζ in float64 and summed in float64
  (TFF's sum and the compiled engine's alike), with a count of the records, so the sensitivity
  covers the sum as computed (``discrete_gaussian.clip_allowance``); a round that sums more
  than the plan's K records is refused. C is b-banded (C = I: b = 1). State: the last b − 1
  sums x (unnoised, float64: as secret as the seed, which regenerates the noise) and
  outputs s. Its DpEvent is
  ``UnsupportedDpEvent``: dp_accounting has no discrete-Gaussian event; the run's ε is the
  record's (zCDP, Canonne, Kamath, Steinke 2020, arXiv:2004.00010, Thm 14 and Cor 13).

  Args:
    noise: a ``StreamingNoise`` of the encoder C (its sensitivity under the schema).
    plan_for: model size d → the checked ``tff_mf.noise.discrete_gaussian.Plan``.
    l2_norm_clip, noise_multiplier, record_specs, noise_seed: as for
      ``MatrixFactorizationQuery``.
  """

  def __init__(self, noise: noise_lib.StreamingNoise, *, plan_for, l2_norm_clip: float,
               noise_multiplier: float, record_specs, noise_seed: Optional[int] = None):
    from tff_mf.noise import discrete_gaussian as dg  # pylint: disable=g-import-not-at-top
    super().__init__(noise, l2_norm_clip=l2_norm_clip, noise_multiplier=noise_multiplier,
                     record_specs=record_specs, noise_seed=noise_seed)
    self._dg = dg
    self._bands = dg.band_coefficients(noise.encoder())
    self._sizes = [int(np.prod(s.shape)) for s in self._flat_specs]
    self.plan = plan_for(sum(self._sizes))

  @property
  def effective_noise_multiplier(self) -> float:
    """σ/Δ = z·γ·ζ/Δ: ρ = 1/(2·(σ/Δ)²)."""
    return self.plan.sigma / self.plan.integer_sensitivity

  def initial_global_state(self):
    d, b = sum(self._sizes), self._bands.shape[1]
    return DiscreteGaussianState(
        round_index=tf.constant(0, tf.int32), seed=initial_seed(self._seed, self._seed_key),
        sums=tf.zeros([b - 1, d], tf.float64), outputs=tf.zeros([b - 1, d], tf.float64))

  def derive_sample_params(self, global_state):
    del global_state
    return tf.constant(self._clip, tf.float64)  # ζ itself, not its float32 rounding

  def initial_sample_state(self, template=None):
    """(float64 zeros shaped like the records, a float64 record count of 0)."""
    if template is not None:
      self._check_structure(template, "the value type")
    zeros = [tf.zeros(s.shape, tf.float64) for s in self._flat_specs]
    return (tf.nest.pack_sequence_as(self._record_specs, zeros), tf.constant(0.0, tf.float64))

  def preprocess_record(self, params, record):
    """(the record clipped to ζ in float64, 1): summed in float64 with its count."""
    clipped, _ = self._clipped(params, record, tf.float64)
    return tf.nest.pack_sequence_as(record, clipped), tf.constant(1.0, tf.float64)

  def get_noised_result(self, sample_state, global_state):
    dg, plan, b = self._dg, self.plan, self._bands.shape[1]
    values, count = sample_state
    i = global_state.round_index
    past_end = tf.debugging.assert_less(
        i, tf.constant(self._bands.shape[0], tf.int32),
        message=f"{checks.IN_GRAPH_PREFIX}DiscreteGaussianQuery: round index past the "
        f"n={self._bands.shape[0]} rounds it was built for")
    few = tf.debugging.assert_less_equal(
        count, tf.constant(float(plan.records), tf.float64),
        message=f"{checks.IN_GRAPH_PREFIX}DiscreteGaussianQuery: the round summed more than "
        f"the {plan.records} records its sensitivity covers (float64 summation allowance)")
    with tf.control_dependencies([past_end, few]):
      coef = tf.gather(tf.constant(self._bands), i)
    flat = tf.nest.flatten(values)
    x = tf.concat([tf.reshape(tf.cast(v, tf.float64), [-1]) for v in flat], 0)
    a, size = coef[0] * x, tf.abs(coef[0]) * tf.abs(x)
    for k in range(1, b):
      a += coef[k] * global_state.sums[k - 1]
      size += tf.abs(coef[k]) * tf.abs(global_state.sums[k - 1])
    gamma = tf.constant(plan.granularity, tf.float64)
    in_range = tf.debugging.assert_less_equal(
        gamma * tf.reduce_max(size), tf.constant(dg.MAGNITUDE_LIMIT, tf.float64),
        message=f"{checks.IN_GRAPH_PREFIX}DiscreteGaussianQuery: gamma * |C x| exceeds 2^40, "
        "where the float64 allowance of the sensitivity holds; use a smaller granularity")
    with tf.control_dependencies([in_range]):
      y = tf.cast(tf.round(gamma * a), tf.int64) + noise_lib.discrete_gaussian_row(
          global_state.seed, i, x.shape[0], plan.sigma)
    exact = tf.debugging.assert_less(
        tf.reduce_max(tf.abs(y)), tf.constant(int(dg.INTEGER_LIMIT), tf.int64),
        message=f"{checks.IN_GRAPH_PREFIX}DiscreteGaussianQuery: the integer release left "
        "2^52; use a smaller granularity")
    with tf.control_dependencies([exact]):
      s = tf.cast(y, tf.float64) / gamma
    for k in range(1, b):
      s -= coef[k] * global_state.outputs[k - 1]
    s /= coef[0]
    if b > 1:
      sums = tf.concat([x[None], global_state.sums[:-1]], 0)
      outputs = tf.concat([s[None], global_state.outputs[:-1]], 0)
    else:
      sums, outputs = global_state.sums, global_state.outputs
    parts = tf.split(s, self._sizes) if len(self._sizes) > 1 else [s]
    result = tf.nest.pack_sequence_as(  # the records' dtype (float64 only up to here)
        values, [tf.cast(tf.reshape(p, s.shape), s.dtype) for p, s in zip(parts, self._flat_specs)])
    new_state = DiscreteGaussianState(round_index=i + 1, seed=global_state.seed, sums=sums,
                                      outputs=outputs)
    return result, new_state, dp_accounting.UnsupportedDpEvent()
