"""The accountant interface: every privacy analysis is one object (numpy core, no TensorFlow).

Two families share the interface (a name, its words and citation, whether its ε is a
bound, and ``epsilon``):

- ``GaussianAccountant``: the ε(δ) of ONE Gaussian mechanism with multiplier z / sens
  (``accountant=``): ``"exact"`` (Balle & Wang 2018, arXiv:1805.06530, Thm 8), ``"pld"``
  (dp_accounting's pessimistic privacy-loss distributions) and ``"rdp"`` (Rényi DP,
  Mironov 2017, arXiv:1702.07476, converted to (ε, δ)). Registry ``ACCOUNTANTS``.
- ``Analysis``: the ε of a whole run with encoder C under a participation schema
  (``amplification=``): ``"none"`` (one Gaussian at z / sens; Denisov et al. 2022,
  arXiv:2202.08312, Thm 4.1; Choquette-Choo et al. 2023, arXiv:2211.06530), ``"mmcc"``
  (Choquette-Choo et al. 2024, arXiv:2310.15526), ``"amplified_banded"`` (Choquette-Choo et
  al. 2023, arXiv:2306.08153, Thm 4; formerly ``"banded"``, a strategy's name),
  ``"amplified_allocation"`` (random allocation, after Schuchardt & Kalinin 2026,
  arXiv:2601.21636; formerly ``"random_allocation"``, a participation kind's name),
  ``"amplified_fixed_bin"`` (fixed-bin balls-in-bins, after arXiv:2601.21636; formerly
  ``"balls_in_bins"``, a kind's name) and
  ``"monte_carlo_bound"`` (Monte-Carlo accounting of the dominating pair of C ≥ 0,
  arXiv:2410.06266, δ bounded by Chernoff-Hoeffding: its ε holds with probability ≥ 1 − β
  and carries β wherever it appears); two more describe records built elsewhere:
  ``"adaptive"`` (the adaptive clip norm's count queries composed in) and ``"monte_carlo"``
  (an ESTIMATE, arXiv:2410.06266, never a run's ε). Each analysis reads the noise side
  through a ``GaussianAccountant``. Registry ``REGISTRY``.

Each class holds its options as frozen fields, computes its record (``record``: ε and
what it rests on), says when it does not apply (``applies``) and words the statement
prints (``label``, ``theorem``, ``words``). A new analysis is one class here plus its
``register`` line; ``tff_mf.accounting`` (ε, calibration) and ``tff_mf.accounting.statement``
dispatch through the registry and never compare analysis names.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Dict, Mapping, Optional, Tuple

import dp_accounting
import numpy as np

from tff_mf import checks
from tff_mf import toeplitz_view
from tff_mf.accounting.encoder_facts import derived
from tff_mf.accounting.gaussian import PLD_DISCRETIZATION
from tff_mf.accounting.gaussian import AccountingError
from tff_mf.accounting.gaussian import gaussian_epsilon_exact
from tff_mf.accounting.gaussian import pld_gaussian_epsilon

# Rényi orders for the RDP accountant: dense at small orders, geometric above.
RDP_ORDERS = tuple(np.concatenate([
    np.linspace(1.01, 8.0, 100), np.geomspace(8.0, 10000.0, 200)[1:]]).tolist())


def fmt(x: Optional[float]) -> str:
  """A figure in a statement's words: 4 significant digits, "?" when unknown."""
  return "?" if x is None else f"{float(x):.4g}"


# ----------------------------------------------------------------------------- the noise side


@dataclasses.dataclass(frozen=True)
class GaussianAccountant:
  """ε(δ) of one Gaussian mechanism with noise multiplier z / sensitivity (an upper bound)."""
  name: ClassVar[str] = ""
  words: ClassVar[str] = ""  # what the statement says computed ε
  exact: ClassVar[bool] = False  # the Gaussian's exact ε (else a looser upper bound)
  bound: ClassVar[bool] = True

  def epsilon(self, noise_multiplier: float, delta: float, sensitivity: float = 1.0) -> float:
    raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class ExactGaussian(GaussianAccountant):
  """The analytic Gaussian ε (Balle & Wang 2018, arXiv:1805.06530, Thm 8), log space."""
  name: ClassVar[str] = "exact"
  words: ClassVar[str] = ("the analytic Gaussian mechanism (Balle & Wang 2018, "
                          "arXiv:1805.06530, Thm 8)")
  exact: ClassVar[bool] = True

  def epsilon(self, noise_multiplier, delta, sensitivity=1.0):
    return gaussian_epsilon_exact(noise_multiplier, delta, sensitivity=sensitivity)


@dataclasses.dataclass(frozen=True)
class PLDGaussian(GaussianAccountant):
  """dp_accounting's pessimistic PLD of the Gaussian (``tff_mf.accounting.gaussian``)."""
  name: ClassVar[str] = "pld"
  words: ClassVar[str] = "dp_accounting's privacy-loss distributions (pessimistic discretization)"

  def epsilon(self, noise_multiplier, delta, sensitivity=1.0):
    try:
      return pld_gaussian_epsilon(noise_multiplier / sensitivity, delta)[0]
    except AccountingError as e:
      exact = ExactGaussian().epsilon(noise_multiplier, delta, sensitivity)
      raise AccountingError(f"{e}; the exact accountant gives epsilon = {exact:.6g}") from None


@dataclasses.dataclass(frozen=True)
class RDPGaussian(GaussianAccountant):
  """Rényi DP of the Gaussian at ``RDP_ORDERS`` (Mironov 2017, arXiv:1702.07476), converted."""
  name: ClassVar[str] = "rdp"
  words: ClassVar[str] = "Renyi DP (dp_accounting), converted to (epsilon, delta)"

  def epsilon(self, noise_multiplier, delta, sensitivity=1.0):
    import dp_accounting  # pylint: disable=g-import-not-at-top
    acc = dp_accounting.rdp.RdpAccountant(orders=list(RDP_ORDERS))
    acc.compose(dp_accounting.GaussianDpEvent(noise_multiplier / sensitivity))
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
      eps = float(acc.get_epsilon(delta))
    if math.isnan(eps):
      return math.inf
    return max(eps, 0.0)


ACCOUNTANTS: Dict[str, type] = {a.name: a for a in (ExactGaussian, PLDGaussian, RDPGaussian)}


def accountant(name: str) -> GaussianAccountant:
  """The Gaussian accountant called ``name`` (CheckError naming the choices otherwise)."""
  if name not in ACCOUNTANTS:
    raise checks.CheckError(f"accountant must be one of {', '.join(ACCOUNTANTS)}, got {name!r}")
  return ACCOUNTANTS[name]()


def gaussian_epsilon(noise_multiplier: float, delta: float, name: str,
                     sensitivity: float) -> float:
  """ε(δ) by accountant ``name`` of the Gaussian at z / sens (∞ when z / sens underflows)."""
  acc = accountant(name)
  if noise_multiplier / sensitivity == 0.0:
    return math.inf
  return acc.epsilon(noise_multiplier, delta, sensitivity)


# ----------------------------------------------------------------------------- C and schema


