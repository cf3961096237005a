"""The mechanism registry: every strategy and mechanism name of tff-mf, as data (no TensorFlow).

Two tables. A *strategy* is a way to choose the encoder C for a given workload A
(a family module in ``tff_mf.factorization.families``); ``tff-mf factorize --mechanism`` takes
these names. A *mechanism* is what a user trains or accounts for: a strategy
applied to a workload (prefix sums post-processed into the training workload, or
the training workload itself), plus the kind of noise stream that realizes it.
The Python API (``build_mechanism``), ``tff-mf``, the training binary, the grids,
the demo's labels and MMCC all read their names, aliases, labels and defaults here,
so one name means one mechanism everywhere.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
from typing import Any, Dict, Optional, Tuple

from tff_mf import checks
from tff_mf import participation

PARTICIPATIONS = participation.KINDS  # every schema kind



@dataclasses.dataclass(frozen=True)
class NoiseKind:
  """How a mechanism's noise is realized: one instance per kind (``NOISE_KIND_CLASSES``),
  whose attributes every layer reads instead of comparing the kind's name.

  Attributes:
    name: the kind's name (JSON records and ``Mechanism.noise``).
    meaning: in words.
    factorized: the noise is C⁻¹·Z of a factorization A = B·C (the encoder is C).
    streams: realized by a ``LinearStream`` recurrence with O(k·d) state.
    stream_choices: the noise streams it may run (``tff_mf.spec.NOISE_STREAMS``), its own
      first; () for a kind with no choice.
    tff_tree: TFF's own ``DifferentiallyPrivateFactory.tree_aggregation`` (its matrix form is
      ``honaker_online``; refused outside TFF and with adaptive clipping).
    identity: C = I, independent noise (TFF's ``gaussian_fixed`` query, seeded).
    noised: it adds noise (False for ``none`` and ``clipped``).
    clips: each update is clipped (False only for ``none``).
    auditable: the black-box audit can rerun it with fresh seeds (``tff_mf.audit``).
  """
  name: str
  meaning: str
  factorized: bool = False
  streams: bool = False
  stream_choices: Tuple[str, ...] = ()
  tff_tree: bool = False
  identity: bool = False
  noised: bool = True
  clips: bool = True
  auditable: bool = False


DENSE_ROWS = NoiseKind("dense_rows", "row i of N·Z regenerated from the secret seed "
                       "(tff_mf.tf.noise.DenseNoise)", factorized=True,
                       stream_choices=("stateless",), auditable=True)
LINEAR = NoiseKind("linear", "a LinearStream recurrence with O(k·d) state "
                   "(tff_mf.tf.noise.LinearNoise)", factorized=True, streams=True,
                   stream_choices=("stateful", "stateless"), auditable=True)
TFF_TREE = NoiseKind("tff_tree", "TFF's DifferentiallyPrivateFactory.tree_aggregation",
                     tff_tree=True)
TFF_GAUSSIAN = NoiseKind("tff_gaussian", "TFF's DifferentiallyPrivateFactory with "
                         "gaussian_fixed's query, seeded", identity=True, auditable=True)
NO_NOISE = NoiseKind("none", "no noise (non-private)", noised=False, clips=False)
CLIPPED = NoiseKind("clipped", "no noise; each client's update clipped to the clip norm before "
                    "the mean (non-private: the ceiling of a DP run with the same clipping)",
                    noised=False)
NOISE_KIND_CLASSES = {k.name: k for k in (DENSE_ROWS, LINEAR, TFF_TREE, TFF_GAUSSIAN, NO_NOISE,
                                          CLIPPED)}
NOISE_KINDS = tuple(NOISE_KIND_CLASSES)
# Former spellings of noise kinds (one name, one meaning: "dense" is the optimal family):
# refused in a Mechanism, naming the new spelling.
RENAMED_NOISE_KINDS = {"dense": "dense_rows"}


class RegistryError(checks.CheckError):
  """An unknown strategy or mechanism name."""


@dataclasses.dataclass(frozen=True)
class Strategy:
  """A way to choose C, computed by a family module (``tff_mf.factorization.families``).

  ``family`` names the module: a module of ``tff_mf.factorization.families`` ("banded") or any
  other importable module ("my_project.my_family"). The module declares what the
  strategy reads, supports and costs (``STRATEGIES[name]``, a
  ``tff_mf.factorization.families.Declaration``); the properties below read that declaration.
  """
  name: str
  family: str
  label: str
  description: str
  citation: str

  @property
  def module(self):
    """The family module that computes this strategy."""
    path = self.family
    in_package = f"tff_mf.factorization.families.{path}"
    if "." not in path and importlib.util.find_spec(in_package) is not None:
      path = in_package
    try:
      return importlib.import_module(path)
    except ImportError as e:
      raise RegistryError(f"strategy {self.name!r}: family module {path!r} cannot be "
                          f"imported ({e})") from None

  @property
  def declaration(self) -> Any:
    """The family's ``tff_mf.factorization.families.Declaration`` for this strategy."""
    module = self.module
    declared = getattr(module, "STRATEGIES", {}).get(self.name)
    if declared is None:
      raise RegistryError(f"family module {module.__name__!r} declares no strategy "
                          f"{self.name!r} in its STRATEGIES")
    return declared

  @property
  def participations(self) -> Tuple[str, ...]:
    """The schema kinds C can be optimized for."""
    return tuple(self.declaration.participations)

  @property
  def streams(self) -> bool:
    """The family has a LinearStream (O(k·d) noise state)."""
    return bool(self.declaration.streams)


@dataclasses.dataclass(frozen=True)
class Mechanism:
  """What a user trains or accounts for.

  Attributes:
    name: canonical name.
    aliases: other accepted spellings (older or field names).
    label: display label for tables and plots.
    strategy: the Strategy name its C comes from (None: not a factorization).
    workload: ``prefix_sum`` when C factorizes S and the decoder is post-processed
      into the training workload A (B = A·S⁻¹·B_S, Denisov et al. 2022 Sec 4), or
      ``training`` when C factorizes the training workload itself.
    noise: one of NOISE_KINDS.
    participations: schemas it can be trained and accounted under. Its C is
      optimized for the schema when the strategy supports it
      (``Strategy.participations``), else for single participation; either way
      the sensitivity under the schema is computed from C.
    trainable: False when it exists for accounting only.
    why_not_trainable: the reason, when not trainable.
    private: False only for ``none`` and ``nonprivate_clipped`` (no noise).
    momentum_workload: its C is meant for a momentum workload M(η)·M(β) (opt_momentum):
      with β = 0 and a constant schedule it would be another mechanism's C, so accounting
      it needs the run's β (or an explicit prefix-sum workload).
  """
  name: str
  aliases: Tuple[str, ...]
  label: str
  description: str
  strategy: Optional[str]
  workload: str
  noise: str
  participations: Tuple[str, ...] = ("single",)
  trainable: bool = True
  why_not_trainable: str = ""
  private: bool = True
  momentum_workload: bool = False

  def __post_init__(self):
    if self.noise in RENAMED_NOISE_KINDS:
      raise RegistryError(f"mechanism {self.name!r}: noise kind {self.noise!r} was renamed "
                          f"{RENAMED_NOISE_KINDS[self.noise]!r} ({self.noise!r} is the optimal "
                          f"family); use {RENAMED_NOISE_KINDS[self.noise]!r}")
    if self.noise not in NOISE_KINDS:
      raise RegistryError(f"mechanism {self.name!r}: noise must be one of "
                          f"{', '.join(NOISE_KINDS)}, got {self.noise!r}")

  @property
  def noise_kind(self) -> NoiseKind:
    """The ``NoiseKind`` named by ``noise``."""
    return NOISE_KIND_CLASSES[self.noise]

  @property
  def post_processes_prefix_decoder(self) -> bool:
    return self.workload == "prefix_sum"


_DENISOV = "Denisov et al. 2022, arXiv:2202.08312"
_MCMAHAN = "McMahan, Rush, Thakurta, arXiv:2202.08312 (v1)"
_MULTI_EPOCH = "Choquette-Choo et al. 2023, arXiv:2211.06530"
_BANDED = "Choquette-Choo et al. 2023, arXiv:2306.08153"
_TOEPLITZ = "McKenna 2024, arXiv:2405.15913"
_BLT = "Dvijotham et al. 2024, arXiv:2404.16706; McMahan, Xu, Zhang 2024, arXiv:2408.08868"
_BSR = "Kalinin, Lampert 2024, arXiv:2405.13763"
_BISR = "Kalinin, Lampert et al. 2025, arXiv:2505.12128"
_LAMBDA_CGD = "Kalinin, McKenna, Pagh, Lampert 2026, arXiv:2601.22334"

# The built-in strategies, one constant each (code outside the registry names a strategy
# through its entry, ``registry.BLT.name``, never by spelling it).
OPTIMAL = Strategy("optimal", "dense", "optimal",
                   "optimal dense C: fixed point of Denisov et al. Eq. 5 (single participation) "
                   "or the multi-epoch dual fixed point (fixed-epoch participation), with a "
                   "duality-gap certificate", f"{_DENISOV}; {_MULTI_EPOCH}")
HONAKER_ONLINE = Strategy("honaker_online", "tree", "Honaker online (tree)",
                          "binary tree C_T with the streaming Honaker decoder (DP-FTRL)", _MCMAHAN)
HONAKER_FULL = Strategy("honaker_full", "tree", "Honaker full",
                        "binary tree C_T with the full Honaker decoder S·C_T⁺", _MCMAHAN)
IDENTITY = Strategy("identity", "identity", "identity",
                    "C = I: independent noise every round (DP-SGD / DP-FedAvg)", _DENISOV)
STRUCTURED = Strategy("structured", "structured", "structured (banded + low rank)",
                      "banded + low-rank approximation B̂ of the optimal decoder, C = B̂⁻¹·A "
                      "(App H)", _DENISOV)
BANDED = Strategy("banded", "banded", "banded",
                  "b-banded C with unit column norms, optimized (valid under b-min-sep)", _BANDED)
BANDED_TOEPLITZ = Strategy("banded_toeplitz", "toeplitz", "banded Toeplitz",
                           "b-banded Toeplitz C with optimized coefficients", _TOEPLITZ)
BLT = Strategy("blt", "blt", "BLT",
               "buffered linear Toeplitz C with m buffers, optimized", _BLT)
BSR = Strategy("bsr", "square_root", "BSR",
               "banded square root: C = the first b diagonals of A^(1/2), closed form", _BSR)
BISR = Strategy("bisr", "square_root", "BISR",
                "banded inverse square root: C⁻¹ = the first b diagonals of A^(-1/2), closed "
                "form", _BISR)
BANDED_INVERSE = Strategy("banded_inverse", "square_root", "BandInvMF",
                          "C⁻¹ Toeplitz with b taps optimized for the schema's rmse (from BISR's "
                          "taps)", _BISR)
LAMBDA_CGD = Strategy("lambda_cgd", "square_root", "λCGD",
                      "C⁻¹ = I − λ·shift (round i cancels λ of round i−1's noise), λ optimized for the "
                      "schema", _LAMBDA_CGD)

STRATEGIES: Dict[str, Strategy] = {s.name: s for s in (
    OPTIMAL, HONAKER_ONLINE, HONAKER_FULL, IDENTITY, STRUCTURED, BANDED, BANDED_TOEPLITZ, BLT,
    BSR, BISR, BANDED_INVERSE, LAMBDA_CGD)}

MECHANISMS: Dict[str, Mechanism] = {m.name: m for m in (
    Mechanism("tree", ("tree_aggregation", "tff_tree"), "tree (TFF tree_aggregation)",
              "TFF's binary-tree aggregator (DifferentiallyPrivateFactory.tree_aggregation, "
              "efficient Honaker estimator), per-node multiplier z·√levels",
              "honaker_online", "prefix_sum", "tff_tree", PARTICIPATIONS),
    Mechanism("honaker_online", ("binary_tree", "dp_ftrl"), "Honaker online (tree)",
              "binary tree C_T with the streaming Honaker decoder, as a matrix mechanism",
              "honaker_online", "prefix_sum", "dense_rows", PARTICIPATIONS),
    Mechanism("honaker_full", (), "Honaker full",
              "binary tree C_T with the full Honaker decoder", "honaker_full", "prefix_sum",
              "dense_rows", PARTICIPATIONS),
    Mechanism("opt_prefix_sum", ("optimal_prefix_sum",), "opt prefix sum",
              "optimal factorization of the prefix sum S; momentum and the learning-rate "
              "schedule applied as post-processing", "optimal", "prefix_sum", "dense_rows",
              PARTICIPATIONS),
    Mechanism("opt_momentum", ("optimal_momentum", "optimal"), "opt momentum",
              "optimal factorization of the training workload M = M(η)·M(β) itself",
              "optimal", "training", "dense_rows", PARTICIPATIONS, momentum_workload=True),
    Mechanism("structured", (), "structured (banded + low rank)",
              "banded + low-rank B̂ for S with O((h + r)·d) noise per round", "structured",
              "prefix_sum", "linear", PARTICIPATIONS),
    Mechanism("banded", ("band_mf", "banded_mf"), "banded",
              "b-banded C for the training workload with O(b·d) noise state",
              "banded", "training", "linear", PARTICIPATIONS),
    Mechanism("banded_toeplitz", (), "banded Toeplitz",
              "b-banded Toeplitz C for the training workload with O(b·d) noise state",
              "banded_toeplitz", "training", "linear", PARTICIPATIONS),
    Mechanism("blt", ("buffered_linear_toeplitz",), "BLT",
              "buffered linear Toeplitz C for the training workload with O(m·d) noise state",
              "blt", "training", "linear", PARTICIPATIONS),
    Mechanism("bsr", ("banded_square_root",), "BSR",
              "banded square root of the training workload, O(b·d) noise state", "bsr",
              "training", "linear", PARTICIPATIONS),
    Mechanism("bisr", ("banded_inverse_square_root",), "BISR",
              "banded inverse square root of the training workload: round i adds the last b "
              "rows of Z, O(b·d) state", "bisr", "training", "linear", PARTICIPATIONS),
    Mechanism("banded_inverse", ("band_inv_mf", "bandinvmf"), "BandInvMF",
              "banded-inverse C⁻¹ with optimized taps for the prefix sum (momentum and the "
              "schedule as post-processing), O(b·d) noise state", "banded_inverse",
              "prefix_sum", "linear", PARTICIPATIONS),
    Mechanism("lambda_cgd", ("dp_lambda_cgd",), "λCGD",
              "each round cancels a fraction λ of the previous round's noise (one row of state)",
              "lambda_cgd", "training", "linear", PARTICIPATIONS),
    Mechanism("gaussian", ("gaussian_fixed", "identity", "dp_fedavg"),
              "gaussian (independent noise)",
              "TFF's DifferentiallyPrivateFactory.gaussian_fixed: independent noise each round "
              "(C = I, DP-FedAvg)", "identity", "training", "tff_gaussian", PARTICIPATIONS),
    Mechanism("tree_restart", (), "tree with restarts",
              "binary trees restarted every 2^(h−1) rounds (Kairouz et al. 2021); MMCC Sec 6.3",
              None, "prefix_sum", "dense_rows", ("single", "min_sep"), trainable=False,
              why_not_trainable="accounting only: tff-mf has no streaming decoder for restarted "
                                "trees; train with tree or honaker_online"),
    Mechanism("none", ("nonprivate",), "non-private", "plain FedAvg without clipping noise",
              None, "training", "none", PARTICIPATIONS, private=False),
    Mechanism("nonprivate_clipped", (), "non-private (clipped)",
              "FedAvg with each client's update clipped to the clip norm and no noise (the "
              "ceiling of a DP run with the same clipping; not private)",
              None, "training", "clipped", PARTICIPATIONS, private=False),
)}


def _index() -> Dict[str, str]:
  out = {}
  for m in MECHANISMS.values():
    for spelling in (m.name,) + m.aliases:
      if spelling in out:
        raise AssertionError(f"mechanism spelling {spelling!r} is used twice")
      out[spelling] = m.name
  return out


_ALIASES = _index()


def mechanism(name: str) -> Mechanism:
  """The mechanism called ``name`` (or one of its aliases)."""
  canonical = _ALIASES.get(name)
  if canonical is None:
    raise RegistryError(f"unknown mechanism {name!r}; expected one of "
                        f"{', '.join(MECHANISMS)} (aliases: "
                        f"{', '.join(sorted(set(_ALIASES) - set(MECHANISMS)))})")
  return MECHANISMS[canonical]


def strategy(name: str) -> Strategy:
  if name not in STRATEGIES:
    raise RegistryError(f"unknown strategy {name!r}; expected one of {', '.join(STRATEGIES)}")
  return STRATEGIES[name]


def mechanism_names(trainable: Optional[bool] = None, private: Optional[bool] = None,
                    participation: Optional[str] = None) -> Tuple[str, ...]:
  """Canonical mechanism names, optionally filtered."""
  out = []
  for m in MECHANISMS.values():
    if trainable is not None and m.trainable != trainable:
      continue
    if private is not None and m.private != private:
      continue
    if participation is not None and participation not in m.participations:
      continue
    out.append(m.name)
  return tuple(out)


def all_spellings() -> Tuple[str, ...]:
  """Every accepted mechanism spelling (names and aliases), for flag choices."""
  return tuple(_ALIASES)


def label(name: str) -> str:
  return mechanism(name).label


def default_parameters(strategy_name: str, n: int, schema=None) -> Dict[str, int]:
  """The strategy parameters used when a caller gives none (the family's declaration)."""
  return dict(strategy(strategy_name).declaration.defaults(n, schema))


def register(strategy_entry: Optional[Strategy] = None,
             mechanism_entry: Optional["Mechanism"] = None) -> None:
  """Adds a strategy and/or a mechanism at run time (a family of one's own).

  The strategy's family module must declare it (``STRATEGIES``); the mechanism's
  name and aliases must be new. Every surface reads the tables, so the new entries
  factorize, cache, account and train like the built-in ones.
  """
  global _ALIASES
  if strategy_entry is not None:
    if strategy_entry.name in STRATEGIES:
      raise RegistryError(f"strategy {strategy_entry.name!r} is already registered")
    _ = strategy_entry.declaration  # the family module must declare it
    STRATEGIES[strategy_entry.name] = strategy_entry
  if mechanism_entry is not None:
    taken = [s for s in (mechanism_entry.name,) + mechanism_entry.aliases if s in _ALIASES]
    if taken:
      if strategy_entry is not None:
        del STRATEGIES[strategy_entry.name]
      raise RegistryError(f"mechanism spelling {taken[0]!r} is already registered")
    if mechanism_entry.strategy is not None:
      strategy(mechanism_entry.strategy)
    MECHANISMS[mechanism_entry.name] = mechanism_entry
    _ALIASES = _index()


def unregister(strategy_name: Optional[str] = None, mechanism_name: Optional[str] = None) -> None:
  """Removes entries added by ``register`` (built-in entries stay)."""
  global _ALIASES
  for table, name in ((MECHANISMS, mechanism_name), (STRATEGIES, strategy_name)):
    if name is not None:
      if name in _BUILTIN_NAMES:
        raise RegistryError(f"{name!r} is built in and cannot be removed")
      table.pop(name, None)
  _ALIASES = _index()


_BUILTIN_NAMES = frozenset(STRATEGIES) | frozenset(MECHANISMS)
