"""Adaptive clipping with matrix-factorization noise (Andrew et al. 2021, arXiv:1905.03871).

The query is driven directly through the DPQuery protocol (clients' records →
preprocess → sum → get_noised_result), the way TFF's DifferentiallyPrivateFactory
drives it, plus one run inside ``build_unweighted_fed_avg``. Every expected value is
computed independently: the geometric rule in float64 (``adaptive_clipping``'s
reference is itself checked against the closed form), the covariance from C and the
recorded ζ_i, and ε with dp_accounting's PLD accountant called directly.
"""

import math

import dp_accounting
import numpy as np
import pytest
import tensorflow as tf

import statcheck
from tff_mf.accounting import adaptive_clipping as ac
from tff_mf import checks
from tff_mf import participation
from tff_mf.factorization import strategies
from tff_mf.factorization import workloads
from tff_mf.spec import MechanismSpec
from tff_mf.tf import aggregators
from tff_mf.tf import noise as noise_lib
from tff_mf.tf import query as query_lib

N = 8
SEED = 7


def _noise(n=N, strategy="optimal"):
  f = strategies.factorize(strategies.FactorizationSpec(
      workloads.WorkloadSpec(kind="prefix_sum", n=n), strategy=strategy))
  return f, noise_lib.DenseNoise(f.c, None, participation.SINGLE)


def _query(noise, specs, z=1.0, **adaptive):
  stddev = adaptive.pop("clipped_count_stddev", 0.0)
  config = ac.AdaptiveClipping(clipped_count_stddev=stddev, **adaptive).checked(4)
  return query_lib.AdaptiveClipMatrixFactorizationQuery(
      noise, adaptive=config, noise_multiplier=z, clients_per_round=4, participations=1,
      record_specs=specs, noise_seed=SEED, allow_no_noise=True)


def _round(q, state, records):
  params = q.derive_sample_params(state)
  sample = q.initial_sample_state()
  for r in records:
    sample = q.accumulate_preprocessed_record(sample, q.preprocess_record(params, r))
  return q.get_noised_result(sample, state)


@pytest.mark.parametrize("norm,direction", [(100.0, "up"), (1e-6, "down")])
def test_clip_moves_toward_the_quantile_at_the_geometric_rate(norm, direction):
  """All norms above ζ: unclipped fraction 0, ζ·exp(ηγ) per round; all below: ζ·exp(−η(1−γ))."""
  _, noise = _noise()
  specs = [tf.TensorSpec([3], tf.float32)]
  q = _query(noise, specs, target_quantile=0.3, initial_clip_norm=0.5, learning_rate=0.2)
  state = q.initial_global_state()
  clips = [float(state.clip)]
  record = [tf.constant([norm, 0.0, 0.0])]
  for _ in range(N):
    _, state, _ = _round(q, state, [record] * 4)
    clips.append(float(state.clip))
  rate = math.exp(0.2 * 0.3) if direction == "up" else math.exp(-0.2 * 0.7)
  expected = 0.5 * rate ** np.arange(N + 1)
  np.testing.assert_allclose(clips, expected, rtol=1e-6)  # float32 state
  # The float64 reference of the rule agrees.
  ref = ac.reference_clips([[norm] * 4] * N, ac.AdaptiveClipping(0.3, 0.5, 0.2, 0.0), 4)
  np.testing.assert_allclose(ref, expected, rtol=1e-12)


def test_zero_learning_rate_is_the_fixed_clip_mechanism_bit_for_bit():
  _, noise = _noise()
  specs = [tf.TensorSpec([5], tf.float32), tf.TensorSpec([2, 2], tf.float32)]
  adaptive = _query(noise, specs, z=0.8, initial_clip_norm=0.7, learning_rate=0.0,
                    clipped_count_stddev=1.0)
  fixed = query_lib.MatrixFactorizationQuery(noise, l2_norm_clip=0.7, noise_multiplier=0.8,
                                             record_specs=specs, noise_seed=SEED)
  rng = np.random.default_rng(0)
  sa, sf = adaptive.initial_global_state(), fixed.initial_global_state()
  for _ in range(N):
    records = [[tf.constant(rng.normal(size=5), tf.float32),
                tf.constant(rng.normal(size=(2, 2)), tf.float32)] for _ in range(4)]
    ra, sa, _ = _round(adaptive, sa, records)
    rf, sf, _ = _round(fixed, sf, records)
    for x, y in zip(ra, rf):
      np.testing.assert_array_equal(x.numpy(), y.numpy())
    assert float(sa.clip) == np.float32(0.7)