def check_schema(schema):
  """``schema`` as a ``tff_mf.participation.Participation`` (None: single; a dict: read)."""
  from tff_mf import participation  # pylint: disable=g-import-not-at-top
  if schema is None:
    return participation.SINGLE
  if isinstance(schema, dict):
    schema = participation.from_dict(schema)
  if not isinstance(schema, participation.Participation):
    raise checks.CheckError(f"schema must be a tff_mf.participation.Participation, got "
                            f"{schema!r}")
  if schema.kind not in participation.KINDS:
    raise checks.CheckError(f"participation must be one of {', '.join(participation.KINDS)}, "
                            f"got {schema.kind!r}")
  return schema  # its class checked its parameters when it was built


def check_encoder(c, name: str = "C") -> np.ndarray:
  """A 2-D real finite float64 C with m ≥ n ≥ 1 rows and columns, not all zero."""
  def check():
    checked = checks.matrix(c, name)
    m, n = checked.shape
    if m < n:
      raise checks.CheckError(f"{name} must have at least as many rows as columns (one "
                              f"column per round), got shape {checked.shape}")
    if not np.any(checked):
      raise checks.CheckError(f"{name} is all zeros")
    return checked
  return derived(c, ("checked", name), check)


def sensitivity_report(c: Optional[np.ndarray], schema) -> Dict[str, Any]:
  """{value, exact, method}: the sensitivity of C under ``schema`` (tff_mf.participation)."""
  from tff_mf import participation  # pylint: disable=g-import-not-at-top
  schema = check_schema(schema)
  if c is None:
    if not schema.at_most_once:
      raise checks.CheckError(f"{schema.kind} participation needs the encoder C (a matrix or "
                              "a mechanism) to compute its sensitivity")
    return {"value": 1.0, "exact": True,
            "method": "C normalized to max column norm 1 (Denisov et al. 2022, App I)"}
  report = participation.sensitivity_report(c, schema)
  value = checks.positive_float(report["value"], f"sensitivity under {schema.label}")
  return {"value": value, "exact": bool(report.get("exact", False)),
          "method": str(report.get("method", ""))}


def sampling_min_sep(schema, n: int) -> int:
  """b of the Poisson sampling a schema describes for the amplified analyses.

  ``min_sep`` b: each user joins the rounds of one residue class mod b (b = 1: every
  round, i.i.d. sampling); ``fixed_epoch`` k: b = n/k rounds per epoch, one round per
  epoch. A cap on participations below ⌈n/b⌉ is not Poisson sampling and is refused.
  """
  return check_schema(schema).poisson_period(n, AccountingError)


def poisson_sensitivity(c: np.ndarray, min_sep: int) -> Tuple[float, bool]:
  """(sens, exact): sensitivity of C when a user joins every round of its residue class mod b.

  sens² = max_r sup_{‖g_j‖ ≤ 1} ‖Σ_{j ≡ r} C_{:,j} g_jᵀ‖²_F ≤ max_r Σ_{j,j' ≡ r} |X_{jj'}|
  with X = CᵀC (Cauchy-Schwarz on ⟨g_j, g_j'⟩); equality when X has no negative
  entry on the class (all g_j equal), e.g. for every non-negative C. This is the
  unamplified bound for the same sampling (every eligible round joined).
  """
  return derived(c, ("poisson_sensitivity", min_sep), lambda: _poisson_sensitivity(c, min_sep))


def _poisson_sensitivity(c: np.ndarray, min_sep: int) -> Tuple[float, bool]:
  n = c.shape[1]
  column = toeplitz_view.column_of(c)
  if column is not None and np.all(column >= 0):  # Toeplitz C ≥ 0: O(n²/b), no C
    from tff_mf.participation import bounds  # pylint: disable=g-import-not-at-top
    return bounds.residue_class_sensitivity_toeplitz(column, min_sep), True
  best = 0.0
  exact = True
  for r in range(min(min_sep, n)):
    # A strided column slice has no unit stride, and numpy's matmul then runs its own loop,
    # not BLAS (about 100x slower at n = 2048): the class's columns are copied first.
    cols = np.ascontiguousarray(c[:, r::min_sep])
    x = cols.T @ cols
    best = max(best, float(np.sum(np.abs(x))))
    exact = exact and not np.any(x < 0)
  return math.sqrt(best), exact


def band_count(c: np.ndarray) -> int:
  """Number of non-zero bands of C: max over C[i, j] ≠ 0 of (release round of row i) − j + 1.

  Row i of a square C is released in round i (C must be lower triangular); a C with
  more rows than rounds has its rows in release order, row i released in the round of
  its last non-zero column (``tff_mf.accounting.mmcc.release_rounds``).
  """
  return derived(c, "band_count", lambda: _band_count(c))


def _band_count(c: np.ndarray) -> int:
  from tff_mf.accounting import mmcc  # pylint: disable=g-import-not-at-top
  rounds = mmcc.release_rounds(c)
  rows, cols = np.nonzero(c)
  if rows.size == 0:
    return 0
  return int(np.max(rounds[rows] - cols)) + 1


def _known_or_report(c, schema, known: Optional[Dict[str, Any]]) -> Dict[str, Any]:
  return known if known is not None else sensitivity_report(c, schema)


def _best_of(record: Dict[str, Any], amplified: float, unamplified: float) -> None:
  """The smaller of two valid bounds is the record's ε; ``bound`` says which."""
  record["amplified_epsilon"] = amplified
  record["bound"] = "amplified" if amplified <= unamplified else "unamplified"
  record["epsilon"] = min(amplified, unamplified)


# ----------------------------------------------------------------------------- the run side


