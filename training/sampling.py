"""Client sampling under a participation schema, and the record of who joined which round.

Three samplers, one per ``--participation`` (no TensorFlow):

- ``single``: each client at most once, in a permutation fixed by ``--seed``
  (Denisov et al. 2022, arXiv:2202.08312, Sec 5; single participation, Thm 4.1).
- ``fixed_epoch`` with k epochs: n = k·b rounds; the clients are split into b cohorts
  of ``clients_per_round`` clients (drawn from the ``--seed`` permutation, empty
  clients skipped, when the cohort is first used) and round t uses cohort
  (t − 1) mod b, so a client joins rounds j, j + b, …, j + (k − 1)·b
  ((k, b)-participation, Choquette-Choo et al. 2023, arXiv:2211.06530).
- ``min_sep`` with separation b and probability p: every client belongs to one
  residue class mod b (balanced, from the ``--seed`` permutation) and joins each
  round of its class independently with probability p, optionally at most k times
  (b-min-sep Poisson sampling, Choquette-Choo et al. 2023, arXiv:2306.08153, Sec 4;
  Choquette-Choo et al. 2024, arXiv:2310.15526, App D). Round t's coins are drawn
  from a generator seeded by (sampling secret, t): a resumed run draws the same
  clients. The secret is kept only in the checkpoints, like the noise seed: the
  amplified ε assumes nobody who sees the models knows who was sampled.

Each sampler enforces its schema by construction and refuses (TrainingError) what
would break it. Independently, :class:`ParticipationLog` records every client's
participations from the rounds actually run (count, last round, separations,
residues), so the run can report the observed maximum participations and minimum
separation and refuse to report an ε when they break the schema.

All sampler and log state is a fixed-structure set of int64 arrays
(:meth:`state` / :meth:`restore`), checkpointed with the model.
"""

from __future__ import annotations

import collections
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from training.config import TrainingError

Load = Callable[[str], Optional[object]]
Round = Tuple[List[str], List[object], int]
NEVER = 0  # ``last`` of a client that has not participated (rounds are 1-based)
NO_GAP = -1  # ``min_gap`` before any client has participated twice


def _permutation(num_clients: int, seed: int) -> np.ndarray:
  return np.random.default_rng(seed).permutation(num_clients)


class _Sampler:
  """Shared by the samplers: the sorted client ids and the seed's permutation."""
  kind = ""

  def __init__(self, client_ids: Sequence[str], seed: int):
    self.client_ids = sorted(client_ids)
    self.index = {c: i for i, c in enumerate(self.client_ids)}
    self.order = _permutation(len(self.client_ids), seed)
    self.cursor = 0

  def __len__(self) -> int:
    return len(self.client_ids)

  def state(self) -> "collections.OrderedDict[str, np.ndarray]":
    return collections.OrderedDict(cursor=np.array([self.cursor], np.int64))

  def restore(self, state) -> None:
    self.cursor = int(np.asarray(state["cursor"])[0])

  def _load_all(self, indices, load: Load) -> Round:
    chosen, loaded, skipped = [], [], 0
    for i in indices:
      client_id = self.client_ids[int(i)]
      value = load(client_id)
      if value is None:
        skipped += 1
      else:
        chosen.append(client_id)
        loaded.append(value)
    return chosen, loaded, skipped

  def _draw(self, count: int, load: Load, what: str) -> Tuple[List[int], List[object], int]:
    """The next ``count`` non-empty clients of the permutation (indices, datasets, skipped)."""
    chosen, loaded, skipped = [], [], 0
    while len(chosen) < count:
      if self.cursor >= len(self.order):
        raise TrainingError(
            f"ran out of clients for {what}: all {len(self.order)} training clients are used "
            f"({skipped} skipped as empty this round) with {len(chosen)} of {count} clients "
            "found for this round")
      i = int(self.order[self.cursor])
      self.cursor += 1
      value = load(self.client_ids[i])
      if value is None:
        skipped += 1
      else:
        chosen.append(i)
        loaded.append(value)
    return chosen, loaded, skipped


