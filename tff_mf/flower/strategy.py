"""Flower strategy wrappers adding correlated noise, with fixed or adaptive clipping.

It wraps a FedAvg-style strategy (``flwr.serverapp.strategy``) as Flower's
``DifferentialPrivacyServerSideFixedClipping`` does, and runs Algorithm 1 of Denisov et al.
2022 (arXiv:2202.08312): round i clips each client's model update to L2 norm ζ over all
arrays by the core's rule (``tff_mf.clipping``: a non-finite update zeroed and counted, a
norm that cannot overflow; the fixed wrapper sends ζ in the train config, so that clients
may clip too with Flower's ``fixedclipping_mod``), sums, divides by the expected clients per round K, adds σ/K·(N·Z)[i] (σ = z·ζ,
``tff_mf.noise.rows``) and applies the workload's server optimizer (heavy-ball momentum β
with the learning-rate schedule η_i, Prop 4.2), so the released iterates are those of the
mechanism's workload A.

The privacy claim is checked where it is used: the clients of round i are drawn by the
library's sampler for the spec's participation schema (``tff_mf.participation``), never by
Flower's random selection; running past n rounds is refused; ε after each round is the core
record's ``epsilon_by_round`` reported through Flower's ``PrivacyAccountant`` protocol, and a
``max_epsilon`` stops the run before the release that would pass it. The seed (OS entropy
unless pinned), the round, the noise stream's rows, the momentum and the sampler's state
are written after every round to a file private to its owner (0600); a restarted server
given that file continues the same stream. The file is bound to its run, locked while a
server runs and checked against its release log (``tff_mf.runstate``): another run's state,
a file others could read or write, or an older copy is refused.
"""

from __future__ import annotations

import functools
import time
from logging import ERROR, INFO
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import numpy as np

from tff_mf import optional

if optional.missing("flower"):
  raise ImportError(optional.message("flower", "tff_mf.flower.strategy"))

# pylint: disable=g-import-not-at-top,wrong-import-position
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import NeighboringRelation, PrivacyConfig, PrivacySpent, SamplingMethod
from flwr.serverapp.exception import PrivacyBudgetExhausted
from flwr.serverapp.strategy import FedAvg, Strategy
from flwr.supercore import log
from flwr.supercore.differential_privacy import KEY_CLIPPING_NORM, KEY_NORM_BIT

from tff_mf import checks
from tff_mf import clipping
from tff_mf import plan as plan_lib
from tff_mf import spec as spec_lib
from tff_mf.participation import samplers

ACCOUNTING_METHOD = "tff-mf epsilon_by_round"
# Flower's DP wrappers' argument names -> ours (``MechanismSpec.from_args``).
FLOWER_NAMES = {"clipping_norm": "clip_norm", "num_sampled_clients": "clients_per_round",
                "initial_clipping_norm": "initial_clip_norm",
                "target_clipped_quantile": "target_quantile",
                "clip_norm_lr": "clip_learning_rate"}
# Flower's positional arguments after the strategy (fixed; adaptive).
FLOWER_POSITIONAL = {False: ("noise_multiplier", "clipping_norm", "num_sampled_clients"),
                     True: ("noise_multiplier", "num_sampled_clients")}
# The mechanism of Flower's forms when none is named: BLT (Dvijotham et al. 2024,
# arXiv:2404.16706), a streaming mechanism with a few buffers of state and near-optimal error.
DEFAULT_MECHANISM = "blt"


def _is_number(x) -> bool:
  return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