@dataclasses.dataclass(frozen=True)
class Analysis:
  """The ε at δ of a run with encoder C, participation schema and noise multiplier z."""
  name: ClassVar[str] = ""
  label: ClassVar[str] = ""  # the statement's one-line name of the analysis
  theorem: ClassVar[str] = ""  # the citation a record carries
  bound: ClassVar[bool] = True  # an upper bound on ε (False: an estimate, never a run's ε)
  amplified: ClassVar[bool] = False  # reports the smaller of an amplified and the plain bound
  poisson: ClassVar[bool] = False  # Poisson sampling: needs sampling_prob and min_sep
  selectable: ClassVar[bool] = True  # an ``amplification=`` of ``tff_mf.accounting``
  counts_clipping: ClassVar[bool] = False  # also accounts the adaptive clip norm's counts
  high_probability: ClassVar[bool] = False  # ε holds with probability ≥ 1 − β (labelled)
  calibrates_itself: ClassVar[bool] = False  # ``calibrate`` of its own (no bisection)
  chosen_because: ClassVar[str] = ""  # why training picks it (``automatic``), in words

  def applies(self, c: Optional[np.ndarray], schema) -> Optional[str]:
    """None when the analysis applies to C under ``schema``, else the one-line reason."""
    return None

  def record(self, record: Dict[str, Any], c: Optional[np.ndarray], schema, z: float,
             delta: float, accountant_name: str, sampling_prob: Optional[float],
             known_sensitivity: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """``record`` completed with ``epsilon`` and what it rests on (checked inputs)."""
    raise checks.CheckError(f"analysis {self.name!r} gives no epsilon of its own here")

  def epsilon(self, c: Optional[np.ndarray], schema, noise_multiplier: float, delta: float,
              accountant_name: str = "exact", sampling_prob: Optional[float] = None) -> float:
    """ε at δ of the run: an upper bound (``bound``), every input checked here."""
    z = checks.noise_multiplier(noise_multiplier, "noise_multiplier")
    delta = checks.delta(delta, "delta")
    accountant(accountant_name)
    schema = check_schema(schema)
    if c is not None:
      c = check_encoder(c)
      schema.check(c.shape[1])
    base = {"noise_multiplier": z, "delta": delta, "analysis": self.name}
    return self.record(base, c, schema, z, delta, accountant_name, sampling_prob,
                       None)["epsilon"]

  def search_sensitivity(self, c: np.ndarray, schema,
                         options: Dict[str, Any]) -> float:
    """The sensitivity of the unamplified bound this analysis also reports (the
    calibration starts from that Gaussian's z, valid for every analysis)."""
    return sensitivity_report(c, schema)["value"]

  def words(self, record: Mapping[str, Any], ratio: str, accountant_words: str,
            sensitivity_words: str) -> str:
    """The analysis behind ``record['epsilon']``, in the statement's words."""
    raise NotImplementedError

  def dp_event(self, record: Mapping[str, Any]) -> Optional[dp_accounting.DpEvent]:
    """The dp_accounting event this analysis bounds ``record``'s run by, where dp_accounting
    can express it (None: it cannot, e.g. MMCC's or random allocation's dominating pairs)."""
    del record
    return None


@dataclasses.dataclass(frozen=True)
class Unamplified(Analysis):
  """One Gaussian mechanism at z / sens (Denisov et al. 2022, Thm 4.1; arXiv:2211.06530)."""
  name: ClassVar[str] = "none"
  label: ClassVar[str] = "unamplified Gaussian mechanism at z / sensitivity"
  # The citation by what the schema's pattern is (``Participation.theorem_key``-like groups).
  THEOREMS: ClassVar[Dict[str, str]] = {
      "single": "Denisov et al. 2022, arXiv:2202.08312, Thm 4.1: one Gaussian mechanism with "
                "multiplier z / sensitivity",
      "multi": "Choquette-Choo et al. 2023, arXiv:2211.06530: one Gaussian mechanism with "
               "multiplier z / sensitivity under the participation schema",
      "balls_in_bins": "one Gaussian mechanism with multiplier z / sensitivity over the "
                       "b-cyclic patterns {j, j+b, ...} of fixed-bin balls-in-bins "
                       "(Choquette-Choo et al. 2024, arXiv:2410.06266; Chua et al. 2024, "
                       "arXiv:2412.16802), the bin given: not amplified",
      "random_allocation": "one Gaussian mechanism with multiplier z / sensitivity over "
                           "every pattern of one round per epoch (random allocation, "
                           "arXiv:2412.16802), unamplified",
  }
  # What an unamplified record of these schemas leaves out (said with every such ε).
  NOT_AMPLIFIED: ClassVar[Dict[str, str]] = {
      "balls_in_bins": "unamplified bound of fixed-bin balls-in-bins (the user's rounds "
                       "given its bin, b apart); amplification 'amplified_fixed_bin' "
                       "(tff_mf.accounting.fixed_bin) bounds the secrecy of the bin",
      "random_allocation": "unamplified bound; amplification 'amplified_allocation' "
                           "(tff_mf.accounting.random_allocation, after arXiv:2601.21636) bounds random "
                           "allocation with amplification",
  }
  theorem: ClassVar[str] = THEOREMS["multi"]

  def record(self, record, c, schema, z, delta, accountant_name, sampling_prob,
             known_sensitivity):
    if sampling_prob is not None:
      raise checks.CheckError("sampling_prob applies only to the amplified analyses "
                              "(amplification 'mmcc' or 'amplified_banded')")
    report = _known_or_report(c, schema, known_sensitivity)
    eps = gaussian_epsilon(z, delta, accountant_name, report["value"])
    record.update(epsilon=eps, accountant=accountant_name, sensitivity=report["value"],
                  sensitivity_exact=report["exact"], sensitivity_method=report["method"],
                  exact=bool(accountant(accountant_name).exact and report["exact"]),
                  theorem=self.THEOREMS.get(schema.kind, self.THEOREMS["multi"]))
    if schema.kind in self.NOT_AMPLIFIED:
      record["amplification"] = self.NOT_AMPLIFIED[schema.kind]
    return record

  def dp_event(self, record):
    return dp_accounting.GaussianDpEvent(record["noise_multiplier"] / record["sensitivity"])

  def words(self, record, ratio, accountant_words, sensitivity_words):
    words = (f"no amplification by sampling: the whole run is one Gaussian mechanism with "
             f"noise multiplier {ratio}, {sensitivity_words} (Denisov et al. 2022, "
             f"arXiv:2202.08312, Thm 4.1; Choquette-Choo et al. 2023, arXiv:2211.06530); "
             f"epsilon by {accountant_words}")
    note = record.get("amplification")  # what an unamplified record of its schema leaves out
    return f"{words} ({note})" if note else words


@dataclasses.dataclass(frozen=True)
class PoissonAmplified(Analysis):
  """Amplification by b-min-sep Poisson sampling: each user joins each round of its residue
  class mod b with probability p (p of arXiv:2306.08153; MMCC App D writes b·p)."""
  amplified: ClassVar[bool] = True
  poisson: ClassVar[bool] = True
  in_words: ClassVar[str] = ""  # the bound's name in the statement (its name when empty)
  pld_discretization: float = PLD_DISCRETIZATION

  def applies(self, c, schema):
    if c is None:
      return f"amplification {self.name!r} needs the encoder C (a matrix or a mechanism)"
    return check_schema(schema).not_poisson

  def search_sensitivity(self, c, schema, options):
    return poisson_sensitivity(c, sampling_min_sep(schema, c.shape[1]))[0]

  def record(self, record, c, schema, z, delta, accountant_name, sampling_prob,
             known_sensitivity):
    if c is None:
      raise checks.CheckError(f"amplification {self.name!r} needs the encoder C (a matrix or a "
                              "mechanism)")
    if sampling_prob is None:
      raise checks.CheckError(f"amplification {self.name!r} needs sampling_prob")
    p = checks.probability(sampling_prob, "sampling_prob")
    discretization = checks.positive_float(self.pld_discretization, "pld_discretization")
    n = c.shape[1]
    b = sampling_min_sep(schema, n)
    if schema.for_rounds(n) != schema:  # min_sep without its cap: the ⌈n/b⌉ that fit
      schema = schema.for_rounds(n)
      record.update(participation=schema.label, schema=schema.as_dict())
    sens, sens_exact = poisson_sensitivity(c, b)
    unamplified = gaussian_epsilon(z, delta, accountant_name, sens)
    record.update(sampling_prob=p, min_sep=b, sensitivity=sens, sensitivity_exact=sens_exact,
                  sensitivity_method=f"every round of a residue class mod {b} joined: "
                                     "sqrt(max_r sum |X_jj'|) over the class, X = C^T C",
                  unamplified_epsilon=unamplified, unamplified_accountant=accountant_name,
                  exact=False, theorem=self.theorem)
    _best_of(record, self.amplified_epsilon(record, c, b, z, delta, p, discretization,
                                            unamplified), unamplified)
    return record

  def amplified_epsilon(self, record: Dict[str, Any], c: np.ndarray, b: int, z: float,
                        delta: float, p: float, discretization: float,
                        unamplified: float) -> float:
    raise NotImplementedError

  def words(self, record, ratio, accountant_words, sensitivity_words):
    if record.get("bound") == "amplified":
      b, p = record.get("min_sep"), record.get("sampling_prob")
      sampling = (f"amplification by Poisson sampling (a client joins each round of its "
                  f"residue class mod {b} with probability {fmt(p)})")
      return f"{sampling}: {self.amplified_words(record)}"
    return (f"no amplification (the {self.in_words or self.name} amplified bound was larger): "
            f"one Gaussian mechanism at {ratio}, sens with every eligible round of a client joined "
            f"(residue classes mod {record.get('min_sep')}); epsilon by {accountant_words}")

  def amplified_words(self, record: Mapping[str, Any]) -> str:
    raise NotImplementedError

  def dp_event(self, record):
    if record.get("bound") == "unamplified":  # the Gaussian at z / sens gave the smaller ε
      return dp_accounting.GaussianDpEvent(record["noise_multiplier"] / record["sensitivity"])
    return self.amplified_dp_event(record)

  def amplified_dp_event(self, record: Mapping[str, Any]) -> Optional[dp_accounting.DpEvent]:
    """The amplified bound's event where dp_accounting expresses it (None: MMCC's is not)."""
    del record
    return None


@dataclasses.dataclass(frozen=True)
class AmplifiedBanded(PoissonAmplified):
  """Amplified banded MF (Choquette-Choo et al. 2023, arXiv:2306.08153, Thm 4): a C with at
  most b bands is dominated by ⌈n/b⌉-fold composition of the Poisson-subsampled Gaussian
  with multiplier z / γ(C)."""
  name: ClassVar[str] = "amplified_banded"
  in_words: ClassVar[str] = "banded"
  chosen_because: ClassVar[str] = "C has at most b bands"
  label: ClassVar[str] = "amplified banded MF (Poisson sampling within residue classes)"
  theorem: ClassVar[str] = (
      "Choquette-Choo et al. 2023, arXiv:2306.08153, Thm 4: ceil(n/b)-fold composition "
      "of the Poisson-subsampled Gaussian with multiplier z / max column norm")

  def applies(self, c, schema):
    reason = super().applies(c, schema)
    if reason is None and band_count(c) > check_schema(schema).min_sep:
      return MMCC.chosen_because
    return reason

  def amplified_epsilon(self, record, c, b, z, delta, p, discretization, unamplified):
    bands = band_count(c)
    if bands > b:
      raise AccountingError(
          f"the amplified banded analysis needs C with at most b = {b} non-zero bands (the "
          f"sampling's min_sep); this C has {bands}. Use amplification 'mmcc' for other C")
    gamma = derived(c, "gamma", lambda: checks.gamma(c))
    rounds = -(-c.shape[1] // b)
    try:
      amplified, interval = pld_gaussian_epsilon(z / gamma, delta, p, rounds, discretization)
    except AccountingError as e:
      raise AccountingError(f"{e}; the unamplified bound is epsilon = {unamplified:.6g}") \
          from None
    record.update(accountant="pld", bands=bands, compositions=rounds, column_norm=gamma,
                  pld_discretization=interval)
    return amplified

  def amplified_dp_event(self, record):
    # Thm 4's dominating mechanism, as pld_gaussian_epsilon composes it.
    return dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        record["sampling_prob"], dp_accounting.GaussianDpEvent(
            record["noise_multiplier"] / record["column_norm"])), record["compositions"])

  def amplified_words(self, record):
    return (f"amplified banded MF (Choquette-Choo et al. 2023, arXiv:2306.08153, "
            f"Thm 4), the {record.get('compositions')}-fold composition of the "
            f"Poisson-subsampled Gaussian with noise multiplier z/max column norm = "
            f"{fmt(record.get('noise_multiplier'))}/{fmt(record.get('column_norm'))}, "
            f"composed via PLD (dp_accounting, pessimistic)")