def test_released_noise_has_the_covariance_of_the_recorded_clips():
  """Zero updates: row i is ζ_i·z·(C⁻¹Z)[i], so Cov = z²·diag(ζ)·C⁻¹C⁻ᵀ·diag(ζ) (d = 20,000).

  Wilks/Bartlett covariance test at α = 1e-3 (false alarm 0.1%), on 20,000 coordinates as
  i.i.d. samples; the same test rejects the fixed-ζ_0 covariance (power shown).
  """
  f, noise = _noise()
  d, z = 20000, 1.3
  specs = [tf.TensorSpec([d], tf.float32)]
  q = _query(noise, specs, z=z, initial_clip_norm=1.0, learning_rate=0.5,
             clipped_count_stddev=0.5)
  state = q.initial_global_state()
  rows, clips = [], []
  zero = [tf.zeros([d], tf.float32)]
  for _ in range(N):
    clips.append(float(state.clip))
    result, state, _ = _round(q, state, [zero] * 4)
    rows.append(result[0].numpy().astype(np.float64))
  samples = np.stack(rows).T  # d x n
  c_inv = np.linalg.inv(f.c)
  scale = np.diag(clips)
  cov = z ** 2 * scale @ c_inv @ c_inv.T @ scale
  assert len(set(clips)) > 4  # the clip really moved
  statcheck.assert_covariance(
      samples, cov, alpha=1e-3, what="adaptive clip noise",
      alternatives={"clip fixed at ζ_0": z ** 2 * c_inv @ c_inv.T,
                    "clip one round late": z ** 2 * np.diag([1.0] + clips[:-1]) @ c_inv
                    @ c_inv.T @ np.diag([1.0] + clips[:-1])})


def test_resume_continues_the_identical_clip_sequence_and_noise():
  _, noise = _noise()
  specs = [tf.TensorSpec([4], tf.float32)]
  q = _query(noise, specs, initial_clip_norm=0.3, learning_rate=0.3, clipped_count_stddev=2.0)
  rng = np.random.default_rng(1)
  records = [[[tf.constant(rng.normal(size=4), tf.float32)] for _ in range(4)]
             for _ in range(N)]
  state = q.initial_global_state()
  straight = []
  for i in range(N):
    result, state, _ = _round(q, state, records[i])
    straight.append((result[0].numpy(), float(state.clip)))
  state = q.initial_global_state()
  for i in range(3):
    _, state, _ = _round(q, state, records[i])
  # A checkpoint holds plain arrays; a new query object restores them.
  saved = tf.nest.map_structure(lambda t: np.array(t), state)
  q2 = _query(noise, specs, initial_clip_norm=0.3, learning_rate=0.3, clipped_count_stddev=2.0)
  state = tf.nest.map_structure(tf.constant, saved)
  state = query_lib.AdaptiveClipState(*state)
  for i in range(3, N):
    result, state, _ = _round(q2, state, records[i])
    np.testing.assert_array_equal(result[0].numpy(), straight[i][0])
    assert float(state.clip) == straight[i][1]


def _pld_epsilon(multipliers, delta):
  acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
  for m in multipliers:
    acc.compose(dp_accounting.GaussianDpEvent(m))
  return acc.get_epsilon(delta)


