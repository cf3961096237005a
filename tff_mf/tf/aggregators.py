"""Drop-in TFF aggregators for every trainable mechanism of the registry.

``build_mechanism(name, ...)`` returns a ``MechanismSetup``: an aggregation factory
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
import math
from typing import Any, Callable, Dict, Optional, Union

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
import tensorflow_privacy as tfp

from tff_mf import adaptive_clipping
from tff_mf import checks
from tff_mf import factorization as fz
from tff_mf import mechanisms
from tff_mf import participation as participation_lib
from tff_mf import registry
from tff_mf import workloads
from tff_mf.families import tree
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
  """
  aggregation_factory: Any
  server_optimizer: Any
  factorization: Optional[fz.Factorization]
  noise: Optional[noise_lib.StreamingNoise]
  single_participation_sqrt_loss: Optional[float]
  info: Dict[str, Any]
  mechanism: Optional[mechanisms.Resolved] = None
  privacy: Optional[mechanisms.PrivacyRecord] = None


@dataclasses.dataclass(frozen=True)
class MechanismConfig:
  """The checked arguments of ``build_mechanism``."""
  mechanism: registry.Mechanism
  n: int
  noise_multiplier: Optional[float]  # None: calibrated to target_epsilon
  target_epsilon: Optional[float]
  delta: Optional[float]
  accountant: str
  clients_per_round: float
  clip_norm: float
  server_learning_rate: float
  momentum: float
  lr_schedule: str
  schedule_rounds: Optional[int]
  participation: participation_lib.Participation
  noise_seed: Optional[int]
  cache_dir: Optional[str]
  bands: Optional[int]
  rank: Optional[int]
  buffers: Optional[int]
  allow_no_noise: bool
  progress: bool
  adaptive: Optional[adaptive_clipping.AdaptiveClipping] = None  # None: fixed clip_norm
  noise_stream: str = "auto"  # NOISE_STREAMS

  @property
  def workload(self) -> workloads.WorkloadSpec:
    return mechanisms.training_workload(self.n, self.momentum, self.lr_schedule,
                                        self.schedule_rounds)


class DPAggregatorFactory(tff.aggregators.UnweightedAggregationFactory,
                          tff.aggregators.WeightedAggregationFactory):
  """Builds the aggregation factory for the model's specs when TFF creates the aggregator.

  ``make_factory(record_specs)`` returns an unweighted factory (the query needs the
  specs, which TFF only reveals in ``create``). Works as an unweighted factory and,
  ignoring the client weights, as a weighted one.
  """

  def __init__(self, make_factory: Callable[[Any], Any], name: str,
               plain_clip_norm: Optional[float] = None):
    self._make_factory = make_factory
    self.name = name
    # A non-private clipped mean (``nonprivate_clipped``): each update clipped to this norm
    # (TFF's ``clipping_factory``), then the plain mean; None for every other mechanism.
    self.plain_clip_norm = plain_clip_norm

  def dp_query(self, record_specs):
    """The DPQuery a process for values of ``record_specs`` aggregates with: the very query
    ``create`` wires into ``tff.aggregators.DifferentiallyPrivateFactory`` (its clipping,
    noise, adaptive clip and DpEvents), for running it outside TFF; None when the mechanism
    is a plain mean (``none``)."""
    factory = self._make_factory(record_specs)
    if isinstance(factory, tff.aggregators.DifferentiallyPrivateFactory):
      return factory._query  # pylint: disable=protected-access
    if isinstance(factory, tff.aggregators.UnweightedMeanFactory) or self.plain_clip_norm:
      return None
    raise TypeError(f"{self.name}: no DPQuery in a {type(factory).__name__}")

  def create(self, value_type, weight_type=None):
    unweighted = self._make_factory(tff.types.type_to_tf_tensor_specs(value_type))
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


def _optional(value, check, name):
  return None if value is None else check(value, name)