# MMCC's own fields that the record already holds under one name (epsilon is the
# record's amplified_epsilon), and those renamed for the meaning they have in a record.
_MMCC_SHARED = ("accountant", "delta", "epsilon", "min_sep", "n", "m", "noise_multiplier",
                "pld_discretization")
_MMCC_RENAMED = {
    "sampling_prob": "average_sampling_rate",  # p / b, MMCC App D's p; the record's is p
    "sensitivity": "column_norm",  # γ(C); the record's sensitivity is the unamplified one's
    "unamplified_epsilon": "single_participation_reference_epsilon",  # not a bound here
}


def mmcc_details(result) -> Dict[str, Any]:
  """MMCC's solver details for an ``epsilon_for`` record: each field once per meaning."""
  return {_MMCC_RENAMED.get(k, k): v for k, v in result.as_dict().items()
          if k not in _MMCC_SHARED}


@dataclasses.dataclass(frozen=True)
class MMCC(PoissonAmplified):
  """MMCC (Choquette-Choo et al. 2024, arXiv:2310.15526, Fig 1; b-min-sep: App D, Fig 6) at
  the average rate p / b, for any lower-triangular non-negative C (``tff_mf.accounting.mmcc``)."""
  name: ClassVar[str] = "mmcc"
  chosen_because: ClassVar[str] = "C has more than b bands"
  label: ClassVar[str] = "MMCC (Poisson sampling within residue classes)"
  theorem: ClassVar[str] = "Choquette-Choo et al. 2024 (MMCC), arXiv:2310.15526, Fig 1 and App D"
  non_adaptive: bool = False  # the data are fixed in advance (signed or non-triangular C)
  mmcc_options: Optional[Mapping[str, Any]] = None  # further keywords of tff_mf.accounting.mmcc.mmcc

  def amplified_epsilon(self, record, c, b, z, delta, p, discretization, unamplified):
    from tff_mf.accounting import mmcc  # pylint: disable=g-import-not-at-top
    options = dict(self.mmcc_options or {})
    try:
      result = mmcc.mmcc(c, p / b, z, delta, min_sep=b, non_adaptive=self.non_adaptive,
                         pld_discretization=discretization, **options)
    except (mmcc.MMCCNumericError, ArithmeticError, RuntimeError, MemoryError) as e:
      raise AccountingError(
          f"MMCC could not analyze this run ({e}); the unamplified bound is epsilon = "
          f"{unamplified:.6g}") from None
    record.update(accountant="mmcc", mmcc=mmcc_details(result),
                  pld_discretization=result.pld_discretization)
    return result.epsilon

  def amplified_words(self, record):
    return (f"MMCC (Choquette-Choo et al. 2024, arXiv:2310.15526, App D) for C with "
            f"noise multiplier z = {fmt(record.get('noise_multiplier'))}, the rows' "
            f"mixture-of-Gaussians PLDs composed via PLD (dp_accounting, pessimistic)")


