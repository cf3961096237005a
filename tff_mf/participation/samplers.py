"""Client samplers, one per participation kind (numpy only; every framework samples alike).

Five samplers, one per ``--participation`` (no TensorFlow):

- ``single``: each client at most once, in a permutation fixed by ``--seed``
  (Denisov et al. 2022, arXiv:2202.08312, Sec 5; single participation, Thm 4.1).
- ``fixed_epoch`` with k epochs: n = k·b rounds; the clients are split into b cohorts
  of ``clients_per_round`` clients (drawn from the ``--seed`` permutation, empty
  clients skipped, when the cohort is first used) and round t uses cohort
  (t − 1) mod b, so a client joins rounds j, j + b, …, j + (k − 1)·b
  ((k, b)-participation, Choquette-Choo et al. 2023, arXiv:2211.06530).
- ``min_sep`` (also spelled ``cyclic_poisson``) with separation b and probability p:
  cyclic Poisson sampling. Every client belongs to one residue class mod b (balanced,
  from the ``--seed`` permutation), class (t − 1) mod b is eligible in round t, and
  each eligible client joins independently with probability p, optionally at most k
  times (Choquette-Choo et al. 2023, arXiv:2306.08153, Sec 4, b-min-sep Poisson
  sampling; Choquette-Choo et al. 2024, arXiv:2310.15526, App D; jax_privacy's
  ``CyclicPoissonSampling``). Round t's coins are drawn from a generator seeded by
  (sampling secret, t): a resumed run draws the same clients. The secret is kept only
  in the checkpoints, like the noise seed: the amplified ε assumes nobody who sees the
  models knows who was sampled.
- ``balls_in_bins`` with k epochs: the field's fixed-bin balls-in-bins (Choquette-Choo et al.
  2024, arXiv:2410.06266; Chua et al. 2024, arXiv:2412.16802; jax_privacy's
  ``BallsInBinsSampling``):
  each client draws one bin j ∈ {0, …, b − 1}, b = n/k, once, from a generator seeded
  by the sampling secret, and joins every round t with (t − 1) mod b = j. ε is the
  smaller of the unamplified bound over these b-cyclic patterns and the amplified bound of
  the secret bin (``tff_mf.accounting.fixed_bin``); the bin is secret as the noise seed is.
- ``random_allocation`` with k epochs (named ``balls_in_bins`` before the fixed-bin
  scheme took that name): n = k·b rounds in k epochs of b rounds; in every epoch each
  client joins exactly one round, chosen uniformly at random and independently per
  epoch. Epoch e's rounds are drawn from a generator seeded by (sampling secret, e).
  ε is the smaller of the unamplified bound over every one-round-per-epoch pattern and
  the random-allocation bound (``tff_mf.accounting.random_allocation``).

Each sampler enforces its schema by construction and refuses what would break it
(``SamplingError``, or the ``error`` a framework's subclass names). All sampler state is a
fixed-structure set of int64 arrays (:meth:`state` / :meth:`restore`), checkpointed with
the model. A kind builds its sampler (``tff_mf.participation.kinds``, ``make_sampler``).
"""

from __future__ import annotations

import collections
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tff_mf import checks


class SamplingError(checks.CheckError):
  """A sampler's refusal (too few clients, a round outside the schema, a missing secret)."""


Load = Callable[[str], Optional[object]]
Round = Tuple[List[str], List[object], int]


def _permutation(num_clients: int, seed: int) -> np.ndarray:
  return np.random.default_rng(seed).permutation(num_clients)