class MatrixFactorizationAccountant:
  """Flower's ``PrivacyAccountant`` protocol over a core ``tff_mf.plan.Plan``: ε after r
  releases is the plan's (``Plan.epsilon_after``, an upper bound at the record's δ), and so is
  the budget check (``Plan.would_exceed``); this class only counts the releases."""

  def __init__(self, plan: plan_lib.Plan, config: PrivacyConfig):
    record = plan.record
    if record.epsilon is None:
      raise checks.CheckError("the mechanism has no epsilon: give delta to the spec")
    if config.target_delta != record.delta:
      raise checks.CheckError(f"PrivacyConfig target_delta={config.target_delta} is not the "
                              f"spec's delta={record.delta}")
    check_privacy_config(config, record.participation)
    self._config = config
    self._plan = plan
    self._record = record
    self._releases = 0

  @property
  def config(self) -> PrivacyConfig:
    return self._config

  @property
  def num_releases(self) -> int:
    return self._releases

  def epsilon_after(self, releases: int) -> float:
    return self._plan.epsilon_after(releases)

  def compose(self, event: Any = None, count: int = 1) -> None:
    del event
    self.epsilon_after(self._releases + count)
    self._releases += int(count)

  def _check_delta(self, delta: Optional[float]) -> float:
    if delta is not None and delta != self._record.delta:
      raise checks.CheckError(f"epsilon is computed at the spec's delta={self._record.delta}, "
                              f"not {delta}")
    return float(self._record.delta)

  def get_epsilon(self, delta: Optional[float] = None) -> float:
    self._check_delta(delta)
    return self.epsilon_after(self._releases)

  def get_delta(self, epsilon: float) -> float:
    if self.epsilon_after(self._releases) <= epsilon:
      return float(self._record.delta)
    raise checks.CheckError(f"epsilon {epsilon} is below the spent {self.get_epsilon()} at any "
                            "delta this record holds")

  def get_privacy_spent(self, delta: Optional[float] = None) -> PrivacySpent:
    delta = self._check_delta(delta)
    return PrivacySpent(epsilon=self.epsilon_after(self._releases), delta=delta,
                        num_releases=self._releases, accounting_method=ACCOUNTING_METHOD)

  def would_exceed(self, event: Any = None, max_epsilon: Optional[float] = None,
                   count: int = 1) -> bool:
    del event
    limit = self._config.max_epsilon if max_epsilon is None else max_epsilon
    return self._plan.would_exceed(limit, self._releases, count)

  def state_dict(self) -> Dict[str, object]:
    return {"num_releases": self._releases}

  def load_state_dict(self, state: Dict[str, object]) -> None:
    self._releases = int(state["num_releases"])


def check_privacy_config(config: PrivacyConfig, schema,
                         sampling_prob: Optional[float] = None) -> None:
  """Refuses a ``PrivacyConfig`` that claims what the record does not account: tff-mf's ε is
  for add-or-remove-one neighbours (a replace-one guarantee needs twice the sensitivity),
  with the clients drawn by the spec's schema (``POISSON`` only for a Poisson schema, and,
  where the spec's ``sampling_prob`` is known, only when it is below 1)."""
  relation = NeighboringRelation(config.neighboring_relation)
  if relation != NeighboringRelation.ADD_OR_REMOVE_ONE:
    raise checks.CheckError(
        f"PrivacyConfig neighboring_relation={relation.value!r}: tff-mf's epsilon is for "
        "add-or-remove-one neighbours (replace-one needs twice the sensitivity, which this "
        "epsilon does not cover); use NeighboringRelation.ADD_OR_REMOVE_ONE")
  method = SamplingMethod(config.sampling_method)
  poisson = schema is not None and schema.poisson and (sampling_prob is None or
                                                       sampling_prob < 1.0)
  if method == SamplingMethod.POISSON and not poisson:
    raise checks.CheckError(
        f"PrivacyConfig sampling_method='poisson', but the wrapper samples clients by "
        f"participation {schema.describe() if schema is not None else 'single'}, not by "
        "Poisson sampling; use SamplingMethod.NO_AMPLIFICATION (the epsilon reported is the "
        "schema's own) or a Poisson schema")


class _SelectedGrid:
  """The grid as the wrapped strategy sees it: only the nodes the sampler chose."""

  def __init__(self, grid, node_ids: List[int]):
    self._grid = grid
    self._node_ids = list(node_ids)

  def get_node_ids(self):
    return list(self._node_ids)

  def __getattr__(self, name):
    return getattr(self._grid, name)


