"""Participation kinds: one frozen class per schema, owning its parameters and rules (numpy core).

Each kind holds its parameters and their validation, its label and description, its
stored form (``as_dict`` / ``from_dict``, including the forms older versions wrote), its
separation rules (``separation``, ``check_bands``, ``max_participations_in``,
``patterns``), its sensitivity bounds (``sensitivity_bounds``, computed by
``tff_mf.participation.bounds``), its sampler (``make_sampler``, from
``tff_mf.participation.samplers``) and its cache-key fragment (``cache_key``). A new
schema is one more subclass here, registered by its ``kind``.

- ``Single``: every pattern is one round (Denisov et al. 2022, arXiv:2202.08312, Eq. 2).
- ``FixedEpoch(epochs=k)``: n = k·b rounds; the b patterns are {j, j+b, …, j+(k−1)b}
  ((k, b)-participation, Choquette-Choo et al. 2023, arXiv:2211.06530).
- ``MinSep(min_sep=b, max_participations=k)``: any ≤ k rounds pairwise ≥ b apart
  (b-min-separation, Choquette-Choo, Ganesh, McMahan, Rush, Steinke, Thakurta 2023,
  arXiv:2306.08153), realized by cyclic Poisson sampling (arXiv:2306.08153 Sec 4);
  ``cyclic_poisson`` is another spelling of the kind.
- ``BallsInBins(epochs=k)``: the field's fixed-bin balls-in-bins (Choquette-Choo, Ganesh, Haque,
  Steinke, Thakurta 2024, arXiv:2410.06266; Chua et al. 2024, arXiv:2412.16802): a user
  draws one bin j of b = n/k once and joins every round i with i mod b = j. Its
  patterns are the fixed-epoch ones (the bin is secret, which only helps).
- ``RandomAllocation(epochs=k)``: k epoch blocks of b rounds; a user joins one round of
  each block, drawn uniformly and independently per epoch (arXiv:2412.16802; Feldman &
  Shenfeld 2026, arXiv:2602.17284). Before this name existed the schema was stored as
  ``balls_in_bins``: such a record (one without ``FIXED_BIN_MARKER``) is read as random
  allocation, never as fixed-bin.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import sys
from typing import Any, ClassVar, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from tff_mf import checks
from tff_mf import flagspec
from tff_mf import toeplitz_view
import tff_mf.participation.samplers as samplers_lib
import tff_mf.participation.bounds as bounds_lib

# A stored balls_in_bins schema is the fixed-bin scheme only with this field; without it
# the record predates the rename and names what is now random_allocation.
FIXED_BIN_MARKER = "fixed_bin"
LEGACY_KINDS = {"balls_in_bins": "random_allocation"}
# Other spellings of a kind: the name of the sampler that realizes the schema.
ALIASES = {"cyclic_poisson": "min_sep"}
# Every parameter a kind may take (the keywords of ``Participation(kind, ...)``).
PARAMETERS = ("epochs", "min_sep", "max_participations")
# kind -> class, in the order the kinds were introduced (filled by ``_register``).
CLASSES: Dict[str, type] = {}


def canonical_kind(spelling: str) -> str:
  """The schema kind a ``--participation`` spelling names (``cyclic_poisson`` is min_sep)."""
  return ALIASES.get(spelling, spelling)


class _Dispatch(type):
  """``Participation(kind, epochs=…, …)`` builds the kind's class (the spelling of the
  single-class schema of earlier versions); a kind's class is called as usual."""

  def __call__(cls, *args, **kwargs):
    if cls is Participation:
      return _build(*args, **kwargs)
    return super().__call__(*args, **kwargs)


