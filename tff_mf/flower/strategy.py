"""Flower strategy wrappers adding correlated noise, with fixed or adaptive clipping.

It wraps a FedAvg-style strategy (``flwr.serverapp.strategy``) as Flower's
``DifferentialPrivacyServerSideFixedClipping`` does, and runs Algorithm 1 of Denisov et al.
2022 (arXiv:2202.08312): round i clips each client's model update to L2 norm ζ over all
arrays by the core's rule (``tff_mf.clipping``: a non-finite update zeroed and counted, a
norm that cannot overflow; the fixed wrapper sends ζ in the train config, so that clients
may clip too with Flower's ``fixedclipping_mod``), sums, divides by the expected clients per round K, adds σ/K·(N·Z)[i] (σ = z·ζ,
``tff_mf.flower.noise``) and applies the workload's server optimizer (heavy-ball momentum β
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

import json
import os
import time
from logging import INFO
from typing import Any, Dict, Iterable, List, Optional, Tuple

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import NeighboringRelation, PrivacyConfig, PrivacySpent, SamplingMethod
from flwr.serverapp.exception import PrivacyBudgetExhausted
from flwr.serverapp.strategy import Strategy
from flwr.supercore import log
from flwr.supercore.differential_privacy import KEY_CLIPPING_NORM, KEY_NORM_BIT

from tff_mf.accounting import adaptive_clipping
from tff_mf import checks
from tff_mf import clipping
from tff_mf import entropy
from tff_mf import mechanisms
from tff_mf import runstate
from tff_mf import spec as spec_lib
from tff_mf.factorization import workloads
from tff_mf.flower import noise as noise_lib

ACCOUNTING_METHOD = "tff-mf epsilon_by_round"
# Beside ``state_path``: its release log and its lock.
RELEASES_SUFFIX = ".releases.jsonl"
STATE_REMEDY = "start the run with a new state_path"


class MatrixFactorizationAccountant:
  """Flower's ``PrivacyAccountant`` protocol over a core ``PrivacyRecord``: ε after r releases
  is ``epsilon_by_round()[r − 1]`` (an upper bound at the record's δ)."""

  def __init__(self, record: mechanisms.PrivacyRecord, config: PrivacyConfig,
               epsilons: Optional[List[float]] = None):
    if record.epsilon is None:
      raise checks.CheckError("the mechanism has no epsilon: give delta to the spec")
    if config.target_delta != record.delta:
      raise checks.CheckError(f"PrivacyConfig target_delta={config.target_delta} is not the "
                              f"spec's delta={record.delta}")
    check_privacy_config(config, record.participation)
    self._config = config
    self._record = record
    self._eps = list(epsilons) if epsilons is not None else record.epsilon_by_round()
    self._releases = 0

  @property
  def config(self) -> PrivacyConfig:
    return self._config

  @property
  def num_releases(self) -> int:
    return self._releases

  def epsilon_after(self, releases: int) -> float:
    if releases > len(self._eps):
      raise checks.CheckError(f"release {releases} is past the n={len(self._eps)} rounds "
                              "the mechanism's epsilon is for")
    return 0.0 if releases <= 0 else float(self._eps[releases - 1])

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
    return limit is not None and self.epsilon_after(self._releases + count) > limit

  def state_dict(self) -> Dict[str, object]:
    return {"num_releases": self._releases}

  def load_state_dict(self, state: Dict[str, object]) -> None:
    self._releases = int(state["num_releases"])


def check_privacy_config(config: PrivacyConfig, schema) -> None:
  """Refuses a ``PrivacyConfig`` that claims what the record does not account: tff-mf's ε is
  for add-or-remove-one neighbours (a replace-one guarantee needs twice the sensitivity),
  with the clients drawn by the spec's schema (``POISSON`` only for a Poisson schema)."""
  relation = NeighboringRelation(config.neighboring_relation)
  if relation != NeighboringRelation.ADD_OR_REMOVE_ONE:
    raise checks.CheckError(
        f"PrivacyConfig neighboring_relation={relation.value!r}: tff-mf's epsilon is for "
        "add-or-remove-one neighbours (replace-one needs twice the sensitivity, which this "
        "epsilon does not cover); use NeighboringRelation.ADD_OR_REMOVE_ONE")
  method = SamplingMethod(config.sampling_method)
  if method == SamplingMethod.POISSON and not (schema is not None and schema.poisson):
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


def _check_continuous(spec: spec_lib.MechanismSpec) -> None:
  """The Flower layer adds continuous noise: a discrete-Gaussian spec's integer release is
  the TF query's (``tff_mf.tf.aggregators``) or ``tff_mf.noise.discrete_gaussian.IntegerRelease``."""
  if spec.privacy.discrete:
    raise checks.CheckError("the Flower layer adds continuous noise: noise_distribution "
                            "'discrete_gaussian' runs with the TF aggregator "
                            "(tff_mf.tf.aggregators) or tff_mf.noise.discrete_gaussian.IntegerRelease",
                            arguments=("noise_distribution",))


class _MatrixFactorizationServerSide(Strategy):
  """Strategy wrapper for central DP with a matrix-factorization mechanism (server side);
  ``MatrixFactorizationFixedClipping`` and ``MatrixFactorizationAdaptiveClipping`` below.

  Parameters:
    strategy: the wrapped FedAvg-style strategy (its ``fraction_train`` must be 1.0: the
      wrapper hands it exactly the clients the library's sampler drew).
    spec: a ``tff_mf.spec.MechanismSpec`` (fixed clip norm), or the name of a registry
      mechanism with ``MechanismSpec.from_args``'s keywords in ``spec_arguments``.
    server_learning_rate: η_server of the server optimizer.
    noise_seed: pins the noise seed (tests, replays); None: a fresh secret from OS entropy.
    exact_noise: draw and combine the noise as the TF aggregator does, bit for bit on the
      same machine (about 3 µs per model coordinate and round more); by default the rows
      are computed in float64 and equal TF's within float32 rounding. With adaptive
      clipping the row is drawn at z·ζ_i, TF's at z·ζ_0 rescaled: equal within rounding.
    sampling_seed, sampling_secret: pin the sampler's permutation and secret; None: OS entropy.
    state_path: the private file the run's state is written to after each round and read
      from at the start if it exists (a restarted server continues the run).
    privacy_config: Flower's ``PrivacyConfig``; its ``max_epsilon`` stops the run.
    population: the clients (nodes) the sampler draws from: round 1 waits until this many
      are connected and fixes the population to those connected then (default: the
      ``PrivacyConfig``'s ``population_size``, else the wrapped strategy's
      ``min_available_nodes``).
  """

  def __init__(self, strategy: Strategy, spec, *, server_learning_rate: float = 1.0,
               noise_seed: Optional[int] = None, sampling_seed: Optional[int] = None,
               sampling_secret: Optional[int] = None, state_path: Optional[str] = None,
               privacy_config: Optional[PrivacyConfig] = None, population: Optional[int] = None,
               cache_dir: Optional[str] = None, exact_noise: bool = False, **spec_arguments):
    super().__init__()
    if not isinstance(spec, spec_lib.MechanismSpec):
      spec = spec_lib.MechanismSpec.from_args(spec, **spec_arguments)
    elif spec_arguments:
      raise checks.CheckError(f"give a MechanismSpec or its keyword arguments, not both "
                              f"({', '.join(sorted(spec_arguments))})")
    if not spec.mechanism.private:
      raise checks.CheckError(f"mechanism {spec.mechanism.name!r} adds no noise; this wrapper "
                              "is for private mechanisms")
    _check_continuous(spec)
    if (spec.adaptive is not None) != self.clips_adaptively:
      raise checks.CheckError(
          f"{type(self).__name__} takes " + ("clip_norm='adaptive'" if self.clips_adaptively
                                             else "a fixed clip_norm") +
          f", got clip_norm={spec.clipping.described!r}; use MatrixFactorization"
          f"{'Fixed' if self.clips_adaptively else 'Adaptive'}Clipping")
    if (spec.adaptive is not None and spec.adaptive.clipped_count_stddev == 0.0
        and not spec.privacy.allow_no_noise):
      raise checks.CheckError("clipped_count_stddev = 0 releases the count of unclipped "
                              "updates without noise; pass allow_no_noise=True to accept that")
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
    self.spec = spec
    pinned = noise_seed is not None
    self.resolved, self.record = mechanisms.build(spec, cache_dir=cache_dir,
                                                  noise_seed_pinned=pinned)
    if self.resolved.factorization is None:
      raise checks.CheckError(f"mechanism {spec.mechanism.name!r} is TFF's own tree "
                              "aggregation; in Flower use 'honaker_online' (the same tree as a "
                              "matrix mechanism)")
    self.server_learning_rate = checks.positive_float(server_learning_rate,
                                                      "server_learning_rate")
    w = spec.workload
    self.momentum = float(w.momentum)
    self.etas = workloads.learning_rates(spec.n, w.lr_schedule, w.schedule_rounds)
    self.clip_norm = spec.clipping.clip_norm  # ζ_i: ζ_0, then the quantile estimate's
    self._exact_noise = bool(exact_noise)
    self._init_seeds(noise_seed, sampling_seed, sampling_secret)
    self.state_path = state_path
    self._lock: Optional[runstate.StateLock] = None
    self._log: Optional[runstate.ReleaseLog] = None
    self._binding: Optional[Dict[str, object]] = None
    # ε after each round (upper bounds at δ), computed once; None without δ.
    self._epsilons = (self.record.epsilon_by_round() if self.record.epsilon is not None
                      else None)
    self.accountant = None
    if privacy_config is not None:
      self.accountant = MatrixFactorizationAccountant(self.record, privacy_config,
                                                      self._epsilons)
    self.noise: Optional[noise_lib.NoiseRows] = None
    self.sampler = None
    self._momentum_buffer: Optional[List[np.ndarray]] = None
    self._keys: Optional[List[str]] = None
    self.current_arrays = ArrayRecord()
    self.rounds_done = 0
    self._offset = 0
    self._restored: Optional[Dict[str, np.ndarray]] = None
    if state_path is not None:
      self._open_state()

  def _init_seeds(self, noise_seed, sampling_seed, sampling_secret) -> None:
    """The noise seed pair and the sampler's seed and secret (OS entropy unless pinned), and
    where each came from (a restarted run keeps the file's; a seed pinned now: pinned)."""
    self._seed = noise_lib.seed_pair(noise_seed)
    self._noise_seed_pinned = noise_seed is not None
    self._sampling_pinned = (sampling_seed is not None, sampling_secret is not None)
    self._sampling_seed = (entropy.new_seed("sampling-seed") if sampling_seed is None
                           else checks.seed(sampling_seed, "sampling_seed"))
    self._secret = (entropy.new_seed("sampling-secret") if sampling_secret is None
                    else checks.seed(sampling_secret, "sampling_secret"))
    self.seed_sources = {name: "pinned" if p else "os_entropy" for name, p in zip(
        ("noise_seed", "sampling_seed", "sampling_secret"),
        (self._noise_seed_pinned,) + self._sampling_pinned)}

  def start(self, grid, initial_arrays: ArrayRecord, *args, **kwargs):
    """Flower's loop (``Strategy.start``) with the state file's lock held throughout."""
    if self.state_path is not None and (self._lock is None or not self._lock.held):
      self._open_state(reopen=True)
    try:
      return super().start(grid, initial_arrays, *args, **kwargs)
    finally:
      self.close()

  def close(self) -> None:
    """Releases the state file's lock (``start`` does at the end of a run)."""
    if self._lock is not None:
      self._lock.release()

  def _open_state(self, reopen: bool = False) -> None:
    """Locks ``state_path`` (one server per state file), checks it is private (owner, mode)
    and reads it with its release log: the run's state as ``_restored``."""
    path = self.state_path
    self._lock = runstate.StateLock(f"{path}.lock", f"the state file {path}", STATE_REMEDY)
    try:
      self._log = runstate.ReleaseLog(f"{path}{RELEASES_SUFFIX}", STATE_REMEDY)
      if reopen:  # a second start of this strategy: the file must still be the one it wrote
        saved = _load_state(path) if os.path.lexists(path) else None
        at = 0 if saved is None else int(np.asarray(saved["rounds_done"])[0])
        if self.noise is not None and at != self.rounds_done:
          raise checks.CheckError(f"the state file {path} was changed by another server "
                                  f"(round {at}, this server's {self.rounds_done}); "
                                  f"{STATE_REMEDY}")
      elif os.path.lexists(path):
        self._restored = _load_state(path)
    except BaseException:
      self.close()
      raise

  def _run_binding(self, arrays: ArrayRecord, ndarrays) -> Dict[str, object]:
    """What makes a state file this run's: the mechanism (encoder C, and B when C is not
    square), schema, spec, noise multiplier, clipping and the model. (The seeds and their
    sources are the file's: a restart continues them, ``_restore``.)"""
    f = self.resolved.factorization
    return {
        "mechanism": self.spec.mechanism.name,
        "encoder_sha256": runstate.encoder_sha256(self.record.encoder, f.b),
        "schema_sha256": runstate.json_sha256(self.spec.participation.as_dict()),
        "spec_sha256": runstate.json_sha256(self.spec.describe()),
        "noise_multiplier": float(self.record.noise_multiplier),
        "sampling_prob": self.spec.privacy.sampling_prob,
        "clipping": "adaptive" if self.clips_adaptively else "fixed",
        "exact_noise": self._exact_noise,
        "server_learning_rate": self.server_learning_rate,
        "model": [[key, list(a.shape), a.dtype.str] for key, a in zip(arrays.keys(), ndarrays)],
    }

  def __repr__(self) -> str:
    kind = "adaptive" if self.clips_adaptively else "fixed"
    return f"Matrix-Factorization DP Strategy Wrapper ({self.spec.mechanism.name}, {kind} clipping)"

  def summary(self) -> None:
    self.strategy.summary()

  def privacy_spent(self) -> Optional[PrivacySpent]:
    return None if self.accountant is None else self.accountant.get_privacy_spent()

  def epsilon(self) -> float:
    """ε spent after the rounds released so far (an upper bound at the spec's δ)."""
    if self._epsilons is None:
      raise checks.CheckError("the mechanism has no epsilon: give delta to the spec")
    return 0.0 if self.rounds_done == 0 else float(self._epsilons[self.rounds_done - 1])

  # ------------------------------------------------------------------ training
  def _setup(self, arrays: ArrayRecord, grid) -> None:
    ndarrays = arrays.to_numpy_ndarrays()
    self._keys = list(arrays.keys())
    self.noise = noise_lib.NoiseRows(self.resolved, [a.shape for a in ndarrays], self._seed,
                                     exact=self._exact_noise)
    self._momentum_buffer = [np.zeros(a.shape, np.float64) for a in ndarrays]
    while len(node_ids := sorted(int(x) for x in grid.get_node_ids())) < self.population:
      log(INFO, "Waiting for nodes to connect: %d connected (population: %d).", len(node_ids),
          self.population)
      time.sleep(1)
    n, k = self.spec.n, self.spec.clients_per_round
    if not float(k).is_integer() and not self.spec.participation.poisson:
      raise checks.CheckError(f"clients_per_round={k} must be an integer for participation "
                              f"{self.spec.participation.kind}")
    self.sampler = self.spec.participation.make_sampler(
        [str(i) for i in node_ids], seed=self._sampling_seed, total_rounds=n,
        clients_per_round=int(k), sampling_prob=self.spec.privacy.sampling_prob,
        secret=self._secret)
    self.sampler.prepare(lambda cid: cid)
    self._binding = self._run_binding(arrays, ndarrays)
    if self._restored is not None:
      self._restore(self._restored)
      self._restored = None
    elif self._log is not None and self._log.last_round:
      raise checks.CheckError(
          f"{self._log.path} shows {self._log.last_round} rounds released but the state file "
          f"{self.state_path} is missing: a new run would release them again with new noise "
          f"under an epsilon that covers one run; {STATE_REMEDY}")
    self._offset = self.rounds_done

  def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                      grid) -> Iterable[Message]:
    if self.noise is None:
      self._setup(arrays, grid)
    i = server_round + self._offset  # the mechanism's round (a restarted run goes on)
    if i != self.rounds_done + 1:
      raise checks.CheckError(f"round {i} does not follow round {self.rounds_done}: rounds "
                              "must run in order, each once")
    if i > self.spec.n:
      raise checks.CheckError(f"round {i} is past the n={self.spec.n} rounds this mechanism "
                              "was built for; build one for more rounds")
    if self.accountant is not None and self.accountant.would_exceed():
      spent = self.accountant.get_privacy_spent()
      raise PrivacyBudgetExhausted(
          f"The next private release would exceed max_epsilon (current epsilon: "
          f"{spent.epsilon}, delta: {spent.delta}).")
    self.current_arrays = arrays
    if not self.clips_adaptively:
      # Clients that use Flower's ``fixedclipping_mod`` clip to ζ themselves too; the server
      # clips every update regardless. The adaptive wrapper sends no clip norm: its quantile
      # estimate needs the raw updates' norms, so client-side clipping mods find no norm
      # to clip to and the round is refused (``aggregate_train``).
      config[KEY_CLIPPING_NORM] = float(self.clip_norm)
    chosen, _, _ = self.sampler.next_round(i, lambda cid: cid)
    if not chosen:
      return []
    return self.strategy.configure_train(server_round, arrays, config,
                                         _SelectedGrid(grid, [int(c) for c in chosen]))

  def aggregate_train(self, server_round: int, replies: Iterable[Message]
                      ) -> Tuple[Optional[ArrayRecord], Optional[MetricRecord]]:
    replies = list(replies)
    _refuse_client_side_clipping(replies, self.clips_adaptively)
    replies = [r for r in replies if not r.has_error()]
    current = [a.astype(np.float64) for a in self.current_arrays.to_numpy_ndarrays()]
    total = [np.zeros_like(a) for a in current]
    count = 0.0  # Σ (1[‖Δ‖ ≤ ζ_i] − ½): the quantile estimate's query (adaptive clipping)
    zeroed = 0
    for reply in replies:
      # The core's rule: a non-finite (or malformed) update is zeroed and counted, and the
      # norm cannot overflow (``tff_mf.clipping``).
      clipped = clipping.clip_update(_update(reply, self._keys, current), self.clip_norm)
      zeroed += int(clipped.zeroed)
      count += (1.0 if clipped.unclipped else 0.0) - 0.5
      for t, u in zip(total, clipped.values):
        t += u
    metrics = None
    if replies:
      _, metrics = self.strategy.aggregate_train(server_round, replies)
    metrics = MetricRecord() if metrics is None else metrics
    metrics[clipping.ZEROED_METRIC] = zeroed
    k = float(self.spec.clients_per_round)
    noise = self.noise.next(self.record.noise_multiplier * self.clip_norm)
    noise = [z.astype(np.float64) / k for z in noise]
    i = server_round + self._offset
    eta = self.server_learning_rate * float(self.etas[i - 1])
    new = []
    for c, t, z, m in zip(current, total, noise, self._momentum_buffer):
      m *= self.momentum
      m += t / k + z
      new.append(c + eta * m)
    self.rounds_done = i
    if self.clips_adaptively:
      self._next_clip(i, count, k)
    if self.accountant is not None:
      self.accountant.compose(None)
    if self._epsilons is not None:
      log(INFO, "Privacy spent: epsilon=%.6f at delta=%g after %d of %d rounds (%s)",
          self.epsilon(), self.record.delta, i, self.spec.n, self.spec.mechanism.name)
    dtypes = [a.dtype for a in self.current_arrays.to_numpy_ndarrays()]
    out = ArrayRecord({key: Array(np.asarray(v, dtype=dt))
                       for key, v, dt in zip(self._keys, new, dtypes)})
    if self.state_path is not None:
      self._save(out)
    return out, metrics

  def _next_clip(self, i: int, count: float, k: float) -> None:
    """ζ_{i+1} from the noisy count of round i (Andrew et al. 2021, arXiv:1905.03871, Alg. 1,
    geometric update), its noise the TF query's draw for the seed and round."""
    a = self.spec.adaptive
    noisy = count + a.clipped_count_stddev * noise_lib.count_noise(self.noise.seed, i - 1)
    self.clip_norm = adaptive_clipping.next_clip(self.clip_norm, noisy, k, a.target_quantile,
                                                 a.learning_rate)

  def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                         grid) -> Iterable[Message]:
    return self.strategy.configure_evaluate(server_round, arrays, config, grid)

  def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]
                         ) -> Optional[MetricRecord]:
    return self.strategy.aggregate_evaluate(server_round, replies)

  # ------------------------------------------------------------------ state
  def state(self) -> Dict[str, np.ndarray]:
    """Everything a restarted server needs to continue (holds the secret seed)."""
    out = dict(self.noise.state())
    out["rounds_done"] = np.array([self.rounds_done], np.int64)
    out["clip_norm"] = np.array([self.clip_norm], np.float64)
    out["sampling"] = np.array([self._sampling_seed, self._secret], np.int64)
    for t, m in enumerate(self._momentum_buffer):
      out[f"momentum_{t}"] = m
    for key, value in self.sampler.state().items():
      out[f"sampler_{key}"] = np.asarray(value)
    return out

  def _restore(self, state: Dict[str, np.ndarray]) -> None:
    path = self.state_path
    if "binding" not in state:
      raise checks.CheckError(f"the state file {path} has no run binding (written by an older "
                              f"tff-mf): it cannot be proven to be this run's; {STATE_REMEDY}")
    recorded = json.loads(str(state["binding"]))
    runstate.check_binding(recorded, self._binding, f"the state file {path}", STATE_REMEDY)
    rounds = int(np.asarray(state["rounds_done"])[0])
    digest = runstate.binding_digest(self._binding)
    elsewhere = self._log.bound_elsewhere(digest)
    if elsewhere is not None:
      raise checks.CheckError(f"{self._log.path} logs round {elsewhere} under another run "
                              f"binding than the state file {path}; {STATE_REMEDY}")
    if self._log.check_state_round(rounds, f"the state file {path}"):
      self._log.record(rounds, runstate.model_digest(_saved_arrays(state, self._keys)), digest)
    recorded_sources = json.loads(str(state["seed_sources"]))
    self.seed_sources = {name: "pinned" if self.seed_sources[name] == "pinned" else
                         recorded_sources[name] for name in self.seed_sources}
    sampling = np.asarray(state["sampling"], np.int64)
    for pinned, name, saved, mine in zip(self._sampling_pinned,
                                         ("sampling_seed", "sampling_secret"), sampling,
                                         (self._sampling_seed, self._secret)):
      if pinned and int(saved) != mine:
        raise checks.CheckError(f"{name} is pinned, but the state file {path} holds another; "
                                f"drop {name} to continue its run, or {STATE_REMEDY}")
    if (int(sampling[0]), int(sampling[1])) != (self._sampling_seed, self._secret):
      self._sampling_seed, self._secret = int(sampling[0]), int(sampling[1])
      node_ids = self.sampler.client_ids
      self.sampler = self.spec.participation.make_sampler(
          node_ids, seed=self._sampling_seed, total_rounds=self.spec.n,
          clients_per_round=int(self.spec.clients_per_round),
          sampling_prob=self.spec.privacy.sampling_prob, secret=self._secret)
    saved_seed = np.asarray(state["noise_seed"], np.int64)
    if self._noise_seed_pinned and not np.array_equal(saved_seed, self._seed):
      raise checks.CheckError(f"noise_seed is pinned, but the state file {self.state_path} "
                              "holds another seed; drop noise_seed to continue its run")
    self.noise.restore(state)
    self._seed = self.noise.seed
    self.rounds_done = int(state["rounds_done"][0])
    self.clip_norm = float(state["clip_norm"][0])
    if self.noise.round != self.rounds_done:
      raise checks.CheckError(f"the state file's noise stream is at round {self.noise.round}, "
                              f"its rounds at {self.rounds_done}")
    for t in range(len(self._momentum_buffer)):
      m = np.asarray(state[f"momentum_{t}"], np.float64)
      if m.shape != self._momentum_buffer[t].shape:
        raise checks.CheckError(f"the state file's momentum_{t} has shape {m.shape}, the "
                                f"model's {self._momentum_buffer[t].shape}")
      self._momentum_buffer[t] = m.copy()
    self.sampler.restore({k[len("sampler_"):]: v for k, v in state.items()
                          if k.startswith("sampler_")})
    if self.accountant is not None:
      self.accountant.load_state_dict({"num_releases": self.rounds_done})

  def _save(self, arrays: ArrayRecord) -> None:
    """The state (with the released model and the run's binding) written whole, then the
    round logged: a kill between the two leaves a state one round ahead of its log, which
    the next start logs from the state."""
    state = self.state()
    model = arrays.to_numpy_ndarrays()
    for key, value in zip(self._keys, model):
      state[f"model_{key}"] = value
    state["binding"] = np.array(json.dumps(self._binding, sort_keys=True))
    state["seed_sources"] = np.array(json.dumps(self.seed_sources, sort_keys=True))
    runstate.write_private(self.state_path, lambda f: np.savez(f, **state))
    self._log.record(self.rounds_done, runstate.model_digest(model),
                     runstate.binding_digest(self._binding))


