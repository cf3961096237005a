"""One spec in, one plan out: what every framework consumes for a run (numpy; no TF, no flwr).

``build(spec)`` resolves a checked ``tff_mf.spec.MechanismSpec`` (``tff_mf.mechanisms.build``)
into a ``Plan``: the resolved encoder and its ``PrivacyRecord`` with ε after each round and
the budget check, the sampler built from the schema's kind, the clipping rule
(``tff_mf.clipping``), the numpy noise source (``tff_mf.noise.rows``), the server optimizer's
spec (momentum β and the learning rates η_i of the workload) and the binding a run's state
is checked against (``tff_mf.runstate``).

``ServerRun`` is the server side of Denisov et al. 2022 (arXiv:2202.08312), Algorithm 1, in
numpy on a plan: round i clips each client update to ζ_i, sums, divides by the expected
clients per round K, adds σ/K·(N·Z)[i] (σ = z·ζ_i) and applies heavy-ball momentum with
η_i (Prop 4.2); with adaptive clipping ζ_{i+1} follows the noisy count of unclipped
updates (Andrew et al. 2021, arXiv:1905.03871, Alg. 1). Its state (seeds, round, stream rows,
momentum, sampler, clip norm, the released model) goes after each round to a private file
bound to the run, locked while a server runs and checked against its release log. A
framework without TensorFlow (Flower's strategy wrapper, the numpy simulation in
``examples/numpy_federated.py``) turns its messages into arrays and calls it; the TF layer
turns the same record and noise into a DPQuery.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tff_mf import checks
from tff_mf import clipping
from tff_mf import entropy
from tff_mf import mechanisms
from tff_mf import runstate
from tff_mf import spec as spec_lib
from tff_mf.accounting import adaptive_clipping
from tff_mf.factorization import workloads
from tff_mf.noise import rows as rows_lib

# Beside a run's state file: its release log and its lock.
RELEASES_SUFFIX = ".releases.jsonl"
STATE_REMEDY = "start the run with a new state_path"
SEEDS = ("noise_seed", "sampling_seed", "sampling_secret")


class BudgetExhausted(checks.CheckError):
  """The next release would pass the run's ε budget (nothing was released for it)."""