class SinglePassSampler(_Sampler):
  """Each client at most once, in a permutation fixed by ``seed``; ``cursor`` is the state."""
  kind = "single"

  def __init__(self, client_ids: Sequence[str], seed: int, clients_per_round: int):
    super().__init__(client_ids, seed)
    self.clients_per_round = int(clients_per_round)

  def next_round(self, round_num: int, load: Load) -> Round:
    """The next ``clients_per_round`` non-empty clients: (ids, datasets, skipped as empty)."""
    del round_num
    indices, loaded, skipped = self._draw(self.clients_per_round, load, "a single pass")
    return [self.client_ids[i] for i in indices], loaded, skipped


class FixedEpochSampler(_Sampler):
  """b = n/k cohorts of ``clients_per_round`` clients; round t uses cohort (t − 1) mod b.

  A cohort is filled from the permutation the first time it is used (empty clients
  skipped and counted) and kept in ``cohorts`` (checkpointed), so each client is in
  one cohort and joins exactly the rounds j, j + b, …, of the (k, b) schema. The
  loaded datasets of a cohort are kept for its later epochs (``load`` is called once
  per client and session).
  """
  kind = "fixed_epoch"

  def __init__(self, client_ids: Sequence[str], seed: int, total_rounds: int, epochs: int,
               clients_per_round: int):
    super().__init__(client_ids, seed)
    if total_rounds % epochs:
      raise TrainingError(f"--epochs={epochs} must divide --total_rounds={total_rounds}")
    self.epochs = int(epochs)
    self.cohort_count = total_rounds // epochs
    self.clients_per_round = int(clients_per_round)
    self.cohorts = np.full([self.cohort_count, self.clients_per_round], -1, np.int64)
    self._loaded: Dict[int, Round] = {}

  def state(self):
    out = super().state()
    out["cohorts"] = self.cohorts.copy()
    return out

  def restore(self, state) -> None:
    super().restore(state)
    cohorts = np.asarray(state["cohorts"], np.int64)
    if cohorts.shape != self.cohorts.shape:
      raise TrainingError(f"the checkpoint's cohorts have shape {cohorts.shape}, this run's "
                          f"{self.cohorts.shape}")
    self.cohorts = cohorts.copy()
    self._loaded = {}

  def form_cohorts(self, load: Load) -> None:
    """Forms every cohort not yet formed, in order (the same cohorts as forming them lazily).

    Called before round 1, so that a dataset with too few non-empty clients is refused
    before any round is released; the clients skipped as empty are reported in each
    cohort's first round.
    """
    for j in range(self.cohort_count):
      if self.cohorts[j, 0] >= 0:
        continue
      try:
        indices, loaded, skipped = self._draw(
            self.clients_per_round, load, f"cohort {j} of {self.cohort_count} (fixed epochs)")
      except TrainingError as e:
        raise TrainingError(
            f"before round 1: too few non-empty clients for --participation=fixed_epoch "
            f"({self.cohort_count} cohorts of {self.clients_per_round}): {e}") from None
      self.cohorts[j] = indices
      self._loaded[j] = ([self.client_ids[i] for i in indices], loaded, skipped)

  def next_round(self, round_num: int, load: Load) -> Round:
    j = (int(round_num) - 1) % self.cohort_count
    if self.cohorts[j, 0] < 0:
      if round_num > self.cohort_count:
        raise TrainingError(f"round {round_num}: cohort {j} was never formed (rounds must run "
                            "in order)")
      indices, loaded, skipped = self._draw(
          self.clients_per_round, load, f"cohort {j} of {self.cohort_count} (fixed epochs)")
      self.cohorts[j] = indices
      self._loaded[j] = ([self.client_ids[i] for i in indices], loaded, 0)
      return [self.client_ids[i] for i in indices], loaded, skipped
    if j not in self._loaded:
      chosen, loaded, skipped = self._load_all(self.cohorts[j], load)
      if skipped:
        raise TrainingError(f"round {round_num}: {skipped} client(s) of cohort {j} have no "
                            "data any more; the dataset changed under the run")
      self._loaded[j] = (chosen, loaded, 0)
    chosen, loaded, skipped = self._loaded[j]
    self._loaded[j] = (chosen, loaded, 0)  # empty clients are reported in the first round only
    return list(chosen), list(loaded), skipped