class Participation(metaclass=_Dispatch):
  """A participation schema (frozen; equal schemas are equal cache keys).

  Every kind has ``epochs``, ``min_sep`` and ``max_participations``; those it does not
  take are None. Subclasses set the class attributes below and override the rules that
  differ from a single participation's.
  """
  kind: ClassVar[str] = ""
  takes: ClassVar[Tuple[str, ...]] = ()
  # The flag of each parameter it takes, (metavar, meaning) (``flags``: every tool's flags).
  parameter_flags: ClassVar[Mapping[str, Tuple[str, str]]] = {}
  # The sampler that realizes the schema, in words.
  sampler: ClassVar[str] = ""
  # At most one round per user (the only kind whose sensitivity needs no encoder).
  at_most_once: ClassVar[bool] = False
  # A sampling probability p applies (Poisson coins in each eligible round).
  poisson: ClassVar[bool] = False
  # The sampler draws from the run's secret sampling seed (kept out of released files).
  secret_sampling: ClassVar[bool] = False
  # An allocation analysis of tff_mf.accounting.analyses of the kind's own name applies (random
  # allocation: tff_mf.accounting.random_allocation; fixed-bin balls-in-bins: tff_mf.accounting.fixed_bin).
  allocation_amplified: ClassVar[bool] = False
  # Why the schema is not Poisson sampling (no amplified Poisson analysis); None: it is.
  not_poisson: ClassVar[Optional[str]] = (
      "amplification analyzes Poisson sampling: give a min_sep or fixed_epoch schema")
  # Its stored form carries ``FIXED_BIN_MARKER`` (fixed-bin balls-in-bins only).
  marks_fixed_bin: ClassVar[bool] = False
  epochs: Optional[int] = None
  min_sep: Optional[int] = None
  max_participations: Optional[int] = None

  def __init_subclass__(cls, **kwargs):
    super().__init_subclass__(**kwargs)
    if cls.kind:
      CLASSES[cls.kind] = cls

  # -- validation against n rounds

  def check(self, n: int) -> "Participation":
    """Refuses (one-line CheckError) a schema that does not apply to n rounds; returns self."""
    checks.positive_int(n, "rounds n")
    return self

  def validate(self, n: int) -> "Participation":
    return self.check(n)

  def separation(self, n: int) -> int:
    """The least distance of two rounds of one user (n for single participation)."""
    self.check(n)
    return n

  def check_bands(self, bands: int, strategy: str) -> None:
    """Refuses a b-banded C whose bands reach two rounds of one user.

    With bands ≤ the separation, columns of different participations have disjoint
    row supports and unit columns give sensitivity √k (arXiv:2306.08153),
    which is what the banded optimizations assume.
    """
    checks.positive_int(bands, f"{strategy} bands")

  def rounds_per_epoch(self, n: int) -> int:
    """fixed_epoch, balls_in_bins, random_allocation: b = n / k rounds per epoch (bins)."""
    raise checks.CheckError(f"rounds_per_epoch needs {', '.join(EPOCH_KINDS)} "
                            f"participation, not {self.kind}")

  def max_participations_in(self, n: int) -> int:
    """The largest number of rounds one pattern holds for n rounds."""
    self.check(n)
    return 1

  def participations_by(self, n: int, rounds: int) -> int:
    """The most rounds among the first ``rounds`` of an n-round run that one pattern holds
    (the count queries of adaptive clipping a user has joined by then)."""
    return min(self.max_participations_in(n), max(0, int(rounds)))

  def residue_period(self, n: int) -> Optional[int]:
    """b when every user's rounds lie in one residue class mod b (None: no such b)."""
    del n
    return None

  def epoch_length(self, n: int) -> Optional[int]:
    """b when a user joins at most one round of each block of b rounds (random allocation)."""
    del n
    return None

  def cyclic_cover(self, n: int) -> Optional[Tuple[int, Optional[int]]]:
    """(b, k): b-min-separation with ≤ k rounds (k None: as many as fit) whose patterns hold
    this schema's, for the optimizers built for it; None: no such b (a single pass)."""
    del n
    return None

  def poisson_period(self, n: int, error: type = checks.CheckError) -> int:
    """b of the Poisson sampling the schema describes for the amplified analyses (each user
    in one residue class mod b); refuses (``error``) a schema that is not Poisson sampling."""
    del n
    raise error(self.not_poisson)

  def prefix(self, rounds: int) -> Optional["Participation"]:
    """The schema of the first ``rounds`` rounds where it is again a schema of this kind with
    the same parameters (min_sep; single when b exceeds them); None otherwise."""
    del rounds
    return None

  def for_rounds(self, n: int) -> "Participation":
    """The same schema at n rounds with every parameter n decides written out (one form, so
    one cache key, from every entry point)."""
    return self.check(n)

  # -- description and stored forms

  @property
  def label(self) -> str:
    """Short name for file names and tables."""
    return self.kind

  def describe(self) -> str:
    return self.kind

  def sampling_text(self, n: int, clients_per_round: Optional[int] = None,
                    sampling_prob: Optional[float] = None) -> str:
    """How a run of n rounds samples its clients under the schema, in words."""
    del n, clients_per_round, sampling_prob
    return "single participation (each client at most once)"

  def as_dict(self) -> Dict[str, Any]:
    """JSON-able: ``kind``, ``label`` and the parameters that are set (cache keys, reports)."""
    out: Dict[str, Any] = {"kind": self.kind, "label": self.label}
    out.update((name, getattr(self, name)) for name in PARAMETERS
               if getattr(self, name) is not None)
    return out

  def legacy_dicts(self) -> List[Dict[str, Any]]:
    """The dicts earlier versions stored for this schema (run identities, cache keys)."""
    return []

  def cache_key(self, n: int) -> Dict[str, Any]:
    """The schema's part of a cache key at n rounds: the same from Python and the CLI."""
    return self.for_rounds(n).as_dict()

  def cache_key_aliases(self, n: int) -> List[Dict[str, Any]]:
    """Other cache-key fragments earlier versions wrote for this schema at n rounds."""
    return self.for_rounds(n).legacy_dicts()

  def analysis_versions(self) -> Dict[str, int]:
    """Versions of the analyses whose figures an entry for this schema stores (part of its
    cache key, so that a newer analysis recomputes rather than refuses the entry)."""
    return {}

  # -- patterns, sensitivity and the sampler

  def pattern_indices(self, n: int) -> np.ndarray:
    """fixed_epoch, balls_in_bins: [b, k] integer array, row j the pattern {j, j+b, …}."""
    raise checks.CheckError(f"pattern_indices needs fixed_epoch or balls_in_bins "
                            f"participation, not {self.kind}")

  def patterns(self, n: int, limit: Optional[int] = None) -> List[Tuple[int, ...]]:
    """The maximal participation patterns for n rounds (every pattern is a subset of one).

    Sub-patterns need no separate listing: contributions may be zero. ``limit``
    refuses (CheckError) an enumeration that would exceed it.
    """
    self.check(n)
    _check_limit(n, limit, self)
    return [(t,) for t in range(n)]

  def joinable_sets(self, n: int, limit: Optional[int] = None) -> List[Tuple[int, ...]]:
    """Every non-empty set of rounds one user may join, for contributions that are never 0
    (a canary's ±1): the patterns themselves, where a user joins all rounds of its pattern."""
    del limit  # at most n patterns
    return self.patterns(n)

  def sensitivity_bounds(self, c: np.ndarray, col_sq: np.ndarray,
                         gram: Optional[bounds_lib.Gram] = None) -> Tuple[float, float, str]:
    """(upper, lower, method) of sens(C)² under the schema (``sensitivity.sensitivity_report``;
    ``gram``: C's ``bounds.Gram``, shared with its other analyses)."""
    del c, gram
    value = float(np.max(col_sq))
    return value, value, "max_column_norm"

  def make_sampler(self, client_ids: Sequence[str], *, seed: int, total_rounds: int,
                   clients_per_round: Optional[int] = None,
                   sampling_prob: Optional[float] = None, secret: int = -1,
                   classes: Any = samplers_lib):
    """The sampler that draws clients under this schema for ``total_rounds`` rounds (checks
    that ``client_ids`` are enough).

    ``classes``: where the sampler classes and ``SamplingError`` come from (the library's
    ``samplers``, or a framework's subclasses of them that raise its own error).
    """
    del sampling_prob, secret
    samplers_lib.check_enough_clients(len(client_ids), total_rounds, clients_per_round,
                                      error=classes.SamplingError)
    return classes.SinglePassSampler(client_ids, seed, clients_per_round)