class _MatrixFactorizationServerSide(Strategy):
  """Strategy wrapper for central DP with a matrix-factorization mechanism (server side);
  ``MatrixFactorizationFixedClipping`` and ``MatrixFactorizationAdaptiveClipping`` below.

  Parameters:
    strategy: the wrapped FedAvg-style strategy (its ``fraction_train`` must be 1.0: the
      wrapper hands it exactly the clients the library's sampler drew).
    spec: a ``tff_mf.spec.MechanismSpec``, or the name of a registry mechanism with
      ``MechanismSpec.from_args``'s keywords in ``spec_arguments``; or, as Flower's own DP
      wrappers take them, positionally ``(noise_multiplier, clipping_norm,
      num_sampled_clients)`` (adaptive: ``(noise_multiplier, num_sampled_clients)``) with
      ``mechanism=`` (default ``DEFAULT_MECHANISM``) and ``total_rounds=`` as keywords.
      Flower's names are accepted beside ours (``FLOWER_NAMES``: ``clipping_norm``,
      ``num_sampled_clients``, ``initial_clipping_norm``, ``target_clipped_quantile``,
      ``clip_norm_lr``); a wrong name is one line naming the closest right one.
    server_learning_rate: η_server of the server optimizer.
    noise_seed: pins the noise seed (tests, replays); None: a fresh secret from OS entropy.
    exact_noise: draw and combine the noise as the TF aggregator does, bit for bit on the
      same machine (about 3 µs per model coordinate and round more); by default the rows
      are computed in float64 and equal TF's within float32 rounding. With adaptive
      clipping the row is drawn at z·ζ_i, TF's at z·ζ_0 rescaled: equal within rounding.
    sampling_seed: pins the sampler's permutation; None: OS entropy.
    sampling_secret: pins the sampler's secret; None: OS entropy.
    state_path: the private file the run's state is written to after each round and read
      from at the start if it exists (a restarted server continues the run).
    privacy_config: Flower's ``PrivacyConfig``; its ``max_epsilon`` stops the run (the last
      released model stays ``current_arrays``).
    node_wait_timeout: seconds round 1 waits for the population's nodes before a one-line
      error.
    population: the clients (nodes) the sampler draws from: round 1 waits until this many
      are connected and fixes the population to those connected then (default: the
      ``PrivacyConfig``'s ``population_size``, else the wrapped strategy's
      ``min_available_nodes``).
  """

  client_side = False  # True: the clients clip (Flower's clipping mods), the server checks

  def __init__(self, strategy: Strategy, *spec, server_learning_rate: float = 1.0,
               noise_seed: Optional[int] = None, sampling_seed: Optional[int] = None,
               sampling_secret: Optional[int] = None, state_path: Optional[str] = None,
               privacy_config: Optional[PrivacyConfig] = None, population: Optional[int] = None,
               cache_dir: Optional[str] = None, exact_noise: bool = False,
               node_wait_timeout: float = 600.0, **spec_arguments):
    super().__init__()
    spec = self._spec_of(spec, spec_arguments)
    self.node_wait_timeout = checks.positive_float(node_wait_timeout, "node_wait_timeout")
    if not spec.mechanism.private:
      raise checks.CheckError(f"mechanism {spec.mechanism.name!r} adds no noise; this wrapper "
                              "is for private mechanisms")
    if (spec.adaptive is not None) != self.clips_adaptively:
      raise checks.CheckError(
          f"{type(self).__name__} takes " + ("clip_norm='adaptive'" if self.clips_adaptively
                                             else "a fixed clip_norm") +
          f", got clip_norm={spec.clipping.described!r}; use MatrixFactorization"
          f"{'Fixed' if self.clips_adaptively else 'Adaptive'}Clipping")
    fraction = getattr(strategy, "fraction_train", None)
    if fraction != 1.0:
      raise checks.CheckError(
          f"the wrapped strategy's fraction_train={fraction}: Flower's random client selection "
          f"cannot honour participation {spec.participation.describe()}; set "
          "fraction_train=1.0 (the wrapper selects clients by the library's sampler)")
    self.strategy = strategy
    # The wrapper selects the round's clients; the wrapped strategy sends to all it is shown,
    # however few (a cyclic Poisson round may draw one client, or none).
    self.population = checks.positive_int(
        population if population is not None else
        privacy_config.population_size if privacy_config is not None else
        max(1, int(getattr(strategy, "min_available_nodes", 1))), "population")
    for name in ("min_train_nodes", "min_available_nodes"):
      if hasattr(strategy, name):
        setattr(strategy, name, 0)
    self.plan = plan_lib.build(spec, cache_dir=cache_dir, noise_seed_pinned=noise_seed is not None)
    self.plan.check_numpy_run()
    self.delegates_optimizer = self._check_optimizer(strategy, spec, server_learning_rate)
    self.accountant = None
    if privacy_config is not None:
      check_privacy_config(privacy_config, spec.participation,
                           spec.privacy.sampling_prob if spec.privacy.sampling_prob is not None
                           else 1.0)
      self.accountant = MatrixFactorizationAccountant(self.plan, privacy_config)
    self.run = plan_lib.ServerRun(
        self.plan, server_learning_rate=server_learning_rate, noise_seed=noise_seed,
        sampling_seed=sampling_seed, sampling_secret=sampling_secret, exact_noise=exact_noise,
        state_path=state_path)
    self.current_arrays = ArrayRecord()
    self._offset = 0

  @classmethod
  def _spec_of(cls, positional: Tuple[Any, ...], keywords: Dict[str, Any]
               ) -> spec_lib.MechanismSpec:
    """The spec of the wrapper's arguments: ours or Flower's (see the class docstring)."""
    if len(positional) == 1 and isinstance(positional[0], spec_lib.MechanismSpec):
      if keywords:
        raise checks.CheckError(f"give a MechanismSpec or its keyword arguments, not both "
                                f"({', '.join(sorted(keywords))})")
      return positional[0]
    keywords = dict(keywords)
    for flower, ours in FLOWER_NAMES.items():
      if flower in keywords:
        if ours in keywords:
          raise checks.CheckError(f"give {flower} (Flower's name) or {ours}, not both")
        keywords[ours] = keywords.pop(flower)
    if len(positional) == 1 and not _is_number(positional[0]):
      name = positional[0]
    else:
      flower_order = (("noise_multiplier", "clients_per_round") if cls.clips_adaptively else
                      ("noise_multiplier", "clip_norm", "clients_per_round"))
      if len(positional) > len(flower_order) or not all(map(_is_number, positional)):
        raise checks.CheckError(
            f"{cls.__name__} takes a MechanismSpec, a mechanism's name, or Flower's "
            f"positional ({', '.join(FLOWER_POSITIONAL[cls.clips_adaptively])})")
      for key, value in zip(flower_order, positional):
        if key in keywords:
          raise checks.CheckError(f"{key} is given positionally and by keyword")
        keywords[key] = value
      name = keywords.pop("mechanism", DEFAULT_MECHANISM)
    if cls.clips_adaptively:
      keywords.setdefault("clip_norm", "adaptive")
    missing = [k for k in ("total_rounds", "clients_per_round", "clip_norm")
               if k not in keywords]
    if missing:
      raise checks.CheckError(
          f"{cls.__name__} needs {', '.join(missing)} (total_rounds: the n rounds the "
          "mechanism's matrices are built for, at least Flower's num_rounds)",
          arguments=tuple(missing))
    return spec_lib.MechanismSpec.from_args(name, **keywords)

  @staticmethod
  def _check_optimizer(strategy: Strategy, spec: spec_lib.MechanismSpec,
                       server_learning_rate: float) -> bool:
    """Whether the wrapped strategy's own optimizer gets the released estimate. FedAvg: no,
    the wrapper applies the workload's optimizer itself. Any other strategy (FedAdam,
    FedYogi, FedAdagrad, FedAvgM, …): yes, where the workload is the prefix sum (momentum 0,
    constant learning rate), whose noisy mean any optimizer may post-process; refused where
    the mechanism's C is built for a momentum workload, whose momentum is the mechanism's.
    The wrapped optimizer's own state (Adam's moments) is not in ``state_path``: a restarted
    server continues the noise, the sampler and the model, and the optimizer starts anew."""
    if type(strategy).aggregate_train is FedAvg.aggregate_train:  # FedAvg's mean, no optimizer
      return False
    w = spec.workload
    if w.momentum != 0.0 or w.lr_schedule != "constant" or spec.mechanism.momentum_workload:
      raise checks.CheckError(
          f"mechanism {spec.mechanism.name!r} with momentum={w.momentum:g} and lr_schedule="
          f"{w.lr_schedule!r} releases the iterates of its own optimizer (the momentum is part "
          f"of the mechanism's workload A); {type(strategy).__name__}'s optimizer cannot be "
          "applied on top of it: wrap FedAvg, or use momentum=0 with a constant lr_schedule "
          f"so that {type(strategy).__name__} post-processes the released noisy mean")
    if server_learning_rate != 1.0:
      raise checks.CheckError(
          f"server_learning_rate={server_learning_rate:g} does not apply: the wrapped "
          f"{type(strategy).__name__}'s own optimizer (and learning rate) takes the released "
          "noisy mean")
    return True

  # The run's parts, as the plan and its server hold them.
  spec = property(lambda self: self.plan.spec)
  resolved = property(lambda self: self.plan.resolved)
  record = property(lambda self: self.plan.record)
  state_path = property(lambda self: self.run.state_path)
  sampler = property(lambda self: self.run.sampler)
  noise = property(lambda self: self.run.noise)
  rounds_done = property(lambda self: self.run.rounds_done)
  clip_norm = property(lambda self: self.run.clip_norm)
  seed_sources = property(lambda self: self.run.seed_sources)

  def start(self, grid, initial_arrays: ArrayRecord, num_rounds: int = 3, *args, **kwargs):
    """Flower's loop (``Strategy.start``) with the state file's lock held throughout; more
    rounds than the mechanism has left are refused before round 1."""
    if self.state_path is not None:
      self.run.open_state()
    left = self.spec.n - self.run.resume_round
    if num_rounds > left:
      self.close()
      raise checks.CheckError(
          f"num_rounds={num_rounds} is more than the {left} rounds the mechanism has left "
          f"(total_rounds={self.spec.n}, {self.run.resume_round} released); build it with "
          "total_rounds at least num_rounds, or lower num_rounds")
    try:
      return super().start(grid, initial_arrays, num_rounds, *args, **kwargs)
    finally:
      self.close()

  def close(self) -> None:
    """Releases the state file's lock (``start`` does at the end of a run)."""
    self.run.close()

  def __repr__(self) -> str:
    kind = "adaptive" if self.clips_adaptively else "fixed"
    return f"Matrix-Factorization DP Strategy Wrapper ({self.spec.mechanism.name}, {kind} clipping)"

  def summary(self) -> None:
    self.strategy.summary()

  def privacy_spent(self) -> Optional[PrivacySpent]:
    return None if self.accountant is None else self.accountant.get_privacy_spent()

  def epsilon(self) -> float:
    """ε spent after the rounds released so far (an upper bound at the spec's δ)."""
    return self.plan.epsilon_after(self.rounds_done)

  # ------------------------------------------------------------------ training
  def _setup(self, arrays: ArrayRecord, grid) -> None:
    waited = 0.0
    while len(node_ids := sorted(int(x) for x in grid.get_node_ids())) < self.population:
      if waited >= self.node_wait_timeout:
        raise checks.CheckError(
            f"only {len(node_ids)} of the population's {self.population} nodes connected in "
            f"{self.node_wait_timeout:g} s (node_wait_timeout); start more SuperNodes "
            "(num-supernodes in a simulation) or lower population")
      log(INFO, "Waiting for nodes to connect: %d connected (population: %d).", len(node_ids),
          self.population)
      time.sleep(1)
      waited += 1.0
    try:
      self.run.start(list(arrays.keys()), arrays.to_numpy_ndarrays(),
                     [str(i) for i in node_ids])
    except samplers.SamplingError as e:
      raise checks.CheckError(
          f"the population of {len(node_ids)} connected nodes is too few for participation "
          f"{self.spec.participation.describe()} over total_rounds={self.spec.n} with "
          f"num_sampled_clients={self.spec.clients_per_round:g} ({e}); start more SuperNodes "
          "(num-supernodes in a simulation) or lower total_rounds") from None
    if self.accountant is not None:
      self.accountant.load_state_dict({"num_releases": self.rounds_done})
    self._offset = self.rounds_done

  def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                      grid) -> Iterable[Message]:
    if not self.run.started:
      self._setup(arrays, grid)
    self.current_arrays = arrays  # the last released model, kept if the budget stops the run
    i = server_round + self._offset  # the mechanism's round (a restarted run goes on)
    self.run.check_next(i)  # before the budget check, which must come before the sampler
    if self.accountant is not None and self.accountant.would_exceed():
      spent = self.accountant.get_privacy_spent()
      raise PrivacyBudgetExhausted(
          f"The next private release would exceed max_epsilon (current epsilon: "
          f"{spent.epsilon}, delta: {spent.delta}).")
    if self.client_side or not self.clips_adaptively:
      # Clients that use Flower's ``fixedclipping_mod`` clip to ζ themselves too; the server
      # clips every update regardless. The server-side adaptive wrapper sends no clip norm:
      # its quantile estimate needs the raw updates' norms, so client-side clipping mods
      # find no norm to clip to and the round is refused (``aggregate_train``).
      config[KEY_CLIPPING_NORM] = float(self.clip_norm)
    _, chosen = self.run.next_round()
    if not chosen and not self.delegates_optimizer:
      return []
    # (An optimizer the estimate is delegated to records the round's model even when the
    # sampler drew nobody.)
    return self.strategy.configure_train(server_round, arrays, config,
                                         _SelectedGrid(grid, [int(c) for c in chosen]))

  def aggregate_train(self, server_round: int, replies: Iterable[Message]
                      ) -> Tuple[Optional[ArrayRecord], Optional[MetricRecord]]:
    replies = list(replies)
    if self.client_side:
      replies, bits = _take_norm_bits([r for r in replies if not r.has_error()],
                                      self.clips_adaptively)
    else:
      _refuse_client_side_clipping(replies, self.clips_adaptively)
      replies = [r for r in replies if not r.has_error()]
    current = self.current_arrays.to_numpy_ndarrays()
    delta = plan_lib.update_fn(current)
    keys = list(self.current_arrays.keys())
    # The core's rule: a non-finite (or malformed) update is zeroed and counted, and the norm
    # cannot overflow (``tff_mf.clipping``); the round is the core's (``ServerRun``).
    returned = [_arrays(r, keys) for r in replies]
    updates = [delta(a) for a in returned]
    client_side = (None if not self.client_side else
                   [(a if a is not None else [], b) for a, b in zip(returned, bits)])
    if self.delegates_optimizer:
      new, counts, metrics = self._delegated_round(server_round, current, keys, updates,
                                                   replies, client_side)
    else:
      new, counts = self.run.release(current, updates, client_side)
      metrics = None
      if replies:
        _, metrics = self.strategy.aggregate_train(server_round, replies)
    metrics = MetricRecord() if metrics is None else metrics
    metrics[clipping.ZEROED_METRIC] = counts[clipping.ZEROED_METRIC]
    if self.client_side:
      metrics[clipping.REJECTED_METRIC] = counts[clipping.REJECTED_METRIC]
    if self.accountant is not None:
      self.accountant.compose(None)
    if self.plan.epsilons is not None:
      log(INFO, "Privacy spent: epsilon=%.6f at delta=%g after %d of %d rounds (%s)",
          self.epsilon(), self.record.delta, self.rounds_done, self.spec.n,
          self.spec.mechanism.name)
    return ArrayRecord({key: Array(v) for key, v in zip(keys, new)}), metrics

  def _delegated_round(self, server_round: int, current, keys, updates, replies, client_side):
    """The round's noisy mean handed to the wrapped strategy's optimizer as the one reply it
    aggregates (post-processing of the release); its metrics from the clients' replies."""
    mean, counts = self.run.estimate(current, updates, client_side)
    estimate = ArrayRecord({key: Array(np.asarray(np.asarray(c, np.float64) + g,
                                                  dtype=np.asarray(c).dtype))
                            for key, c, g in zip(keys, current, mean)})
    weight_key = getattr(self.strategy, "weighted_by_key", "num-examples")
    content = RecordDict({getattr(self.strategy, "arrayrecord_key", "arrays"): estimate,
                          "metrics": MetricRecord({weight_key: 1})})
    source = Message(RecordDict(), dst_node_id=0, message_type=MessageType.TRAIN)
    arrays, _ = self.strategy.aggregate_train(server_round, [Message(content, reply_to=source)])
    new = [np.asarray(a) for a in arrays.to_numpy_ndarrays()]
    self.run.commit(new)
    metrics = None
    aggregate_metrics = getattr(self.strategy, "train_metrics_aggr_fn", None)
    if replies and aggregate_metrics is not None:
      metrics = aggregate_metrics([r.content for r in replies], weight_key)
    return new, counts, metrics

  def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                         grid) -> Iterable[Message]:
    return self.strategy.configure_evaluate(server_round, arrays, config, grid)

  def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]
                         ) -> Optional[MetricRecord]:
    return self.strategy.aggregate_evaluate(server_round, replies)

  def state(self) -> Dict[str, np.ndarray]:
    """Everything a restarted server needs to continue (holds the secret seeds)."""
    return self.run.state()