@dataclasses.dataclass(frozen=True)
class RandomAllocation(Analysis):
  """Amplification by random allocation (one uniformly random round per epoch, drawn anew
  each epoch) for lower-triangular non-negative square C: Rényi bounds after Schuchardt &
  Kalinin 2026 (arXiv:2601.21636, Sec 3); for near-diagonal C the PLD of a dominating
  comparison pair (Kahane 1985; Feldman & Shenfeld 2026, arXiv:2602.17284; for C = a·I the
  pair itself). ``tff_mf.accounting.random_allocation``."""
  name: ClassVar[str] = "amplified_allocation"
  kind: ClassVar[str] = "random_allocation"  # the participation kind it analyzes
  label: ClassVar[str] = ("random-allocation amplification (Renyi bounds after "
                          "arXiv:2601.21636; for near-diagonal C a comparison pair's PLD, "
                          "arXiv:2602.17284)")
  theorem: ClassVar[str] = (
      "random-allocation amplification: Renyi divergence bounds of the pair "
      "N(0, z^2 I) vs E_pi N(C 1_pi, z^2 I) at integer orders (collision "
      "dynamic program and decoupling for remove, Jensen for add), after "
      "Schuchardt & Kalinin 2026, arXiv:2601.21636, Sec 3; converted by "
      "Canonne, Kamath, Steinke 2020, arXiv:2004.00010, Prop 12")
  theorem_pld: ClassVar[str] = (
      "random-allocation privacy-loss distribution (Feldman & Shenfeld 2026, "
      "arXiv:2602.17284) of a pair dominating C's by Kahane's convexity inequality (1985; "
      "C = a I: the pair itself): the law of the likelihood ratio on a geometric grid, "
      "every loss rounded up, epochs composed by dp_accounting's pessimistic PLDs")
  amplified: ClassVar[bool] = True
  field: ClassVar[str] = "random_allocation"  # the record's field of the bound's details
  bound_name: ClassVar[str] = "random-allocation Renyi bound after arXiv:2601.21636"
  analyzes: ClassVar[str] = ("random_allocation participation (a new random round each "
                             "epoch)")

  def applies(self, c, schema):
    schema = check_schema(schema)
    if c is None:
      return (f"amplification {self.name!r} needs the encoder C (a matrix or a mechanism)")
    if schema.kind != self.kind:
      return f"amplification {self.name!r} analyzes {self.analyzes}, not {schema.describe()}"
    return None

  def search_sensitivity(self, c, schema, options):
    known = options.pop("known_sensitivity", None) or sensitivity_report(c, schema)
    options["known_sensitivity"] = known
    return known["value"]

  def amplified_bound(self, c, schema, z: float, delta: float, sens: float):
    """The amplified bound's details (``epsilon``, ``method``, ...), the record's ``field``."""
    from tff_mf.accounting import random_allocation  # pylint: disable=g-import-not-at-top
    return random_allocation.epsilon(c, schema.epochs, z, delta, sensitivity=sens)

  def record(self, record, c, schema, z, delta, accountant_name, sampling_prob,
             known_sensitivity):
    reason = self.applies(c, schema)
    if reason is not None:
      raise checks.CheckError(reason)
    if sampling_prob is not None:
      raise checks.CheckError(f"sampling_prob does not apply to {self.name} (a user's rounds "
                              "are allocated, not sampled)")
    report = _known_or_report(c, schema, known_sensitivity)
    sens = float(report["value"])
    unamplified = gaussian_epsilon(z, delta, accountant_name, sens)
    bound = self.amplified_bound(c, schema, z, delta, sens)
    amplified = bound.pop("epsilon")
    record.update(sensitivity=sens, sensitivity_exact=report["exact"],
                  sensitivity_method=report["method"], unamplified_epsilon=unamplified,
                  unamplified_accountant=accountant_name, theorem=self.theorem,
                  **{self.field: bound})
    _best_of(record, amplified, unamplified)
    if record["bound"] == "amplified":  # else ε is the unamplified accountant's, as recorded
      pld = bound["method"] == "pld"
      record.update(accountant="pld" if pld else "rdp", exact=False)
      if pld:
        record["theorem"] = self.theorem_pld
    return record

  def words(self, record, ratio, accountant_words, sensitivity_words):
    bound = record.get(self.field) or {}
    z = fmt(record.get("noise_multiplier"))
    if record.get("bound") == "amplified":
      pld = bound.get("method") == "pld"
      how = self.pld_words(bound, z) if pld else self.renyi_words(bound, z)
      return f"{self.scheme_words(bound)}: {how}"
    return (f"no amplification (the {self.bound_name} was larger): one Gaussian mechanism at "
            f"{ratio}, {sensitivity_words}; epsilon by {accountant_words}")

  def scheme_words(self, bound: Mapping[str, Any]) -> str:
    del bound
    return ("amplification by random allocation (one uniformly random round per epoch, drawn "
            "anew each epoch)")

  def pld_words(self, bound: Mapping[str, Any], z: str) -> str:
    pld = bound.get("pld") or {}
    common = (f"; a Gaussian at squared sensitivity {fmt(pld.get('common'))} composed in, "
              f"the pair dominating C's by Kahane's convexity inequality (1985)"
              if pld.get("common") else "")
    return (f"the privacy-loss distribution of the pair N(0, z^2 I) vs the mixture over the "
            f"round of N(e_round, z^2 I) at squared sensitivity {fmt(pld.get('hidden'))}, "
            f"noise multiplier z = {z} (Feldman & Shenfeld 2026, arXiv:2602.17284; "
            f"tff_mf.accounting.allocation_pld, losses rounded up), {bound.get('epochs')} epochs "
            f"composed via PLD (dp_accounting, pessimistic){common}")

  def renyi_words(self, bound: Mapping[str, Any], z: str) -> str:
    return (f"Renyi divergence bounds of the pair N(0, z^2 I) vs E_pi N(C 1_pi, z^2 I) for C "
            f"with noise multiplier z = {z} at order {bound.get('order')} "
            f"(tff_mf.accounting.random_allocation, after Schuchardt & Kalinin 2026, arXiv:2601.21636, "
            f"Sec 3), converted to (epsilon, delta) by Canonne, Kamath, Steinke 2020, "
            f"arXiv:2004.00010, Prop 12")