def _check_limit(count: int, limit: Optional[int], schema: Participation) -> None:
  if limit is not None and count > limit:
    raise checks.CheckError(f"{schema.describe()} has {count} patterns, more than {limit}")


@dataclasses.dataclass(frozen=True)
class Single(Participation):
  """Single participation: each user joins at most one round."""
  kind: ClassVar[str] = "single"
  sampler: ClassVar[str] = "single pass"
  at_most_once: ClassVar[bool] = True
  not_poisson: ClassVar[Optional[str]] = (
      "amplification analyzes Poisson sampling, where a user may join several rounds; give a "
      "min_sep schema (min_sep 1: i.i.d. sampling every round) or fixed_epoch, not single")


@dataclasses.dataclass(frozen=True)
class _Epochs(Participation):
  """n = k·b rounds in k epochs of b rounds (``epochs`` = k)."""
  takes: ClassVar[Tuple[str, ...]] = ("epochs",)
  parameter_flags: ClassVar[Mapping[str, Tuple[str, str]]] = {
      "epochs": ("K", "number of epochs K, dividing n")}
  epochs: Optional[int] = None

  def __post_init__(self):
    if self.epochs is None:
      raise checks.CheckError(f"participation {self.kind} needs epochs")
    object.__setattr__(self, "epochs", checks.positive_int(self.epochs, "epochs"))

  def check(self, n: int) -> "Participation":
    n = checks.positive_int(n, "rounds n")
    if self.epochs > n:
      raise checks.CheckError(f"{self.kind}: epochs={self.epochs} exceeds the number of "
                              f"rounds n={n}")
    if n % self.epochs:
      raise checks.CheckError(f"{self.kind}: epochs={self.epochs} must divide the number of "
                              f"rounds n={n}")
    return self

  def rounds_per_epoch(self, n: int) -> int:
    self.check(n)
    return n // self.epochs

  def max_participations_in(self, n: int) -> int:
    self.check(n)
    return self.epochs

  def participations_by(self, n: int, rounds: int) -> int:
    # At most one round in each epoch of b = n/k rounds: the epochs the first rounds touch.
    b = n // self.max_participations_in(n)
    return min(self.epochs, -(-max(0, int(rounds)) // b))

  @property
  def label(self) -> str:
    return f"{self.kind}-k{self.epochs}"

  def describe(self) -> str:
    return f"{self.kind}(epochs={self.epochs})"

  def _epochs_sampler(self, sampler_class, client_ids, seed, total_rounds, secret, error):
    if not client_ids:
      raise error(f"--participation={self.kind} needs at least one training client")
    return sampler_class(client_ids, seed, total_rounds, self.epochs, secret)


class _Cyclic(_Epochs):
  """Epoch kinds whose user joins one fixed residue class mod b = n/k (fixed epochs, bins)."""

  def separation(self, n: int) -> int:
    return self.rounds_per_epoch(n)

  def residue_period(self, n: int) -> Optional[int]:
    return n // self.epochs

  def cyclic_cover(self, n: int) -> Optional[Tuple[int, int]]:
    return n // self.epochs, self.epochs

  def pattern_indices(self, n: int) -> np.ndarray:
    b = self.rounds_per_epoch(n)
    return np.arange(n).reshape(self.epochs, b).T.copy()

  def patterns(self, n: int, limit: Optional[int] = None) -> List[Tuple[int, ...]]:
    idx = self.pattern_indices(n)
    _check_limit(idx.shape[0], limit, self)
    return [tuple(int(t) for t in row) for row in idx]


@dataclasses.dataclass(frozen=True)
class FixedEpoch(_Cyclic):
  """(k, b)-participation with k = ``epochs`` (b = n/k is fixed by the number of rounds)."""
  kind: ClassVar[str] = "fixed_epoch"
  sampler: ClassVar[str] = "fixed cohorts (k, b)"

  not_poisson: ClassVar[Optional[str]] = None

  def sampling_text(self, n, clients_per_round=None, sampling_prob=None):
    del sampling_prob
    b = n // self.epochs
    return (f"{self.epochs} fixed epochs ({b} cohorts of {clients_per_round} clients, each "
            f"client in {self.epochs} rounds {b} apart)")

  def poisson_period(self, n: int, error: type = checks.CheckError) -> int:
    """b = n/k rounds per epoch, one round per epoch."""
    return self.rounds_per_epoch(n)

  def sensitivity_bounds(self, c, col_sq, gram=None):
    return bounds_lib.fixed_epoch_bounds(c, self.pattern_indices(c.shape[1]), col_sq, gram)

  def make_sampler(self, client_ids, *, seed, total_rounds, clients_per_round=None,
                   sampling_prob=None, secret=-1, classes=samplers_lib):
    del sampling_prob, secret
    b = total_rounds // self.epochs
    samplers_lib.check_enough_clients(
        len(client_ids), b, clients_per_round,
        f"--participation=fixed_epoch --epochs={self.epochs} uses b = {b} cohorts",
        error=classes.SamplingError)
    return classes.FixedEpochSampler(client_ids, seed, total_rounds, self.epochs,
                                     clients_per_round)


@dataclasses.dataclass(frozen=True)
class BallsInBins(_Cyclic):
  """Fixed-bin balls-in-bins: one uniformly random bin j of b = n/k, every round ≡ j mod b."""
  kind: ClassVar[str] = "balls_in_bins"
  sampler: ClassVar[str] = "balls in bins (fixed bin)"
  secret_sampling: ClassVar[bool] = True
  marks_fixed_bin: ClassVar[bool] = True
  allocation_amplified: ClassVar[bool] = True
  not_poisson: ClassVar[Optional[str]] = (
      "balls_in_bins (fixed bin) is not Poisson sampling: use amplification 'amplified_fixed_bin' "
      "(or none)")

  @property
  def label(self) -> str:  # never the pre-rename label balls_in_bins-k<k>
    return f"balls_in_bins_fixed-k{self.epochs}"

  def describe(self) -> str:
    return f"balls_in_bins(epochs={self.epochs}, fixed bin)"

  def sampling_text(self, n, clients_per_round=None, sampling_prob=None):
    del clients_per_round, sampling_prob
    return (f"fixed-bin balls-in-bins over {self.epochs} epochs (each client in one secret "
            f"bin of {n // self.epochs}, every round of it)")

  def as_dict(self) -> Dict[str, Any]:
    return dict(super().as_dict(), **{FIXED_BIN_MARKER: True})

  def sensitivity_bounds(self, c, col_sq, gram=None):
    """Given its bin a user's pattern is a fixed-epoch one (bracketed as for fixed epochs,
    exact for C ≥ 0); these are b-separated, so the b-min-sep upper bound also holds
    (arXiv:2410.06266): the smaller upper value is used, the lower one from the patterns."""
    gram = gram or bounds_lib.Gram(c)
    upper, lower, method = FixedEpoch(self.epochs).sensitivity_bounds(c, col_sq, gram)
    n, k = c.shape[1], self.epochs
    if k > 1 and upper > lower * (1 + bounds_lib.EXACT_RTOL):
      ms_upper, _, ms_method = MinSep(n // k, k).sensitivity_bounds(c, col_sq, gram)
      if ms_upper < upper:
        upper, method = ms_upper, f"min_sep_{ms_method}"
    return upper, min(lower, upper), method

  def make_sampler(self, client_ids, *, seed, total_rounds, clients_per_round=None,
                   sampling_prob=None, secret=-1, classes=samplers_lib):
    del clients_per_round, sampling_prob
    return self._epochs_sampler(classes.BallsInBinsSampler, client_ids, seed, total_rounds,
                                secret, classes.SamplingError)


@dataclasses.dataclass(frozen=True)
class RandomAllocation(_Epochs):
  """Random allocation: one uniformly random round in each of k = ``epochs`` blocks of n/k."""
  kind: ClassVar[str] = "random_allocation"
  sampler: ClassVar[str] = "random allocation (a new round each epoch)"
  secret_sampling: ClassVar[bool] = True
  allocation_amplified: ClassVar[bool] = True
  not_poisson: ClassVar[Optional[str]] = (
      "random_allocation is not Poisson sampling: use amplification 'amplified_allocation' "
      "(or none)")

  def separation(self, n: int) -> int:
    self.check(n)
    return 1 if self.epochs > 1 else n  # the last round of one epoch and the first of the next

  def epoch_length(self, n: int) -> Optional[int]:
    return n // self.epochs

  def sampling_text(self, n, clients_per_round=None, sampling_prob=None):
    del clients_per_round, sampling_prob
    return (f"random allocation over {self.epochs} epochs of {n // self.epochs} rounds (each "
            "client in one random round of each epoch)")

  def legacy_dicts(self) -> List[Dict[str, Any]]:
    """Before the fixed-bin rename random_allocation was written as balls_in_bins."""
    return [{"kind": "balls_in_bins", "label": f"balls_in_bins-k{self.epochs}",
             "epochs": self.epochs}]

  def patterns(self, n: int, limit: Optional[int] = None) -> List[Tuple[int, ...]]:
    b = self.rounds_per_epoch(n)
    _check_limit(b ** self.epochs, limit, self)
    return [tuple(j * b + t for j, t in enumerate(choice))
            for choice in itertools.product(range(b), repeat=self.epochs)]

  def joinable_sets(self, n: int, limit: Optional[int] = None) -> List[Tuple[int, ...]]:
    return self.patterns(n, limit)

  def sensitivity_bounds(self, c, col_sq, gram=None):
    return bounds_lib.random_allocation_bounds(c, self.epochs, col_sq, self.patterns, gram)

  def make_sampler(self, client_ids, *, seed, total_rounds, clients_per_round=None,
                   sampling_prob=None, secret=-1, classes=samplers_lib):
    del clients_per_round, sampling_prob
    return self._epochs_sampler(classes.RandomAllocationSampler, client_ids, seed,
                                total_rounds, secret, classes.SamplingError)


@dataclasses.dataclass(frozen=True)
class MinSep(Participation):
  """b-min-separation with at most k = ``max_participations`` rounds (None: as many as fit)."""
  kind: ClassVar[str] = "min_sep"
  takes: ClassVar[Tuple[str, ...]] = ("min_sep", "max_participations")
  parameter_flags: ClassVar[Mapping[str, Tuple[str, str]]] = {
      "min_sep": ("B", "rounds between two contributions of a user, at least B"),
      "max_participations": ("K", "contributions of a user, at most K (unset: ⌈n/B⌉, all that "
                                  "B allows)")}
  sampler: ClassVar[str] = "cyclic Poisson"
  poisson: ClassVar[bool] = True
  secret_sampling: ClassVar[bool] = True
  not_poisson: ClassVar[Optional[str]] = None
  min_sep: Optional[int] = None
  max_participations: Optional[int] = None

  def __post_init__(self):
    if self.min_sep is None:
      raise checks.CheckError("participation min_sep needs min_sep")
    object.__setattr__(self, "min_sep", checks.positive_int(self.min_sep, "min_sep"))
    if self.max_participations is not None:
      object.__setattr__(self, "max_participations",
                         checks.positive_int(self.max_participations, "max_participations"))

  def check(self, n: int) -> "Participation":
    n = checks.positive_int(n, "rounds n")
    if self.min_sep > n:
      raise checks.CheckError(f"min_sep: min_sep={self.min_sep} exceeds the number of rounds "
                              f"n={n}")
    return self

  def separation(self, n: int) -> int:
    self.check(n)
    return self.min_sep

  def check_bands(self, bands: int, strategy: str) -> None:
    bands = checks.positive_int(bands, f"{strategy} bands")
    if bands > self.min_sep:
      raise checks.CheckError(f"{strategy}: bands={bands} exceed min_sep={self.min_sep}; a "
                              f"b-banded C is built for b-min-separation, use bands ≤ "
                              f"{self.min_sep}")

  def max_participations_in(self, n: int) -> int:
    self.check(n)
    fit = -(-n // self.min_sep)
    return fit if self.max_participations is None else min(fit, self.max_participations)

  def participations_by(self, n: int, rounds: int) -> int:
    # Rounds at least b apart: at most ⌈rounds/b⌉ among the first rounds, and the cap.
    return min(self.max_participations_in(n), -(-max(0, int(rounds)) // self.min_sep))

  def residue_period(self, n: int) -> Optional[int]:
    return self.min_sep

  def cyclic_cover(self, n: int) -> Optional[Tuple[int, Optional[int]]]:
    return self.min_sep, self.max_participations

  def prefix(self, rounds: int) -> Optional["Participation"]:
    return SINGLE if self.min_sep > rounds else self

  def sampling_text(self, n, clients_per_round=None, sampling_prob=None):
    del n, clients_per_round
    return f"{self.min_sep}-min-sep Poisson sampling with p = {sampling_prob:g}"

  def poisson_period(self, n: int, error: type = checks.CheckError) -> int:
    """b; each user joins the rounds of one residue class mod b (b = 1: every round, i.i.d.
    sampling). A cap on participations below ⌈n/b⌉ is not Poisson sampling."""
    b = self.min_sep
    if b > n:
      raise error(f"min_sep b = {b} exceeds the number of rounds n = {n}")
    rounds = -(-n // b)
    if self.max_participations is not None and self.max_participations < rounds:
      raise error(f"Poisson sampling with min_sep {b} lets a user join up to {rounds} rounds; "
                  f"a cap of {self.max_participations} participations is not covered by the "
                  "amplified analyses")
    return b

  def for_rounds(self, n: int) -> "Participation":
    """Without max_participations: the number that fits, ⌈n/b⌉ (the CLI's form of the same
    schema, so that Python and the CLI share one cache key)."""
    if self.max_participations is None:
      return dataclasses.replace(self, max_participations=self.max_participations_in(n))
    return self.check(n)

  def analysis_versions(self) -> Dict[str, int]:
    return {"min_sep_analysis": bounds_lib.MIN_SEP_ANALYSIS_VERSION}

  def cache_key_aliases(self, n: int) -> List[Dict[str, Any]]:
    """Earlier versions keyed the schema without max_participations from Python (``kall``)
    and with ⌈n/b⌉ from the CLI (``k<⌈n/b⌉>``): the Python form is read too."""
    if self.max_participations_in(n) == -(-n // self.min_sep):
      return [MinSep(self.min_sep).as_dict()]
    return []

  @property
  def label(self) -> str:
    k = "all" if self.max_participations is None else self.max_participations
    return f"min_sep-b{self.min_sep}-k{k}"

  def describe(self) -> str:
    k = "all" if self.max_participations is None else self.max_participations
    return f"min_sep(min_sep={self.min_sep}, max_participations={k})"

  def patterns(self, n: int, limit: Optional[int] = None) -> List[Tuple[int, ...]]:
    """Every maximal set of rounds a client may join (the same list for the same schema, n
    and limit: kept for the last few, since each C's sensitivity under the schema asks)."""
    return list(_min_sep_patterns(self, n, limit))

  def listed_patterns(self, n: int, limit: Optional[int] = None) -> List[Tuple[int, ...]]:
    k, b = self.max_participations_in(n), self.min_sep
    if k > sys.getrecursionlimit() // 2:  # one frame per round of a pattern
      raise checks.CheckError(f"{self.describe()}: listing its maximal patterns at n={n} "
                              f"would nest {k} rounds deep")
    out: List[Tuple[int, ...]] = []
    # Partial patterns may far outnumber the maximal ones (b = 1: every subset is visited on
    # the way to the one maximal pattern): past this many visits the listing is refused too.
    visits = [0, None if limit is None else PATTERN_VISITS_PER_LIMIT * limit * (n + 1)]

    def extend(prefix: Tuple[int, ...], start: int):
      visits[0] += 1
      if visits[1] is not None and visits[0] > visits[1]:
        raise checks.CheckError(f"{self.describe()}: listing its maximal patterns at n={n} "
                                f"visits more than {visits[1]} partial patterns")
      # A pattern is maximal when it is full, or no round fits before, between or after.
      if len(prefix) >= k or not _has_gap(prefix, n, b):
        out.append(prefix)
        if limit is not None and len(out) > limit:
          raise checks.CheckError(f"{self.describe()} has more than {limit} maximal patterns "
                                  f"at n={n}")
        return
      for t in range(start, n):
        extend(prefix + (t,), t + b)

    extend((), 0)
    return out

  def joinable_sets(self, n: int, limit: Optional[int] = None) -> List[Tuple[int, ...]]:
    """Every non-empty set of ≤ k rounds pairwise ≥ b apart (subsets of patterns too: a
    Poisson-sampled user may skip rounds of its class)."""
    k, b = self.max_participations_in(n), self.min_sep
    out: List[Tuple[int, ...]] = []

    def extend(prefix: Tuple[int, ...], start: int) -> None:
      if prefix:
        out.append(prefix)
        if limit is not None and len(out) > limit:
          raise checks.CheckError(f"min_sep(b={b}) has more than {limit} patterns at n={n}")
      if len(prefix) < k:
        for t in range(start, n):
          extend(prefix + (t,), t + b)

    extend((), 0)
    return out

  def sensitivity_bounds(self, c, col_sq, gram=None):
    return bounds_lib.min_sep_bounds(c, self.min_sep, self.max_participations_in(c.shape[1]),
                                          col_sq, self.patterns, gram)

  def make_sampler(self, client_ids, *, seed, total_rounds, clients_per_round=None,
                   sampling_prob=None, secret=-1, classes=samplers_lib):
    del total_rounds, clients_per_round
    if len(client_ids) < self.min_sep:
      raise classes.SamplingError(
          f"--min_sep={self.min_sep} needs at least {self.min_sep} training clients (one per "
          f"residue class); the dataset has {len(client_ids)}")
    return classes.CyclicPoissonSampler(client_ids, seed, self.min_sep, sampling_prob, secret,
                                        self.max_participations)


# Partial patterns ``MinSep.patterns`` visits per maximal pattern allowed and round, at most.
PATTERN_VISITS_PER_LIMIT = 1


def _has_gap(pattern: Tuple[int, ...], n: int, b: int) -> bool:
  """Some round t ∉ pattern is ≥ b away from every round of the pattern."""
  edges = (-b,) + pattern + (n - 1 + b,)
  return any(hi - lo >= 2 * b for lo, hi in zip(edges[:-1], edges[1:]))


KINDS = ("single", "fixed_epoch", "min_sep", "balls_in_bins", "random_allocation")
assert set(KINDS) == set(CLASSES), "every kind class is listed in KINDS"
# Kinds whose n = k·b rounds form k epochs of b rounds (parameter ``epochs``).
EPOCH_KINDS = tuple(kind for kind in KINDS if issubclass(CLASSES[kind], _Epochs))
SPELLINGS = KINDS + tuple(ALIASES)
# The sampler that realizes each kind in words.
SAMPLERS = {kind: CLASSES[kind].sampler for kind in KINDS}
# What each --participation spelling means, for the command-line help of every tool.
HELP = ("single: at most one round per user; fixed_epoch --epochs K: rounds j, j+b, ... "
        "(b = n/K); min_sep (or cyclic_poisson) --min_sep B: rounds at least B apart; "
        "balls_in_bins --epochs K: the field's fixed-bin balls-in-bins (jax_privacy's "
        "BallsInBinsSampling): one secret random bin j of b = n/K per user, every round "
        "i = j mod b; random_allocation --epochs K: one uniformly random round in each of "
        "the K epochs, drawn anew each epoch (named balls_in_bins before this release)")


def flags() -> Tuple[flagspec.Flag, ...]:
  """The schema's flags for every tool: ``--participation`` (any of ``SPELLINGS``), then each
  parameter a kind takes (its class's ``parameter_flags``), naming the kinds that take it."""
  kind_flag = flagspec.Flag("participation", str, "KIND",
                            f"how often and how far apart a user may contribute: {HELP}",
                            choices=SPELLINGS, convert=canonical_kind)
  return (kind_flag,) + flagspec.merged(
      flagspec.Flag(name, int, *CLASSES[kind].parameter_flags[name], owners=(kind,))
      for kind in KINDS for name in CLASSES[kind].takes)


def _build(kind: str = "single", epochs: Optional[int] = None,
           min_sep: Optional[int] = None,  # pylint: disable=redefined-outer-name
           max_participations: Optional[int] = None) -> Participation:
  """The schema of ``kind`` (or a spelling in ``ALIASES``) with these parameters."""
  cls = CLASSES.get(canonical_kind(kind))
  if cls is None:
    raise checks.CheckError(f"unknown participation {kind!r}; expected one of {KINDS}")
  given = dict(epochs=epochs, min_sep=min_sep, max_participations=max_participations)
  extra = [name for name, value in given.items() if value is not None and name not in cls.takes]
  if extra:
    takes = f"takes only {', '.join(cls.takes)}" if cls.takes else "takes no parameters"
    raise checks.CheckError(f"participation {cls.kind} {takes}; got {', '.join(extra)}")
  return cls(**{name: given[name] for name in cls.takes})


# ----------------------------------------------------------------------------- sensitivity


def sensitivity(c, schema: Participation, n: Optional[int] = None) -> float:
  """L2 sensitivity of the encoder C (m x n) under ``schema``; never below the true value.

  Exact (up to float64 rounding) for: ``single`` (max column norm); ``fixed_epoch``
  when every pattern block of X = CᵀC is non-negative (= max_j √Σ_{s,t∈P_j} X_st) or
  diagonal (orthogonal columns within patterns: √max_j Σ_{t∈P_j} X_tt); ``min_sep``
  when columns of rounds ≥ b apart have disjoint row supports (e.g. C lower triangular
  with ≤ b bands; then sens² = max over admissible sets of Σ‖C[:, t]‖², by dynamic
  programming, arXiv:2306.08153). Otherwise an upper bound: arXiv:2306.08153
  Eq. 5 (Σ|X_st| per pattern, tightened by |P|·λ_max) for fixed_epoch, and Alg. 4
  (tightened by enumeration when there are few patterns, and for a Toeplitz C by the
  smaller of ``toeplitz_ops``' structured bounds) for min_sep.
  ``sensitivity_report`` says which (its method).
  """
  return sensitivity_report(c, schema, n)["value"]


def sensitivity_report(c, schema: Participation, n: Optional[int] = None,
                       gram: Optional[bounds_lib.Gram] = None) -> Dict[str, Any]:
  """``value`` (the sensitivity returned by ``sensitivity``), ``lower`` (attained by an
  explicit contribution), ``exact`` (value ≤ lower within 1e-12 relative), ``method``
  and ``schema`` (its ``describe()``); ``gram``: C's ``bounds.Gram``, where the caller
  analyzes one C under several schemas."""
  c = checks.matrix(c, "C")
  if not isinstance(schema, Participation):
    raise checks.CheckError(f"schema must be a participation schema, got {type(schema).__name__}")
  rounds = c.shape[1]
  if n is not None and checks.positive_int(n, "rounds n") != rounds:
    raise checks.CheckError(f"C has {rounds} columns (rounds), expected n={n}")
  schema.check(rounds)
  column = toeplitz_view.column_of(c)  # a lower-triangular Toeplitz view: O(n·k) where exact
  report = None if column is None else toeplitz_sensitivity_report(column, schema)
  if report is not None:
    return report
  if column is not None:  # the dense analysis, on a contiguous copy (BLAS-friendly), with
    gram = gram or bounds_lib.Gram(c, column=column)  # CᵀC still from the column, O(n²)
    c = np.array(c)
  return report_from_bounds(schema, *schema.sensitivity_bounds(
      c, np.sum(np.square(c), axis=0), gram))


def toeplitz_sensitivity_report(coef, schema: Participation) -> Optional[Dict[str, Any]]:
  """``sensitivity_report`` of the n x n lower-triangular Toeplitz C with first column
  ``coef`` in O(n·k), without C (``bounds.toeplitz_bounds``), where it is exact; None
  otherwise (then the caller uses the dense C or a structured upper bound)."""
  coef = checks.real_array(coef, "Toeplitz coefficients")
  n = coef.shape[0]
  schema.check(n)
  b = schema.min_sep if schema.kind == "min_sep" else n
  found = bounds_lib.toeplitz_bounds(coef, schema.kind, b, schema.max_participations_in(n))
  return None if found is None else report_from_bounds(schema, *found)


def toeplitz_upper_bound_report(coef, schema: Participation) -> Optional[Dict[str, Any]]:
  """For min_sep, the report of the structured upper bound of ``toeplitz_bounds`` on the
  n x n lower-triangular Toeplitz C with first column ``coef`` (O(n·b), no C; exact False);
  None for other kinds."""
  # scipy.signal (toeplitz_bounds) is loaded on use: the commands' modules stay light.
  from tff_mf.participation import toeplitz_bounds  # pylint: disable=g-import-not-at-top
  if not isinstance(schema, MinSep):
    return None
  coef = checks.real_array(coef, "Toeplitz coefficients")
  n = coef.shape[0]
  found = toeplitz_bounds.min_sep_sensitivity_report(
      np.trim_zeros(coef, "b"), n, schema.min_sep, schema.max_participations_in(n))
  return report_from_bounds(schema, found["value"] ** 2, 0.0, "toeplitz_" + found["method"])


def report_from_bounds(schema: Participation, upper: float, lower: float,
                       method: str) -> Dict[str, Any]:
  """The ``sensitivity_report`` of squared bounds (upper, lower) found by ``method``."""
  exact = bool(upper <= lower * (1 + bounds_lib.EXACT_RTOL) or upper == 0.0)
  if exact and method.endswith("_bound"):  # the bound meets an explicit contribution
    method += "_attained"
  # Rounded up by bounds.ROUNDING_MARGIN so that float64 rounding in the sums of squares
  # never makes the value (and an ε computed from z/value) optimistic.
  return {"value": math.sqrt(upper) * (1 + bounds_lib.ROUNDING_MARGIN),
          "lower": math.sqrt(max(lower, 0.0)), "exact": exact, "method": method,
          "schema": schema.describe()}


Schema = Participation
SINGLE = Single()


def single() -> Participation:
  """Single participation."""
  return SINGLE


def fixed_epoch(epochs: int) -> Participation:
  """(k, b)-participation with k = ``epochs`` (b = n/k is fixed by the number of rounds)."""
  return FixedEpoch(epochs)


# pylint: disable-next=redefined-outer-name
def min_sep(min_sep: int, max_participations: Optional[int] = None) -> Participation:
  """b-min-separation with at most k = ``max_participations`` rounds (None: as many as fit)."""
  return MinSep(min_sep, max_participations)


def balls_in_bins(epochs: int) -> Participation:
  """Fixed-bin balls-in-bins: one uniformly random bin j of b = n/k, every round ≡ j mod b."""
  return BallsInBins(epochs)


def random_allocation(epochs: int) -> Participation:
  """Random allocation: one uniformly random round in each of k = ``epochs`` blocks of n/k."""
  return RandomAllocation(epochs)


def from_args(kind: str, n: int, epochs: Optional[int] = None,
              min_sep: Optional[int] = None,  # pylint: disable=redefined-outer-name
              max_participations: Optional[int] = None) -> Participation:
  """The schema named by ``kind`` with its parameters, validated against n rounds.

  Refuses (one-line CheckError) unknown kinds, missing or extra parameters, epochs
  that do not divide n and separations beyond n. The schema is in its form at n
  (``for_rounds``): a min_sep schema without max_participations gets the number that
  fits, ⌈n/b⌉ (one cache key per schema). ``cyclic_poisson`` (``ALIASES``) is min_sep.
  """
  if canonical_kind(kind) not in KINDS:
    raise checks.CheckError(f"unknown participation {kind!r}; expected one of {SPELLINGS}")
  n = checks.positive_int(n, "rounds n")
  return Participation(kind, epochs=epochs, min_sep=min_sep,
                       max_participations=max_participations).check(n).for_rounds(n)


def from_dict(d: Dict[str, Any]) -> Participation:
  """The inverse of ``Participation.as_dict`` (the label is derived, so ignored).

  A ``balls_in_bins`` record without ``FIXED_BIN_MARKER`` was written before the
  fixed-bin rename and is read as what it was, random allocation (``LEGACY_KINDS``).
  """
  if not isinstance(d, dict) or d.get("kind") not in SPELLINGS:
    raise checks.CheckError(f"participation must be a dict with kind in {KINDS}, got {d!r}")
  unknown = set(d) - {"kind", "label", FIXED_BIN_MARKER, *PARAMETERS}
  if unknown:
    raise checks.CheckError(f"participation {d['kind']}: unknown fields {sorted(unknown)}")
  kind = d["kind"]
  if FIXED_BIN_MARKER in d:
    if not CLASSES[canonical_kind(kind)].marks_fixed_bin or d[FIXED_BIN_MARKER] is not True:
      raise checks.CheckError(f"participation {kind}: {FIXED_BIN_MARKER}="
                              f"{d[FIXED_BIN_MARKER]!r} belongs to balls_in_bins only (true)")
  else:
    kind = LEGACY_KINDS.get(kind, kind)
  return Participation(kind, **{name: d.get(name) for name in PARAMETERS})


@functools.lru_cache(maxsize=8)
def _min_sep_patterns(schema: MinSep, n: int,
                      limit: Optional[int]) -> Tuple[Tuple[int, ...], ...]:
  return tuple(schema.listed_patterns(n, limit))