class MatrixFactorizationClientSideFixedClipping(_MatrixFactorizationServerSide):
  """Flower's ``DifferentialPrivacyClientSideFixedClipping`` with the mechanism's correlated
  noise: ζ goes to the clients in the train config and each clips its own update with
  Flower's ``fixedclipping_mod``. The server does not clip again: it checks each update's norm
  (ζ up to the rounding of the model the client returned, ``tff_mf.clipping.within_clip``)
  and rejects one above it, zeroed and counted (``unclipped_client_updates``): seeing the
  updates, it trusts no client. Behind secure aggregation, where a server sees only the sum,
  the same ε holds only if every client runs the mod."""
  clips_adaptively = False
  client_side = True


class MatrixFactorizationClientSideAdaptiveClipping(_MatrixFactorizationServerSide):
  """Flower's ``DifferentialPrivacyClientSideAdaptiveClipping`` with the mechanism's noise:
  clients clip to ζ_i with ``adaptiveclipping_mod`` and send its norm bit (1: their update was
  above ζ_i); the server checks the norms as the fixed variant does, takes the bits (a reply
  without one is rejected) out of the metrics, so that they are released only through the
  noisy count, and updates ζ as ``MatrixFactorizationAdaptiveClipping`` does. The server
  trusts each client's bit (it cannot see the norm before clipping); ε composes the count
  queries with the mechanism, as for the server-side adaptive wrapper."""
  clips_adaptively = True
  client_side = True


