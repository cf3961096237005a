"""Drop-in TFF aggregators for every mechanism of Denisov et al. Table 1 (plus TFF baselines).

``build_mechanism(name, ...)`` returns a ``MechanismSetup``: an aggregation
factory for ``model_aggregator=`` of ``tff.learning.algorithms.
build_unweighted_fed_avg`` / ``build_weighted_fed_avg`` and the server
optimizer that applies the workload A = M(η)·M(β) (Denisov Prop 4.2, Eq. 9) to
the aggregator's outputs, so that the released model after round i is
θ_0 − (η_server/K)·(A·G + B·Z)[i] — Algorithm 1 line 11 (``001_…`` Sec 4), K
clients per round. The algebra for each mechanism is in ``docs/mechanisms.md``.

Mechanisms (N = A⁻¹·B is the per-round noise matrix the query adds):

- ``honaker_online``: C = C_T, B = A·S⁻¹·B_hs, N = S⁻¹·B_hs (DP-FTRL; momentum
  and learning rates as post-processing).
- ``honaker_full``: C = C_T, B = A·S⁻¹·B_hf, N = S⁻¹·B_hf.
- ``opt_prefix_sum``: optimal S = B*_S·C*_S, B = A·S⁻¹·B*_S, N = C*_S⁻¹.
- ``opt_momentum``: optimal A = B*_A·C*_A, N = C*_A⁻¹.
- ``structured``: B̂ banded + low rank for S (Denisov App H, Table 2),
  C = B̂⁻¹·S, N = S⁻¹·B̂, streamed with O((h+r)·d) work (Algorithm 3).
- ``tree_aggregation``: TFF's ``DifferentiallyPrivateFactory.tree_aggregation``
  (efficient Honaker tree, residual form) with per-node noise multiplier
  z·√levels, so that it has the same privacy as the others at multiplier z.
- ``gaussian_fixed``: TFF's ``DifferentiallyPrivateFactory.gaussian_fixed``
  (independent noise each round: C = I, B = A).

``noise_multiplier`` is always the normalized z of Denisov Thm 4.1 (γ(C) = 1):
under single participation every mechanism here is one Gaussian mechanism with
multiplier z. Noise is divided by clients per round like TFF's DP factories
(``tensorflow_privacy.NormalizedQuery``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Dict, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
import tensorflow_privacy as tfp

from tff_mf import factorization as fz
from tff_mf import strategies
from tff_mf import tree
from tff_mf import workloads
from tff_mf.tf import noise as noise_lib
from tff_mf.tf import query as query_lib

MECHANISMS = ("honaker_online", "honaker_full", "opt_prefix_sum", "opt_momentum", "structured",
              "tree_aggregation", "gaussian_fixed")
MATRIX_MECHANISMS = MECHANISMS[:5]


@dataclasses.dataclass
class MechanismSetup:
  """What ``build_mechanism`` returns.

  Attributes:
    aggregation_factory: for ``model_aggregator=`` of ``build_unweighted_fed_avg``
      and ``build_weighted_fed_avg`` (client weights are ignored: DP needs each
      client to count once).
    server_optimizer: ``tff.learning.optimizers.Optimizer`` applying momentum β
      and the learning-rate schedule (the workload A).
    factorization: the normalized A = B·C for the workload (None for TFF's tree).
    sqrt_loss: √L(B, C) of that factorization (Denisov Eq. 2), or None.
    info: JSON-ready description (mechanism, noise, sensitivity, cache entry …).
  """
  aggregation_factory: Any
  server_optimizer: Any
  factorization: Optional[fz.Factorization]
  sqrt_loss: Optional[float]
  info: Dict[str, Any]


class DPAggregatorFactory(tff.aggregators.UnweightedAggregationFactory,
                          tff.aggregators.WeightedAggregationFactory):
  """Builds the DP aggregation factory for the model's specs when TFF creates the aggregator.

  ``make_factory(record_specs)`` returns an unweighted
  ``tff.aggregators.DifferentiallyPrivateFactory`` (the query needs the specs,
  which TFF only reveals in ``create``). Works as an unweighted factory and,
  ignoring the client weights, as a weighted one.
  """

  def __init__(self, make_factory: Callable[[Any], Any], name: str):
    self._make_factory = make_factory
    self.name = name

  def create(self, value_type, weight_type=None):
    unweighted = self._make_factory(tff.types.type_to_tf_tensor_specs(value_type))
    if weight_type is None:
      return unweighted.create(value_type)
    return tff.aggregators.as_weighted_aggregator(unweighted).create(value_type, weight_type)


def dp_event_from_state(aggregator_state) -> "dp_accounting.DpEvent":
  """The DpEvent of the last round from a DP aggregator's state (after ``next``, not ``initialize``).

  For a learning process: ``dp_event_from_state(state.aggregator)``. Composing
  the events of all rounds of a matrix mechanism gives Denisov Thm 4.1's single
  Gaussian mechanism (see ``tff_mf.tf.query``).
  """
  from tensorflow_federated.python.aggregators import differential_privacy  # pylint: disable=g-import-not-at-top
  return differential_privacy.extract_dp_event_from_state(aggregator_state)


def default_structure(n: int):
  """(h, r) with h + r = ⌈log₂ n⌉, h = ⌈(h + r)/2⌉: Denisov App H Table 2 ((6, 5) for n = 2048)."""
  total = max(2, int(math.ceil(math.log2(max(n, 2)))))
  h = (total + 1) // 2
  return h, total - h


def workload_spec(total_rounds, momentum, lr_schedule, schedule_rounds) -> workloads.WorkloadSpec:
  if momentum == 0.0 and lr_schedule == "constant":
    return workloads.WorkloadSpec(kind="prefix_sum", n=total_rounds)
  return workloads.WorkloadSpec(kind="momentum", n=total_rounds, momentum=float(momentum),
                                lr_schedule=lr_schedule, schedule_rounds=schedule_rounds)


def build_server_optimizer(server_learning_rate: float, momentum: float, etas: np.ndarray):
  """Heavy-ball SGD with per-round learning rates η_server·η_i (Denisov Algorithm 2).

  TFF model deltas are (initial − trained) weights, i.e. gradient-like, and the
  optimizer subtracts them, which gives θ_i = θ_0 − η_server·(M(η)·M(β)·X)[i]
  for the aggregator outputs X (Prop 4.2).
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


def _check_args(mechanism, total_rounds, noise_multiplier, clients_per_round, clip_norm,
                server_learning_rate, momentum, lr_schedule, schedule_rounds, noise_seed, bands,
                rank):
  if mechanism not in MECHANISMS:
    raise ValueError(f"unknown mechanism {mechanism!r}; expected one of {MECHANISMS}")
  if isinstance(total_rounds, bool) or not isinstance(total_rounds, (int, np.integer)) \
      or total_rounds < 1:
    raise ValueError(f"total_rounds must be a positive integer, got {total_rounds!r}")
  query_lib._check_noise_multiplier(noise_multiplier)  # pylint: disable=protected-access
  query_lib._check_positive_float(clients_per_round, "clients_per_round")  # pylint: disable=protected-access
  query_lib._check_positive_float(clip_norm, "clip_norm")  # pylint: disable=protected-access
  query_lib._check_positive_float(server_learning_rate, "server_learning_rate")  # pylint: disable=protected-access
  if not 0.0 <= float(momentum) < 1.0:
    raise ValueError(f"momentum must be in [0, 1), got {momentum}")
  if lr_schedule not in workloads.LR_SCHEDULES:
    raise ValueError(f"unknown lr_schedule {lr_schedule!r}; expected one of "
                     f"{workloads.LR_SCHEDULES}")
  if lr_schedule == "constant" and schedule_rounds is not None:
    raise ValueError("schedule_rounds is only used with lr_schedule 'decay' or 'cooldown'")
  if lr_schedule != "constant" and schedule_rounds is None:
    raise ValueError(f"lr_schedule {lr_schedule!r} needs schedule_rounds")
  if noise_seed is not None:
    noise_lib.seed_pair(noise_seed)
  if mechanism != "structured" and (bands is not None or rank is not None):
    raise ValueError(f"bands/rank only apply to the structured mechanism, not {mechanism!r}")
  if mechanism == "structured":
    if bands is not None and (not isinstance(bands, (int, np.integer)) or bands < 1):
      raise ValueError(f"bands must be a positive integer, got {bands!r}")
    if rank is not None and (not isinstance(rank, (int, np.integer)) or rank < 0):
      raise ValueError(f"rank must be a non-negative integer, got {rank!r}")
  if mechanism == "gaussian_fixed" and noise_seed is not None:
    raise ValueError("TFF's gaussian_fixed draws from TensorFlow's stateful RNG and cannot pin "
                     "noise_seed; leave it None")


def _cached(spec: strategies.FactorizationSpec, cache_dir, progress):
  """Loads ``spec`` from the factorization cache, factorizing (and storing) it when missing."""
  from tff_mf import cache  # pylint: disable=g-import-not-at-top
  f, entry = cache.load_or_factorize(spec, cache_dir=cache_dir, progress=progress)
  return f, {"cache_npz": str(entry.npz_path), "cache_hit": bool(entry.cache_hit)}


def _post_processed(f_prefix: fz.Factorization, a: np.ndarray, strategy: str) -> fz.Factorization:
  """A = (A·S⁻¹·B_S)·C_S: a prefix-sum factorization serving workload A (Denisov Table 1)."""
  b = strategies.post_process_prefix_decoder(a, f_prefix.b)
  info = dict(f_prefix.info)
  info["post_processed_from"] = f_prefix.strategy
  return fz.Factorization(a=a, b=b, c=f_prefix.c, strategy=strategy, info=info).validate(atol=1e-6)


def structured_noise_for(n: int, bands: int, rank: int, cache_dir=None, progress=False):
  """(StructuredNoise, Factorization for S, info) for the banded + low-rank B̂ of S.

  B̂ and its Algorithm 3 pieces come from the cache (``cache.load_or_factorize``
  runs ``structured.fit`` on the cached optimal decoder when the entry is
  missing; ``cache.load_structured`` checks that the pieces rebuild B̂).
  """
  from tff_mf import cache  # pylint: disable=g-import-not-at-top
  spec = strategies.FactorizationSpec(workload=workloads.WorkloadSpec("prefix_sum", n),
                                      strategy="structured", bands=bands, rank=rank)
  f, info = _cached(spec, cache_dir, progress)
  pieces = cache.load_structured(info["cache_npz"])
  stream = noise_lib.StructuredNoise.from_fit(pieces, f.a, bands)
  gap = float(np.max(np.abs(stream.decoder() - f.b)))
  if gap > 1e-8 * max(1.0, float(np.max(np.abs(f.b)))):
    raise ValueError(f"structured pieces in {info['cache_npz']} do not reproduce B̂ ({gap:.3g})")
  return stream, f, info


def build_mechanism(mechanism: str, *, total_rounds: int, noise_multiplier: float,
                    clients_per_round: float, clip_norm: float, server_learning_rate: float = 1.0,
                    momentum: float = 0.0, lr_schedule: str = "constant",
                    schedule_rounds: Optional[int] = None, noise_seed: Optional[int] = None,
                    cache_dir=None, bands: Optional[int] = None, rank: Optional[int] = None,
                    progress: bool = False) -> MechanismSetup:
  """Aggregator + server optimizer for one mechanism of Denisov Table 1 (or a TFF baseline).

  Raises ValueError for unknown mechanisms and bad or conflicting arguments.
  """
  _check_args(mechanism, total_rounds, noise_multiplier, clients_per_round, clip_norm,
              server_learning_rate, momentum, lr_schedule, schedule_rounds, noise_seed, bands,
              rank)
  n = int(total_rounds)
  z = float(noise_multiplier)
  clip = float(clip_norm)
  k = float(clients_per_round)
  try:
    etas = workloads.learning_rates(n, lr_schedule, schedule_rounds)
    w_spec = workload_spec(n, float(momentum), lr_schedule, schedule_rounds)
    a = w_spec.build()
  except workloads.WorkloadError as e:
    raise ValueError(str(e)) from e
  server_optimizer = build_server_optimizer(server_learning_rate, float(momentum), etas)
  info: Dict[str, Any] = {
      "mechanism": mechanism, "total_rounds": n, "noise_multiplier": z,
      "clients_per_round": k, "clip_norm": clip, "stddev_per_round_sum": z * clip,
      "server_learning_rate": float(server_learning_rate), "momentum": float(momentum),
      "lr_schedule": lr_schedule, "schedule_rounds": schedule_rounds,
      "noise_seed_pinned": noise_seed is not None,
      "accounting": "single participation: one Gaussian mechanism with noise multiplier z "
                    "(Denisov Thm 4.1)",
  }
  f: Optional[fz.Factorization] = None
  stream: Optional[noise_lib.StreamingNoise] = None

  if mechanism in ("honaker_online", "honaker_full"):
    f = strategies.factorize(strategies.FactorizationSpec(workload=w_spec, strategy=mechanism))
  elif mechanism == "opt_prefix_sum":
    f_s, cache_info = _cached(strategies.FactorizationSpec(
        workload=workloads.WorkloadSpec("prefix_sum", n), strategy="optimal"), cache_dir, progress)
    info.update(cache_info)
    f = f_s if w_spec.kind == "prefix_sum" else _post_processed(f_s, a, "opt_prefix_sum")
  elif mechanism == "opt_momentum":
    f, cache_info = _cached(strategies.FactorizationSpec(workload=w_spec, strategy="optimal"),
                             cache_dir, progress)
    info.update(cache_info)
  elif mechanism == "structured":
    h0, r0 = default_structure(n)
    h = int(bands) if bands is not None else h0
    r = int(rank) if rank is not None else r0
    stream, f_s, cache_info = structured_noise_for(n, h, r, cache_dir=cache_dir,
                                                   progress=progress)
    info.update(cache_info)
    info.update({"bands": h, "rank": r})
    f = f_s if w_spec.kind == "prefix_sum" else _post_processed(f_s, a, "structured")
  elif mechanism == "gaussian_fixed":
    f = strategies.factorize(strategies.FactorizationSpec(workload=w_spec, strategy="identity"))
    info["tff_dp_events"] = ("TFF reports GaussianDpEvent(z) every round; composing them "
                             "over-counts a single-participation run (an upper bound)")
  elif mechanism == "tree_aggregation":
    levels = tree.tree_levels(n)
    info["tree_levels"] = levels
    info["noise_multiplier_per_node"] = z * math.sqrt(levels)
    info["tff_dp_events"] = "TFF's tree query reports UnsupportedDpEvent"
    info["comparable_strategy"] = "honaker_online"
    if noise_seed is None:
      info["noise_seed_source"] = "TFF's clock-based seed (tensorflow_privacy GaussianNoiseGenerator)"

  if mechanism in MATRIX_MECHANISMS:
    if stream is None:
      stream = noise_lib.DenseNoise.from_factorization(f)
    noise = stream
    seed = noise_seed

    def make_factory(specs):
      q = query_lib.MatrixFactorizationQuery(noise, l2_norm_clip=clip, noise_multiplier=z,
                                             record_specs=specs, noise_seed=seed)
      return tff.aggregators.DifferentiallyPrivateFactory(tfp.NormalizedQuery(q, denominator=k))

    info["noise_implementation"] = stream.describe()
    info["state_rows"] = stream.buffer_rows()
  elif mechanism == "gaussian_fixed":

    def make_factory(specs):
      del specs
      return tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
          noise_multiplier=z, clients_per_round=k, clip=clip)

  else:  # tree_aggregation
    per_node = z * math.sqrt(tree.tree_levels(n))

    def make_factory(specs):
      return tff.aggregators.DifferentiallyPrivateFactory.tree_aggregation(
          noise_multiplier=per_node, clients_per_round=k, l2_norm_clip=clip,
          record_specs=specs, noise_seed=noise_seed, use_efficient=True)

  factory = DPAggregatorFactory(make_factory, mechanism)
  if f is not None:
    info["strategy"] = f.strategy
    info["sensitivity"] = f.sensitivity
    info["sqrt_loss"] = f.sqrt_loss
  return MechanismSetup(aggregation_factory=factory, server_optimizer=server_optimizer,
                        factorization=f, sqrt_loss=None if f is None else f.sqrt_loss, info=info)