@dataclasses.dataclass(frozen=True)
class FixedBin(RandomAllocation):
  """Amplification by the secret bin of fixed-bin balls-in-bins (arXiv:2410.06266,
  arXiv:2412.16802) for lower-triangular non-negative square C: Rényi bounds of the mixture
  over bins and a comparison pair's PLD (``tff_mf.accounting.fixed_bin``)."""
  name: ClassVar[str] = "amplified_fixed_bin"
  kind: ClassVar[str] = "balls_in_bins"
  field: ClassVar[str] = "fixed_bin"
  bound_name: ClassVar[str] = "fixed-bin balls-in-bins bound of tff_mf.accounting.fixed_bin"
  analyzes: ClassVar[str] = "balls_in_bins participation (one secret bin for the whole run)"
  label: ClassVar[str] = ("fixed-bin balls-in-bins amplification (Renyi bounds of the mixture "
                          "over the secret bin; a comparison pair's PLD)")
  theorem: ClassVar[str] = (
      "fixed-bin balls-in-bins amplification: Renyi divergence bounds of the pair "
      "N(0, z^2 I) vs (1/b) sum_j N(C 1_{S_j}, z^2 I) at integer orders (Hoeffding "
      "decoupling and collisions for remove, Jensen for add; the Renyi DP over bins of "
      "Schuchardt & Kalinin 2026, arXiv:2601.21636), converted by Canonne, Kamath, Steinke "
      "2020, arXiv:2004.00010, Prop 12")
  theorem_pld: ClassVar[str] = (
      "fixed-bin balls-in-bins amplification: the pair of the covariance A 11^T + B I >= "
      "the bins' Gram matrix dominates (Kahane's convexity inequality, 1985), a Gaussian "
      "composed with one epoch of random allocation, its PLD rounded up (after Feldman & "
      "Shenfeld 2026, arXiv:2602.17284) and composed by dp_accounting (pessimistic)")

  def amplified_bound(self, c, schema, z, delta, sens):
    from tff_mf.accounting import fixed_bin  # pylint: disable=g-import-not-at-top
    return fixed_bin.epsilon(c, schema.epochs, z, delta, sensitivity=sens)

  def scheme_words(self, bound):
    return (f"amplification by the secret bin of fixed-bin balls-in-bins (one of "
            f"{bound.get('bins')} bins drawn once, every round of it)")

  def pld_words(self, bound, z):
    pld = bound.get("pld") or {}
    return (f"the privacy-loss distribution of a dominating pair (Kahane's convexity "
            f"inequality, 1985): a Gaussian at squared sensitivity {fmt(pld.get('common'))} "
            f"composed with one epoch of random allocation at squared sensitivity "
            f"{fmt(pld.get('hidden'))}, noise multiplier z = {z} (tff_mf.accounting.fixed_bin, "
            f"tff_mf.accounting.allocation_pld, losses rounded up), composed via PLD (dp_accounting, "
            f"pessimistic)")

  def renyi_words(self, bound, z):
    return (f"Renyi divergence bounds of the pair N(0, z^2 I) vs the mixture over bins of "
            f"N(C 1_bin, z^2 I) for C with noise multiplier z = {z} at order "
            f"{bound.get('order')} (tff_mf.accounting.fixed_bin; the Renyi DP over bins of Schuchardt & "
            f"Kalinin 2026, arXiv:2601.21636), converted to (epsilon, delta) by Canonne, "
            f"Kamath, Steinke 2020, arXiv:2004.00010, Prop 12")


@dataclasses.dataclass(frozen=True)
class AdaptiveClipping(Analysis):
  """The unamplified Gaussian composed with the adaptive clip norm's k count queries (Andrew
  et al. 2021, arXiv:1905.03871): one Gaussian at 1/μ, μ² = (sens/z)² + k·(½/σ_b)²; the
  record is built by ``tff_mf.mechanisms`` (``tff_mf.accounting.adaptive_clipping``)."""
  name: ClassVar[str] = "adaptive"
  counts_clipping: ClassVar[bool] = True
  label: ClassVar[str] = ("unamplified Gaussian at z / sensitivity composed with the adaptive "
                          "clip norm's count queries (one Gaussian at 1/mu)")
  selectable: ClassVar[bool] = False

  def dp_event(self, record):
    k = record["count_participations"]
    return dp_accounting.ComposedDpEvent([
        dp_accounting.GaussianDpEvent(record["noise_multiplier"] / record["sensitivity"]),
        dp_accounting.GaussianDpEvent(record["clipped_count_stddev"] / (0.5 * math.sqrt(k)))])

  def words(self, record, ratio, accountant_words, sensitivity_words):
    return (f"no amplification by sampling: the matrix mechanism's Gaussian at {ratio} "
            f"({sensitivity_words}) composed with the "
            f"{record.get('count_participations')} count queries of adaptive clipping (noise "
            f"std {fmt(record.get('clipped_count_stddev'))}, sensitivity 1/2 each) as one "
            f"Gaussian with noise multiplier {fmt(record.get('effective_noise_multiplier'))}; "
            f"epsilon by {accountant_words}")


@dataclasses.dataclass(frozen=True)
class MonteCarlo(Analysis):
  """An ESTIMATE of ε of b-min-sep Poisson sampling's residue-class pair (Monte-Carlo
  accounting, Choquette-Choo et al. 2024, arXiv:2410.06266; ``tff_mf.accounting.mixture_pair``): it
  carries sampling error, is labelled as such and is never a run's ε."""
  name: ClassVar[str] = "monte_carlo"
  label: ClassVar[str] = ("ESTIMATE of the epsilon of residue class 0's first rounds "
                          "(Monte-Carlo accounting, arXiv:2410.06266): sampling error, not a "
                          "bound, never the run's epsilon")
  theorem: ClassVar[str] = "Monte-Carlo accounting, arXiv:2410.06266 (an estimate, not a bound)"
  bound: ClassVar[bool] = False
  selectable: ClassVar[bool] = False
  samples: int = 1_000_000

  def record(self, record, c, schema, z, delta, accountant_name, sampling_prob,
             known_sensitivity):
    raise checks.CheckError("monte_carlo is an ESTIMATE, not an upper bound: never a run's "
                            "epsilon (its estimate() is reported beside the bounds)")

  def estimate(self, c, sampling_prob: float, noise_multiplier: float, delta: float,
               min_sep: int) -> Dict[str, Any]:
    """The estimate's fields for a record (``epsilon_estimate``, never ``epsilon``)."""
    from tff_mf.accounting import mixture_pair  # pylint: disable=g-import-not-at-top
    found = mixture_pair.monte_carlo_epsilon(c, sampling_prob, noise_multiplier, delta,
                                             samples=self.samples, min_sep=min_sep)
    return dict(epsilon_estimate=found["epsilon"], samples=found["samples"],
                seed=found["seed"], tail_hits=found["tail_hits"], label=self.label)