@pytest.mark.parametrize("schema", [participation.SINGLE, participation.fixed_epoch(2)])
def test_epsilon_composes_the_mf_gaussian_and_the_count_queries(schema):
  """ε of build_mechanism = PLD of Gaussian(z/sens) ∘ Gaussian(σ_b/(½√k)), computed directly."""
  n, z, sigma_b, delta = 16, 1.2, 3.0, 1e-6
  setup = aggregators.build_mechanism(MechanismSpec.from_args(
      "opt_prefix_sum", total_rounds=n, noise_multiplier=z, clients_per_round=10,
      clip_norm="adaptive", clipped_count_stddev=sigma_b, delta=delta, participation=schema))
  info = setup.info
  k = schema.max_participations_in(n)
  sens = info["sensitivity"]
  assert info["clipping"] == "adaptive" and info["count_participations"] == k
  assert info["effective_noise_multiplier_value"] == pytest.approx(z / sens, rel=1e-12)
  assert info["effective_noise_multiplier_count"] == pytest.approx(
      sigma_b / (0.5 * math.sqrt(k)), rel=1e-12)
  independent = _pld_epsilon([z / sens, sigma_b / (0.5 * math.sqrt(k))], delta)
  # The exact accountant of one Gaussian at 1/μ is never above the (pessimistic) PLD of the
  # two Gaussians, and within the PLD's discretization error (1e-4 per loss unit) of it.
  assert info["epsilon"] <= independent * (1 + 1e-9)
  assert info["epsilon"] >= independent - 1e-2


def test_epsilon_after_each_round_charges_the_count_queries_released_by_then():
  """Issue 48 item 6 (docs/mechanisms.md, "ε after each round"): after round r the run is
  one Gaussian with μ_r² = (sens_r/z)² + k_r·(½/σ_b)², k_r the participations a user can have
  had by round r; computed here from the released rows' sensitivity, independently of the
  library's sequence, which must agree up to its monotone envelope and end at the record."""
  from tff_mf import accounting, mechanisms  # pylint: disable=g-import-not-at-top
  n, z, sigma_b, delta = 16, 1.2, 3.0, 1e-6
  schema = participation.fixed_epoch(2)
  setup = aggregators.build_mechanism(MechanismSpec.from_args(
      "opt_prefix_sum", total_rounds=n, noise_multiplier=z, clients_per_round=10,
      clip_norm="adaptive", clipped_count_stddev=sigma_b, delta=delta, participation=schema))
  eps = setup.privacy.epsilon_by_round()
  c = setup.privacy.encoder
  direct = []
  for r in range(1, n + 1):
    rows, schema_r = mechanisms.prefix_encoder(c, schema, r)
    sens_r = accounting.sensitivity_report(rows, schema_r)["value"]
    k_r = 1 if r <= n // 2 else 2  # epochs of 8 rounds: the second participation from round 9
    assert schema.participations_by(n, r) == k_r
    mu = math.hypot(sens_r / z, math.sqrt(k_r) * 0.5 / sigma_b)
    direct.append(accounting.epsilon(1.0 / mu, delta, "exact"))
  assert eps[-1] == setup.privacy.epsilon
  for r in range(n):
    assert eps[r] <= min(direct[r:]) * (1 + 1e-12)  # never above a bound for a later release
  # The first round no longer pays for both count queries of a user.
  sens_1 = accounting.sensitivity_report(*mechanisms.prefix_encoder(c, schema, 1))["value"]
  charged_all = accounting.epsilon(
      1.0 / math.hypot(sens_1 / z, math.sqrt(2) * 0.5 / sigma_b), delta, "exact")
  assert eps[0] < charged_all


def test_participations_by_round_under_each_kind():
  """The count queries a user can have joined by round r, per schema (16 rounds)."""
  assert [participation.SINGLE.participations_by(16, r) for r in (1, 16)] == [1, 1]
  assert [participation.fixed_epoch(4).participations_by(16, r) for r in (1, 4, 5, 16)] == \
      [1, 1, 2, 4]
  assert [participation.random_allocation(4).participations_by(16, r) for r in (4, 5)] == [1, 2]
  assert [participation.min_sep(3).participations_by(16, r) for r in (1, 3, 4, 16)] == \
      [1, 1, 2, 6]
  assert participation.min_sep(3, 2).participations_by(16, 16) == 2


def test_target_epsilon_is_split_and_met():
  n, delta, target = 16, 1e-6, 4.0
  setup = aggregators.build_mechanism(MechanismSpec.from_args(
      "opt_prefix_sum", total_rounds=n, target_epsilon=target, delta=delta, clients_per_round=100,
      clip_norm="adaptive"))
  info = setup.info
  assert info["epsilon"] <= target
  assert info["epsilon"] == pytest.approx(target, rel=1e-3)
  sigma_b = info["adaptive_clipping"]["clipped_count_stddev"]
  assert sigma_b == pytest.approx(0.05 * 100)
  total = ac.combined_noise_multiplier(info["noise_multiplier"], info["sensitivity"], sigma_b, 1)
  assert total == pytest.approx(info["effective_noise_multiplier"], rel=1e-12)
  assert info["noise_multiplier"] > total  # the MF noise pays for the count queries