def _privacy_arguments(mechanism, noise_multiplier, target_epsilon, delta, accountant,
                       allow_no_noise):
  """(z or None, target ε or None, δ or None, accountant), checked."""
  from tff_mf import accounting  # pylint: disable=g-import-not-at-top
  if accountant not in accounting.ACCOUNTANTS:
    raise checks.CheckError(f"accountant must be one of {accounting.ACCOUNTANTS}, got "
                            f"{accountant!r}")
  if not mechanism.private:
    if noise_multiplier not in (None, 0.0) or target_epsilon is not None:
      raise checks.CheckError(f"mechanism {mechanism.name!r} adds no noise; it takes neither "
                              "noise_multiplier nor target_epsilon")
    return 0.0, None, None, accountant
  if (noise_multiplier is None) == (target_epsilon is None):
    raise checks.CheckError("give exactly one of noise_multiplier and target_epsilon")
  delta = None if delta is None else checks.delta(delta)
  if target_epsilon is not None:
    if delta is None:
      raise checks.CheckError("target_epsilon needs delta")
    return None, checks.positive_float(target_epsilon, "target_epsilon"), delta, accountant
  return (checks.noise_multiplier(noise_multiplier, allow_zero=allow_no_noise,
                                  no_noise_hint=checks.PYTHON_NO_NOISE_HINT), None, delta,
          accountant)


def _clipping(mechanism, clip_norm, adaptive, clients_per_round):
  """(ζ_0, checked AdaptiveClipping or None) from ``clip_norm`` (a number or "adaptive")."""
  if isinstance(clip_norm, str):
    if clip_norm != "adaptive":
      raise checks.CheckError(f"clip_norm must be a positive number or 'adaptive', got "
                              f"{clip_norm!r}")
    if not mechanism.private:
      raise checks.CheckError(f"mechanism {mechanism.name!r} adds no noise and clips nothing; "
                              "adaptive clipping does not apply")
    if mechanism.noise == "tff_tree":
      raise checks.CheckError(
          "adaptive clipping with TFF's tree: use mechanism 'honaker_online' (the same tree "
          "and estimator as a matrix mechanism, which takes clip_norm='adaptive')")
    checked = adaptive.checked(clients_per_round)
    return checked.initial_clip_norm, checked
  if adaptive != adaptive_clipping.AdaptiveClipping():
    raise checks.CheckError("target_quantile, initial_clip_norm, clip_learning_rate and "
                            "clipped_count_stddev go with clip_norm='adaptive' only")
  return checks.positive_float(clip_norm, "clip_norm"), None


def _config(name, total_rounds, privacy, clients_per_round, clip_norm, server_learning_rate,
            momentum, lr_schedule, schedule_rounds, participation, noise_seed, cache_dir, bands,
            rank, buffers, allow_no_noise, progress, adaptive):
  mechanism = registry.mechanism(name)
  if not mechanism.trainable:
    raise checks.CheckError(f"mechanism {mechanism.name!r} cannot be trained: "
                            f"{mechanism.why_not_trainable}")
  schema = participation or participation_lib.SINGLE
  if schema.kind not in mechanism.participations:
    raise checks.CheckError(f"mechanism {mechanism.name!r} supports participation "
                            f"{', '.join(mechanism.participations)}, not {schema.kind!r}")
  n = checks.positive_int(total_rounds, "total_rounds")
  schema.check(n)
  z, target, delta, accountant = _privacy_arguments(mechanism, *privacy, allow_no_noise)
  if lr_schedule not in workloads.LR_SCHEDULES:
    raise checks.CheckError(f"unknown lr_schedule {lr_schedule!r}; expected one of "
                            f"{workloads.LR_SCHEDULES}")
  if (lr_schedule == "constant") != (schedule_rounds is None):
    raise checks.CheckError("schedule_rounds goes with lr_schedule 'decay' or 'cooldown', and "
                            "only with them")
  accepted = registry.default_parameters(mechanism.strategy, n, schema) \
      if mechanism.strategy in registry.STRATEGIES else {}
  for key, value in (("bands", bands), ("rank", rank), ("buffers", buffers)):
    if value is not None and key not in accepted:
      raise checks.CheckError(f"{key} does not apply to mechanism {mechanism.name!r}")
  clients_per_round = checks.positive_float(clients_per_round, "clients_per_round")
  clip_norm, adaptive = _clipping(mechanism, clip_norm, adaptive, clients_per_round)
  return MechanismConfig(
      mechanism=mechanism, n=n, noise_multiplier=z, target_epsilon=target, delta=delta,
      accountant=accountant,
      clients_per_round=clients_per_round, clip_norm=clip_norm, adaptive=adaptive,
      server_learning_rate=checks.positive_float(server_learning_rate, "server_learning_rate"),
      momentum=checks.in_range(momentum, "momentum", 0.0, 1.0), lr_schedule=lr_schedule,
      schedule_rounds=_optional(schedule_rounds, checks.positive_int, "schedule_rounds"),
      participation=schema, noise_seed=_optional(noise_seed, checks.seed, "noise_seed"),
      cache_dir=cache_dir, bands=_optional(bands, checks.positive_int, "bands"),
      rank=_optional(rank, checks.nonnegative_int, "rank"),
      buffers=_optional(buffers, checks.positive_int, "buffers"),
      allow_no_noise=bool(allow_no_noise), progress=bool(progress))