class MatrixFactorizationFixedClipping(_MatrixFactorizationServerSide):
  """The wrapper with a fixed clip norm ζ (Flower's ``DifferentialPrivacyServerSideFixedClipping``
  with the mechanism's correlated noise in place of independent noise)."""
  clips_adaptively = False


class MatrixFactorizationAdaptiveClipping(_MatrixFactorizationServerSide):
  """The wrapper with ``clip_norm='adaptive'``: round i clips to ζ_i, adds ζ_i·z·(N·Z)[i], and
  ζ_{i+1} follows the noisy count of unclipped updates (the spec's ``AdaptiveClipping``);
  ε composes the count queries with the mechanism (the core's record)."""
  clips_adaptively = True


def _update(reply: Message, keys: List[str], current: List[np.ndarray]) -> List[np.ndarray]:
  """A reply's model minus the current model (float64); NaN where the reply is malformed
  (not one ArrayRecord of the model's keys and shapes), so the rule zeroes and counts it."""
  records = list(reply.content.array_records.values())
  try:
    if len(records) != 1 or list(records[0].keys()) != keys:
      raise ValueError("not the model's arrays")
    arrays = records[0].to_numpy_ndarrays()
    if any(a.shape != c.shape for a, c in zip(arrays, current)):
      raise ValueError("not the model's shapes")
    return [np.asarray(a, np.float64) - c for a, c in zip(arrays, current)]
  except (ValueError, TypeError):
    return [np.full(c.shape, np.nan) for c in current]


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


def _saved_arrays(state: Dict[str, np.ndarray], keys: List[str]) -> List[np.ndarray]:
  return [state[f"model_{key}"] for key in keys]


def _load_state(path: str) -> Dict[str, np.ndarray]:
  """The state file's arrays, after its owner and mode checks (it holds the seeds)."""
  runstate.check_private(path, STATE_REMEDY)
  runstate.check_secret(path, "its noise seed and sampling secret", STATE_REMEDY)
  try:
    with np.load(path, allow_pickle=False) as data:
      return {k: data[k] for k in data.files}
  except (OSError, ValueError) as e:
    raise checks.CheckError(f"cannot read the state file {path}: {e}") from None


def saved_model(path: str) -> Dict[str, np.ndarray]:
  """The model arrays written with the state after the last round (by their keys)."""
  return {k[len("model_"):]: v for k, v in _load_state(path).items() if k.startswith("model_")}