def test_bad_adaptive_arguments_are_one_line_errors():
  base = dict(total_rounds=8, noise_multiplier=1.0, clients_per_round=4)
  cases = [
      (dict(clip_norm="adaptiv"), "clip_norm must be a positive number or 'adaptive'"),
      (dict(clip_norm=1.0, target_quantile=0.9), "go with clip_norm='adaptive' only"),
      (dict(clip_norm="adaptive", target_quantile=1.5), "target_quantile must be in"),
      (dict(clip_norm="adaptive", initial_clip_norm=0.0), "initial_clip_norm must be"),
      (dict(clip_norm="adaptive", clip_learning_rate=-1.0), "clip_learning_rate must be"),
  ]
  for kwargs, message in cases:
    with pytest.raises(checks.CheckError, match=message) as e:
      aggregators.build_mechanism(MechanismSpec.from_args("opt_prefix_sum", **base, **kwargs))
    assert "\n" not in str(e.value)
  with pytest.raises(checks.CheckError, match="honaker_online"):
    aggregators.build_mechanism(MechanismSpec.from_args("tree", **base, clip_norm="adaptive"))
  with pytest.raises(checks.CheckError, match="too small"):
    aggregators.build_mechanism(MechanismSpec.from_args(
        "opt_prefix_sum", total_rounds=8, target_epsilon=1.0, delta=1e-6, clients_per_round=4,
        clip_norm="adaptive"))


@pytest.mark.parametrize("mechanism", ["blt", "gaussian"])
def test_adaptive_mechanism_trains_inside_tff_fed_avg(mechanism):
  """build_mechanism(clip_norm='adaptive') as model_aggregator: ζ per round in the metrics,
  DpEvents that compose to the reported ε, and (blt) the clip sequence of the reference."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_mf.tf import runtime  # pylint: disable=g-import-not-at-top
  runtime.install_exit_hook()
  n, k, delta = 6, 3, 1e-5
  input_spec = (tf.TensorSpec([None, 2], tf.float32), tf.TensorSpec([None, 1], tf.float32))

  def model_fn():
    keras_model = tf.keras.Sequential([tf.keras.layers.Dense(
        1, kernel_initializer="zeros", bias_initializer="zeros", input_shape=(2,))])
    return tff.learning.models.from_keras_model(
        keras_model, loss=tf.keras.losses.MeanSquaredError(), input_spec=input_spec)

  setup = aggregators.build_mechanism(MechanismSpec.from_args(
      mechanism, total_rounds=n, noise_multiplier=2.0, clients_per_round=k, clip_norm="adaptive",
      initial_clip_norm=0.05, clip_learning_rate=0.5, delta=delta,
      clipped_count_stddev=0.5), noise_seed=None if mechanism == "gaussian" else SEED)
  process = tff.learning.algorithms.build_unweighted_fed_avg(
      model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.5),
      server_optimizer_fn=setup.server_optimizer, model_aggregator=setup.aggregation_factory)
  rng = np.random.default_rng(0)
  state = process.initialize()
  clips, events = [], []
  for _ in range(n):
    data = [tf.data.Dataset.from_tensor_slices(
        (rng.normal(size=(4, 2)).astype(np.float32),
         (10 * rng.normal(size=(4, 1))).astype(np.float32))).batch(4) for _ in range(k)]
    out = process.next(state, data)
    state = out.state
    metrics = out.metrics["aggregator"]["dp_query_metrics"]
    clip = metrics["clip_norm"]
    clips.append(float(clip))
    events.append(aggregators.dp_event_from_state(state.aggregator))
  assert all(np.isfinite(clips)) and len(set(clips)) > 1  # ζ is reported and moves
  # Large updates (targets ~ 10) are all clipped at ζ_0 = 0.05: the clip grows.
  assert clips[-1] > clips[0]
  if mechanism == "blt":
    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    for event in events:
      acc.compose(event)
    assert setup.info["epsilon"] <= acc.get_epsilon(delta) * (1 + 1e-9)
    assert setup.info["epsilon"] >= acc.get_epsilon(delta) - 1e-2