class MinSepSampler(_Sampler):
  """Residue classes mod b (from ``seed``); Poisson coins with probability p per eligible round.

  Round t's class is (t − 1) mod b; its coins come from a generator seeded by
  (``secret``, t), so the clients of a round depend only on the secret and t. With
  ``max_participations`` k, a client that has joined k rounds is no longer eligible.
  """
  kind = "min_sep"

  def __init__(self, client_ids: Sequence[str], seed: int, min_sep: int, sampling_prob: float,
               secret: int, max_participations: Optional[int] = None):
    super().__init__(client_ids, seed)
    if secret < 0:
      raise TrainingError("min_sep sampling needs its secret sampling seed")
    self.min_sep = int(min_sep)
    self.sampling_prob = float(sampling_prob)
    self.secret = int(secret)
    self.max_participations = max_participations
    residue = np.empty(len(self.client_ids), np.int64)
    residue[self.order] = np.arange(len(self.client_ids)) % self.min_sep
    self.residue = residue
    self.members = [np.sort(np.flatnonzero(residue == r)) for r in range(self.min_sep)]
    self.counts = np.zeros(len(self.client_ids), np.int64)

  def state(self):
    out = super().state()
    out["counts"] = self.counts.copy()
    return out

  def restore(self, state) -> None:
    super().restore(state)
    self.counts = np.asarray(state["counts"], np.int64).copy()

  def coins(self, round_num: int) -> np.ndarray:
    """Indices of the class of round ``round_num`` whose coin came up (cap not applied)."""
    members = self.members[(int(round_num) - 1) % self.min_sep]
    rng = np.random.default_rng([self.secret, int(round_num)])
    return members[rng.random(members.size) < self.sampling_prob]

  def next_round(self, round_num: int, load: Load) -> Round:
    chosen = self.coins(round_num)
    if self.max_participations is not None:
      chosen = chosen[self.counts[chosen] < self.max_participations]
    self.counts[chosen] += 1
    self.cursor += int(chosen.size)
    return self._load_all(chosen, load)

  def class_sizes(self) -> Tuple[int, int]:
    sizes = [m.size for m in self.members]
    return min(sizes), max(sizes)


def build_sampler(config, client_ids: Sequence[str], sampling_secret: int = -1):
  """The sampler of ``config.participation`` (checks that the dataset has enough clients)."""
  n, per_round = config.total_rounds, config.clients_per_round
  if config.participation == "fixed_epoch":
    check_enough_clients(len(client_ids), n // config.epochs, per_round,
                         f"--participation=fixed_epoch --epochs={config.epochs} uses b = "
                         f"{n // config.epochs} cohorts")
    return FixedEpochSampler(client_ids, config.seed, n, config.epochs, per_round)
  if config.participation == "min_sep":
    if len(client_ids) < config.min_sep:
      raise TrainingError(f"--min_sep={config.min_sep} needs at least {config.min_sep} "
                          f"training clients (one per residue class); the dataset has "
                          f"{len(client_ids)}")
    return MinSepSampler(client_ids, config.seed, config.min_sep, config.sampling_prob,
                         sampling_secret, config.max_participations)
  check_enough_clients(len(client_ids), n, per_round)
  return SinglePassSampler(client_ids, config.seed, per_round)