def build_mechanism(mechanism: str, *, total_rounds: int,
                    noise_multiplier: Optional[float] = None, clients_per_round: float,
                    clip_norm: Union[float, str], target_epsilon: Optional[float] = None,
                    delta: Optional[float] = None, accountant: str = "exact",
                    server_learning_rate: float = 1.0, momentum: float = 0.0,
                    lr_schedule: str = "constant", schedule_rounds: Optional[int] = None,
                    participation: Optional[participation_lib.Participation] = None,
                    noise_seed: Optional[int] = None, cache_dir: Optional[str] = None,
                    bands: Optional[int] = None, rank: Optional[int] = None,
                    buffers: Optional[int] = None, allow_no_noise: bool = False,
                    progress: bool = False, resolved: Optional[mechanisms.Resolved] = None,
                    target_quantile: float = adaptive_clipping.DEFAULT_TARGET_QUANTILE,
                    initial_clip_norm: float = adaptive_clipping.DEFAULT_INITIAL_CLIP_NORM,
                    clip_learning_rate: float = adaptive_clipping.DEFAULT_LEARNING_RATE,
                    clipped_count_stddev: Optional[float] = None,
                    noise_stream: str = "auto", sampling_prob: Optional[float] = None,
                    _resolve_only: bool = False) -> MechanismSetup:
  """Aggregator + server optimizer for a registry mechanism (any accepted spelling).

  Give the noise multiplier z, or ``target_epsilon`` and ``delta`` to calibrate the
  smallest z whose ε (one Gaussian at z/sens, sens computed from the mechanism's C
  under ``participation``, without amplification) is at most the target.
  ``participation`` is the schema clients are sampled under (default single
  participation); z must be positive unless ``allow_no_noise=True``. Raises
  ``CheckError`` (a ValueError) naming the first bad or conflicting argument.
  ``resolved``: the numpy mechanism ``resolve_mechanism`` returned for the same mechanism,
  workload and schema (not resolved again: one cache load, one check).

  ``clip_norm="adaptive"`` clips round i to ζ_i, a private estimate of the
  ``target_quantile`` of the update norms (``tff_mf.adaptive_clipping``; defaults of
  TFF's ``gaussian_adaptive``: ζ_0 = ``initial_clip_norm`` 0.1, ``clip_learning_rate``
  0.2, ``clipped_count_stddev`` 0.05·clients_per_round). z is then the MF noise
  multiplier; ε covers the MF noise and the count queries together, and a target ε is
  split between them as TFF splits it (the count's σ_b fixed, z takes the rest).
  ``noise_stream``: one of ``NOISE_STREAMS`` (same noise C⁻¹·Z, different state).
  ``sampling_prob``: under min_sep participation, the probability p < 1 that a client joins
  each round it is eligible for (cyclic Poisson sampling): ε is then also bounded with
  amplification (banded or MMCC), z calibrated with it, and the smaller bound reported
  (``tff_mf.mechanisms.run_privacy``). ``setup.privacy`` is the record a run writes.
  """
  cfg = _config(mechanism, total_rounds, (noise_multiplier, target_epsilon, delta, accountant),
                clients_per_round, clip_norm, server_learning_rate, momentum, lr_schedule,
                schedule_rounds, participation, noise_seed, cache_dir, bands, rank, buffers,
                allow_no_noise, progress,
                adaptive_clipping.AdaptiveClipping(target_quantile, initial_clip_norm,
                                                   clip_learning_rate, clipped_count_stddev))
  cfg = dataclasses.replace(cfg, noise_stream=_noise_stream(cfg.mechanism, noise_stream))
  resolved = _resolved(cfg, resolved)
  if _resolve_only:
    return resolved
  runtime.install_exit_hook()  # the aggregator runs on TFF's server, which TFF leaves running
  etas = workloads.learning_rates(cfg.n, cfg.lr_schedule, cfg.schedule_rounds)
  server_optimizer = build_server_optimizer(cfg.server_learning_rate, cfg.momentum, etas)
  info = _setup_info(cfg, resolved)
  record = mechanisms.privacy(resolved, cfg.noise_multiplier, cfg.target_epsilon, cfg.delta,
                              cfg.accountant, sampling_prob=sampling_prob,
                              adaptive=cfg.adaptive, mmcc_options=MMCC_OPTIONS)
  if record.private:
    cfg = dataclasses.replace(cfg, noise_multiplier=record.noise_multiplier)
  record = dataclasses.replace(record, setup=_statement_setup(cfg))
  info.update(record.info(cfg.clip_norm))
  if cfg.adaptive is not None:
    info.update(_adaptive_info(cfg, resolved))
  factory, noise = _BUILDERS[cfg.mechanism.noise](cfg, resolved, info)
  f = resolved.factorization
  if f is not None:
    info.update(strategy=f.strategy,
                single_participation_sqrt_loss=f.single_participation_sqrt_loss)
  return MechanismSetup(
      aggregation_factory=DPAggregatorFactory(
          factory, cfg.mechanism.name,
          plain_clip_norm=cfg.clip_norm if cfg.mechanism.noise == "clipped" else None),
      server_optimizer=server_optimizer, factorization=f, noise=noise,
      single_participation_sqrt_loss=None if f is None else f.single_participation_sqrt_loss,
      info=info, mechanism=resolved, privacy=record)


