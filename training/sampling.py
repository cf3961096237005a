"""The training harness's client sampling: the library's samplers, and the record of who
joined which round.

The samplers, one per participation kind, live in ``tff_mf.participation.samplers``
(numpy only, so that every framework samples alike; each kind builds its own,
``make_sampler``). Here they raise the harness's one-line ``TrainingError`` and are
built from a ``TrainingConfig`` (``build_sampler``). Independently,
:class:`ParticipationLog` records every client's participations from the rounds
actually run (count, last round, separations, residues), so the run can report the
observed maximum participations and minimum separation and refuse to report an ε when
they break the schema. Its state is a fixed-structure set of int64 arrays
(:meth:`state` / :meth:`restore`), checkpointed with the model.
"""

from __future__ import annotations

import collections
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from tff_mf.participation import samplers as samplers_lib
from training.config import TrainingError

Load = samplers_lib.Load
Round = samplers_lib.Round
NEVER = 0  # ``last`` of a client that has not participated (rounds are 1-based)
NO_GAP = -1  # ``min_gap`` before any client has participated twice
RANDOM_ALLOCATION_STREAM = samplers_lib.RANDOM_ALLOCATION_STREAM
FIXED_BIN_STREAM = samplers_lib.FIXED_BIN_STREAM
# The harness's refusals are its one-line TrainingError (``make_sampler(classes=…)``).
SamplingError = TrainingError


class SinglePassSampler(samplers_lib.SinglePassSampler):
  """The library's sampler, refusing with the harness's ``TrainingError``."""
  error = TrainingError


class FixedEpochSampler(samplers_lib.FixedEpochSampler):
  """The library's sampler, refusing with the harness's ``TrainingError``."""
  error = TrainingError


class CyclicPoissonSampler(samplers_lib.CyclicPoissonSampler):
  """The library's sampler, refusing with the harness's ``TrainingError``."""
  error = TrainingError


MinSepSampler = CyclicPoissonSampler  # the schema's name


class BallsInBinsSampler(samplers_lib.BallsInBinsSampler):
  """The library's sampler, refusing with the harness's ``TrainingError``."""
  error = TrainingError


class RandomAllocationSampler(samplers_lib.RandomAllocationSampler):
  """The library's sampler, refusing with the harness's ``TrainingError``."""
  error = TrainingError


def build_sampler(config, client_ids: Sequence[str], sampling_secret: int = -1):
  """The sampler of ``config``'s schema (checks that the dataset has enough clients)."""
  return config.schema().make_sampler(
      client_ids, seed=config.seed, total_rounds=config.total_rounds,
      clients_per_round=config.clients_per_round, sampling_prob=config.sampling_prob,
      secret=sampling_secret, classes=sys.modules[__name__])


def check_enough_clients(num_clients: int, total_rounds: int, clients_per_round: int,
                         what: str = "") -> None:
  """A single pass (or b cohorts) needs rounds × clients_per_round distinct clients."""
  samplers_lib.check_enough_clients(num_clients, total_rounds, clients_per_round, what,
                                    error=TrainingError)


class ParticipationLog:
  """Who joined which round, as counts: what the run reports and checks against its schema.

  ``observe(round, client_ids)`` after every round. ``period`` is the b whose residue
  classes the schema fixes (fixed_epoch: n/k; min_sep: b; single: none);
  ``epoch_length`` the b of random-allocation epochs, where a client joins at most one
  round of each block of b rounds (then ``epoch_repeats`` counts the participations
  that broke that, and is part of the state).
  """

  def __init__(self, client_ids: Sequence[str], period: Optional[int] = None,
               epoch_length: Optional[int] = None):
    self.index = {c: i for i, c in enumerate(sorted(client_ids))}
    size = len(self.index)
    self.period = period
    self.epoch_length = epoch_length
    self.counts = np.zeros(size, np.int64)
    self.last = np.full(size, NEVER, np.int64)
    # [min_gap, gaps off the residue class, client-rounds, rounds observed]
    self.totals = np.array([NO_GAP, 0, 0, 0], np.int64)
    self.epoch_repeats = np.zeros(1, np.int64)

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
        if self.epoch_length and ((int(self.last[i]) - 1) // self.epoch_length ==
                                  (round_num - 1) // self.epoch_length):
          self.epoch_repeats[0] += 1
      self.counts[i] += 1
      self.last[i] = round_num
    self.totals[2] += idx.size
    self.totals[3] += 1

  def _names(self) -> Tuple[str, ...]:
    return ("counts", "last", "totals") + (("epoch_repeats",) if self.epoch_length else ())

  def state(self) -> "collections.OrderedDict[str, np.ndarray]":
    return collections.OrderedDict((name, getattr(self, name).copy()) for name in self._names())

  def restore(self, state) -> None:
    for name in self._names():
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
            "client_rounds": int(self.totals[2]), "rounds": int(self.totals[3]),
            **({"repeats_within_an_epoch": int(self.epoch_repeats[0])}
               if self.epoch_length else {})}

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
    if seen.get("repeats_within_an_epoch"):
      out.append(f"{seen['repeats_within_an_epoch']} participation(s) repeated a client within "
                 f"one epoch of {self.epoch_length} rounds; the schema {schema.describe()} "
                 "allows one round per epoch")
    if seen["separations_off_residue_class"]:
      out.append(f"{seen['separations_off_residue_class']} repeat participation(s) left the "
                 f"client's residue class mod {self.period}")
    return out


def schema_period(config) -> Optional[int]:
  """b of the residue classes the sampler fixes (None for a single pass)."""
  return config.schema().residue_period(config.total_rounds)


def schema_epoch_length(config) -> Optional[int]:
  """b of the random-allocation epochs (a client joins one round per block of b); None
  otherwise."""
  return config.schema().epoch_length(config.total_rounds)


def build_log(config, client_ids: Sequence[str]) -> ParticipationLog:
  """The participation record of a run under ``config``'s schema."""
  return ParticipationLog(client_ids, schema_period(config), schema_epoch_length(config))