@dataclasses.dataclass(frozen=True)
class MonteCarloBound(Analysis):
  """Monte-Carlo accounting with a proof (``tff_mf.accounting.monte_carlo``): the dominating pair of C ≥ 0
  (arXiv:2410.06266) under cyclic Poisson (min_sep as sampled here) or fixed-bin
  balls-in-bins, sampled; δ bounded by Chernoff-Hoeffding (Hoeffding 1963, Thm 1). Its ε
  holds with probability ≥ 1 − β over the accountant's own draws, and every record and
  statement carries β beside it."""
  name: ClassVar[str] = "monte_carlo_bound"
  label: ClassVar[str] = ("Monte-Carlo accounting with a proof (arXiv:2410.06266; "
                          "Chernoff-Hoeffding bound on delta)")
  theorem: ClassVar[str] = (
      "Monte-Carlo accounting of the dominating pair N(0, z^2 I) vs the mixture over join "
      "patterns of N(C x, z^2 I) (Choquette-Choo, Ganesh, Haque, Steinke, Thakurta 2024, "
      "arXiv:2410.06266), delta bounded by the Chernoff-Hoeffding inequality (Hoeffding "
      "1963, Thm 1), calibration by the ordered sweep of arXiv:2602.09338, Alg. 5")
  amplified: ClassVar[bool] = True
  high_probability: ClassVar[bool] = True  # its ε holds with probability ≥ 1 − β
  calibrates_itself: ClassVar[bool] = True  # a search over fresh draws would not be valid
  samples: int = 1_000_000
  failure_probability: float = 1e-3
  seed: Optional[int] = None  # None: OS entropy
  other_events: Tuple[Any, ...] = ()  # dp_accounting DpEvents composed in

  def applies(self, c, schema):
    schema = check_schema(schema)
    if c is None:
      return f"amplification {self.name!r} needs the encoder C (a matrix or a mechanism)"
    if schema.not_poisson is not None and not schema.marks_fixed_bin:
      return (f"amplification {self.name!r} analyzes min_sep / fixed_epoch Poisson sampling "
              f"and fixed-bin balls_in_bins, not {schema.describe()}")
    return None

  def epsilon(self, c, schema, noise_multiplier, delta, accountant_name="exact",
              sampling_prob=None):
    """Refused: a bare ε would lose its failure probability."""
    raise checks.CheckError(
        f"{self.name}'s epsilon holds with probability >= 1 - beta over the accountant's own "
        "sampling and is never given without that label: use tff_mf.accounting.epsilon_for "
        "(its record carries failure_probability beside epsilon)")

  def _unamplified(self, c, schema, z, delta, accountant_name, sampling_prob, known):
    """(ε, sensitivity fields) of the same sampling without amplification."""
    if schema.marks_fixed_bin:
      report = _known_or_report(c, schema, known)
      sens, exact, method = report["value"], report["exact"], report["method"]
    else:
      b = sampling_min_sep(schema, c.shape[1])
      sens, exact = poisson_sensitivity(c, b)
      method = (f"every round of a residue class mod {b} joined: sqrt(max_r sum |X_jj'|) over "
                "the class, X = C^T C")
    fields = dict(sensitivity=sens, sensitivity_exact=exact, sensitivity_method=method,
                  unamplified_accountant=accountant_name)
    return gaussian_epsilon(z, delta, accountant_name, sens), fields

  def search_sensitivity(self, c, schema, options):
    schema = check_schema(schema)
    if schema.marks_fixed_bin:
      return sensitivity_report(c, schema)["value"]
    return poisson_sensitivity(c, sampling_min_sep(schema, c.shape[1]))[0]

  def _options(self):
    return dict(samples=self.samples, failure_probability=self.failure_probability,
                seed=self.seed, other_events=self.other_events)

  def _check(self, c, schema, sampling_prob):
    reason = self.applies(c, schema)
    if reason is not None:
      raise checks.CheckError(reason)
    if self.other_events:
      raise checks.CheckError(
          f"amplification {self.name!r} composes other_events only in "
          "tff_mf.accounting.monte_carlo.epsilon; its unamplified bound here would leave them out")
    if not schema.marks_fixed_bin:
      if sampling_prob is None:
        raise checks.CheckError(f"amplification {self.name!r} under {schema.describe()} (Poisson "
                                "sampling of each eligible round) needs sampling_prob",
                                arguments=("sampling_prob",))
      record_b = sampling_min_sep(schema, c.shape[1])
      return {"sampling_prob": checks.probability(sampling_prob, "sampling_prob"),
              "min_sep": record_b}
    return {}

  def record(self, record, c, schema, z, delta, accountant_name, sampling_prob,
             known_sensitivity):
    from tff_mf.accounting import monte_carlo  # pylint: disable=g-import-not-at-top
    record.update(self._check(c, schema, sampling_prob))
    unamplified, fields = self._unamplified(c, schema, z, delta, accountant_name,
                                            sampling_prob, known_sensitivity)
    found = monte_carlo.epsilon(c, schema, z, delta, sampling_prob=sampling_prob,
                                **self._options())
    # ε lives in the record once, beside its β; the point estimate (no bound) stays out.
    amplified = found.pop("epsilon")
    found.pop("point_estimate")
    record.update(fields, unamplified_epsilon=unamplified, exact=False, theorem=self.theorem,
                  failure_probability=found["failure_probability"], monte_carlo=found,
                  epsilon_label=high_probability_words(found["failure_probability"]))
    _best_of(record, amplified, unamplified)
    return record

  def calibrate(self, c, schema, target: float, delta: float, z_start: float,
                accountant_name: str, sampling_prob: Optional[float],
                record: Dict[str, Any]) -> Dict[str, Any]:
    """``record`` at the smallest z of ``tff_mf.accounting.monte_carlo.calibrate``'s sweep from
    ``z_start`` (a valid unamplified z): ε is the target, holding with probability ≥ 1 − β."""
    from tff_mf.accounting import monte_carlo  # pylint: disable=g-import-not-at-top
    record.update(self._check(c, schema, sampling_prob))
    found = monte_carlo.calibrate(c, schema, target, delta, z_start,
                                  sampling_prob=sampling_prob, **self._options())
    z = found["noise_multiplier"] or z_start
    unamplified, fields = self._unamplified(c, schema, z, delta, accountant_name,
                                            sampling_prob, None)
    record.update(fields, noise_multiplier=z, unamplified_epsilon=unamplified, exact=False,
                  theorem=self.theorem, failure_probability=found["failure_probability"],
                  monte_carlo=found,
                  epsilon_label=high_probability_words(found["failure_probability"]))
    _best_of(record, target if found["noise_multiplier"] else math.inf, unamplified)
    return record

  def words(self, record, ratio, accountant_words, sensitivity_words):
    beta = record.get("failure_probability")
    if record.get("bound") != "amplified":
      return (f"no amplification (the Monte-Carlo bound was larger): one Gaussian mechanism "
              f"at {ratio}, {sensitivity_words}; epsilon by {accountant_words}")
    found = record.get("monte_carlo") or {}
    pair = ("the mixture over the b bins of N(C 1_bin, z^2 I) (fixed-bin balls-in-bins)"
            if found.get("pair") == "bins" else
            f"the mixture over join patterns of N(C x, z^2 I) of each residue class mod "
            f"{record.get('min_sep')} (Poisson sampling, probability "
            f"{fmt(record.get('sampling_prob'))})")
    return (f"Monte-Carlo accounting with a proof: {found.get('samples')} draws of the "
            f"privacy loss of the dominating pair N(0, z^2 I) vs {pair}, z = "
            f"{fmt(record.get('noise_multiplier'))} (arXiv:2410.06266); delta bounded by the "
            f"Chernoff-Hoeffding inequality (Hoeffding 1963, Thm 1), so epsilon "
            f"{high_probability_words(beta)}; draws seeded from "
            f"{found.get('seed_source')} (seed {found.get('seed')})")


