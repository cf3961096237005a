"""Flower strategy wrappers adding correlated noise, with fixed or adaptive clipping.

It wraps a FedAvg-style strategy (``flwr.serverapp.strategy``) as Flower's
``DifferentialPrivacyServerSideFixedClipping`` does, and runs Algorithm 1 of Denisov et al.
2022 (arXiv:2202.08312): round i clips each client's model update to L2 norm ζ over all
arrays (and sends ζ in the train config, so that clients may clip too with Flower's
``fixedclipping_mod``), sums, divides by the expected clients per round K, adds σ/K·(N·Z)[i] (σ = z·ζ,
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
given that file continues the same stream, and a replayed round adds the same noise.
"""

from __future__ import annotations

import os
import time
from logging import INFO
from typing import Any, Dict, Iterable, List, Optional, Tuple

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import PrivacyConfig, PrivacySpent
from flwr.serverapp.exception import PrivacyBudgetExhausted
from flwr.serverapp.strategy import Strategy
from flwr.supercore import log
from flwr.supercore.differential_privacy import KEY_CLIPPING_NORM

from tff_mf.accounting import adaptive_clipping
from tff_mf import checks
from tff_mf import entropy
from tff_mf import mechanisms
from tff_mf import spec as spec_lib
from tff_mf.factorization import workloads
from tff_mf.flower import noise as noise_lib

ACCOUNTING_METHOD = "tff-mf epsilon_by_round"


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
    self._seed = noise_lib.seed_pair(noise_seed)
    self._noise_seed_pinned = pinned
    self._exact_noise = bool(exact_noise)
    self._sampling_seed = (entropy.new_seed("sampling-seed") if sampling_seed is None
                           else checks.seed(sampling_seed, "sampling_seed"))
    self._secret = (entropy.new_seed("sampling-secret") if sampling_secret is None
                    else checks.seed(sampling_secret, "sampling_secret"))
    self.state_path = state_path
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
    if state_path is not None and os.path.exists(state_path):
      self._restored = _load_state(state_path)

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
    if self._restored is not None:
      self._restore(self._restored)
      self._restored = None
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
    # Clients that use Flower's ``fixedclipping_mod`` clip to ζ_i themselves too; the server
    # clips every update regardless.
    config[KEY_CLIPPING_NORM] = float(self.clip_norm)
    chosen, _, _ = self.sampler.next_round(i, lambda cid: cid)
    if not chosen:
      return []
    return self.strategy.configure_train(server_round, arrays, config,
                                         _SelectedGrid(grid, [int(c) for c in chosen]))

  def aggregate_train(self, server_round: int, replies: Iterable[Message]
                      ) -> Tuple[Optional[ArrayRecord], Optional[MetricRecord]]:
    replies = [r for r in replies if not r.has_error()]
    current = [a.astype(np.float64) for a in self.current_arrays.to_numpy_ndarrays()]
    total = [np.zeros_like(a) for a in current]
    count = 0.0  # Σ (1[‖Δ‖ ≤ ζ_i] − ½): the quantile estimate's query (adaptive clipping)
    for reply in replies:
      record = next(iter(reply.content.array_records.values()))
      update = [a.astype(np.float64) - c for a, c in zip(record.to_numpy_ndarrays(), current)]
      norm = float(np.sqrt(sum(float(np.sum(u * u)) for u in update)))
      scale = min(1.0, self.clip_norm / norm) if norm > 0 else 1.0
      count += (1.0 if norm <= self.clip_norm else 0.0) - 0.5
      for t, u in zip(total, update):
        t += scale * u
    metrics = None
    if replies:
      _, metrics = self.strategy.aggregate_train(server_round, replies)
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
    sampling = np.asarray(state["sampling"], np.int64)
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
    state = self.state()
    for key, value in zip(self._keys, arrays.to_numpy_ndarrays()):
      state[f"model_{key}"] = value
    _write_private(self.state_path, state)


class MatrixFactorizationFixedClipping(_MatrixFactorizationServerSide):
  """The wrapper with a fixed clip norm ζ (Flower's ``DifferentialPrivacyServerSideFixedClipping``
  with the mechanism's correlated noise in place of independent noise)."""
  clips_adaptively = False


class MatrixFactorizationAdaptiveClipping(_MatrixFactorizationServerSide):
  """The wrapper with ``clip_norm='adaptive'``: round i clips to ζ_i, adds ζ_i·z·(N·Z)[i], and
  ζ_{i+1} follows the noisy count of unclipped updates (the spec's ``AdaptiveClipping``);
  ε composes the count queries with the mechanism (the core's record)."""
  clips_adaptively = True


def _write_private(path: str, arrays: Dict[str, np.ndarray]) -> None:
  """``np.savez`` to ``path`` through a 0600 temporary file, renamed into place."""
  tmp = f"{path}.tmp"
  fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
  os.fchmod(fd, 0o600)
  with os.fdopen(fd, "wb") as f:
    np.savez(f, **arrays)
  os.replace(tmp, path)


def _load_state(path: str) -> Dict[str, np.ndarray]:
  try:
    with np.load(path) as data:
      return {k: data[k] for k in data.files}
  except (OSError, ValueError) as e:
    raise checks.CheckError(f"cannot read the state file {path}: {e}") from None


def saved_model(path: str) -> Dict[str, np.ndarray]:
  """The model arrays written with the state after the last round (by their keys)."""
  return {k[len("model_"):]: v for k, v in _load_state(path).items() if k.startswith("model_")}
