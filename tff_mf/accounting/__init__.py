"""Privacy accounting of matrix-factorization runs under a participation schema (numpy core).

A run releases C·G + Z with noise std z (the noise multiplier, in units of the clip
norm) and the encoder C used as given (cached and built-in encoders are normalized to
max column norm γ(C) = 1, Denisov et al. 2022, arXiv:2202.08312, App I). Every ε
returned here is an upper bound on the run's ε at δ (add/remove-one adjacency,
equivalently replace-with-zero). Each analysis and each Gaussian accountant is one
object of ``tff_mf.accounting.analyses`` (its registry names them; this module dispatches through
it and keeps the functional API). The analyses (``epsilon_for``):

- ``"none"`` (no amplification): the run is dominated by ONE Gaussian mechanism with
  multiplier z / sens, sens the sensitivity of C under the participation schema
  (``tff_mf.participation``): γ(C) for single participation (Denisov et al. 2022,
  Thm 4.1), the multi-participation sensitivity for fixed-epoch and b-min-sep
  participation (Choquette-Choo et al. 2023, arXiv:2211.06530, Sec 2); for fixed-bin
  balls-in-bins (one secret bin j per user, every round ≡ j mod b; Choquette-Choo et al.
  2024, arXiv:2410.06266; Chua et al. 2024, arXiv:2412.16802) the sensitivity over the
  b-cyclic patterns: given the bin the pattern is deterministic, so this bound holds and
  the bin's secrecy only lowers the true ε (its amplified bound is ``"amplified_fixed_bin"``,
  below); for
  random allocation (one uniformly random round per epoch, drawn anew each epoch) the
  sensitivity over every one-round-per-epoch pattern (its amplified bound is
  ``"amplified_allocation"``, below). The two are different mechanisms: neither's bound
  is used for the other.
- ``"mmcc"``: amplification by Poisson sampling for any lower-triangular non-negative
  C (Choquette-Choo et al. 2024, MMCC, arXiv:2310.15526, Fig 1; b-min-sep sampling:
  App D, Fig 6); ``tff_mf.accounting.mmcc``.
- ``"amplified_allocation"`` (formerly ``"random_allocation"``, now only the kind's name):
  amplification by random allocation (one uniformly random
  round per epoch, the ``random_allocation`` schema) for any lower-triangular non-negative square C: Rényi-divergence
  bounds of the dominating pair at integer orders, after Schuchardt & Kalinin 2026
  (arXiv:2601.21636, Sec 3), converted to (ε, δ); ``tff_mf.accounting.random_allocation``.
- ``"amplified_fixed_bin"`` (formerly ``"balls_in_bins"``, now only the kind's name):
  amplification by the secret bin of fixed-bin balls-in-bins for any
  lower-triangular non-negative square C: Rényi bounds of the mixture over bins and a
  dominating comparison pair's PLD; ``tff_mf.accounting.fixed_bin``.
- ``"amplified_banded"`` (formerly ``"banded"``): amplified banded MF (Choquette-Choo et al.
  2023, "(Amplified) Banded Matrix Factorization", arXiv:2306.08153, Thm 4): when C has at
  most b non-zero bands and every user belongs to one residue class mod b and joins each
  round of its class independently with probability p, the run is dominated by ⌈n/b⌉-fold
  composition of the Poisson-subsampled Gaussian mechanism with multiplier z / γ(C).

Sampling probability convention (amplified analyses): ``sampling_prob`` p is the
probability that a user joins a round it is eligible for (every round for b = 1, the
rounds of its residue class for b-min-sep). This is p of arXiv:2306.08153 and
jax_privacy's ``amplified_bandmf_event``; MMCC App D writes the same probability as
b·p (its p is the average rate). Both amplified analyses also compute the
unamplified bound for the same sampling (every eligible round joined) and report the
smaller of the two valid bounds.

The single Gaussian mechanism has three accountants:

- ``"exact"`` (default): the analytic ε(δ) of the Gaussian mechanism (Balle & Wang
  2018, "Improving the Gaussian Mechanism for Differential Privacy", ICML,
  arXiv:1805.06530, Thm 8), evaluated in log space with ``scipy.special.log_ndtr``
  so that tiny z and huge ε neither overflow nor allocate anything; the δ used in
  the bisection is an upper bound that includes a floating-point error allowance, and
  the bisection returns the upper end of its bracket, so the value is never below
  the true ε;
- ``"pld"``: dp_accounting's privacy-loss distributions, pessimistic discretization
  (1e-4, made coarser when the privacy-loss range would need more than
  ``PLD_MAX_POINTS`` grid points: a coarser pessimistic grid is still an upper bound);
- ``"rdp"``: Rényi DP converted to (ε, δ), the loosest.

``calibrate`` (and ``calibrate_noise_multiplier`` for one Gaussian) runs the one search
(``_search``) for the smallest z, to a relative tolerance, whose ε does not exceed a target, always
returning a z whose ε was evaluated to be at most the target.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np

from tff_mf.accounting import analyses
from tff_mf import checks
from tff_mf.accounting.analyses import RDP_ORDERS  # pylint: disable=unused-import
from tff_mf.accounting.analyses import band_count  # pylint: disable=unused-import
from tff_mf.accounting.analyses import check_encoder
from tff_mf.accounting.bound import Bound
from tff_mf.accounting import encoder_facts
from tff_mf.accounting.analyses import mmcc_details  # pylint: disable=unused-import
from tff_mf.accounting.analyses import poisson_sensitivity  # pylint: disable=unused-import
from tff_mf.accounting.analyses import sampling_min_sep  # pylint: disable=unused-import
from tff_mf.accounting.analyses import sensitivity_report  # pylint: disable=unused-import
from tff_mf.accounting.gaussian import PLD_DISCRETIZATION
from tff_mf.accounting.gaussian import AccountingError

# The names of the registered analyses (``tff_mf.accounting.analyses``): its registry is their
# one home.
ACCOUNTANTS = tuple(analyses.ACCOUNTANTS)
DEFAULT_ACCOUNTANT = "exact"
ANALYSES = analyses.SELECTABLE

# Largest noise multiplier calibration searches (above it ε = 0 for every δ ≥ 1e-300).
_MAX_NOISE_MULTIPLIER = 1e300

# ----------------------------------------------------------------------------- checks


def check_delta(delta, name: str = "delta") -> float:
  """0 < δ < 1 (raises CheckError otherwise)."""
  return checks.delta(delta, name)


def check_noise_multiplier(noise_multiplier, name: str = "noise_multiplier") -> float:
  """A finite z > 0 (raises CheckError otherwise)."""
  return checks.noise_multiplier(noise_multiplier, name)


def check_accountant(accountant: str) -> str:
  """One of ``ACCOUNTANTS`` ("exact", "pld", "rdp"), returned as given (raises CheckError otherwise)."""
  analyses.accountant(accountant)
  return accountant


def check_sensitivity(sensitivity, name: str = "sensitivity") -> float:
  """A finite sensitivity > 0 (raises CheckError otherwise)."""
  return checks.positive_float(sensitivity, name)


def _check_target(target_epsilon) -> float:
  return checks.positive_float(target_epsilon, "target_epsilon")


def _check_tolerance(tolerance) -> float:
  return checks.in_range(tolerance, "tolerance", 0.0, 1.0, low_open=True, high_open=True)


def epsilon(noise_multiplier: float, delta: float, accountant: str = DEFAULT_ACCOUNTANT,
            sensitivity: float = 1.0) -> float:
  """ε(δ) of one Gaussian mechanism with multiplier z / sensitivity (an upper bound).

  A run whose encoder C has sensitivity ``sensitivity`` under its participation schema
  (γ(C) = 1 for a normalized C under single participation, Denisov et al. 2022,
  Thm 4.1; Choquette-Choo et al. 2023, arXiv:2211.06530, for multiple participations)
  has exactly this ε. Bounded time and memory for every input; ``inf`` only when ε
  exceeds the largest double.
  """
  z = check_noise_multiplier(noise_multiplier)
  delta = check_delta(delta)
  check_accountant(accountant)
  sens = check_sensitivity(sensitivity)
  return analyses.gaussian_epsilon(z, delta, accountant, sens)


# ----------------------------------------------------------------------------- calibration


def calibrate_noise_multiplier(target_epsilon: float, delta: float,
                               accountant: str = DEFAULT_ACCOUNTANT,
                               tolerance: float = 1e-3, relative: bool = True,
                               sensitivity: float = 1.0) -> float:
  """Smallest z (to ``tolerance``) with ε(z / sensitivity, δ) ≤ target_epsilon.

  The returned z always satisfies ε(z) ≤ target; z − tol does not (tol = tolerance·z
  when ``relative``, else the absolute ``tolerance``), so z over-shoots the exact
  answer by less than tol: the safe side. Every accountant upper-bounds the exact
  Gaussian ε, so the exact calibration (to 1e-9) is where the search starts.
  """
  target = _check_target(target_epsilon)
  delta = check_delta(delta)
  check_accountant(accountant)
  sens = check_sensitivity(sensitivity)
  if relative:
    tolerance = _check_tolerance(tolerance)
  else:
    tolerance = checks.positive_float(tolerance, "tolerance")
  start = None
  if not analyses.accountant(accountant).exact:
    start, _ = _search(lambda z: epsilon(z, delta, "exact", sensitivity=sens), target, sens,
                       1e-9)
  z, _ = _search(lambda z: epsilon(z, delta, accountant, sensitivity=sens), target,
                 start or sens, tolerance, relative)
  return float(z)


def _search(eps_of: Callable[[float], float], target: float, hi: float, tolerance: float,
            relative: bool = True) -> Tuple[float, int]:
  """The one calibration search: the smallest z with eps_of(z) ≤ target, for ε non-increasing
  in z. Returns (z, evaluations); z was evaluated to pass, and a z' < z evaluated to fail
  lies within the tolerance (relative to z, or absolute).

  Keeps a bracket ε(lo) > target ≥ ε(hi) and probes just above, then just below, the
  root estimated by interpolating log ε against log z between the bracket ends: for a
  smooth ε (the Gaussian, PLD, MMCC, amplified banded) two or three probes close the
  bracket. After two probes in a row that do not halve it, one bisection (geometric
  while the bracket spans more than a factor 2). ``hi`` is the first z tried; an
  ε that raises ``AccountingError`` below a z that worked counts as failing.
  """
  values: Dict[float, float] = {}

  def f(z):
    try:
      values[z] = eps_of(z)
    except AccountingError:
      if not any(v <= target for v in values.values()):
        raise  # the inputs themselves are refused
      values[z] = math.inf  # below a z that worked, the analysis gave up: failing
    return values[z]

  while f(hi) > target:
    hi *= 2.0
    if hi > _MAX_NOISE_MULTIPLIER:
      raise AccountingError(f"no noise multiplier up to {_MAX_NOISE_MULTIPLIER:g} reaches "
                            f"epsilon {target}")
  lo = max((z for z, v in values.items() if v > target and z < hi), default=hi / 2.0)
  while f(lo) <= target:
    hi, lo = lo, lo / 2.0
    if lo == 0.0:
      return hi, len(values)
  side, slow = 1.0, 0
  while hi - lo > (tolerance * hi if relative else tolerance):
    width = hi - lo
    e_lo, e_hi = values[lo], values[hi]
    probe = math.sqrt(lo * hi) if hi > 2.0 * lo else 0.5 * (lo + hi)
    bisect = slow >= 2
    if not bisect and math.isfinite(e_lo) and 0.0 < e_hi < e_lo:
      t = (math.log(e_lo) - math.log(target)) / (math.log(e_lo) - math.log(e_hi))
      probe = math.exp(math.log(lo) + t * (math.log(hi) - math.log(lo)))
      step = (tolerance * hi if relative else tolerance)
      probe += side * 0.3 * step
      probe = min(max(probe, lo + 0.01 * width), hi - 0.01 * width)
    if not lo < probe < hi:
      break
    if f(probe) <= target:
      hi, side = probe, -1.0
    else:
      lo, side = probe, 1.0
    slow = 0 if bisect or hi - lo <= 0.5 * width else slow + 1
  return hi, len(values)


# ----------------------------------------------------------------------------- schemas and C


_check_schema = analyses.check_schema


# ----------------------------------------------------------------------------- ε of a run


def epsilon_for(c: Optional[np.ndarray], schema, noise_multiplier: float, delta: float,
                amplification: Optional[str] = None, sampling_prob: Optional[float] = None,
                accountant: str = DEFAULT_ACCOUNTANT, *,
                pld_discretization: float = PLD_DISCRETIZATION, non_adaptive: bool = False,
                mmcc_options: Optional[Dict[str, Any]] = None,
                known_sensitivity: Optional[Dict[str, Any]] = None) -> Bound:
  """ε at δ of a run with encoder C, participation ``schema`` and noise multiplier z.

  Args:
    c: the encoder C (m x n, used as given; cached ones have γ(C) = 1). None only for
      single participation without amplification (a normalized C: sensitivity 1).
    schema: a ``tff_mf.participation.Participation`` (or its dict).
    noise_multiplier: z, the noise std in units of the clip norm.
    delta: δ in (0, 1).
    amplification: None / "none" (one Gaussian at z / sensitivity), "mmcc" (MMCC),
      "amplified_banded" (formerly "banded"): a min_sep or fixed_epoch schema
      (``sampling_min_sep``) and ``sampling_prob``; "random_allocation": the
      random_allocation schema (never fixed-bin);
      "balls_in_bins": the fixed-bin balls_in_bins schema;
      "monte_carlo_bound" (best given as ``analyses.MonteCarloBound(samples=, failure_probability=,
      seed=)``): min_sep / fixed_epoch with ``sampling_prob``, or fixed-bin balls_in_bins; its
      record carries ``failure_probability`` and ``epsilon_label`` beside ``epsilon``.
      Or the ``tff_mf.accounting.analyses.Analysis`` object itself, holding its own options.
    sampling_prob: p in (0, 1], the probability that a user joins a round it is
      eligible for (amplified analyses only).
    accountant: accountant of the unamplified Gaussian ("exact", "pld" or "rdp").
    pld_discretization: privacy-loss grid of the amplified analyses' PLDs (coarsened
      automatically where a PLD would exceed ``PLD_MAX_POINTS`` points).
    non_adaptive: MMCC only: the data are fixed in advance (allows signed or
      non-triangular C; ``tff_mf.accounting.mmcc``).
    mmcc_options: further keyword arguments of ``tff_mf.accounting.mmcc.mmcc`` (workers,
      grid_resolution, progress, ...).
    known_sensitivity: C's ``sensitivity_report`` under ``schema`` when the caller holds it
      (``tff_mf.mechanisms``; unamplified, amplified_allocation or amplified_fixed_bin), so it
      is not recomputed.

  Returns a ``Bound`` (``tff_mf.accounting.bound``; ``.json()`` its JSON form): ``epsilon``
  (an upper bound), ``analysis``, ``accountant``, ``sensitivity`` (of the unamplified
  Gaussian), ``sensitivity_exact``, ``exact`` (ε is the run's exact ε: unamplified, exact
  accountant, exact sensitivity), the schema, and for amplified analyses
  ``amplified_epsilon``, ``unamplified_epsilon`` and ``bound`` (which of the two valid bounds
  is reported).
  """
  analysis = analyses.make(amplification, pld_discretization=pld_discretization,
                           non_adaptive=non_adaptive, mmcc_options=mmcc_options)
  z = check_noise_multiplier(noise_multiplier)
  delta = check_delta(delta)
  check_accountant(accountant)
  schema = _check_schema(schema)
  if c is not None:
    c = check_encoder(c)
  record = _base_record(c, schema, z, delta, analysis)
  return Bound.of_json(analysis.record(record, c, schema, z, delta, accountant, sampling_prob,
                                       known_sensitivity))


def _base_record(c: Optional[np.ndarray], schema, z: float, delta: float,
                 analysis) -> Dict[str, Any]:
  """What every record of a run holds before its analysis fills it in (C's shape checked
  against the schema)."""
  record: Dict[str, Any] = {"noise_multiplier": z, "delta": delta, "analysis": analysis.name,
                            "participation": schema.label, "schema": schema.as_dict()}
  if c is not None:
    record["m"], record["n"] = int(c.shape[0]), int(c.shape[1])
    schema.check(c.shape[1])
  return record


def calibrate(c: Optional[np.ndarray], schema, target_epsilon: float, delta: float,
              amplification: Optional[str] = None, sampling_prob: Optional[float] = None,
              accountant: str = DEFAULT_ACCOUNTANT, tolerance: float = 1e-3,
              **options) -> Bound:
  """The smallest z (within relative ``tolerance``) whose ``epsilon_for`` ε ≤ target.

  Returns ``epsilon_for``'s record at that z plus ``target_epsilon``, ``tolerance``
  and ``evaluations``. Safe side: the returned z was evaluated to give ε ≤ target,
  and z·(1 − tolerance) was evaluated (or bracketed) to give ε > target when ε is
  monotone in z. The search starts from the exact unamplified calibration (a valid z
  for every analysis, since each reports at most the unamplified bound).
  """
  target = _check_target(target_epsilon)
  delta = check_delta(delta)
  tolerance = _check_tolerance(tolerance)
  analysis = analyses.analysis_class(amplification)
  schema = _check_schema(schema)
  if c is not None:
    c = check_encoder(c)
  if c is None and analysis.amplified:
    raise checks.CheckError(f"amplification {analysis.name!r} needs the encoder C")
  with encoder_facts.same_encoder(c):  # the search's analyses of this one C at every z
    return _calibrate(c, schema, target, delta, amplification, sampling_prob, accountant,
                      tolerance, analysis, options)


def _calibrate(c, schema, target, delta, amplification, sampling_prob, accountant, tolerance,
               analysis, options) -> Bound:
  # The unamplified calibration passes for every registered analysis (each reports at most
  # the unamplified bound), so it is where the search starts; for the unamplified analysis
  # it is the answer. Whatever the analysis, the z returned was evaluated to pass.
  options = dict(options)
  sens = analyses.make(amplification).search_sensitivity(c, schema, options)
  hi = calibrate_noise_multiplier(target, delta, accountant, tolerance, sensitivity=sens)
  if analysis.calibrates_itself:  # its draws decide z: a bisection over them is not valid
    record = _base_record(c, schema, hi, delta, analyses.make(amplification))
    record = analyses.make(amplification).calibrate(c, schema, target, delta, hi, accountant,
                                                    sampling_prob, record)
    return Bound.of_json(record).replace(target_epsilon=target, tolerance=tolerance)
  if not analysis.amplified:  # the Gaussian's calibration is the answer when its ε passes
    bound = epsilon_for(c, schema, hi, delta, amplification, sampling_prob, accountant,
                        **options)
    if bound.epsilon <= target:
      return bound.replace(target_epsilon=target, tolerance=tolerance)
  records: Dict[float, Bound] = {}
  mmcc_options = options.get("mmcc_options") or {}
  bar = _SearchBar(bool(mmcc_options.get("progress")), target, tolerance)
  if mmcc_options.get("progress"):  # one bar for the whole search, none per evaluation
    options = dict(options, mmcc_options=dict(mmcc_options, progress=False))

  def eps_of(z):
    records[z] = epsilon_for(c, schema, z, delta, amplification, sampling_prob, accountant,
                             **options)
    bar.probed(z, records[z].epsilon)
    return records[z].epsilon

  try:
    z, evaluations = _search(eps_of, target, hi, tolerance)
  finally:
    bar.close()
  return records[z].replace(target_epsilon=target, tolerance=tolerance,
                            evaluations=evaluations)


class _SearchBar:
  """One tqdm bar on stderr for a calibration search: it fills with the decades the
  bracket around z has closed, −log10((hi − lo)/hi), of the −log10(tolerance) to close
  (all of them once the tolerance is met), so its ETA is the search's own; the postfix
  shows the bracket and the evaluations. Every evaluation costs about the same (an MMCC
  run), and each one closes the bracket by a factor."""

  def __init__(self, progress: bool, target: float, tolerance: float):
    self.target = target
    self.lo, self.hi, self.evaluations = 0.0, math.inf, 0
    self.bar = None
    if progress:
      from tqdm import tqdm  # pylint: disable=g-import-not-at-top
      self.decades = -math.log10(tolerance)
      self.bar = tqdm(total=self.decades, file=sys.stderr, leave=False,
                      desc=f"calibrating z to epsilon {target:g}",
                      bar_format="{desc}: {percentage:3.0f}%|{bar}| "
                                 "[{elapsed}<{remaining}{postfix}]")

  def probed(self, z: float, eps: float) -> None:
    self.evaluations += 1
    if eps > self.target:
      self.lo = max(self.lo, z)
    else:
      self.hi = min(self.hi, z)
    if self.bar is None:
      return
    if math.isfinite(self.hi) and self.lo > 0.0:
      closed = -math.log10(max((self.hi - self.lo) / self.hi, 1e-300))
      self.bar.n = min(self.decades, max(0.0, closed))
    bracket = f"z in [{self.lo:.4g}, {self.hi:.4g}]" if self.lo > 0.0 and \
        math.isfinite(self.hi) else f"z = {z:.4g}"
    self.bar.set_postfix_str(f"{bracket}, {self.evaluations} evaluations")

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()


def summary(noise_multiplier: float, delta: float, accountant: str = DEFAULT_ACCOUNTANT,
            target_epsilon: Optional[float] = None) -> dict:
  """JSON-ready record of a single-participation guarantee (C normalized to γ(C) = 1)."""
  eps = epsilon(noise_multiplier, delta, accountant)
  out = {
      "epsilon": eps,
      "delta": float(delta),
      "noise_multiplier": float(noise_multiplier),
      "accountant": accountant,
      "participation": "single",
      "analysis": "none",
      "sensitivity": 1.0,
      "exact": analyses.accountant(accountant).exact,
      "theorem": "Denisov et al. 2022 Thm 4.1 (C normalized to sensitivity 1)",
  }
  if target_epsilon is not None:
    out["target_epsilon"] = float(target_epsilon)
  return out