def check_enough_clients(num_clients: int, total_rounds: int, clients_per_round: int,
                         what: str = "") -> None:
  """A single pass (or b cohorts) needs rounds × clients_per_round distinct clients."""
  needed = total_rounds * clients_per_round
  if num_clients < needed:
    if what:
      raise TrainingError(
          f"too few clients: {what} of --clients_per_round={clients_per_round}, so {needed} "
          f"distinct clients are needed, but the dataset has {num_clients} training clients")
    raise TrainingError(
        f"too few clients for a single pass: the dataset has {num_clients} training clients, "
        f"but --total_rounds={total_rounds} × --clients_per_round={clients_per_round} = "
        f"{needed} are needed (each client is used at most once)")


class ParticipationLog:
  """Who joined which round, as counts: what the run reports and checks against its schema.

  ``observe(round, client_ids)`` after every round. ``period`` is the b whose residue
  classes the schema fixes (fixed_epoch: n/k; min_sep: b; single: none).
  """

  def __init__(self, client_ids: Sequence[str], period: Optional[int] = None):
    self.index = {c: i for i, c in enumerate(sorted(client_ids))}
    size = len(self.index)
    self.period = period
    self.counts = np.zeros(size, np.int64)
    self.last = np.full(size, NEVER, np.int64)
    # [min_gap, gaps off the residue class, client-rounds, rounds observed]
    self.totals = np.array([NO_GAP, 0, 0, 0], np.int64)

  def observe(self, round_num: int, client_ids: Sequence[str]) -> None:
    round_num = int(round_num)
    idx = np.array([self.index[c] for c in client_ids], np.int64)
    for i in idx:
      if self.last[i] != NEVER:
        gap = round_num - int(self.last[i])
        if self.totals[0] == NO_GAP or gap < self.totals[0]:
          self.totals[0] = gap
        if self.period and gap % self.period:
          self.totals[1] += 1
      self.counts[i] += 1
      self.last[i] = round_num
    self.totals[2] += idx.size
    self.totals[3] += 1

  def state(self) -> "collections.OrderedDict[str, np.ndarray]":
    return collections.OrderedDict(counts=self.counts.copy(), last=self.last.copy(),
                                   totals=self.totals.copy())

  def restore(self, state) -> None:
    for name in ("counts", "last", "totals"):
      value = np.asarray(state[name], np.int64)
      if value.shape != getattr(self, name).shape:
        raise TrainingError(f"the checkpoint's participation record {name} has shape "
                            f"{value.shape}, this run's {getattr(self, name).shape}")
      setattr(self, name, value.copy())

  def observed(self) -> Dict[str, object]:
    """JSON-ready: max participations, min separation (None: nobody joined twice), ..."""
    min_gap = int(self.totals[0])
    return {"max_participations": int(self.counts.max()) if self.counts.size else 0,
            "min_separation": None if min_gap == NO_GAP else min_gap,
            "separations_off_residue_class": int(self.totals[1]),
            "distinct_clients": int(np.count_nonzero(self.counts)),
            "client_rounds": int(self.totals[2]), "rounds": int(self.totals[3])}

  def violations(self, schema, total_rounds: int) -> List[str]:
    """How the observed participations break ``schema`` (empty: they follow it)."""
    seen = self.observed()
    allowed = schema.max_participations_in(total_rounds)
    out = []
    if seen["max_participations"] > allowed:
      out.append(f"a client joined {seen['max_participations']} rounds; the schema "
                 f"{schema.describe()} allows {allowed}")
    separation = schema.separation(total_rounds)
    if seen["min_separation"] is not None and seen["min_separation"] < separation:
      out.append(f"a client joined two rounds {seen['min_separation']} apart; the schema "
                 f"{schema.describe()} needs at least {separation}")
    if seen["separations_off_residue_class"]:
      out.append(f"{seen['separations_off_residue_class']} repeat participation(s) left the "
                 f"client's residue class mod {self.period}")
    return out


def schema_period(config) -> Optional[int]:
  """b of the residue classes the sampler fixes (None for a single pass)."""
  if config.participation == "fixed_epoch":
    return config.total_rounds // config.epochs
  if config.participation == "min_sep":
    return config.min_sep
  return None
