"""Participation schemas as data, and the sensitivity of an encoder C under each (numpy core).

A user contributes a vector x_t with ‖x_t‖₂ ≤ 1 in every round t of a participation
pattern P (a set of rounds); the L2 sensitivity of C (m x n, columns = rounds) is

  sens(C)² = sup_P sup_{‖x_t‖ ≤ 1} ‖Σ_{t∈P} C[:, t] x_tᵀ‖²_F = sup_P sup Σ_{s,t∈P} X_st ⟨x_s, x_t⟩

with X = CᵀC (Choquette-Choo, McMahan, Rush, Thakurta 2023, arXiv:2211.06530).
Schemas:

- ``single``: every pattern is one round (Denisov et al. 2022, arXiv:2202.08312, Eq. 2).
- ``fixed_epoch(epochs=k)``: n = k·b rounds; the b patterns are {j, j+b, …, j+(k−1)b}
  ((k, b)-participation, Choquette-Choo et al. 2023, arXiv:2211.06530).
- ``min_sep(min_sep=b, max_participations=k)``: any ≤ k rounds pairwise ≥ b apart
  (b-min-separation, Choquette-Choo, Ganesh, McMahan, Rush, Steinke, Thakurta 2023,
  arXiv:2306.08153). The sampler realizing it is cyclic Poisson sampling (the clients
  split into b groups, group i mod b eligible in round i, each eligible client joining
  with probability p; arXiv:2306.08153 Sec 4, jax_privacy's ``CyclicPoissonSampling``);
  ``cyclic_poisson`` is accepted as another spelling of the kind.
- ``balls_in_bins(epochs=k)``: the field's fixed-bin balls-in-bins (Chua, Ghazi, Kamath,
  Kumar, Manurangsi, Sinha, Zhang 2024, arXiv:2410.06266 and arXiv:2412.16802;
  jax_privacy's ``BallsInBinsSampling``): n = k·b rounds; a user draws one bin
  j ∈ {0, …, b−1} once and joins every round i with i mod b = j. Its patterns are the
  fixed-epoch patterns (the bin is secret, which only helps), so ``_fixed_epoch``
  brackets the sensitivity, tightened by the b-min-sep bound (b-cyclic patterns are
  b-separated).
- ``random_allocation(epochs=k)``: n = k·b rounds in k epoch blocks of b rounds; a user
  joins exactly one round of each block, chosen uniformly and independently per epoch
  (per-epoch random allocation; arXiv:2412.16802, Feldman & Shenfeld 2026,
  arXiv:2602.17284). The patterns are every choice of one round per block;
  ``_random_allocation`` computes the sensitivity. Before this name existed the schema
  was stored as ``balls_in_bins``: ``from_dict`` reads such a record (one without the
  ``FIXED_BIN_MARKER``) as random allocation, never as fixed-bin.

For min_sep the value is exact when columns ≥ b apart have disjoint supports, and when C
is lower-triangular Toeplitz with non-negative, non-increasing coefficients (BLT and
banded Toeplitz almost always are): then the earliest pattern {0, b, …, (k−1)b} is the
worst one, O(n·k) (``_earliest_pattern_toeplitz``).

Per pattern P the inner supremum is an SDP; this module brackets it by
  lower(P) = max(1ᵀX_P1, tr X_P, max_{s∈{±1}^|P|} sᵀX_P s)   (explicit contributions)
  upper(P) = min(Σ_{s,t}|X_st|, |P|·λ_max(X_P))              (arXiv:2306.08153 Eq. 5, and
                                                             ⟨X_P, VᵀV⟩ ≤ λ_max·tr VᵀV)
(random_allocation: see ``_random_allocation`` for how the b^k patterns are searched)
and ``sensitivity`` returns the square root of the maximal upper value, never below the
true sensitivity (up to float64 rounding of CᵀC). The report says ``exact`` when the
largest upper value is attained by an explicit contribution (within 1e-12 relative).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from tff_mf import checks
from tff_mf import separation

KINDS = ("single", "fixed_epoch", "min_sep", "balls_in_bins", "random_allocation")
# Kinds whose n = k·b rounds form k epochs of b rounds (parameter ``epochs``).
EPOCH_KINDS = ("fixed_epoch", "balls_in_bins", "random_allocation")
# A stored balls_in_bins schema is the fixed-bin scheme only with this field; without it
# the record predates the rename and names what is now random_allocation.
FIXED_BIN_MARKER = "fixed_bin"
LEGACY_KINDS = {"balls_in_bins": "random_allocation"}
# Other spellings of a kind: the name of the sampler that realizes the schema.
ALIASES = {"cyclic_poisson": "min_sep"}
SPELLINGS = KINDS + tuple(ALIASES)


def canonical_kind(spelling: str) -> str:
  """The schema kind a ``--participation`` spelling names (``cyclic_poisson`` is min_sep)."""
  return ALIASES.get(spelling, spelling)
# The sampler that realizes each kind in the training binary (training/sampling.py).
SAMPLERS = {"single": "single pass", "fixed_epoch": "fixed cohorts (k, b)",
            "min_sep": "cyclic Poisson", "balls_in_bins": "balls in bins (fixed bin)",
            "random_allocation": "random allocation (a new round each epoch)"}
# What each --participation spelling means, for the command-line help of every tool.
HELP = ("single: at most one round per user; fixed_epoch --epochs K: rounds j, j+b, ... "
        "(b = n/K); min_sep (or cyclic_poisson) --min_sep B: rounds at least B apart; "
        "balls_in_bins --epochs K: the field's fixed-bin balls-in-bins (jax_privacy's "
        "BallsInBinsSampling): one secret random bin j of b = n/K per user, every round "
        "i = j mod b; random_allocation --epochs K: one uniformly random round in each of "
        "the K epochs, drawn anew each epoch (named balls_in_bins before this release)")
# Random-allocation patterns (b^k) enumerated for the sensitivity at most.
RANDOM_ALLOCATION_ENUMERATION_LIMIT = 20000
# Admissible min-sep patterns enumerated (to tighten the Alg. 4 bound) at most.
ENUMERATION_LIMIT = 2000
# Blocks up to this size also try every ±1 sign vector for the lower bound.
SIGN_ENUMERATION_MAX = 10
# Upper and lower squared sensitivity within this relative distance count as exact.
EXACT_RTOL = 1e-12
# Relative margin added to every reported sensitivity (float64 rounding of Σ C_ij²).
ROUNDING_MARGIN = 1e-12
# Version of the min_sep analysis (2: exact earliest-pattern value for non-negative,
# non-increasing Toeplitz C; 3: for other Toeplitz C also toeplitz_ops' structured bounds,
# the smallest valid bound used). Part of min_sep cache keys, so that entries whose sidecar
# figures came from an older analysis are recomputed rather than refused as edited.
MIN_SEP_ANALYSIS_VERSION = 3


# ----------------------------------------------------------------------------- schemas


@dataclasses.dataclass(frozen=True)
class Participation:
  """A participation schema (frozen; equal schemas are equal cache keys).

  Attributes:
    kind: one of KINDS (or a spelling of ALIASES, stored as its kind).
    epochs: fixed_epoch, balls_in_bins, random_allocation: k (n = k·b rounds; b = n/k).
    min_sep: min_sep: b, the least separation of two rounds of one user.
    max_participations: min_sep: k, at most this many rounds (None: as many as fit).
  """
  kind: str = "single"
  epochs: Optional[int] = None
  min_sep: Optional[int] = None
  max_participations: Optional[int] = None

  def __post_init__(self):
    object.__setattr__(self, "kind", ALIASES.get(self.kind, self.kind))
    if self.kind not in KINDS:
      raise checks.CheckError(f"unknown participation {self.kind!r}; expected one of {KINDS}")
    allowed = {"single": (), "fixed_epoch": ("epochs",), "balls_in_bins": ("epochs",),
               "random_allocation": ("epochs",),
               "min_sep": ("min_sep", "max_participations")}[self.kind]
    extra = [name for name in ("epochs", "min_sep", "max_participations")
             if getattr(self, name) is not None and name not in allowed]
    if extra:
      takes = f"takes only {', '.join(allowed)}" if allowed else "takes no parameters"
      raise checks.CheckError(f"participation {self.kind} {takes}; got {', '.join(extra)}")
    if self.kind in EPOCH_KINDS:
      if self.epochs is None:
        raise checks.CheckError(f"participation {self.kind} needs epochs")
      object.__setattr__(self, "epochs", checks.positive_int(self.epochs, "epochs"))
    if self.kind == "min_sep":
      if self.min_sep is None:
        raise checks.CheckError("participation min_sep needs min_sep")
      object.__setattr__(self, "min_sep", checks.positive_int(self.min_sep, "min_sep"))
      if self.max_participations is not None:
        object.__setattr__(self, "max_participations",
                           checks.positive_int(self.max_participations, "max_participations"))

  # -- validation against n rounds

  def check(self, n: int) -> "Participation":
    """Refuses (one-line CheckError) a schema that does not apply to n rounds; returns self."""
    n = checks.positive_int(n, "rounds n")
    if self.kind in EPOCH_KINDS:
      if self.epochs > n:
        raise checks.CheckError(f"{self.kind}: epochs={self.epochs} exceeds the number of "
                                f"rounds n={n}")
      if n % self.epochs:
        raise checks.CheckError(f"{self.kind}: epochs={self.epochs} must divide the number of "
                                f"rounds n={n}")
    if self.kind == "min_sep" and self.min_sep > n:
      raise checks.CheckError(f"min_sep: min_sep={self.min_sep} exceeds the number of rounds "
                              f"n={n}")
    return self

  validate = check

  def separation(self, n: int) -> int:
    """The least distance of two rounds of one user (n for single participation)."""
    self.check(n)
    if self.kind in ("fixed_epoch", "balls_in_bins"):
      return n // self.epochs
    if self.kind == "min_sep":
      return self.min_sep
    if self.kind == "random_allocation" and self.epochs > 1:
      return 1  # the last round of one epoch and the first of the next
    return n

  def check_bands(self, bands: int, strategy: str) -> None:
    """Refuses a b-banded C whose bands reach two rounds of one user.

    With bands ≤ the separation, columns of different participations have disjoint
    row supports and unit columns give sensitivity √k (arXiv:2306.08153),
    which is what the banded optimizations assume.
    """
    bands = checks.positive_int(bands, f"{strategy} bands")
    if self.kind == "min_sep" and bands > self.min_sep:
      raise checks.CheckError(f"{strategy}: bands={bands} exceed min_sep={self.min_sep}; a "
                              f"b-banded C is built for b-min-separation, use bands ≤ "
                              f"{self.min_sep}")

  def rounds_per_epoch(self, n: int) -> int:
    """fixed_epoch, balls_in_bins, random_allocation: b = n / k rounds per epoch (bins)."""
    if self.kind not in EPOCH_KINDS:
      raise checks.CheckError(f"rounds_per_epoch needs {', '.join(EPOCH_KINDS)} "
                              f"participation, not {self.kind}")
    self.check(n)
    return n // self.epochs

  def max_participations_in(self, n: int) -> int:
    """The largest number of rounds one pattern holds for n rounds."""
    self.check(n)
    if self.kind in EPOCH_KINDS:
      return self.epochs
    if self.kind == "min_sep":
      fit = -(-n // self.min_sep)
      return fit if self.max_participations is None else min(fit, self.max_participations)
    return 1

  # -- description

  @property
  def label(self) -> str:
    """Short name for file names and tables."""
    if self.kind == "balls_in_bins":  # never the pre-rename label balls_in_bins-k<k>
      return f"balls_in_bins_fixed-k{self.epochs}"
    if self.kind in EPOCH_KINDS:
      return f"{self.kind}-k{self.epochs}"
    if self.kind == "min_sep":
      k = "all" if self.max_participations is None else self.max_participations
      return f"min_sep-b{self.min_sep}-k{k}"
    return "single"

  @property
  def sampler(self) -> str:
    """The sampler that realizes the schema (``SAMPLERS``): min_sep is cyclic Poisson."""
    return SAMPLERS[self.kind]

  def describe(self) -> str:
    if self.kind == "balls_in_bins":
      return f"balls_in_bins(epochs={self.epochs}, fixed bin)"
    if self.kind in EPOCH_KINDS:
      return f"{self.kind}(epochs={self.epochs})"
    if self.kind == "min_sep":
      k = "all" if self.max_participations is None else self.max_participations
      return f"min_sep(min_sep={self.min_sep}, max_participations={k})"
    return "single"

  def as_dict(self) -> Dict[str, Any]:
    """JSON-able: ``kind``, ``label`` and the parameters that are set (cache keys, reports)."""
    out: Dict[str, Any] = {"kind": self.kind, "label": self.label}
    for name in ("epochs", "min_sep", "max_participations"):
      if getattr(self, name) is not None:
        out[name] = getattr(self, name)
    if self.kind == "balls_in_bins":
      out[FIXED_BIN_MARKER] = True
    return out

  def legacy_dicts(self) -> List[Dict[str, Any]]:
    """The dicts that versions before the fixed-bin rename stored for this schema (run
    identities, cache keys): random_allocation was then written as balls_in_bins."""
    if self.kind != "random_allocation":
      return []
    return [{"kind": "balls_in_bins", "label": f"balls_in_bins-k{self.epochs}",
             "epochs": self.epochs}]

  # -- patterns

  def pattern_indices(self, n: int) -> np.ndarray:
    """fixed_epoch, balls_in_bins: [b, k] integer array, row j the pattern {j, j+b, …}."""
    if self.kind not in ("fixed_epoch", "balls_in_bins"):
      raise checks.CheckError(f"pattern_indices needs fixed_epoch or balls_in_bins "
                              f"participation, not {self.kind}")
    b = self.rounds_per_epoch(n)
    return np.arange(n).reshape(self.epochs, b).T.copy()

  def patterns(self, n: int, limit: Optional[int] = None) -> List[Tuple[int, ...]]:
    """The maximal participation patterns for n rounds (every pattern is a subset of one).

    Sub-patterns need no separate listing: contributions may be zero. ``limit``
    refuses (CheckError) an enumeration that would exceed it.
    """
    self.check(n)
    if self.kind == "single":
      _check_limit(n, limit, self)
      return [(t,) for t in range(n)]
    if self.kind in ("fixed_epoch", "balls_in_bins"):
      idx = self.pattern_indices(n)
      _check_limit(idx.shape[0], limit, self)
      return [tuple(int(t) for t in row) for row in idx]
    if self.kind == "random_allocation":
      b = self.rounds_per_epoch(n)
      _check_limit(b ** self.epochs, limit, self)
      return [tuple(j * b + t for j, t in enumerate(choice))
              for choice in itertools.product(range(b), repeat=self.epochs)]
    k = self.max_participations_in(n)
    b = self.min_sep
    out: List[Tuple[int, ...]] = []

    def extend(prefix: Tuple[int, ...], start: int):
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


Schema = Participation
SINGLE = Participation()


def _has_gap(pattern: Tuple[int, ...], n: int, b: int) -> bool:
  """Some round t ∉ pattern is ≥ b away from every round of the pattern."""
  edges = (-b,) + pattern + (n - 1 + b,)
  return any(hi - lo >= 2 * b for lo, hi in zip(edges[:-1], edges[1:]))


def _check_limit(count: int, limit: Optional[int], schema: Participation) -> None:
  if limit is not None and count > limit:
    raise checks.CheckError(f"{schema.describe()} has {count} patterns, more than {limit}")


def single() -> Participation:
  """Single participation."""
  return SINGLE


def fixed_epoch(epochs: int) -> Participation:
  """(k, b)-participation with k = ``epochs`` (b = n/k is fixed by the number of rounds)."""
  return Participation("fixed_epoch", epochs=epochs)


# pylint: disable-next=redefined-outer-name
def min_sep(min_sep: int, max_participations: Optional[int] = None) -> Participation:
  """b-min-separation with at most k = ``max_participations`` rounds (None: as many as fit)."""
  return Participation("min_sep", min_sep=min_sep, max_participations=max_participations)


def balls_in_bins(epochs: int) -> Participation:
  """Fixed-bin balls-in-bins: one uniformly random bin j of b = n/k, every round ≡ j mod b."""
  return Participation("balls_in_bins", epochs=epochs)


def random_allocation(epochs: int) -> Participation:
  """Random allocation: one uniformly random round in each of k = ``epochs`` blocks of n/k."""
  return Participation("random_allocation", epochs=epochs)


def from_args(kind: str, n: int, epochs: Optional[int] = None,
              min_sep: Optional[int] = None,  # pylint: disable=redefined-outer-name
              max_participations: Optional[int] = None) -> Participation:
  """The schema named by ``kind`` with its parameters, validated against n rounds.

  Refuses (one-line CheckError) unknown kinds, missing or extra parameters, epochs
  that do not divide n and separations beyond n. A min_sep schema without
  max_participations gets the number that fits, ⌈n/b⌉ (one cache key per schema).
  ``cyclic_poisson`` (``ALIASES``) is min_sep.
  """
  kind = canonical_kind(kind)
  if kind not in KINDS:
    raise checks.CheckError(f"unknown participation {kind!r}; expected one of {SPELLINGS}")
  n = checks.positive_int(n, "rounds n")
  schema = Participation(kind, epochs=epochs, min_sep=min_sep,
                         max_participations=max_participations).check(n)
  if kind == "min_sep" and max_participations is None:
    schema = dataclasses.replace(schema, max_participations=schema.max_participations_in(n))
  return schema


def from_dict(d: Dict[str, Any]) -> Participation:
  """The inverse of ``Participation.as_dict`` (the label is derived, so ignored).

  A ``balls_in_bins`` record without ``FIXED_BIN_MARKER`` was written before the
  fixed-bin rename and is read as what it was, random allocation (``LEGACY_KINDS``).
  """
  if not isinstance(d, dict) or d.get("kind") not in SPELLINGS:
    raise checks.CheckError(f"participation must be a dict with kind in {KINDS}, got {d!r}")
  unknown = set(d) - {"kind", "label", "epochs", "min_sep", "max_participations",
                      FIXED_BIN_MARKER}
  if unknown:
    raise checks.CheckError(f"participation {d['kind']}: unknown fields {sorted(unknown)}")
  kind = d["kind"]
  if FIXED_BIN_MARKER in d:
    if kind != "balls_in_bins" or d[FIXED_BIN_MARKER] is not True:
      raise checks.CheckError(f"participation {kind}: {FIXED_BIN_MARKER}="
                              f"{d[FIXED_BIN_MARKER]!r} belongs to balls_in_bins only (true)")
  else:
    kind = LEGACY_KINDS.get(kind, kind)
  return Participation(kind, epochs=d.get("epochs"), min_sep=d.get("min_sep"),
                       max_participations=d.get("max_participations"))


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


def sensitivity_report(c, schema: Participation, n: Optional[int] = None) -> Dict[str, Any]:
  """``value`` (the sensitivity returned by ``sensitivity``), ``lower`` (attained by an
  explicit contribution), ``exact`` (value ≤ lower within 1e-12 relative), ``method``
  and ``schema`` (its ``describe()``)."""
  c = checks.matrix(c, "C")
  if not isinstance(schema, Participation):
    raise checks.CheckError(f"schema must be a participation schema, got {type(schema).__name__}")
  rounds = c.shape[1]
  if n is not None and checks.positive_int(n, "rounds n") != rounds:
    raise checks.CheckError(f"C has {rounds} columns (rounds), expected n={n}")
  schema.check(rounds)
  col_sq = np.sum(np.square(c), axis=0)
  if schema.kind == "fixed_epoch":
    upper, lower, method = _fixed_epoch(c, schema, col_sq)
  elif schema.kind == "min_sep":
    upper, lower, method = _min_sep(c, schema, col_sq)
  elif schema.kind == "balls_in_bins":
    upper, lower, method = _fixed_bin(c, schema, col_sq)
  elif schema.kind == "random_allocation":
    upper, lower, method = _random_allocation(c, schema, col_sq)
  else:
    upper = lower = float(np.max(col_sq))
    method = "max_column_norm"
  exact = bool(upper <= lower * (1 + EXACT_RTOL) or upper == 0.0)
  if exact and method.endswith("_bound"):  # the bound meets an explicit contribution
    method += "_attained"
  # Rounded up by ROUNDING_MARGIN so that float64 rounding in the sums of squares never
  # makes the value (and an ε computed from z/value) optimistic.
  return {"value": math.sqrt(upper) * (1 + ROUNDING_MARGIN), "lower": math.sqrt(max(lower, 0.0)),
          "exact": exact, "method": method, "schema": schema.describe()}


def _gram(c: np.ndarray) -> np.ndarray:
  m, n = c.shape
  checks.dense_matrices_fit(n, 2.0, f"the Gram matrix CᵀC for n={n}")
  x = c.T @ c
  return 0.5 * (x + x.T)


def _block_bounds(blocks: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
  """(upper, lower) bounds on the SDP value of each [p, p] block (see the module docstring)."""
  size = blocks.shape[-1]
  abs_sum = np.sum(np.abs(blocks), axis=(-2, -1))
  lam_max = np.linalg.eigvalsh(blocks)[..., -1]
  upper = np.minimum(abs_sum, size * np.maximum(lam_max, 0.0))
  lower = np.maximum(np.sum(blocks, axis=(-2, -1)), np.trace(blocks, axis1=-2, axis2=-1))
  if 1 < size <= SIGN_ENUMERATION_MAX:
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=size - 1)))
    signs = np.concatenate([np.ones((signs.shape[0], 1)), signs], axis=1)
    forms = np.einsum("si,...ij,sj->...s", signs, blocks, signs)
    lower = np.maximum(lower, np.max(forms, axis=-1))
  # Never report a lower bound above the upper one (they meet when exact; rounding aside).
  return upper, np.minimum(lower, upper)


def _fixed_epoch(c: np.ndarray, schema: Participation, col_sq: np.ndarray):
  n = c.shape[1]
  idx = schema.pattern_indices(n)
  if schema.epochs == 1:
    value = float(np.max(col_sq))
    return value, value, "max_column_norm"
  x = _gram(c)
  blocks = x[idx[:, :, None], idx[:, None, :]]
  upper, lower = _block_bounds(blocks)
  off = blocks * (1.0 - np.eye(schema.epochs))
  if not np.any(off):
    method = "pattern_traces"  # exact: orthogonal columns within every pattern
  elif np.all(blocks >= 0):
    method = "pattern_sums"  # exact: all-equal contributions attain Σ X_st
  else:
    method = "abs_bound"  # arXiv:2306.08153 Eq. 5, tightened by |P|·λ_max
  return float(np.max(upper)), float(np.max(lower)), method


def _disjoint_supports(c: np.ndarray, sep: int) -> bool:
  """Columns of rounds ≥ sep apart have disjoint row supports (so X_st = 0 exactly)."""
  m, n = c.shape
  nonzero = c != 0
  has = np.any(nonzero, axis=0)
  first = np.where(has, np.argmax(nonzero, axis=0), m)
  last = np.where(has, m - 1 - np.argmax(nonzero[::-1], axis=0), -1)
  # Smallest first row among columns t ≥ s + sep (suffix minimum).
  suffix_first = np.minimum.accumulate(first[::-1])[::-1]
  s = np.arange(n - sep)
  # Disjoint intervals need every later column to start after s ends, or s to start after
  # it ends; banded lower-triangular C gives the first case.
  return bool(np.all(last[s] < suffix_first[s + sep])) if n > sep else True


def toeplitz_coefficients(c: np.ndarray) -> Optional[np.ndarray]:
  """c_0..c_{n−1} when C (n x n) is exactly lower-triangular Toeplitz, C[i, j] = c_{i−j}; else None."""
  m, n = c.shape
  if m != n or np.any(np.triu(c, 1)):
    return None
  coef = c[:, 0]
  # Every diagonal equals its first entry: compare C with the Toeplitz matrix of its column.
  idx = np.arange(n)
  diff = idx[:, None] - idx[None, :]
  built = np.where(diff >= 0, coef[np.maximum(diff, 0)], 0.0)
  return coef.copy() if np.array_equal(built, c) else None


def _earliest_pattern_toeplitz(coef: np.ndarray, b: int, k: int) -> Optional[float]:
  """Σ_{i,j<k} X_{ib, jb} for C = Toeplitz(coef), in O(n·k); None unless coef ≥ 0 is non-increasing.

  X_st = Σ_{l=0}^{n−1−max(s,t)} c_l c_{l+|s−t|}. With c_0 ≥ c_1 ≥ … ≥ 0 every X_st is
  non-negative and non-increasing in |s − t| and in max(s, t), so the earliest pattern
  {0, b, …, (k−1)b} dominates every admissible pattern term by term (its i-th and j-th
  rounds are no farther apart and no later), and equal contributions attain Σ X_st
  (X ≥ 0): the value is the exact squared sensitivity (cf. Kalinin, Lampert 2024,
  arXiv:2405.13763, for the same domination argument under b-min-separation).
  """
  n = coef.shape[0]
  if np.any(coef < 0) or np.any(np.diff(coef) > 0):
    return None
  total = 0.0
  for gap in range(k):  # pairs (i, j) with |i − j| = gap, max(i, j) = i
    d = gap * b
    # cum[r] = Σ_{l < r} c_l c_{l+d}; X_{s,s+d} with max = s + d sums l ≤ n − 1 − (s + d).
    prod = coef[:n - d] * coef[d:]
    cum = np.concatenate([[0.0], np.cumsum(prod)])
    rows = np.arange(gap, k) * b  # max(i, j)·b for i = gap..k−1
    terms = cum[n - rows]
    total += (1.0 if gap == 0 else 2.0) * float(np.sum(terms))
  return total


def _min_sep(c: np.ndarray, schema: Participation, col_sq: np.ndarray):
  n = c.shape[1]
  b = schema.min_sep
  k = schema.max_participations_in(n)
  # Mutually orthogonal unit contributions attain Σ_{t∈P} X_tt: a lower bound for any C.
  lower, best_set = separation.separated_argmax(col_sq, b, k)
  if k == 1:
    return lower, lower, "max_column_norm"
  if _disjoint_supports(c, b):
    return lower, lower, "disjoint_supports"  # X_st = 0 for |s − t| ≥ b: exact
  coef = toeplitz_coefficients(c)
  earliest = None if coef is None else _earliest_pattern_toeplitz(coef, b, k)
  if earliest is not None:
    return earliest, earliest, "toeplitz_earliest_pattern"
  checks.dense_matrices_fit(n, 6.0, f"the min_sep sensitivity bound for n={n}")
  x = _gram(c)
  # arXiv:2306.08153 Alg. 4: best admissible set per row of |X|, then over the row values.
  row_best = separation.separated_max(np.abs(x), b, k)
  upper, row_set = separation.separated_argmax(row_best, b, k)
  method = "alg4_bound"
  for pattern in (best_set, row_set):
    if pattern:
      p = np.asarray(pattern)
      _, low = _block_bounds(x[np.ix_(p, p)])
      lower = max(lower, float(low))
  try:
    patterns = schema.patterns(n, limit=ENUMERATION_LIMIT)
  except checks.CheckError:
    patterns = None
  if patterns is not None:
    enum_upper, enum_lower = 0.0, lower
    for size in sorted({len(p) for p in patterns}):
      idx = np.array([p for p in patterns if len(p) == size])
      up, low = _block_bounds(x[idx[:, :, None], idx[:, None, :]])
      enum_upper = max(enum_upper, float(np.max(up)))
      enum_lower = max(enum_lower, float(np.max(low)))
    if enum_upper < upper:
      upper, method = enum_upper, "enumerated_patterns"
    lower = enum_lower
  if coef is not None:  # Toeplitz: its structured bounds are valid too; the smaller is used
    from tff_mf import toeplitz_ops  # pylint: disable=g-import-not-at-top
    structured = toeplitz_ops.min_sep_sensitivity_report(np.trim_zeros(coef, "b"), n, b, k)
    if structured["value"] ** 2 < upper:
      upper, method = structured["value"] ** 2, "toeplitz_" + structured["method"]
  return upper, min(lower, upper), method


def _best_one_per_block(weights: np.ndarray, k: int, b: int) -> Tuple[float, Tuple[int, ...]]:
  """max over one round per block of Σ_{s,t∈P} weights[s, t], when weights vanish between
  blocks ≥ 2 apart: a chain, so dynamic programming over the blocks is exact; O(k·b²)."""
  w = weights.reshape(k, b, k, b)
  value = np.diagonal(w[0, :, 0, :]).copy()
  back = []
  for j in range(1, k):
    cross = value[:, None] + 2.0 * w[j - 1, :, j, :]  # [previous round, this round]
    back.append(np.argmax(cross, axis=0))
    value = np.max(cross, axis=0) + np.diagonal(w[j, :, j, :])
  t = int(np.argmax(value))
  chosen = [t]
  for j in range(k - 1, 0, -1):
    t = int(back[j - 1][t])
    chosen.append(t)
  return float(np.max(value)), tuple(j * b + t for j, t in enumerate(reversed(chosen)))


def _ascend_one_per_block(x: np.ndarray, pattern: Tuple[int, ...], b: int,
                          sweeps: int = 50) -> Tuple[int, ...]:
  """Block coordinate ascent of 1ᵀX_P1 over one round per block (a local maximum)."""
  p = list(pattern)
  for _ in range(sweeps):
    changed = False
    for j in range(len(p)):
      rows = np.arange(j * b, (j + 1) * b)
      others = [q for i, q in enumerate(p) if i != j]
      gain = np.diag(x)[rows] + 2.0 * np.sum(x[np.ix_(rows, others)], axis=1)
      best = int(rows[np.argmax(gain)])
      if best != p[j] and gain[best - j * b] > gain[p[j] - j * b]:  # strict: it terminates
        p[j], changed = best, True
    if not changed:
      break
  return tuple(p)


def _fixed_bin(c: np.ndarray, schema: Participation, col_sq: np.ndarray):
  """(upper, lower, method) of sens² under fixed-bin balls-in-bins (arXiv:2410.06266).

  Given its bin j a user's pattern is {j, j+b, …}: the fixed-epoch patterns, bracketed
  by ``_fixed_epoch`` (exact for C ≥ 0). These are b-separated, so the b-min-sep upper
  bound (``_min_sep``, with its structured Toeplitz bounds) also holds; the smaller
  upper value is used, the lower one only from the patterns themselves.
  """
  upper, lower, method = _fixed_epoch(c, schema, col_sq)
  n, k = c.shape[1], schema.epochs
  if k > 1 and upper > lower * (1 + EXACT_RTOL):
    ms_upper, _, ms_method = _min_sep(c, min_sep(n // k, k), col_sq)
    if ms_upper < upper:
      upper, method = ms_upper, f"min_sep_{ms_method}"
  return upper, min(lower, upper), method


def _random_allocation(c: np.ndarray, schema: Participation, col_sq: np.ndarray):
  """(upper, lower, method) of sens² under random allocation: one round in each of k blocks.

  Patterns: every choice P of one round per block of b = n/k rounds (Chua et al. 2024,
  arXiv:2412.16802). Exact ("block_chain_dp") when X = CᵀC vanishes between rounds
  of blocks ≥ 2 apart (e.g. C with ≤ b + 1 bands): max_P Σ|X_P| by dynamic programming
  over the blocks, attained by equal contributions when X_P ≥ 0 (as for every
  non-negative C). Exact by enumeration ("enumerated_patterns") when b^k ≤
  ``RANDOM_ALLOCATION_ENUMERATION_LIMIT`` and the best pattern's block is non-negative
  or diagonal. Otherwise ("row_bound") the smaller of two upper bounds valid for every
  pattern: Σ_j max_{s∈block j} Σ_i max_{t∈block i} |X_st| (arXiv:2306.08153 Alg. 4
  with one round per block instead of b-separated sets) and k·λ_max(X) (λ_max of a
  principal block ≤ λ_max(X)); the lower value comes from explicit contributions on
  patterns found by block coordinate ascent, and the report says exact only when they
  meet.
  """
  n = c.shape[1]
  k = schema.epochs
  b = n // k
  # Mutually orthogonal unit contributions, each at its block's longest column.
  lower = float(np.sum(np.max(col_sq.reshape(k, b), axis=1)))
  if k == 1:
    return lower, lower, "max_column_norm"
  x = _gram(c)
  if b == 1:
    up, low = _block_bounds(x[None])
    return float(up[0]), float(low[0]), ("pattern_sums" if np.all(x >= 0) else "abs_bound")
  ax = np.abs(x)
  block_of = np.arange(n) // b
  far = np.abs(block_of[:, None] - block_of[None, :]) >= 2
  if not np.any(x[far]):
    upper, pattern = _best_one_per_block(ax, k, b)
    p = np.asarray(pattern)
    _, low = _block_bounds(x[np.ix_(p, p)])
    return upper, max(lower, float(low)), "block_chain_dp"
  row = np.sum(np.max(ax.reshape(n, k, b), axis=2), axis=1)  # per s: best |X_st| per block
  upper = min(float(np.sum(np.max(row.reshape(k, b), axis=1))),
              k * max(float(np.linalg.eigvalsh(x)[-1]), 0.0))
  method = "row_bound"
  starts = [tuple(j * b + int(np.argmax(col_sq[j * b:(j + 1) * b])) for j in range(k)),
            tuple(j * b + int(np.argmax(row[j * b:(j + 1) * b])) for j in range(k))]
  for start in starts:
    p = np.asarray(_ascend_one_per_block(x, start, b))
    _, low = _block_bounds(x[np.ix_(p, p)])
    lower = max(lower, float(low))
  if b ** k <= RANDOM_ALLOCATION_ENUMERATION_LIMIT:
    idx = np.asarray(schema.patterns(n))
    up, low = _block_bounds(x[idx[:, :, None], idx[:, None, :]])
    if float(np.max(up)) < upper:
      upper, method = float(np.max(up)), "enumerated_patterns"
    lower = max(lower, float(np.max(low)))
  return upper, min(lower, upper), method