@dataclasses.dataclass(frozen=True)
class Plan:
  """A resolved run: every framework reads its rules here and re-derives none.

  Attributes:
    spec: the checked spec. resolved, record: ``tff_mf.mechanisms.build``'s.
    learning_rates: η_1..η_n of the workload's schedule.
    epsilons: ε after rounds 1..n (upper bounds at δ), None without δ or noise; computed on
      first use.
  """
  spec: spec_lib.MechanismSpec
  resolved: mechanisms.Resolved
  record: mechanisms.PrivacyRecord
  learning_rates: np.ndarray

  @functools.cached_property
  def epsilons(self) -> Optional[Tuple[float, ...]]:
    if not self.record.private or self.record.epsilon is None:
      return None
    return tuple(self.record.epsilon_by_round())

  @property
  def n(self) -> int:
    return self.spec.n

  @property
  def momentum(self) -> float:
    return float(self.spec.workload.momentum)

  def epsilon_after(self, releases: int) -> float:
    """ε spent after ``releases`` rounds (0 before any)."""
    if self.epsilons is None:
      raise checks.CheckError("the mechanism has no epsilon: give delta to the spec")
    if releases > len(self.epsilons):
      raise checks.CheckError(f"release {releases} is past the n={len(self.epsilons)} rounds "
                              "the mechanism's epsilon is for")
    return 0.0 if releases <= 0 else float(self.epsilons[releases - 1])

  def would_exceed(self, max_epsilon: Optional[float], releases: int, count: int = 1) -> bool:
    """Whether ``count`` more releases after ``releases`` would pass ``max_epsilon`` (None: no
    budget)."""
    return max_epsilon is not None and self.epsilon_after(releases + count) > max_epsilon

  def clip(self, update: Sequence[np.ndarray], clip_norm: float) -> clipping.ClippedUpdate:
    """The clipping rule on one client's update (``tff_mf.clipping.clip_update``)."""
    return clipping.clip_update(update, clip_norm)

  def check_numpy_run(self) -> None:
    """Refuses what a numpy server (``ServerRun``) cannot run as the record accounts it:
    TFF's own tree (its matrix form is ``honaker_online``), the discrete Gaussian's integer
    release (the TF query's, or ``tff_mf.noise.discrete_gaussian.IntegerRelease``) and an
    unnoised count of unclipped updates unless ``allow_no_noise``."""
    name, privacy, adaptive = self.spec.mechanism.name, self.spec.privacy, self.spec.adaptive
    if not self.spec.mechanism.private:
      raise checks.CheckError(f"mechanism {name!r} adds no noise; a numpy server runs private "
                              "mechanisms")
    if self.resolved.factorization is None:
      raise checks.CheckError(f"mechanism {name!r} is TFF's own tree aggregation; outside TFF "
                              "use 'honaker_online' (the same tree as a matrix mechanism)")
    if privacy.discrete:
      raise checks.CheckError("the numpy noise source adds continuous noise: noise_distribution "
                              "'discrete_gaussian' runs with the TF aggregator "
                              "(tff_mf.tf.aggregators) or "
                              "tff_mf.noise.discrete_gaussian.IntegerRelease",
                              arguments=("noise_distribution",))
    if (adaptive is not None and adaptive.clipped_count_stddev == 0.0
        and not privacy.allow_no_noise):
      raise checks.CheckError("clipped_count_stddev = 0 releases the count of unclipped "
                              "updates without noise; pass allow_no_noise=True to accept that",
                              arguments=("clipped_count_stddev", "allow_no_noise"))

  def noise_rows(self, shapes, seed: np.ndarray, exact: bool = False) -> rows_lib.NoiseRows:
    """The run's noise source: σ·(N·Z)[i] for the model's array shapes and a seed pair."""
    self.check_numpy_run()
    return rows_lib.NoiseRows(self.resolved, shapes, seed, exact=exact)

  def make_sampler(self, client_ids: Sequence[str], seed: int, secret: int):
    """The schema's sampler over ``client_ids`` for the n rounds (its own checks)."""
    k = self.spec.clients_per_round
    if not float(k).is_integer() and not self.spec.participation.poisson:
      raise checks.CheckError(f"clients_per_round={k} must be an integer for participation "
                              f"{self.spec.participation.kind}")
    return self.spec.participation.make_sampler(
        list(client_ids), seed=seed, total_rounds=self.n, clients_per_round=int(k),
        sampling_prob=None if self.spec.privacy is None else self.spec.privacy.sampling_prob,
        secret=secret)

  def binding(self, model: Sequence[Tuple[str, Tuple[int, ...], str]],
              **extra: object) -> Dict[str, object]:
    """What makes a state this run's: the encoder C (and B when C is not square), schema,
    spec, z and the model's (key, shape, dtype); ``extra``: the framework's own settings."""
    f = self.resolved.factorization
    return {
        "mechanism": self.spec.mechanism.name,
        "encoder_sha256": runstate.encoder_sha256(self.record.encoder,
                                                  None if f is None else f.b),
        "schema_sha256": runstate.json_sha256(self.spec.participation.as_dict()),
        "spec_sha256": runstate.json_sha256(self.spec.describe()),
        "noise_multiplier": float(self.record.noise_multiplier),
        "sampling_prob": self.spec.privacy.sampling_prob,
        "clipping": "fixed" if self.spec.adaptive is None else "adaptive",
        "model": [[key, list(shape), dtype] for key, shape, dtype in model],
        **extra,
    }


def build(spec: spec_lib.MechanismSpec, *, cache_dir: Optional[str] = None,
          noise_seed_pinned: bool = False, progress: bool = False,
          resolved: Optional[mechanisms.Resolved] = None,
          mmcc_options: Optional[Dict[str, Any]] = None) -> Plan:
  """The plan of a spec (one line naming what is wrong otherwise): ``mechanisms.build``'s
  resolved mechanism and record (``resolved``: one already resolved for this spec), and the
  workload's learning rates."""
  if not isinstance(spec, spec_lib.MechanismSpec):
    raise checks.CheckError(f"build takes a MechanismSpec, got {type(spec).__name__}")
  resolved, record = mechanisms.build(spec, cache_dir=cache_dir, progress=progress,
                                      resolved=resolved, noise_seed_pinned=noise_seed_pinned,
                                      mmcc_options=mmcc_options)
  w = spec.workload
  etas = workloads.learning_rates(spec.n, w.lr_schedule, w.schedule_rounds)
  return Plan(spec, resolved, record, np.asarray(etas, np.float64))


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