@dataclasses.dataclass(frozen=True)
class DiscreteGaussian(Analysis):
  """The discrete Gaussian on the integer release round(γ·C·x) (``tff_mf.noise.discrete_gaussian``):
  ρ-zCDP with ρ = (sens·(1 + η))²/(2z²), η the accounted rounding inflation (Canonne, Kamath,
  Steinke 2020, arXiv:2004.00010, Thm 14), as (ε, δ) by their Cor. 13; never amplified. The
  record is built by ``tff_mf.mechanisms``."""
  name: ClassVar[str] = "discrete_gaussian"
  label: ClassVar[str] = ("discrete Gaussian on the integer release: zCDP (Canonne, Kamath, "
                          "Steinke 2020, arXiv:2004.00010, Thm 14) as (epsilon, delta) by "
                          "Cor 13, unamplified")
  theorem: ClassVar[str] = (
      "Canonne, Kamath, Steinke 2020, arXiv:2004.00010, Thm 14 (the multivariate discrete "
      "Gaussian with l2 sensitivity Delta and variance parameter sigma^2 is "
      "Delta^2/(2 sigma^2)-zCDP) and Cor 13 (zCDP to (epsilon, delta))")
  selectable: ClassVar[bool] = False

  def words(self, record, ratio, accountant_words, sensitivity_words):
    gamma, sigma = record.get("granularity"), record.get("discrete_gaussian_sigma")
    numeric = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
    gamma_words = (f"granularity gamma = {fmt(gamma)}" if numeric(gamma)
                   else "granularity gamma chosen per model size")
    sigma_words = (f" (sigma = {fmt(sigma)} integer units)" if numeric(sigma) else "")
    share = record.get("rounding_share")
    share_words = (f" (this run's rounding: {100 * share:.2g}%)" if numeric(share) else "")
    return (f"discrete Gaussian noise N_Z(0, sigma^2), sigma = z gamma clip{sigma_words}, on the "
            f"integer release round(gamma C x), {gamma_words}, sensitivity inflated by at most "
            f"{100 * record.get('rounding_inflation', 0):.2g}% for rounding and float64 "
            f"clipping and summation{share_words}; no "
            f"amplification by sampling: the whole run is rho-zCDP with rho = "
            f"{fmt(record.get('rho'))} at {ratio}, {sensitivity_words} (Canonne, Kamath, "
            f"Steinke 2020, arXiv:2004.00010, Thm 14); epsilon by their Cor 13 at order "
            f"{fmt(record.get('order'))}")


def high_probability_words(beta) -> str:
  """How an ε that holds with probability ≥ 1 − β is labelled wherever it appears: β and the
  condition that the seed was fixed before looking (``monte_carlo.SEED_CONDITION``)."""
  from tff_mf.accounting import monte_carlo  # pylint: disable=g-import-not-at-top
  return (f"holds with probability >= 1 - {fmt(beta)} over the accountant's own sampling, "
          f"{monte_carlo.SEED_CONDITION}")


REGISTRY: Dict[str, type] = {}
# Former names of analyses (one name, one meaning: "banded" is also a strategy,
# "random_allocation" and "balls_in_bins" are participation kinds). A stored record that names
# one reads as the analysis it named (``of_record``); a caller who passes one is refused in
# one line naming the new name (``analysis_class``). A name never changes meaning, and a new
# thing gets a new name (dp_accounting's rule). Former name: (new name, what it names now).
RENAMED: Dict[str, Tuple[str, str]] = {
    "banded": ("amplified_banded", "a strategy"),
    "random_allocation": ("amplified_allocation", "a participation kind"),
    "balls_in_bins": ("amplified_fixed_bin", "a participation kind")}


def register(cls: type) -> type:
  """Adds an analysis class to ``REGISTRY`` under its name (one name, one class)."""
  if cls.name in REGISTRY:
    raise ValueError(f"analysis {cls.name!r} is registered twice")
  REGISTRY[cls.name] = cls
  return cls


for _cls in (Unamplified, MMCC, AmplifiedBanded, RandomAllocation, FixedBin,
             AdaptiveClipping, MonteCarlo, MonteCarloBound, DiscreteGaussian):
  register(_cls)

# The ``amplification=`` choices of ``tff_mf.accounting`` (bounds on a run's ε).
SELECTABLE = tuple(name for name, cls in REGISTRY.items() if cls.selectable and cls.bound)
# Tried in this order when training picks the amplified analysis itself.
AUTOMATIC = (RandomAllocation, FixedBin, AmplifiedBanded, MMCC)


def renamed_refusal(former: str, spell=repr) -> str:
  """The one-line refusal of a former analysis name (``RENAMED``), each name ``spell``-ed (a
  command line spells them as ``--amplification x``)."""
  new, now = RENAMED[former]
  return (f"{spell(former)} was renamed {spell(new)} (one name, one meaning: {former!r} is "
          f"{now}); use {spell(new)}")


def analysis_class(name) -> type:
  """The selectable analysis called ``name`` (None: "none"; an ``Analysis``: its class);
  CheckError otherwise."""
  if isinstance(name, Analysis):
    name = name.name
  name = "none" if name is None else name
  if name in RENAMED:
    raise checks.CheckError(f"amplification {renamed_refusal(name)}")
  if name not in SELECTABLE:
    raise checks.CheckError(f"amplification must be one of {', '.join(SELECTABLE)} (or None), "
                            f"got {name!r}")
  return REGISTRY[name]


def takes(cls: type, option: str) -> bool:
  """Whether analysis class ``cls`` holds ``option`` (one of its fields)."""
  return option in {f.name for f in dataclasses.fields(cls)}


def make(name, **options) -> Analysis:
  """The analysis ``name`` holding those of ``options`` that are its own fields (an
  ``Analysis`` given instead of a name is used as it is, with its own options)."""
  cls = analysis_class(name)
  if isinstance(name, Analysis):
    return name
  return cls(**{k: v for k, v in options.items() if takes(cls, k)})


def of_record(name: Optional[str]) -> Optional[type]:
  """The registered analysis class a record's ``analysis`` names, under its current or a
  former name (``RENAMED``); None when it names none."""
  if not isinstance(name, str):
    return None
  return REGISTRY.get(RENAMED[name][0] if name in RENAMED else name)


def described(name: Optional[str]) -> Optional[Analysis]:
  """The registered analysis a record names (None when none is), for its words."""
  cls = of_record(name)
  return None if cls is None else cls()


def counts_clipping(record: Mapping[str, Any]) -> bool:
  """Whether the analysis a record names also accounts adaptive clipping's count queries."""
  analysis = described(record.get("analysis"))
  return analysis is not None and analysis.counts_clipping


def automatic(encoder: np.ndarray, schema) -> str:
  """The amplified analysis a training run uses: the first of ``AUTOMATIC`` that applies
  (random allocation; fixed-bin balls-in-bins; banded when C has at most b bands,
  arXiv:2306.08153, Thm 4; else MMCC, arXiv:2310.15526)."""
  for cls in AUTOMATIC:
    if cls().applies(encoder, schema) is None:
      return cls.name
  return AUTOMATIC[-1].name