class MatrixFactorizationFixedClipping(_MatrixFactorizationServerSide):
  """The wrapper with a fixed clip norm ζ (Flower's ``DifferentialPrivacyServerSideFixedClipping``
  with the mechanism's correlated noise in place of independent noise)."""
  clips_adaptively = False


class MatrixFactorizationAdaptiveClipping(_MatrixFactorizationServerSide):
  """The wrapper with ``clip_norm='adaptive'``: round i clips to ζ_i, adds ζ_i·z·(N·Z)[i], and
  ζ_{i+1} follows the noisy count of unclipped updates (the spec's ``AdaptiveClipping``,
  Andrew et al. 2021, arXiv:1905.03871); ε composes the count queries with the mechanism (the
  core's record). The arguments are those of every wrapper (on the API reference's page)
  and ``MechanismSpec.from_args``'s adaptive keywords: ``initial_clip_norm`` (Flower's
  ``initial_clipping_norm``), ``target_quantile`` (``target_clipped_quantile``),
  ``clip_learning_rate`` (``clip_norm_lr``) and ``clipped_count_stddev``."""
  clips_adaptively = True


def _arrays(reply: Message, keys: List[str]) -> Optional[List[np.ndarray]]:
  """The model a client returned: its one ArrayRecord's arrays by the model's keys, or None
  (which ``plan.update_fn`` turns into an update the clipping rule zeroes and counts)."""
  records = list(reply.content.array_records.values())
  if len(records) != 1 or list(records[0].keys()) != keys:
    return None
  try:
    return records[0].to_numpy_ndarrays()
  except (ValueError, TypeError):
    return None