def _statement_setup(cfg: MechanismConfig) -> Dict[str, Any]:
  """What the privacy statement names beside ε (``tff_mf.statement.setup_words``)."""
  out: Dict[str, Any] = {
      "mechanism": cfg.mechanism.name, "label": cfg.mechanism.label, "rounds": cfg.n,
      "clients_per_round": cfg.clients_per_round,
      "clip_norm": "adaptive" if cfg.adaptive is not None else cfg.clip_norm,
      "participation": cfg.participation.as_dict(),
      "noise_seed_pinned": cfg.noise_seed is not None}
  if cfg.adaptive is not None:
    out["adaptive_clipping"] = cfg.adaptive.as_dict()
  return out


def _setup_info(cfg: MechanismConfig, resolved: mechanisms.Resolved) -> Dict[str, Any]:
  """The JSON-ready description of the mechanism asked for and resolved (no seed)."""
  info: Dict[str, Any] = {
      "mechanism": cfg.mechanism.name, "label": cfg.mechanism.label, "total_rounds": cfg.n,
      "clients_per_round": cfg.clients_per_round, "clip_norm": cfg.clip_norm,
      "server_learning_rate": cfg.server_learning_rate, "momentum": cfg.momentum,
      "lr_schedule": cfg.lr_schedule, "schedule_rounds": cfg.schedule_rounds,
      "participation": cfg.participation.as_dict(), "noise_kind": cfg.mechanism.noise,
      "noise_stream": cfg.noise_stream,
      "noise_seed_pinned": cfg.noise_seed is not None,
      "clipping": "fixed" if cfg.adaptive is None else "adaptive",
  }
  if cfg.adaptive is not None:
    info["adaptive_clipping"] = cfg.adaptive.as_dict()
  info.update(resolved.info)
  return info


# MMCC in this process only: no forked workers inside a process that runs TensorFlow and
# TFF's gRPC threads.
MMCC_OPTIONS = {"workers": 1}