class _Sampler:
  """Shared by the samplers: the sorted client ids and the seed's permutation.

  Refusals raise ``error`` (``SamplingError``; a framework's subclass may name its own,
  e.g. the training harness's error for a one-line exit).
  """
  kind = ""
  error: type = SamplingError

  def __init__(self, client_ids: Sequence[str], seed: int):
    self.client_ids = sorted(client_ids)
    self.index = {c: i for i, c in enumerate(self.client_ids)}
    self.order = _permutation(len(self.client_ids), seed)
    self.cursor = 0

  def __len__(self) -> int:
    return len(self.client_ids)

  def state(self) -> "collections.OrderedDict[str, np.ndarray]":
    return collections.OrderedDict(cursor=np.array([self.cursor], np.int64))

  def prepare(self, load: Load) -> None:
    """Before round 1: whatever must be drawn up front (nothing, except for fixed cohorts)."""
    del load

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
        raise self.error(
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

  def _set_epochs(self, total_rounds: int, epochs: int) -> None:
    """n rounds in k epochs of b = n/k rounds (k must divide n)."""
    if total_rounds % epochs:
      raise self.error(f"--epochs={epochs} must divide --total_rounds={total_rounds}")
    self.total_rounds = int(total_rounds)
    self.epochs = int(epochs)
    self.rounds_per_epoch = self.total_rounds // self.epochs


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
    self._set_epochs(total_rounds, epochs)
    self.cohort_count = self.rounds_per_epoch
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
      raise self.error(f"the checkpoint's cohorts have shape {cohorts.shape}, this run's "
                       f"{self.cohorts.shape}")
    self.cohorts = cohorts.copy()
    self._loaded = {}

  def prepare(self, load: Load) -> None:
    self.form_cohorts(load)

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
      except self.error as e:
        raise self.error(
            f"before round 1: too few non-empty clients for --participation=fixed_epoch "
            f"({self.cohort_count} cohorts of {self.clients_per_round}): {e}") from None
      self.cohorts[j] = indices
      self._loaded[j] = ([self.client_ids[i] for i in indices], loaded, skipped)

  def next_round(self, round_num: int, load: Load) -> Round:
    j = (int(round_num) - 1) % self.cohort_count
    if self.cohorts[j, 0] < 0:
      if round_num > self.cohort_count:
        raise self.error(f"round {round_num}: cohort {j} was never formed (rounds must run "
                         "in order)")
      indices, loaded, skipped = self._draw(
          self.clients_per_round, load, f"cohort {j} of {self.cohort_count} (fixed epochs)")
      self.cohorts[j] = indices
      self._loaded[j] = ([self.client_ids[i] for i in indices], loaded, 0)
      return [self.client_ids[i] for i in indices], loaded, skipped
    if j not in self._loaded:
      chosen, loaded, skipped = self._load_all(self.cohorts[j], load)
      if skipped:
        raise self.error(f"round {round_num}: {skipped} client(s) of cohort {j} have no "
                         "data any more; the dataset changed under the run")
      self._loaded[j] = (chosen, loaded, 0)
    chosen, loaded, skipped = self._loaded[j]
    self._loaded[j] = (chosen, loaded, 0)  # empty clients are reported in the first round only
    return list(chosen), list(loaded), skipped


class _SecretSampler(_Sampler):
  """A sampler whose draws come from the run's secret sampling seed (never stored beside the
  model), counting each client's participations in ``counts`` (checkpointed)."""

  def __init__(self, client_ids: Sequence[str], seed: int, secret: int):
    super().__init__(client_ids, seed)
    if secret < 0:
      raise self.error(f"{self.kind} sampling needs its secret sampling seed")
    self.secret = int(secret)
    self.counts = np.zeros(len(self.client_ids), np.int64)

  def state(self):
    out = super().state()
    out["counts"] = self.counts.copy()
    return out

  def restore(self, state) -> None:
    super().restore(state)
    self.counts = np.asarray(state["counts"], np.int64).copy()


class CyclicPoissonSampler(_SecretSampler):
  """Cyclic Poisson: residue classes mod b (from ``seed``), Poisson coins of probability p in
  each eligible round (the b-min-sep schema's sampler, arXiv:2306.08153 Sec 4).

  Round t's class is (t − 1) mod b; its coins come from a generator seeded by
  (``secret``, t), so the clients of a round depend only on the secret and t. With
  ``max_participations`` k, a client that has joined k rounds is no longer eligible.
  """
  kind = "min_sep"

  def __init__(self, client_ids: Sequence[str], seed: int, min_sep: int, sampling_prob: float,
               secret: int, max_participations: Optional[int] = None):
    super().__init__(client_ids, seed, secret)
    self.min_sep = int(min_sep)
    self.sampling_prob = float(sampling_prob)
    self.max_participations = max_participations
    residue = np.empty(len(self.client_ids), np.int64)
    residue[self.order] = np.arange(len(self.client_ids)) % self.min_sep
    self.residue = residue
    self.members = [np.sort(np.flatnonzero(residue == r)) for r in range(self.min_sep)]

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


MinSepSampler = CyclicPoissonSampler  # the schema's name

# Tag of the random-allocation generators (another stream than the cyclic Poisson coins;
# unchanged since the scheme was named balls_in_bins, so resumed runs draw the same rounds).
RANDOM_ALLOCATION_STREAM = 0xB1B
# Tag of the fixed-bin generator (each client's bin).
FIXED_BIN_STREAM = 0xF1B


class BallsInBinsSampler(_SecretSampler):
  """Fixed-bin balls-in-bins (arXiv:2410.06266): one secret uniform bin per client, for good.

  Client i (in sorted id order) draws bin u_i ~ Uniform{0, …, b − 1}, b = n/k, from a
  generator seeded by (``secret``, ``FIXED_BIN_STREAM``) and joins every round t with
  (t − 1) mod b = u_i: by construction its rounds are exactly b apart, k of them.
  """
  kind = "balls_in_bins"

  def __init__(self, client_ids: Sequence[str], seed: int, total_rounds: int, epochs: int,
               secret: int):
    super().__init__(client_ids, seed, secret)
    self._set_epochs(total_rounds, epochs)
    self.bins = self.rounds_per_epoch
    rng = np.random.default_rng([self.secret, FIXED_BIN_STREAM])
    self.bin = rng.integers(0, self.bins, size=len(self.client_ids))

  def members(self, round_num: int) -> np.ndarray:
    """Indices of the clients whose bin is round ``round_num``'s (1-based)."""
    round_num = int(round_num)
    if not 1 <= round_num <= self.total_rounds:
      raise self.error(f"round {round_num} is outside the {self.total_rounds} rounds of the "
                       "balls-in-bins schema")
    return np.flatnonzero(self.bin == (round_num - 1) % self.bins)

  def next_round(self, round_num: int, load: Load) -> Round:
    chosen = self.members(round_num)
    self.counts[chosen] += 1
    self.cursor += int(chosen.size)
    return self._load_all(chosen, load)


class RandomAllocationSampler(_SecretSampler):
  """Random allocation (arXiv:2412.16802, arXiv:2602.17284): one uniform round per client and
  epoch, drawn anew each epoch.

  The n = k·b rounds form k epochs of b rounds. In epoch e, client i (in sorted id
  order) joins round e·b + u_i + 1 with u ~ Uniform{0, …, b − 1}ⁿ drawn from a generator
  seeded by (``secret``, e), independently per epoch: by construction every client is
  in exactly one round of each epoch, and a round's clients depend only on the secret
  and the round. ``counts`` (checkpointed) records each client's participations.
  """
  kind = "random_allocation"

  def __init__(self, client_ids: Sequence[str], seed: int, total_rounds: int, epochs: int,
               secret: int):
    super().__init__(client_ids, seed, secret)
    self._set_epochs(total_rounds, epochs)
    self._slots: Dict[int, np.ndarray] = {}

  def slots(self, epoch: int) -> np.ndarray:
    """u: each client's round within epoch ``epoch`` (0-based), uniform on [0, b)."""
    epoch = int(epoch)
    if epoch not in self._slots:
      rng = np.random.default_rng([self.secret, RANDOM_ALLOCATION_STREAM, epoch])
      self._slots = {epoch: rng.integers(0, self.rounds_per_epoch, size=len(self.client_ids))}
    return self._slots[epoch]

  def members(self, round_num: int) -> np.ndarray:
    """Indices of the clients whose ball fell in round ``round_num`` (1-based)."""
    round_num = int(round_num)
    if not 1 <= round_num <= self.total_rounds:
      raise self.error(f"round {round_num} is outside the {self.total_rounds} rounds of the "
                       "random-allocation schema")
    epoch, slot = divmod(round_num - 1, self.rounds_per_epoch)
    return np.flatnonzero(self.slots(epoch) == slot)

  def next_round(self, round_num: int, load: Load) -> Round:
    chosen = self.members(round_num)
    self.counts[chosen] += 1
    self.cursor += int(chosen.size)
    return self._load_all(chosen, load)


def check_enough_clients(num_clients: int, total_rounds: int, clients_per_round: int,
                         what: str = "", error: type = SamplingError) -> None:
  """A single pass (or b cohorts) needs rounds × clients_per_round distinct clients."""
  needed = total_rounds * clients_per_round
  if num_clients < needed:
    if what:
      raise error(
          f"too few clients: {what} of --clients_per_round={clients_per_round}, so {needed} "
          f"distinct clients are needed, but the dataset has {num_clients} training clients")
    raise error(
        f"too few clients for a single pass: the dataset has {num_clients} training clients, "
        f"but --total_rounds={total_rounds} × --clients_per_round={clients_per_round} = "
        f"{needed} are needed (each client is used at most once)")