def _take_norm_bits(replies: List[Message], adaptive: bool
                    ) -> Tuple[List[Message], List[Optional[bool]]]:
  """(the replies with ``adaptiveclipping_mod``'s norm bit taken out of their metrics, each
  client's unclipped bit). Fixed: a norm bit is refused (it would be released in the metrics
  without noise). Adaptive: a reply without a bit gets None (the core rejects its update)."""
  bits: List[Optional[bool]] = []
  for reply in replies:
    found = None
    for record in reply.content.metric_records.values():
      if KEY_NORM_BIT in record:
        if not adaptive:
          raise checks.CheckError(
              "a client runs Flower's adaptiveclipping_mod under "
              "MatrixFactorizationClientSideFixedClipping: its norm bit would be released in "
              "the round's metrics without noise; use fixedclipping_mod")
        found = not bool(record.pop(KEY_NORM_BIT))  # Flower's bit: 1 when clipped
    bits.append(found)
  return replies, bits


def _refuse_client_side_clipping(replies: List[Message], adaptive: bool) -> None:
  """Refuses a round whose clients ran Flower's client-side clipping mods where the wrapper
  cannot honour them: ``adaptiveclipping_mod``'s norm bit would be released in the
  metrics without noise, and with the adaptive wrapper any client-side clipping hides the
  raw norms its quantile estimate counts (true norms of 5 would keep ζ near 1)."""
  for reply in replies:
    if reply.has_error():
      if adaptive and KEY_CLIPPING_NORM in str(reply.error.reason):
        raise checks.CheckError(
            "a client runs Flower's client-side clipping mod (fixedclipping_mod or "
            "adaptiveclipping_mod) under MatrixFactorizationAdaptiveClipping, whose quantile "
            "estimate needs the raw update norms; remove the mod from the ClientApp")
      continue
    if any(KEY_NORM_BIT in m for m in reply.content.metric_records.values()):
      raise checks.CheckError(
          "a client runs Flower's adaptiveclipping_mod: its norm bit would be released in "
          "the round's metrics without noise; remove the mod from the ClientApp")


saved_model = plan_lib.saved_model


def stops_cleanly(main: Callable[..., None]) -> Callable[..., None]:
  """Decorates a ServerApp's main function (``@app.main()`` above ``@stops_cleanly``): a
  refusal of the wrappers, ``checks.CheckError`` (more rounds than the mechanism has left, a
  refused state file, too few nodes, a PrivacyConfig the record does not account), ends the
  run with its one line logged as an error (``ServerApp stopped: ...``) instead of a
  traceback; Flower then ends the run as it ends a finished one. Other exceptions, Flower's
  ``PrivacyBudgetExhausted`` among them, propagate unchanged."""
  @functools.wraps(main)
  def wrapped(*args, **kwargs):
    try:
      return main(*args, **kwargs)
    except checks.CheckError as e:
      log(ERROR, "ServerApp stopped: %s", e)
      return None
  return wrapped