class ServerRun:
  """Algorithm 1's server on a plan, in numpy, with its state (see the module docstring).

  Args:
    plan: the run's ``Plan``.
    server_learning_rate: η_server, times the schedule's η_i.
    noise_seed: pins the noise seed (tests, replays); None: OS entropy (a noise key of two
      secret words, ``tff_mf.noise.keys``).
    sampling_seed: pins the sampling seed, as ``noise_seed``; None: OS entropy.
    sampling_secret: pins the sampling secret, as ``noise_seed``; None: OS entropy.
    exact_noise: the TF aggregator's arithmetic as well as its draws (``NoiseRows``).
    state_path: the private file the state goes to after each round and is read from at
      the start (a restarted server continues the run); locked from here until ``close``.
    binding_extra: the framework's settings that the state is bound to as well.
  """

  def __init__(self, plan: Plan, *, server_learning_rate: float = 1.0,
               noise_seed=None, sampling_seed: Optional[int] = None,
               sampling_secret: Optional[int] = None, exact_noise: bool = False,
               state_path: Optional[str] = None,
               binding_extra: Optional[Dict[str, object]] = None):
    plan.check_numpy_run()
    self.plan = plan
    self.server_learning_rate = checks.positive_float(server_learning_rate,
                                                      "server_learning_rate")
    self.exact_noise = bool(exact_noise)
    self.seed = rows_lib.seed_pair(noise_seed)
    pinned = (noise_seed is not None, sampling_seed is not None, sampling_secret is not None)
    self.pinned = dict(zip(SEEDS, pinned))
    self.seed_sources = {name: "pinned" if p else "os_entropy" for name, p in zip(SEEDS, pinned)}
    self.sampling_seed = (entropy.new_seed("sampling-seed") if sampling_seed is None
                          else checks.seed(sampling_seed, "sampling_seed"))
    self.secret = (entropy.new_seed("sampling-secret") if sampling_secret is None
                   else checks.seed(sampling_secret, "sampling_secret"))
    self.clip_norm = plan.spec.clipping.clip_norm  # ζ_i: ζ_0, then the quantile estimate's
    self.state_path = state_path
    self._binding_extra = dict(binding_extra or {})
    self.binding: Optional[Dict[str, object]] = None
    self.noise: Optional[rows_lib.NoiseRows] = None
    self.sampler = None
    self.momentum_buffer: Optional[List[np.ndarray]] = None
    self.keys: Optional[List[str]] = None
    self.rounds_done = 0
    self._lock: Optional[runstate.StateLock] = None
    self._log: Optional[runstate.ReleaseLog] = None
    self._restored: Optional[Dict[str, np.ndarray]] = None
    self._pending: Optional[Tuple[float, float]] = None
    if state_path is not None:
      self.open_state()

  @property
  def started(self) -> bool:
    return self.noise is not None

  @property
  def resume_round(self) -> int:
    """The rounds released before this server's next one (the state file's, before start)."""
    if self._restored is not None:
      return int(np.asarray(self._restored["rounds_done"])[0])
    return self.rounds_done

  # ------------------------------------------------------------------ state file
  def open_state(self) -> None:
    """Locks ``state_path`` (one server per state file) and reads it, after its owner and
    mode checks, with its release log. A server that already ran checks that the file is
    still the one it wrote."""
    path = self.state_path
    if self._lock is not None and self._lock.held:
      return
    self._lock = runstate.StateLock(f"{path}.lock", f"the state file {path}", STATE_REMEDY)
    try:
      self._log = runstate.ReleaseLog(f"{path}{RELEASES_SUFFIX}", STATE_REMEDY)
      saved = _load_state(path) if os.path.lexists(path) else None
      if self.started:
        at = 0 if saved is None else int(np.asarray(saved["rounds_done"])[0])
        if at != self.rounds_done:
          raise checks.CheckError(f"the state file {path} was changed by another server "
                                  f"(round {at}, this server's {self.rounds_done}); "
                                  f"{STATE_REMEDY}")
      else:
        self._restored = saved
    except BaseException:
      self.close()
      raise

  def close(self) -> None:
    """Releases the state file's lock."""
    if self._lock is not None:
      self._lock.release()

  # ------------------------------------------------------------------ rounds
  def start(self, keys: Sequence[str], model: Sequence[np.ndarray],
            client_ids: Sequence[str]) -> None:
    """Builds the noise source, the momentum and the sampler for the model's arrays and the
    population, then continues the state file's run if there is one."""
    self.keys = list(keys)
    shapes = [np.shape(a) for a in model]
    self.noise = self.plan.noise_rows(shapes, self.seed, exact=self.exact_noise)
    self.momentum_buffer = [np.zeros(s, np.float64) for s in shapes]
    self.sampler = self.plan.make_sampler(client_ids, self.sampling_seed, self.secret)
    self.sampler.prepare(lambda cid: cid)
    self.binding = self.plan.binding(
        [(k, tuple(np.shape(a)), np.asarray(a).dtype.str) for k, a in zip(self.keys, model)],
        exact_noise=self.exact_noise, server_learning_rate=self.server_learning_rate,
        **self._binding_extra)
    if self._restored is not None:
      self._restore(self._restored)
      self._restored = None
    elif self._log is not None and self._log.last_round:
      raise checks.CheckError(
          f"{self._log.path} shows {self._log.last_round} rounds released but the state file "
          f"{self.state_path} is missing: a new run would release them again with new noise "
          f"under an epsilon that covers one run; {STATE_REMEDY}")

  def check_next(self, i: int) -> None:
    """Refuses round ``i`` unless it is the next one (rounds run in order, each once) and
    within the n rounds the mechanism was built for."""
    if i != self.rounds_done + 1:
      raise checks.CheckError(f"round {i} does not follow round {self.rounds_done}: rounds "
                              "must run in order, each once")
    if i > self.plan.n:
      raise checks.CheckError(f"round {i} is past the n={self.plan.n} rounds this mechanism "
                              "was built for; build one for more rounds")

  def next_round(self) -> Tuple[int, List[str]]:
    """(the next round i, its clients by the schema's sampler); refuses a round past n."""
    i = self.rounds_done + 1
    self.check_next(i)
    chosen, _, _ = self.sampler.next_round(i, lambda cid: cid)
    return i, list(chosen)

  def estimate(self, current: Sequence[np.ndarray], updates: Sequence[Sequence[np.ndarray]],
               client_side: Optional[Sequence[Tuple[Sequence[np.ndarray],
                                                    Optional[bool]]]] = None
               ) -> Tuple[List[np.ndarray], Dict[str, int]]:
    """Round ``rounds_done + 1``'s release before any optimizer: (the noisy mean update
    Σ clip(Δ)/K + σ/K·(N·Z)[i] in float64, the counts of updates zeroed for NaN/Inf and of
    client-side updates rejected). ``updates``: the clients' float64 deltas (NaN where a reply
    was malformed). ``client_side``: where the clients clipped, per update the model it
    returned and its unclipped bit (None: not sent); an update above ζ (beyond the rounding
    of its model: ``clipping.within_clip``), or without a bit under adaptive clipping, is
    rejected, zeroed and counted, and the bits feed the quantile estimate. ``commit`` ends
    the round."""
    current = [np.asarray(a, np.float64) for a in current]
    total = [np.zeros_like(a) for a in current]
    count = 0.0  # Σ (1[‖Δ‖ ≤ ζ_i] − ½): the quantile estimate's query
    counts = {clipping.ZEROED_METRIC: 0, clipping.REJECTED_METRIC: 0}
    for j, update in enumerate(updates):
      bit = None
      if client_side is not None:
        returned, bit = client_side[j]
        no_bit = bit is None and self.plan.spec.adaptive is not None
        if no_bit or (clipping.all_finite(update) and
                      not clipping.within_clip(update, self.clip_norm, returned)):
          counts[clipping.REJECTED_METRIC] += 1
          update, bit = [np.zeros_like(u) for u in update], True
      clipped = self.plan.clip(update, self.clip_norm)  # client-side: trims rounding only
      counts[clipping.ZEROED_METRIC] += int(clipped.zeroed)
      unclipped = clipped.unclipped if bit is None or clipped.zeroed else bit
      count += (1.0 if unclipped else 0.0) - 0.5
      for t, u in zip(total, clipped.values):
        t += u
    k = float(self.plan.spec.clients_per_round)
    noise = self.noise.next(self.plan.record.noise_multiplier * self.clip_norm)
    self._pending = (count, k)
    return [t / k + z.astype(np.float64) / k for t, z in zip(total, noise)], counts

  def commit(self, released: Sequence[np.ndarray]) -> None:
    """Ends the round ``estimate`` began with the model it released: the next clip norm
    (adaptive clipping), then the state saved and the round logged (with a state file)."""
    count, k = self._pending
    self.rounds_done += 1
    if self.plan.spec.adaptive is not None:
      self._next_clip(self.rounds_done, count, k)
    if self.state_path is not None:
      self.save(released)

  def release(self, current: Sequence[np.ndarray], updates: Sequence[Sequence[np.ndarray]],
              client_side=None) -> Tuple[List[np.ndarray], Dict[str, int]]:
    """Round ``rounds_done + 1`` with the workload's optimizer (heavy-ball momentum β, η_i
    times ``server_learning_rate``): (the released model, in the current model's dtypes, and
    ``estimate``'s counts); committed (saved and logged) before it returns."""
    mean, counts = self.estimate(current, updates, client_side)
    eta = self.server_learning_rate * float(self.plan.learning_rates[self.rounds_done])
    released = []
    for c, g, m in zip(current, mean, self.momentum_buffer):
      m *= self.plan.momentum
      m += g
      released.append(np.asarray(np.asarray(c, np.float64) + eta * m, dtype=np.asarray(c).dtype))
    self.commit(released)
    return released, counts

  def _next_clip(self, i: int, count: float, k: float) -> None:
    """ζ_{i+1} from the noisy count of round i (Andrew et al. 2021, arXiv:1905.03871, Alg. 1,
    geometric update), its noise the TF query's draw for the seed and round."""
    a = self.plan.spec.adaptive
    noisy = count + a.clipped_count_stddev * rows_lib.count_noise(self.noise.seed, i - 1)
    self.clip_norm = adaptive_clipping.next_clip(self.clip_norm, noisy, k, a.target_quantile,
                                                 a.learning_rate)

  # ------------------------------------------------------------------ state
  def state(self) -> Dict[str, np.ndarray]:
    """Everything a restarted server needs to continue (holds the secret seeds)."""
    out = dict(self.noise.state())
    out["rounds_done"] = np.array([self.rounds_done], np.int64)
    out["clip_norm"] = np.array([self.clip_norm], np.float64)
    out["sampling"] = np.array([self.sampling_seed, self.secret], np.int64)
    for t, m in enumerate(self.momentum_buffer):
      out[f"momentum_{t}"] = m
    for key, value in self.sampler.state().items():
      out[f"sampler_{key}"] = np.asarray(value)
    return out

  def save(self, model: Sequence[np.ndarray]) -> None:
    """The state (with the released model, the binding and the seeds' sources) written
    whole, then the round logged: a kill between the two leaves a state one round ahead of
    its log, which the next start logs from the state."""
    state = self.state()
    for key, value in zip(self.keys, model):
      state[f"model_{key}"] = np.asarray(value)
    state["binding"] = np.array(json.dumps(self.binding, sort_keys=True))
    state["seed_sources"] = np.array(json.dumps(self.seed_sources, sort_keys=True))
    runstate.write_private(self.state_path, lambda f: np.savez(f, **state))
    self._log.record(self.rounds_done, runstate.model_digest(list(model)),
                     runstate.binding_digest(self.binding))

  def _check_state(self, state: Dict[str, np.ndarray]) -> None:
    """The file is this run's (binding), its log agrees (no older copy), and no pinned seed
    differs from the file's."""
    path = self.state_path
    if "binding" not in state:
      raise checks.CheckError(f"the state file {path} has no run binding (written by an older "
                              f"tff-mf): it cannot be proven to be this run's; {STATE_REMEDY}")
    runstate.check_binding(json.loads(str(state["binding"])), self.binding,
                           f"the state file {path}", STATE_REMEDY)
    digest = runstate.binding_digest(self.binding)
    elsewhere = self._log.bound_elsewhere(digest)
    if elsewhere is not None:
      raise checks.CheckError(f"{self._log.path} logs round {elsewhere} under another run "
                              f"binding than the state file {path}; {STATE_REMEDY}")
    rounds = int(np.asarray(state["rounds_done"])[0])
    if self._log.check_state_round(rounds, f"the state file {path}"):
      model = [state[f"model_{key}"] for key in self.keys]
      self._log.record(rounds, runstate.model_digest(model), digest)
    sampling = np.asarray(state["sampling"], np.int64)
    saved = {"noise_seed": np.asarray(state["noise_seed"], np.int64),
             "sampling_seed": int(sampling[0]), "sampling_secret": int(sampling[1])}
    mine = {"noise_seed": self.seed, "sampling_seed": self.sampling_seed,
            "sampling_secret": self.secret}
    for name in SEEDS:
      if self.pinned[name] and not np.array_equal(saved[name], mine[name]):
        raise checks.CheckError(f"{name} is pinned, but the state file {path} holds another; "
                                f"drop {name} to continue its run, or {STATE_REMEDY}")
    recorded = json.loads(str(state["seed_sources"]))
    self.seed_sources = {name: "pinned" if self.pinned[name] else recorded[name]
                         for name in SEEDS}

  def _restore(self, state: Dict[str, np.ndarray]) -> None:
    self._check_state(state)
    sampling = np.asarray(state["sampling"], np.int64)
    if (int(sampling[0]), int(sampling[1])) != (self.sampling_seed, self.secret):
      self.sampling_seed, self.secret = int(sampling[0]), int(sampling[1])
      self.sampler = self.plan.make_sampler(self.sampler.client_ids, self.sampling_seed,
                                            self.secret)
    self.noise.restore(state)
    self.seed = self.noise.seed
    self.rounds_done = int(state["rounds_done"][0])
    self.clip_norm = float(state["clip_norm"][0])
    if self.noise.round != self.rounds_done:
      raise checks.CheckError(f"the state file's noise stream is at round {self.noise.round}, "
                              f"its rounds at {self.rounds_done}")
    for t, buffer in enumerate(self.momentum_buffer):
      m = np.asarray(state[f"momentum_{t}"], np.float64)
      if m.shape != buffer.shape:
        raise checks.CheckError(f"the state file's momentum_{t} has shape {m.shape}, the "
                                f"model's {buffer.shape}")
      self.momentum_buffer[t] = m.copy()
    self.sampler.restore({k[len("sampler_"):]: v for k, v in state.items()
                          if k.startswith("sampler_")})


def update_fn(current: Sequence[np.ndarray]) -> Callable[[Sequence[np.ndarray]], List[np.ndarray]]:
  """``delta(model)``: a client's returned model minus ``current`` in float64, or NaN (which
  the clipping rule zeroes and counts) where it is not arrays of the model's shapes."""
  current = [np.asarray(a, np.float64) for a in current]

  def delta(model: Sequence[np.ndarray]) -> List[np.ndarray]:
    try:
      arrays = [np.asarray(a, np.float64) for a in model]
      if len(arrays) != len(current) or any(a.shape != c.shape
                                            for a, c in zip(arrays, current)):
        raise ValueError("not the model's arrays")
      return [a - c for a, c in zip(arrays, current)]
    except (ValueError, TypeError):
      return [np.full(c.shape, np.nan) for c in current]
  return delta
