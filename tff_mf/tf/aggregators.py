"""Drop-in TFF aggregators for every trainable mechanism of the registry.

``build_mechanism(spec)`` returns a ``MechanismSetup``: an aggregation factory
for ``model_aggregator=`` of ``tff.learning.algorithms.build_unweighted_fed_avg`` /
``build_weighted_fed_avg`` and the server optimizer that applies the training
workload A = M(η)·M(β) (Denisov et al. 2022, arXiv:2202.08312, Prop 4.2, Eq. 9) to
the aggregator's outputs, so that the model after round i is
θ_0 − (η_server/K)·(A·G + B·Z)[i] (Algorithm 1, K clients per round). Names,
aliases, workloads and noise kinds come from ``tff_mf.registry``; the algebra of
each mechanism is in ``docs/mechanisms.md``. What the mechanism is — its factorization,
stream, encoder, sensitivity and privacy record — is decided in numpy by
``tff_mf.mechanisms``; this module only turns that into TFF objects.

``noise_multiplier`` z is the noise standard deviation per clip norm of each row of
Z for the normalized encoder (γ(C) = 1). Under the participation schema the run is
one Gaussian mechanism with multiplier z/sens, sens the encoder's sensitivity
under that schema computed from the matrices (1 for single participation). Noise
is divided by the clients per round like TFF's own DP factories
(``tensorflow_privacy.NormalizedQuery``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Optional, Union

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
import tensorflow_privacy as tfp

from tff_mf import checks
from tff_mf import factorization as fz
from tff_mf import mechanisms
from tff_mf import plan as plan_lib
from tff_mf import registry
from tff_mf import spec as spec_lib
from tff_mf.factorization.families import tree
from tff_mf.noise import keys
from tff_mf.tf import clipping as tf_clipping
from tff_mf.tf import noise as noise_lib
from tff_mf.tf import query as query_lib
from tff_mf.tf import runtime


@dataclasses.dataclass
class MechanismSetup:
  """What ``build_mechanism`` returns.

  Attributes:
    aggregation_factory: for ``model_aggregator=`` of ``build_unweighted_fed_avg`` and
      ``build_weighted_fed_avg`` (client weights are ignored: DP needs each client to
      count once).
    server_optimizer: ``tff.learning.optimizers.Optimizer`` applying momentum β and
      the learning-rate schedule (the training workload A).
    factorization: the normalized A = B·C for the training workload (None for TFF's
      tree and for ``none``).
    noise: the ``StreamingNoise`` the query adds (None for TFF's baselines and ``none``).
    single_participation_sqrt_loss: √L(B, C) (Denisov Eq. 2), or None.
    info: JSON-ready description (mechanism, participation, sensitivity, the
      effective noise multiplier, the cache entry, ...).
    mechanism: the numpy ``tff_mf.mechanisms.Resolved`` the TFF objects were built from
      (its encoder, sensitivity and stream).
    privacy: its ``tff_mf.mechanisms.PrivacyRecord`` (z, sens, z/sens, ε).
    plan: the ``tff_mf.plan.Plan`` every framework consumes (record, ε after each round, the
      workload's learning rates), which the TF objects were built from.
  """
  aggregation_factory: Any
  server_optimizer: Any
  factorization: Optional[fz.Factorization]
  noise: Optional[noise_lib.StreamingNoise]
  single_participation_sqrt_loss: Optional[float]
  info: Dict[str, Any]
  mechanism: Optional[mechanisms.Resolved] = None
  privacy: Optional[mechanisms.PrivacyRecord] = None
  plan: Optional[plan_lib.Plan] = None


@dataclasses.dataclass(frozen=True)
class _Wiring:
  """What the TF objects are built from: the checked spec, its privacy record (z given or
  calibrated) and the seed (pinned: an int or a key pair, ``tff_mf.noise.keys``; or None:
  drawn from OS entropy)."""
  spec: spec_lib.MechanismSpec
  record: mechanisms.PrivacyRecord
  noise_seed: Optional[keys.Seed]

  mechanism = property(lambda self: self.spec.mechanism)
  n = property(lambda self: self.spec.n)
  participation = property(lambda self: self.spec.participation)
  clients_per_round = property(lambda self: self.spec.clients_per_round)
  clip_norm = property(lambda self: self.spec.clipping.clip_norm)
  adaptive = property(lambda self: self.spec.adaptive)
  noise_stream = property(lambda self: self.spec.noise_stream)
  noise_multiplier = property(lambda self: self.record.noise_multiplier)

  @property
  def allow_no_noise(self) -> bool:
    return self.spec.privacy is not None and self.spec.privacy.allow_no_noise


class DPAggregatorFactory(tff.aggregators.UnweightedAggregationFactory,
                          tff.aggregators.WeightedAggregationFactory):
  """The TFF aggregation factory of a mechanism, built when TFF reveals the model's specs.

  ``make_query(record_specs)`` returns the mechanism's DPQuery (normalized by the clients per
  round), which ``create`` wraps in ``tff.aggregators.DifferentiallyPrivateFactory``; None for
  a mechanism without noise: the plain mean, each update first clipped to ``plain_clip_norm``
  where it is set (``nonprivate_clipped``, TFF's ``clipping_factory``). Works as an
  unweighted factory and, ignoring the client weights, as a weighted one.
  """

  def __init__(self, make_query: Optional[Callable[[Any], Any]], name: str,
               plain_clip_norm: Optional[float] = None):
    self._make_query = make_query
    self.name = name
    self.plain_clip_norm = plain_clip_norm

  def dp_query(self, record_specs):
    """The public seam of the query: the very DPQuery ``create`` wires into TFF (its clipping,
    noise, adaptive clip and DpEvents), for running it outside TFF (the compiled engine);
    None when the mechanism adds no noise."""
    return None if self._make_query is None else self._make_query(record_specs)

  def _factory(self, record_specs):
    if self._make_query is not None:
      return tff.aggregators.DifferentiallyPrivateFactory(self._make_query(record_specs))
    if self.plain_clip_norm:
      return tff.aggregators.clipping_factory(self.plain_clip_norm,
                                              tff.aggregators.UnweightedMeanFactory())
    return tff.aggregators.UnweightedMeanFactory()

  def create(self, value_type, weight_type=None):
    unweighted = self._factory(tff.types.type_to_tf_tensor_specs(value_type))
    if weight_type is None:
      return unweighted.create(value_type)
    return tff.aggregators.as_weighted_aggregator(unweighted).create(value_type, weight_type)


def dp_event_from_state(aggregator_state):
  """The DpEvent of the last round from a DP aggregator's state (after ``next``).

  For a learning process: ``dp_event_from_state(state.aggregator)``. Composing the
  events of a matrix mechanism's rounds gives one Gaussian with multiplier z/sens.
  """
  from tensorflow_federated.python.aggregators import differential_privacy  # pylint: disable=g-import-not-at-top
  return differential_privacy.extract_dp_event_from_state(aggregator_state)


def build_server_optimizer(server_learning_rate: float, momentum: float, etas: np.ndarray):
  """Heavy-ball SGD with per-round learning rates η_server·η_i (Denisov Algorithm 2).

  TFF model deltas are (initial − trained) weights, i.e. gradient-like, and the
  optimizer subtracts them, which gives θ_i = θ_0 − η_server·(M(η)·M(β)·X)[i] for
  the aggregator outputs X (Prop 4.2).
  """
  base = tff.learning.optimizers.build_sgdm(
      learning_rate=float(server_learning_rate), momentum=float(momentum) if momentum else None)
  if np.all(etas == 1.0):
    return base
  lrs = (float(server_learning_rate) * etas).astype(np.float32)
  last = len(lrs) - 1

  def schedule(round_num):
    # round_num = number of updates applied so far; the query stops the run at n.
    return tf.gather(tf.constant(lrs), tf.minimum(tf.cast(round_num, tf.int32), last))

  return tff.learning.optimizers.schedule_learning_rate(base, schedule)


def build_mechanism(spec: spec_lib.MechanismSpec, *, server_learning_rate: float = 1.0,
                    noise_seed: Optional[keys.Seed] = None, cache_dir: Optional[str] = None,
                    progress: bool = False,
                    resolved: Optional[mechanisms.Resolved] = None) -> MechanismSetup:
  """Aggregator + server optimizer for a ``tff_mf.spec.MechanismSpec``.

  ``spec`` is the only description of the mechanism: build it with
  ``MechanismSpec.from_args(name, total_rounds=, clients_per_round=, clip_norm=, ...)``, the
  one keyword constructor (its docstring lists the keywords). The numpy layer resolves the
  spec and decides its privacy record (``tff_mf.mechanisms.build``); this function only wires
  them into TFF objects. The keywords are the wiring, not the mechanism:
  ``server_learning_rate``; ``noise_seed`` (None, a secret 126-bit key from OS entropy; an
  int, pinned with the public tag; a pair, a full pinned key, ``tff_mf.noise.keys``);
  ``cache_dir`` and ``progress`` for the factorization; ``resolved``, the numpy mechanism
  ``resolve_mechanism`` returned for the same spec (one cache load, one check).
  ``setup.privacy`` is the record a run writes. Raises ``CheckError`` (a ValueError) naming
  the first bad argument.
  """
  spec = _spec_only(spec, "build_mechanism")
  server_learning_rate = checks.positive_float(server_learning_rate, "server_learning_rate")
  noise_seed = None if noise_seed is None else keys.pinned(noise_seed, "noise_seed")
  pinned = noise_seed is not None
  plan = plan_lib.build(spec, cache_dir=cache_dir, progress=bool(progress), resolved=resolved,
                        noise_seed_pinned=pinned, mmcc_options=MMCC_OPTIONS)
  resolved, record = plan.resolved, plan.record
  runtime.install_exit_hook()  # the aggregator runs on TFF's server, which TFF leaves running
  server_optimizer = build_server_optimizer(server_learning_rate, plan.momentum,
                                            plan.learning_rates)
  info = mechanisms.describe(spec, resolved, record, noise_seed_pinned=pinned)
  info["server_learning_rate"] = server_learning_rate
  wiring = _Wiring(spec, record, noise_seed)
  builder = (_build_discrete if spec.privacy is not None and spec.privacy.discrete
             else _BUILDERS[spec.mechanism.noise_kind])
  make_query, noise = builder(wiring, resolved, info)
  f = resolved.factorization
  if f is not None:
    info.update(strategy=f.strategy,
                single_participation_sqrt_loss=f.single_participation_sqrt_loss)
  return MechanismSetup(
      aggregation_factory=DPAggregatorFactory(
          make_query, spec.mechanism.name, plain_clip_norm=spec.clipping.clip_norm
          if not spec.mechanism.noise_kind.noised and spec.mechanism.noise_kind.clips
          else None),
      server_optimizer=server_optimizer, factorization=f, noise=noise,
      single_participation_sqrt_loss=None if f is None else f.single_participation_sqrt_loss,
      info=info, mechanism=resolved, privacy=record, plan=plan)


# MMCC in this process only: no forked workers inside a process that runs TensorFlow and
# TFF's gRPC threads.
MMCC_OPTIONS = {"workers": 1}

# The noise streams a linear-noise mechanism can run (``tff_mf.spec``).
NOISE_STREAMS = spec_lib.NOISE_STREAMS


def resolve_mechanism(spec: spec_lib.MechanismSpec, *, cache_dir: Optional[str] = None,
                      progress: bool = False) -> mechanisms.Resolved:
  """The numpy ``tff_mf.mechanisms.Resolved`` that ``build_mechanism(spec)`` wires, checked
  the same way, without building TFF objects: its encoder is what the run's privacy is
  accounted for; pass it back to ``build_mechanism(spec, resolved=)``."""
  return mechanisms.resolve_spec(_spec_only(spec, "resolve_mechanism"), cache_dir=cache_dir,
                                 progress=bool(progress))


def _spec_only(spec, caller: str) -> spec_lib.MechanismSpec:
  if not isinstance(spec, spec_lib.MechanismSpec):
    raise checks.CheckError(
        f"{caller} takes a MechanismSpec, not {type(spec).__name__} {spec!r}: build one with "
        "tff_mf.spec.MechanismSpec.from_args(mechanism, total_rounds=..., ...)")
  return spec


def _make_query(cfg: _Wiring, noise: noise_lib.StreamingNoise):
  def make_query(specs):
    if cfg.adaptive is not None:
      q = query_lib.AdaptiveClipMatrixFactorizationQuery(
          noise, adaptive=cfg.adaptive, noise_multiplier=cfg.noise_multiplier,
          clients_per_round=cfg.clients_per_round,
          participations=cfg.participation.max_participations_in(cfg.n), record_specs=specs,
          noise_seed=cfg.noise_seed, allow_no_noise=cfg.allow_no_noise)
    else:
      q = query_lib.MatrixFactorizationQuery(
          noise, l2_norm_clip=cfg.clip_norm, noise_multiplier=cfg.noise_multiplier,
          record_specs=specs, noise_seed=cfg.noise_seed, allow_no_noise=cfg.allow_no_noise)
    return tfp.NormalizedQuery(q, denominator=cfg.clients_per_round)
  return make_query


def _record_noise(info: Dict[str, Any], noise) -> None:
  info.update(noise_implementation=noise.describe(), state_rows=noise.state_rows())


def _build_dense(cfg: _Wiring, resolved: mechanisms.Resolved, info: Dict[str, Any]):
  f = resolved.factorization
  noise = noise_lib.DenseNoise(f.c, f.noise_matrix() if f.m != f.n else None, cfg.participation,
                               sensitivity_report=resolved.sensitivity_report)
  _record_noise(info, noise)
  return _make_query(cfg, noise), noise


def _build_linear(cfg: _Wiring, resolved: mechanisms.Resolved, info: Dict[str, Any]):
  if cfg.noise_stream == "stateless":
    # The rows of Z that round i's noise needs, regenerated from the seed: N = C⁻¹ from the
    # stream itself (run on Z = I, so entries outside C⁻¹'s band are exact zeros).
    noise = noise_lib.DenseNoise(resolved.factorization.c, resolved.stream.noise_matrix(),
                                 cfg.participation,
                                 sensitivity_report=resolved.sensitivity_report)
  else:
    noise = noise_lib.LinearNoise(resolved.stream, resolved.factorization.c, cfg.participation,
                                  sensitivity_report=resolved.sensitivity_report)
  _record_noise(info, noise)
  return _make_query(cfg, noise), noise


def _build_discrete(cfg: _Wiring, resolved: mechanisms.Resolved, info: Dict[str, Any]):
  """The discrete Gaussian's integer release (``query_lib.DiscreteGaussianQuery``) for C = I
  or a b-banded C; γ and σ are fixed per model size when TFF reveals the specs."""
  from tff_mf.noise import discrete_gaussian as dg  # pylint: disable=g-import-not-at-top
  noise = noise_lib.DenseNoise(resolved.encoder, None, cfg.participation,
                               sensitivity_report=resolved.sensitivity_report)
  bands = dg.band_coefficients(resolved.encoder).shape[1]

  records = dg.records_covered(cfg.clients_per_round)  # the query refuses a round with more

  def plan_for(model_size: int) -> dg.Plan:
    found = dg.plan(sensitivity=resolved.sensitivity, clip_norm=cfg.clip_norm,
                    noise_multiplier=cfg.noise_multiplier, model_size=model_size, bands=bands,
                    participations=cfg.participation.max_participations_in(cfg.n), n=cfg.n,
                    records=records, encoder=resolved.encoder,
                    granularity=cfg.spec.privacy.granularity)
    info.update(granularity=found.granularity, discrete_gaussian_sigma=found.sigma,
                integer_sensitivity=found.integer_sensitivity,
                rounding_inflation=found.inflation, model_size=found.model_size,
                max_records_per_round=found.records, clip_allowance=found.clip_allowance)
    return found

  info.update(noise_implementation=f"DiscreteGaussianQuery(bands={bands})", state_rows=2 * (
      bands - 1), tff_dp_events="UnsupportedDpEvent: the run's epsilon is the record's (zCDP)",
              noise_seed_source="pinned" if cfg.noise_seed is not None else "os_entropy")

  def make_query(specs):
    q = query_lib.DiscreteGaussianQuery(
        noise, plan_for=plan_for, l2_norm_clip=cfg.clip_norm,
        noise_multiplier=cfg.noise_multiplier, record_specs=specs, noise_seed=cfg.noise_seed)
    return tfp.NormalizedQuery(q, denominator=cfg.clients_per_round)

  return make_query, noise


@dataclasses.dataclass(frozen=True)
class TreeAggregationParams:
  """What is passed to TFF's tree_aggregation, recorded from the same object."""
  noise_multiplier_per_node: float
  levels: int
  noise_seed: Union[int, list]


def tree_aggregation_params(n: int, noise_multiplier: float,
                            noise_seed: Optional[keys.Seed]) -> TreeAggregationParams:
  """Per-node multiplier z·√levels (``mechanisms.tree_node_multiplier``) for n rounds at
  run multiplier z. The seed: a pinned int as TFF takes it (its generator's key [s, s]), a
  key pair as TFF's two key words, None a fresh secret pair (``tff_mf.noise.keys``; never
  TFF's clock-based default)."""
  seed = keys.pinned(noise_seed) if noise_seed is not None else keys.noise_key(None)
  seed = list(seed) if isinstance(seed, tuple) else seed
  return TreeAggregationParams(mechanisms.tree_node_multiplier(noise_multiplier, n),
                               tree.tree_levels(n), seed)


def _build_tff_tree(cfg: _Wiring, resolved: mechanisms.Resolved,
                    info: Dict[str, Any]):
  # The nodes TFF adds noise to are the rows of C_T; the run is calibrated for C_T/√levels
  # (``tff_mf.mechanisms``).
  del resolved
  params = tree_aggregation_params(cfg.n, cfg.noise_multiplier, cfg.noise_seed)
  info.update(tff_dp_events="TFF's tree query reports UnsupportedDpEvent",
              noise_seed_source="pinned" if cfg.noise_seed is not None else "os_entropy",
              noise_multiplier_per_node=params.noise_multiplier_per_node)

  def make_query(specs):
    # The query of TFF's ``DifferentiallyPrivateFactory.tree_aggregation``; its clipping is
    # the rule's (``tff_mf.tf.clipping``: TF's own ops where the float32 norm is finite, no NaN
    # past it).
    sum_query = tfp.TreeResidualSumQuery.build_l2_gaussian_query(
        cfg.clip_norm, params.noise_multiplier_per_node, specs, noise_seed=params.noise_seed,
        use_efficient=True)
    sum_query._clip_fn = lambda flat, clip: tf_clipping.clip_by_global_norm(flat, clip)[0]  # pylint: disable=protected-access
    return tfp.NormalizedQuery(sum_query, denominator=float(cfg.clients_per_round))

  return make_query, None


def _build_tff_gaussian(cfg: _Wiring, resolved: mechanisms.Resolved,
                        info: Dict[str, Any]):
  info.update(tff_dp_events="TFF reports GaussianDpEvent(z) every round; composing them "
                            "over-counts (an upper bound)",
              noise_seed_source="pinned" if cfg.noise_seed is not None else "os_entropy")
  # gaussian_fixed's query, with its noise drawn from the seed (replayable, never reused): a
  # pinned seed, else one from OS entropy at every initialize().
  seed = cfg.noise_seed

  def make_query(specs):
    if cfg.adaptive is not None:
      return _seeded_gaussian_adaptive(cfg, resolved, specs, seed)
    return tfp.NormalizedQuery(
        query_lib.SeededGaussianSumQuery(cfg.clip_norm, cfg.clip_norm * cfg.noise_multiplier,
                                         seed), denominator=cfg.clients_per_round)

  return make_query, None


def _seeded_gaussian_adaptive(cfg: _Wiring, resolved: mechanisms.Resolved, specs,
                              seed: Optional[keys.Seed]):
  """Independent noise (C = I) with adaptive clipping, drawn from the run's seed.

  The query of the matrix mechanisms with C = I: the noise and the count noise come from
  the seed (a replayed round adds the same noise), unlike TFF's ``gaussian_adaptive``,
  whose stateful generator cannot be replayed.
  """
  noise = noise_lib.DenseNoise(resolved.encoder, None, cfg.participation,
                               sensitivity_report=resolved.sensitivity_report)
  q = query_lib.AdaptiveClipMatrixFactorizationQuery(
      noise, adaptive=cfg.adaptive, noise_multiplier=cfg.noise_multiplier,
      clients_per_round=cfg.clients_per_round,
      participations=cfg.participation.max_participations_in(cfg.n), record_specs=specs,
      noise_seed=seed, allow_no_noise=cfg.allow_no_noise)
  return tfp.NormalizedQuery(q, denominator=cfg.clients_per_round)


def _build_none(cfg: _Wiring, resolved: mechanisms.Resolved, info: Dict[str, Any]):
  del cfg, resolved, info
  return None, None


def _build_clipped(cfg: _Wiring, resolved: mechanisms.Resolved, info: Dict[str, Any]):
  """Each client's update clipped to ζ (TFF's ``clipping_factory``, its global L2 norm), then
  the plain mean: no noise, not private."""
  del resolved
  info["clip_norm"] = cfg.clip_norm
  return None, None


# The TF objects of each noise kind (``tff_mf.registry.NoiseKind``).
_BUILDERS = {registry.DENSE_ROWS: _build_dense, registry.LINEAR: _build_linear,
             registry.TFF_TREE: _build_tff_tree, registry.TFF_GAUSSIAN: _build_tff_gaussian,
             registry.NO_NOISE: _build_none, registry.CLIPPED: _build_clipped}
assert set(_BUILDERS) == set(registry.NOISE_KIND_CLASSES.values()), "a builder per noise kind"