# How a linear-noise mechanism produces C⁻¹·Z: "stateful" runs the family's recurrence and
# carries its k model-sized state rows between rounds; "stateless" regenerates the rows of Z
# that round i's noise needs from the secret seed and keeps no state (cost ∝ the non-zeros
# of C⁻¹'s row i: b for BISR, BandInvMF and λCGD, whose C⁻¹ is banded; Kalinin et al. 2025,
# arXiv:2505.12128). "auto": the registry's kind (stateful for linear, stateless for dense).
NOISE_STREAMS = ("auto", "stateful", "stateless")


def _noise_stream(mechanism: registry.Mechanism, value: str) -> str:
  """The noise stream asked for, checked against the mechanism's noise kind."""
  if value not in NOISE_STREAMS:
    raise checks.CheckError(f"noise_stream must be one of {', '.join(NOISE_STREAMS)}, got "
                            f"{value!r}")
  if value == "auto":
    return {"linear": "stateful", "dense": "stateless"}.get(mechanism.noise, "auto")
  allowed = {"linear": ("stateful", "stateless"), "dense": ("stateless",)}.get(mechanism.noise,
                                                                            ())
  if value not in allowed:
    raise checks.CheckError(f"noise_stream={value!r} does not apply to mechanism "
                            f"{mechanism.name!r} (its noise is {mechanism.noise}"
                            f"{': stateless only' if allowed else ''})")
  return value


def resolve_mechanism(mechanism: str, **kwargs) -> mechanisms.Resolved:
  """The numpy ``tff_mf.mechanisms.Resolved`` that ``build_mechanism`` with the same arguments
  wires, checked the same way, without building TFF objects: its encoder is what the run's
  privacy is accounted for; pass it back to ``build_mechanism(..., resolved=)``."""
  return build_mechanism(mechanism, _resolve_only=True, **kwargs)


def _resolved(cfg: MechanismConfig,
              resolved: Optional[mechanisms.Resolved]) -> mechanisms.Resolved:
  if resolved is None:
    return mechanisms.resolve(cfg.mechanism, cfg.workload, cfg.participation,
                              cache_dir=cfg.cache_dir, bands=cfg.bands, rank=cfg.rank,
                              buffers=cfg.buffers, progress=cfg.progress)
  if (resolved.mechanism != cfg.mechanism or resolved.workload != cfg.workload
      or resolved.participation != cfg.participation):
    raise checks.CheckError(f"the resolved mechanism ({resolved.mechanism.name}, "
                            f"{resolved.workload}, {resolved.participation.describe()}) is not "
                            f"the one asked for ({cfg.mechanism.name})")
  return resolved


def _adaptive_info(cfg: MechanismConfig, resolved: mechanisms.Resolved) -> Dict[str, Any]:
  k = cfg.participation.max_participations_in(cfg.n)
  sigma_b, sens = cfg.adaptive.clipped_count_stddev, resolved.sensitivity
  count_mu = adaptive_clipping.count_mu(sigma_b, k)
  out = {"effective_noise_multiplier_value": cfg.noise_multiplier / sens,
         "effective_noise_multiplier_count": 1.0 / count_mu if count_mu else math.inf,
         "count_participations": k,
         "effective_noise_multiplier": adaptive_clipping.combined_noise_multiplier(
             cfg.noise_multiplier, sens, sigma_b, k),
         "stddev_per_round_sum": f"{cfg.noise_multiplier:g} x the round's clip norm"}
  if cfg.target_epsilon is not None:
    out["budget_split"] = "clipped_count_stddev fixed; the MF noise takes the rest"
  return out


def _make_query_factory(cfg: MechanismConfig, noise: noise_lib.StreamingNoise):
  def make_factory(specs):
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
    return tff.aggregators.DifferentiallyPrivateFactory(
        tfp.NormalizedQuery(q, denominator=cfg.clients_per_round))
  return make_factory


def _record_noise(info: Dict[str, Any], noise) -> None:
  info.update(noise_implementation=noise.describe(), state_rows=noise.state_rows())


def _build_dense(cfg: MechanismConfig, resolved: mechanisms.Resolved, info: Dict[str, Any]):
  f = resolved.factorization
  noise = noise_lib.DenseNoise(f.c, f.noise_matrix() if f.m != f.n else None, cfg.participation,
                               sensitivity_report=resolved.sensitivity_report)
  _record_noise(info, noise)
  return _make_query_factory(cfg, noise), noise


def _build_linear(cfg: MechanismConfig, resolved: mechanisms.Resolved, info: Dict[str, Any]):
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
  return _make_query_factory(cfg, noise), noise


@dataclasses.dataclass(frozen=True)
class TreeAggregationParams:
  """What is passed to TFF's tree_aggregation, recorded from the same object."""
  noise_multiplier_per_node: float
  levels: int
  noise_seed: int


def tree_aggregation_params(cfg: MechanismConfig) -> TreeAggregationParams:
  """Per-node multiplier z·√levels (``mechanisms.tree_node_multiplier``). The seed is pinned
  or drawn from OS entropy (never TFF's clock-based default)."""
  seed = cfg.noise_seed if cfg.noise_seed is not None else checks.new_seed()
  return TreeAggregationParams(mechanisms.tree_node_multiplier(cfg.noise_multiplier, cfg.n),
                               tree.tree_levels(cfg.n), seed)


def _build_tff_tree(cfg: MechanismConfig, resolved: mechanisms.Resolved,
                    info: Dict[str, Any]):
  # The nodes TFF adds noise to are the rows of C_T; the run is calibrated for C_T/√levels
  # (``tff_mf.mechanisms``).
  del resolved
  params = tree_aggregation_params(cfg)
  info.update(tff_dp_events="TFF's tree query reports UnsupportedDpEvent",
              noise_seed_source="pinned" if cfg.noise_seed is not None else "os_entropy",
              noise_multiplier_per_node=params.noise_multiplier_per_node)

  def make_factory(specs):
    return tff.aggregators.DifferentiallyPrivateFactory.tree_aggregation(
        noise_multiplier=params.noise_multiplier_per_node,
        clients_per_round=cfg.clients_per_round, l2_norm_clip=cfg.clip_norm,
        record_specs=specs, noise_seed=params.noise_seed, use_efficient=True)

  return make_factory, None


def _build_tff_gaussian(cfg: MechanismConfig, resolved: mechanisms.Resolved,
                        info: Dict[str, Any]):
  info.update(tff_dp_events="TFF reports GaussianDpEvent(z) every round; composing them "
                            "over-counts (an upper bound)",
              noise_seed_source="pinned" if cfg.noise_seed is not None else "os_entropy")
  # gaussian_fixed's query, with its noise drawn from the seed (replayable, never reused): a
  # pinned seed, else one from OS entropy at every initialize().
  seed = cfg.noise_seed

  def make_factory(specs):
    if cfg.adaptive is not None:
      return _seeded_gaussian_adaptive(cfg, resolved, specs, seed)
    return tff.aggregators.DifferentiallyPrivateFactory(tfp.NormalizedQuery(
        query_lib.SeededGaussianSumQuery(cfg.clip_norm, cfg.clip_norm * cfg.noise_multiplier,
                                         seed), denominator=cfg.clients_per_round))

  return make_factory, None


def _seeded_gaussian_adaptive(cfg: MechanismConfig, resolved: mechanisms.Resolved, specs,
                              seed: int):
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
  return tff.aggregators.DifferentiallyPrivateFactory(
      tfp.NormalizedQuery(q, denominator=cfg.clients_per_round))


def _build_none(cfg: MechanismConfig, resolved: mechanisms.Resolved, info: Dict[str, Any]):
  del cfg, resolved, info
  return (lambda specs: tff.aggregators.UnweightedMeanFactory()), None


def _build_clipped(cfg: MechanismConfig, resolved: mechanisms.Resolved, info: Dict[str, Any]):
  """Each client's update clipped to ζ (TFF's ``clipping_factory``, its global L2 norm), then
  the plain mean: no noise, not private."""
  del resolved
  info["clip_norm"] = cfg.clip_norm
  return (lambda specs: tff.aggregators.clipping_factory(
      cfg.clip_norm, tff.aggregators.UnweightedMeanFactory())), None


_BUILDERS = {"dense": _build_dense, "linear": _build_linear, "tff_tree": _build_tff_tree,
             "tff_gaussian": _build_tff_gaussian, "none": _build_none,
             "clipped": _build_clipped}
