"""The numpy mechanism layer: what a registry mechanism is, before TensorFlow (no TF import).

``build(spec)`` takes the one input of the layer, a checked ``tff_mf.spec.MechanismSpec``,
and returns the resolved mechanism and its privacy record, whose ``epsilon_by_round``
gives the ε spent after each round. ``resolve`` turns a registry mechanism, the training
workload and a participation schema into a ``Resolved`` mechanism: its factorization (from
the cache where the strategy is cached), the noise stream of linear-noise mechanisms (a
``tff_mf.noise.streams.LinearStream``), the encoder the noise is calibrated for and its
sensitivity under the schema. ``privacy`` then fixes the noise multiplier — given, or
calibrated to a target ε — and returns a typed ``PrivacyRecord`` (z, sensitivity, z/sens, ε,
analysis, and the JSON record a run writes).
It is the one place a run's ε is decided (``run_privacy``): the unamplified Gaussian under
the schema, amplification under cyclic Poisson sampling, adaptive clipping's composition.
``tff_mf.tf.aggregators`` only turns a ``Resolved`` and its record into TFF objects; the
training harness writes that same record. Another framework's integration reads the same
``Resolved`` (its ``stream`` is plain numpy) and ``PrivacyRecord``.

The encoder the noise is calibrated for:

- matrix mechanisms (dense and linear noise): the normalized C of the factorization;
- TFF's tree (``tff_tree``): C_T/√levels. TFF adds noise of multiplier z·√levels to every
  node of C_T (``tree_node_multiplier``), so per unit of z the sensitivity is
  sens(C_T)/√levels (McMahan et al. 2022, Sec 2.1); when n is not a power of two no leaf
  is in all ``levels`` released nodes and this is below 1;
- TFF's ``gaussian_fixed`` (``tff_gaussian``): C = I.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, List, Mapping, MutableMapping, Optional, Tuple

import dp_accounting
import numpy as np

from tff_mf.accounting import analyses
from tff_mf.accounting.bound import Bound
from tff_mf.accounting import encoder_facts
from tff_mf import checks
from tff_mf.noise import discrete_gaussian as dg
from tff_mf import factorization as fz
from tff_mf import participation as participation_lib
from tff_mf import registry
from tff_mf import spec as spec_lib
from tff_mf.accounting import statement
from tff_mf.noise import streams
from tff_mf.factorization import strategies
from tff_mf.factorization import toeplitz_factorization
from tff_mf.factorization import workloads
from tff_mf.factorization.families import tree

EPSILON_ANALYSIS = "one Gaussian at z/sens, without amplification"


@dataclasses.dataclass(frozen=True)
class Resolved:
  """A registry mechanism resolved for n rounds, a workload and a schema (numpy only).

  Attributes:
    mechanism: the registry entry.
    workload: the training workload A (``WorkloadSpec``).
    participation: the schema the sensitivity is for.
    factorization: the normalized A = B·C for the training workload (None for TFF's tree
      and for ``none``; C = I for TFF's gaussian).
    a_factorized: the A the strategy factorized (S when the mechanism post-processes a
      prefix-sum decoder), which linear streams are rebuilt for; its number of rounds n
      when A is Toeplitz and held as its first column (``ToeplitzFactorization``).
    stream: C⁻¹·Z as a ``LinearStream`` (linear-noise mechanisms), else None.
    encoder: the C the noise is calibrated for (see the module docstring); None for
      ``none``.
    sensitivity_report: {value, exact, method} of the encoder's sensitivity under the
      schema (for TFF's tree: of C_T, per node); None for ``none``.
    sensitivity: sens per unit of z (for TFF's tree sens(C_T)/√levels); None for ``none``.
    info: JSON-ready fields for the run record (the factorization's parameters, the cache
      entry, the sensitivity and how it was computed).
  """
  mechanism: registry.Mechanism
  workload: workloads.WorkloadSpec
  participation: participation_lib.Participation
  factorization: Optional[fz.Factorization]
  a_factorized: Any  # np.ndarray, or n for a Toeplitz A held as its first column
  stream: Optional[streams.LinearStream]
  encoder: Optional[np.ndarray]
  sensitivity_report: Optional[Dict[str, Any]]
  sensitivity: Optional[float]
  info: Dict[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def n(self) -> int:
    return int(self.workload.n)


@dataclasses.dataclass(frozen=True)
class PrivacyRecord:
  """The privacy of a resolved mechanism at its noise multiplier z (given or calibrated).

  Attributes:
    private: False for ``none`` (no noise; every other field unset).
    noise_multiplier: z, the noise std of a round's sum in units of the clip norm.
    sensitivity: sens of the encoder under the schema, per unit of z (what the noise is
      calibrated for; ``effective_noise_multiplier`` is z/sens).
    delta, accountant: δ and the unamplified Gaussian's accountant (None without δ).
    epsilon: the reported upper bound on ε at δ: the smallest of the valid bounds computed
      (``details["candidates"]``), None without δ.
    target_epsilon: the target z was calibrated to, or None.
    analysis: in words, the analysis that gave ``epsilon``.
    bound: its analysis's name in ``tff_mf.accounting.analyses.REGISTRY`` (none,
      amplified_banded, mmcc, adaptive).
    details: the run's ``tff_mf.accounting.Bound`` (its ``json()`` is summary.json's
      ``privacy``): the reported bound's fields, every candidate bound, notes; empty without
      δ.
    setup: what the privacy statement names beside ε (``tff_mf.accounting.statement.setup_words``):
      mechanism, rounds, clients per round, clip norm, schema; set by ``build``.
    encoder, participation: the C the noise is calibrated for and the schema (what
      ``epsilon_by_round`` accounts for).

  ``str()`` is the privacy statement (``tff_mf.accounting.statement``) of this configuration.
  """
  private: bool
  noise_multiplier: float
  sensitivity: Optional[float] = None
  delta: Optional[float] = None
  accountant: Optional[str] = None
  epsilon: Optional[float] = None
  target_epsilon: Optional[float] = None
  analysis: str = EPSILON_ANALYSIS
  bound: str = "none"
  # Left out of repr(): ``details`` alone runs to thousands of characters (str() is the
  # statement, the JSON record is ``details``).
  details: Bound = dataclasses.field(default_factory=Bound, repr=False)
  setup: Dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)
  encoder: Optional[np.ndarray] = dataclasses.field(default=None, repr=False, compare=False)
  participation: Optional[participation_lib.Participation] = dataclasses.field(
      default=None, repr=False, compare=False)

  @property
  def dp_event(self) -> dp_accounting.DpEvent:
    """The run's dp_accounting event, where dp_accounting can express the analysis that gave
    ``epsilon``: the Gaussian at z/sens (unamplified), amplified banded MF's composition of
    Poisson-subsampled Gaussians, adaptive clipping's two Gaussians;
    ``NonPrivateDpEvent`` without noise; ``UnsupportedDpEvent`` where it cannot (MMCC, random
    allocation, fixed bin, Monte Carlo, the discrete Gaussian) or without δ."""
    if not self.private:
      return dp_accounting.NonPrivateDpEvent()
    analysis = analyses.described(self.details.analysis) if self.details else None
    event = analysis.dp_event(self.details) if analysis is not None else None
    return event if event is not None else dp_accounting.UnsupportedDpEvent()

  def epsilon_by_round(self, rounds: Optional[int] = None) -> List[float]:
    """ε spent after rounds 1..``rounds`` (default n): upper bounds, non-decreasing, ε after
    round n the record's ``epsilon`` (``epsilon_by_round``). CheckError without ε."""
    if not self.private or self.epsilon is None or self.encoder is None:
      raise checks.CheckError("epsilon_by_round needs a private record with delta (an epsilon)")
    out = epsilon_by_round(self.encoder, self.participation, self.noise_multiplier,
                           self.delta, self.accountant, self.details)
    return out if rounds is None else out[:checks.positive_int(rounds, "rounds")]

  def __str__(self) -> str:
    return statement.privacy_statement(self)["text"]

  def statement_input(self) -> Tuple[Optional[Dict[str, Any]], Dict[str, Any]]:
    """(the record ``tff_mf.accounting.statement.privacy_statement`` describes, or None without noise;
    its keyword defaults: the setup, schema, seed source and why ε may be missing)."""
    if not self.private:
      return None, {}
    setup = dict(self.setup)
    defaults: Dict[str, Any] = {"setup": setup, "run": False}
    if setup.get("noise_seed_pinned"):
      defaults["noise_seed_source"] = "pinned"
    if not self.details.rest.get("schema"):
      defaults["schema"] = setup.get("participation")
    if self.details:
      return dict(self.details), defaults
    defaults["epsilon_reason"] = "no delta was given, so no epsilon was computed"
    return ({"analysis": "none", "noise_multiplier": self.noise_multiplier,
             "sensitivity": self.sensitivity, "epsilon": None}, defaults)

  @property
  def effective_noise_multiplier(self) -> Optional[float]:
    """z/sens: the multiplier of the one Gaussian mechanism the run is."""
    return None if self.sensitivity is None else self.noise_multiplier / self.sensitivity

  def info(self, clip_norm: float) -> Dict[str, Any]:
    """The JSON-ready fields ``build_mechanism`` records."""
    if not self.private:
      return {"noise_multiplier": 0.0, "private": False}
    out: Dict[str, Any] = {}
    if self.target_epsilon is not None:
      out.update(target_epsilon=self.target_epsilon, calibrated=True)
    out.update(noise_multiplier=self.noise_multiplier,
               stddev_per_round_sum=self.noise_multiplier * clip_norm,
               effective_noise_multiplier=self.effective_noise_multiplier)
    if self.delta is not None:
      out.update(delta=self.delta, accountant=self.accountant, epsilon=self.epsilon,
                 epsilon_analysis=self.analysis, epsilon_bound=self.bound)
      if self.details.failure_probability is not None:  # β beside an ε that needs it
        out.update(failure_probability=self.details.failure_probability,
                   epsilon_label=self.details.epsilon_label)
    return out


# The workload A a run trains with (checked): one home, ``tff_mf.spec``.
training_workload = spec_lib.training_workload


def tree_encoder(n: int) -> np.ndarray:
  """C_T/√levels: the encoder TFF's tree aggregation is calibrated for (module docstring)."""
  return np.asarray(tree.tree_encoder(n), np.float64) / math.sqrt(tree.tree_levels(n))


def tree_node_multiplier(noise_multiplier: float, n: int) -> float:
  """z·√levels: the multiplier TFF's tree adds to every node of C_T for run multiplier z."""
  return noise_multiplier * math.sqrt(tree.tree_levels(n))


def resolve(mechanism: registry.Mechanism, workload: workloads.WorkloadSpec,
            participation: participation_lib.Participation, *, cache_dir: Optional[str] = None,
            params: Optional[Mapping[str, Any]] = None, progress: bool = False,
            loaded: Optional[MutableMapping[str, Any]] = None, **family_params) -> Resolved:
  """The ``Resolved`` mechanism (see the class); ``params`` (or keywords: bands=, rank=,
  buffers=, a family's own; None: not given) override the family's defaults.

  ``loaded``: factorizations this process loaded from the cache (and checked) before, by
  cache entry, read and filled here: one C serves every schema that shares its entry
  (``families.Declaration.schema_free``, single-participation C's), loaded once, while the
  sensitivity is computed under each schema from it."""
  params = {k: v for k, v in dict(params or {}, **family_params).items() if v is not None}
  info: Dict[str, Any] = {}
  f = a_factorized = stream = encoder = report = sens = None
  n = workload.n
  kind = mechanism.noise_kind
  if kind.factorized:
    f, a_factorized = _matrix_factorization(mechanism, workload, participation, cache_dir,
                                            params, progress, info, loaded)
    if kind.streams:
      stream = strategies.stream(mechanism.strategy, f.extras, a_factorized)
    encoder = f.c
    report = f.sensitivity_report(participation)
    sens = float(report["value"])
  elif kind.tff_tree:
    levels = tree.tree_levels(n)
    report = participation_lib.sensitivity_report(tree.tree_encoder(n), participation)
    sens = report["value"] / math.sqrt(levels)
    encoder = tree_encoder(n)
    info.update(tree_levels=levels, sensitivity_per_node=report["value"])
  elif kind.identity:
    f = strategies.factorize(strategies.FactorizationSpec(workload=workload,
                                                          strategy=registry.IDENTITY.name))
    encoder = f.c
    report = participation_lib.sensitivity_report(encoder, participation)
    sens = float(report["value"])
  if report is not None:
    info.update(sensitivity=sens, sensitivity_exact=report["exact"],
                sensitivity_method=report["method"])
  return Resolved(mechanism=mechanism, workload=workload, participation=participation,
                  factorization=f, a_factorized=a_factorized, stream=stream, encoder=encoder,
                  sensitivity_report=report, sensitivity=sens, info=info)


def factorization_spec(m: registry.Mechanism, w_spec: workloads.WorkloadSpec,
                       participation: participation_lib.Participation,
                       given: Mapping[str, Any]):
  """(the ``FactorizationSpec`` whose C the mechanism runs, its family parameters, the
  schema C is optimized for): the family's defaults for (n, schema) overridden by ``given``;
  the prefix sum's C where the mechanism post-processes it. A ``schema_free`` family's
  parameters are checked against the schema and its spec is single participation's, which
  every schema shares."""
  n = w_spec.n
  factorized = workloads.WorkloadSpec("prefix_sum", n) if m.post_processes_prefix_decoder \
      else w_spec
  params = registry.default_parameters(m.strategy, n, participation)
  params.update({k: v for k, v in given.items() if k in params})
  # C is optimized for the schema where its strategy can be; the noise stream computes the
  # sensitivity under the schema from C either way.
  declared = registry.strategy(m.strategy).declaration
  optimized_for = (participation if participation.kind in declared.participations
                   else participation_lib.SINGLE)
  spec = strategies.FactorizationSpec.with_parameters(
      params, workload=factorized, strategy=m.strategy, participation=optimized_for)
  if declared.schema_free:  # one C for every schema: its parameters checked against this one
    dataclasses.replace(spec, participation=participation).validate()
    spec = dataclasses.replace(spec, participation=participation_lib.SINGLE)
  return spec, params, optimized_for


def _matrix_factorization(m: registry.Mechanism, w_spec: workloads.WorkloadSpec,
                          participation: participation_lib.Participation,
                          cache_dir: Optional[str], given: Mapping[str, Any], progress: bool,
                          info: Dict[str, Any],
                          loaded: Optional[MutableMapping[str, Any]] = None):
  """(factorization for the training A, workload of the stream) from the cache, checked
  (``loaded``: see ``resolve``)."""
  from tff_mf.factorization import cache  # pylint: disable=g-import-not-at-top
  spec, params, optimized_for = factorization_spec(m, w_spec, participation, given)
  factorized = spec.workload
  key = cache.entry_paths(spec, cache_dir)[0] if loaded is not None else None
  if key is not None and key in loaded:
    f, npz_path = loaded[key]
    if npz_path is not None:
      info.update(cache_npz=npz_path, cache_hit=True)
  elif strategies.cached(m.strategy):
    f, entry = cache.load_or_factorize(spec, cache_dir=cache_dir, progress=progress)
    info.update(cache_npz=entry.npz_path, cache_hit=entry.cache_hit)
    if key is not None:
      loaded[key] = (f, entry.npz_path)
  else:
    f = strategies.factorize(spec, progress=progress)
    if key is not None:
      loaded[key] = (f, None)
  info.update(params, optimized_for=optimized_for.as_dict())
  # A Toeplitz A held as its first column stays so: its stream needs only n.
  a_factorized = f.n if isinstance(f, toeplitz_factorization.ToeplitzFactorization) else f.a
  if factorized != w_spec:
    f = strategies.post_processed(f, w_spec.build(), m.name)
  # Every path above ran every check of ``checks.factors`` once (B·C = A on every entry,
  # γ(C) = 1): the cache's load, ``strategies.factorize`` and ``post_processed``.
  return f, a_factorized


def calibrate(resolved: Resolved, target_epsilon: float, delta: float, accountant: str,
              **options) -> PrivacyRecord:
  """``privacy`` calibrated: the smallest z (relative tolerance 1e-3) whose reported ε is at
  most ``target_epsilon`` (``options``: ``privacy``'s keywords)."""
  return privacy(resolved, None, target_epsilon, delta, accountant, **options)


def privacy(resolved: Resolved, noise_multiplier: Optional[float],
            target_epsilon: Optional[float], delta: Optional[float], accountant: str,
            **options) -> PrivacyRecord:
  """The ``PrivacyRecord`` of a resolved mechanism at the given z, or calibrated to
  ``target_epsilon`` (``options``: ``run_privacy``'s keywords)."""
  if not resolved.mechanism.private:
    return PrivacyRecord(private=False, noise_multiplier=0.0)
  return run_privacy(resolved.encoder, resolved.participation, noise_multiplier,
                     target_epsilon, delta, accountant, known_sensitivity=_known(resolved),
                     **options)


def _known(resolved: Resolved) -> Dict[str, Any]:
  """The resolved encoder's sensitivity report, as ``run_privacy`` takes it."""
  return {"value": resolved.sensitivity, "exact": resolved.sensitivity_report["exact"],
          "method": resolved.sensitivity_report["method"]}


# ----------------------------------------------------------------------------- build(spec)

def resolve_spec(spec: spec_lib.MechanismSpec, *, cache_dir: Optional[str] = None,
                 progress: bool = False, resolved: Optional[Resolved] = None,
                 loaded: Optional[MutableMapping[str, Any]] = None) -> Resolved:
  """The ``Resolved`` mechanism of ``spec``; ``resolved``: one resolved before for the same
  mechanism, workload and schema (checked, not resolved again); ``loaded``: ``resolve``'s."""
  if resolved is None:
    return resolve(spec.mechanism, spec.workload, spec.participation, cache_dir=cache_dir,
                   params=spec.params, progress=progress, loaded=loaded)
  if (resolved.mechanism != spec.mechanism or resolved.workload != spec.workload
      or resolved.participation != spec.participation):
    raise checks.CheckError(f"the resolved mechanism ({resolved.mechanism.name}, "
                            f"{resolved.workload}, {resolved.participation.describe()}) is not "
                            f"the one asked for ({spec.mechanism.name})")
  return resolved


def build(spec: spec_lib.MechanismSpec, *, cache_dir: Optional[str] = None,
          progress: bool = False, resolved: Optional[Resolved] = None,
          noise_seed_pinned: bool = False,
          mmcc_options: Optional[Dict[str, Any]] = None) -> Tuple[Resolved, PrivacyRecord]:
  """(the resolved mechanism, its privacy record) of a checked ``MechanismSpec``.

  The record's z is the spec's, or the smallest calibrated to its target ε; its ε is
  ``run_privacy``'s for the resolved encoder (with adaptive clipping's count queries where
  the spec clips adaptively); ``setup`` is what its statement names beside ε. An accounting
  spec (no clipping) is refused: ``resolve_spec`` resolves its mechanism.
  """
  spec.require_run()
  resolved = resolve_spec(spec, cache_dir=cache_dir, progress=progress, resolved=resolved)
  if spec.privacy is None:
    record = PrivacyRecord(private=False, noise_multiplier=0.0)
  else:
    record = privacy_record(resolved.encoder, resolved.participation, spec.privacy,
                            adaptive=spec.adaptive, known_sensitivity=_known(resolved),
                            mmcc_options=mmcc_options)
  return resolved, dataclasses.replace(record, setup=spec.statement_setup(noise_seed_pinned))


def describe(spec: spec_lib.MechanismSpec, resolved: Resolved, record: PrivacyRecord,
             noise_seed_pinned: bool = False) -> Dict[str, Any]:
  """The JSON-ready description of a built mechanism (no seed): the spec, the resolution,
  the privacy record and, with adaptive clipping, how the run's multiplier splits."""
  info = spec.describe(noise_seed_pinned)
  info.update(resolved.info)
  info.update(record.info(spec.clipping.clip_norm))
  if spec.adaptive is not None:
    info.update(adaptive_info(spec, resolved, record))
  return info


def adaptive_info(spec: spec_lib.MechanismSpec, resolved: Resolved,
                  record: PrivacyRecord) -> Dict[str, Any]:
  """The multipliers of adaptive clipping's two Gaussians and of their composition:
  μ² = (sens/z)² + k·(½/σ_b)² (``tff_mf.accounting.adaptive_clipping``)."""
  from tff_mf.accounting import adaptive_clipping  # pylint: disable=g-import-not-at-top
  k = spec.participation.max_participations_in(spec.n)
  sigma_b, sens, z = spec.adaptive.clipped_count_stddev, resolved.sensitivity, \
      record.noise_multiplier
  count_mu = adaptive_clipping.count_mu(sigma_b, k)
  out = {"effective_noise_multiplier_value": z / sens,
         "effective_noise_multiplier_count": 1.0 / count_mu if count_mu else math.inf,
         "count_participations": k,
         "effective_noise_multiplier": adaptive_clipping.combined_noise_multiplier(
             z, sens, sigma_b, k),
         "stddev_per_round_sum": f"{z:g} x the round's clip norm"}
  if spec.privacy.target_epsilon is not None:
    out["budget_split"] = "clipped_count_stddev fixed; the MF noise takes the rest"
  return out


# ----------------------------------------------------------------------------- a run's ε

def amplification_applies(schema: participation_lib.Participation, n: int,
                          sampling_prob: Optional[float]) -> bool:
  """Whether an amplified analysis applies: random allocation, or min_sep
  (cyclic Poisson) sampling with p < 1 and no cap on participations below the ⌈n/b⌉ that fit
  (a binding cap is not Poisson)."""
  if schema.allocation_amplified:
    return True
  if not schema.poisson or sampling_prob is None or sampling_prob >= 1.0:
    return False
  fit = -(-n // schema.min_sep)
  return schema.max_participations is None or schema.max_participations >= fit


def amplified_analysis(encoder: np.ndarray, schema: participation_lib.Participation) -> str:
  """The amplified analysis of a run whose sampling amplifies (``amplification_applies``):
  amplified_allocation under random allocation, amplified_fixed_bin under fixed-bin
  balls-in-bins; under cyclic Poisson sampling the amplified
  banded analysis when C has at most b bands (Choquette-Choo et al. 2023, arXiv:2306.08153,
  Thm 4), else MMCC (Choquette-Choo et al. 2024, arXiv:2310.15526)."""
  return analyses.automatic(encoder, schema)


def run_privacy(encoder: np.ndarray, schema: participation_lib.Participation,
                noise_multiplier: Optional[float], target_epsilon: Optional[float],
                delta: Optional[float], accountant: str, *,
                sampling_prob: Optional[float] = None,
                adaptive: Optional[Any] = None,
                known_sensitivity: Optional[Dict[str, Any]] = None,
                mmcc_options: Optional[Dict[str, Any]] = None,
                amplification: Optional[Any] = None) -> PrivacyRecord:
  """The privacy of a run that adds z·(C⁻¹Z)-noise for ``encoder`` C under ``schema``.

  Every bound is computed by ``tff_mf.accounting`` and is an upper bound on ε at δ:

  - always, one Gaussian at z/sens, sens C's sensitivity under the schema (Denisov et al.
    2022, arXiv:2202.08312, Thm 4.1; Choquette-Choo et al. 2023, arXiv:2211.06530);
  - with ``sampling_prob`` p < 1 under min_sep (cyclic Poisson sampling, no binding cap):
    also the amplified banded analysis when C has at most b bands (Choquette-Choo et al.
    2023, arXiv:2306.08153, Thm 4), else MMCC (Choquette-Choo et al. 2024,
    arXiv:2310.15526, App D); under random_allocation: also its Rényi bound
    (``tff_mf.accounting.random_allocation``, after Schuchardt & Kalinin 2026, arXiv:2601.21636).
    z is then calibrated with it. The record reports the smallest bound and names it; an
    analysis that does not apply leaves a note;
  - with ``adaptive`` (a checked ``tff_mf.accounting.adaptive_clipping.AdaptiveClipping``): the MF
    Gaussian composed with the clip norm's count queries, one Gaussian at 1/μ, without
    amplification; a target ε keeps σ_b and gives z the rest.

  ``known_sensitivity``: C's sensitivity report under the schema, when the caller holds it.
  ``amplification``: a ``tff_mf.accounting.analyses.Analysis`` used in place of the automatic choice
  (e.g. ``MonteCarloBound``, whose ε the record and statement label with its β).
  Without δ the record has z and sens but no ε. Raises ``CheckError`` on bad input.
  """
  privacy_spec = spec_lib.Privacy(noise_multiplier, target_epsilon, delta, accountant,
                                  sampling_prob, allow_no_noise=True,
                                  amplification=amplification)
  privacy_spec.check_schema(schema)
  return privacy_record(encoder, schema, privacy_spec, adaptive=adaptive,
                        known_sensitivity=known_sensitivity, mmcc_options=mmcc_options)


def privacy_record(encoder: np.ndarray, schema: participation_lib.Participation,
                   privacy_spec: spec_lib.Privacy, *, adaptive: Optional[Any] = None,
                   known_sensitivity: Optional[Dict[str, Any]] = None,
                   mmcc_options: Optional[Dict[str, Any]] = None) -> PrivacyRecord:
  """``run_privacy`` for a checked ``tff_mf.spec.Privacy`` (its schema checked too)."""
  from tff_mf import accounting  # pylint: disable=g-import-not-at-top
  encoder = accounting.check_encoder(encoder, "encoder C")
  with encoder_facts.same_encoder(encoder):  # its analyses at every z share what C gives them
    return _privacy_record(encoder, schema, privacy_spec, adaptive, known_sensitivity,
                           mmcc_options)


def _privacy_record(encoder, schema, privacy_spec, adaptive, known_sensitivity,
                    mmcc_options) -> PrivacyRecord:
  from tff_mf import accounting  # pylint: disable=g-import-not-at-top
  target, delta = privacy_spec.target_epsilon, privacy_spec.delta
  report = known_sensitivity or accounting.sensitivity_report(encoder, schema)
  sens = float(report["value"])
  if privacy_spec.discrete:
    return discrete_record(encoder, schema, report, privacy_spec)
  if delta is None:
    return PrivacyRecord(private=True, noise_multiplier=float(privacy_spec.noise_multiplier),
                         sensitivity=sens, encoder=encoder, participation=schema)
  run = _Run(encoder, schema, report, delta, privacy_spec.accountant,
             privacy_spec.sampling_prob, mmcc_options or {}, privacy_spec.amplification)
  z = privacy_spec.noise_multiplier
  details = run.adaptive(z, target, adaptive) if adaptive is not None else run.record(z, target)
  if target is not None:
    details = details.replace(target_epsilon=target)
    if not details.epsilon <= target:
      raise checks.CheckError(f"calibration gave epsilon {details.epsilon} above the target "
                              f"{target}")
  return PrivacyRecord(private=True, noise_multiplier=float(details.noise_multiplier),
                       sensitivity=sens, delta=delta, accountant=privacy_spec.accountant,
                       epsilon=float(details.epsilon), target_epsilon=target,
                       analysis=details.analysis_label, bound=details.analysis,
                       details=details, encoder=encoder, participation=schema)


def discrete_record(encoder: np.ndarray, schema: participation_lib.Participation,
                    report: Dict[str, Any], privacy_spec: spec_lib.Privacy,
                    tolerance: float = 1e-3) -> PrivacyRecord:
  """The record of a run with the discrete Gaussian (``tff_mf.noise.discrete_gaussian``): z
  given or calibrated (within relative ``tolerance``), ρ-zCDP at the sensitivity inflated by
  the accounted rounding share, ε by Cor. 13 of arXiv:2004.00010; its ``sensitivity`` is that
  inflated one (z/sens is ρ's)."""
  sens = float(report["value"])
  accounted = sens * (1.0 + dg.ROUNDING_INFLATION)
  delta, target = privacy_spec.delta, privacy_spec.target_epsilon
  z = (dg.calibrate(target, delta, sens, rtol=tolerance) if target is not None
       else float(privacy_spec.noise_multiplier))
  common = dict(private=True, noise_multiplier=z, sensitivity=accounted, encoder=encoder,
                participation=schema)
  if delta is None:
    return PrivacyRecord(**common)
  analysis = analyses.DiscreteGaussian
  rho = dg.rho(z, sens) if z > 0 else math.inf
  eps, order = dg.zcdp_epsilon(rho, delta) if z > 0 else (math.inf, math.inf)
  details = Bound.of_json({
      "analysis": analysis.name, "analysis_label": analysis.label, "epsilon": eps,
      "noise_multiplier": z, "delta": delta, "accountant": "zcdp",
      "noise_distribution": "discrete_gaussian", "sensitivity": accounted,
      "encoder_sensitivity": sens, "sensitivity_exact": False,
      "sensitivity_method": f"{report['method']}; times 1 + {dg.ROUNDING_INFLATION:g} for "
                            "the rounding of gamma C x and the float64 clipping and sum of x",
      "rounding_inflation": dg.ROUNDING_INFLATION,
      "granularity": privacy_spec.granularity or "automatic (per model size)",
      "rho": rho, "order": order, "exact": False, "theorem": analysis.theorem, "notes": []})
  details = details.replace(candidates=[_candidate(details)])
  if target is not None:
    details = details.replace(target_epsilon=target)
    if not eps <= target:
      raise checks.CheckError(f"calibration gave epsilon {eps} above the target {target}")
  return PrivacyRecord(**common, delta=delta, accountant="zcdp", epsilon=eps,
                       target_epsilon=target, analysis=analysis.label, bound=analysis.name,
                       details=details)


@dataclasses.dataclass(frozen=True)
class _Run:
  """What ``run_privacy`` computes its candidate bounds from."""
  encoder: np.ndarray
  schema: participation_lib.Participation
  report: Dict[str, Any]
  delta: float
  accountant: str
  sampling_prob: Optional[float]
  mmcc_options: Dict[str, Any]
  chosen: Optional[Any] = None  # an Analysis in place of the automatic choice

  @property
  def amplified(self) -> bool:
    if self.chosen is not None:
      return True  # it says itself, in the record's notes, when it does not apply
    return amplification_applies(self.schema, self.encoder.shape[1], self.sampling_prob)

  def unamplified(self, z: float) -> Bound:
    from tff_mf import accounting  # pylint: disable=g-import-not-at-top
    return accounting.epsilon_for(self.encoder, self.schema, z, self.delta, None,
                                  accountant=self.accountant, known_sensitivity=self.report)

  def calibrated(self, target: float) -> float:
    from tff_mf import accounting  # pylint: disable=g-import-not-at-top
    return float(accounting.calibrate_noise_multiplier(target, self.delta, self.accountant,
                                                       sensitivity=self.report["value"]))

  def amplified_record(self, z: Optional[float], target: Optional[float]):
    """(record, note): the amplified analysis at z (or calibrated to ``target``)."""
    from tff_mf import accounting  # pylint: disable=g-import-not-at-top
    args = (self.encoder, self.schema)
    analysis = self.chosen or amplified_analysis(self.encoder, self.schema)
    if self.chosen is not None:
      options = dict(amplification=analysis, sampling_prob=self.sampling_prob,
                     accountant=self.accountant, known_sensitivity=self.report)
    elif analyses.REGISTRY[analysis].poisson:
      options = dict(amplification=analysis, sampling_prob=self.sampling_prob,
                     accountant=self.accountant, mmcc_options=self.mmcc_options)
    else:
      options = dict(amplification=analysis, accountant=self.accountant,
                     known_sensitivity=self.report)
    try:
      if target is not None:
        return accounting.calibrate(*args, target, self.delta, **options), ""
      return accounting.epsilon_for(*args, z, self.delta, **options), ""
    except ValueError as e:  # AccountingError, CheckError: the analysis does not apply
      name = getattr(analysis, "name", analysis)
      return None, f"{name} analysis not applicable: {' '.join(str(e).split())}"

  def record(self, z: Optional[float], target: Optional[float]) -> Bound:
    notes: List[str] = []
    amplified = None
    if self.amplified:
      amplified, note = self.amplified_record(z, target)
      if amplified is None:
        notes.append(note)
      else:
        z = amplified.noise_multiplier
    if z is None:
      z = self.calibrated(target)
    plain = self.unamplified(float(z))
    candidates = [plain] + ([amplified] if amplified is not None else [])
    best = min(candidates, key=lambda r: r.epsilon)
    fields: Dict[str, Any] = dict(
        candidates=[_candidate(r) for r in candidates], notes=notes,
        analysis_label=analyses.REGISTRY[best.analysis].label + (
            f" ({best.epsilon_label})" if best.epsilon_label else ""))
    if self.sampling_prob is not None and best.sampling_prob is None:
      fields["sampling_prob"] = self.sampling_prob  # the sampling, whichever bound is reported
    if analyses.REGISTRY[best.analysis].poisson:
      # ``sensitivity`` then means every eligible round joined; the noise is calibrated for
      # the unamplified one (one field a meaning).
      fields.update(unamplified_sensitivity=plain.sensitivity,
                    unamplified_sensitivity_exact=plain.sensitivity_exact,
                    unamplified_sensitivity_method=plain.sensitivity_method)
    # MMCC's per-row details: too large for a run record.
    return best.without("mmcc").replace(**fields)

  def adaptive(self, z: Optional[float], target: Optional[float], adaptive) -> Bound:
    """μ² = (sens/z)² + k·(½/σ_b)² (``tff_mf.accounting.adaptive_clipping``), one Gaussian at 1/μ."""
    from tff_mf import accounting  # pylint: disable=g-import-not-at-top
    from tff_mf.accounting import adaptive_clipping  # pylint: disable=g-import-not-at-top
    k = self.schema.max_participations_in(self.encoder.shape[1])
    sigma_b, sens = adaptive.clipped_count_stddev, float(self.report["value"])
    if target is not None:
      total = accounting.calibrate_noise_multiplier(target, self.delta, self.accountant)
      z = adaptive_clipping.value_noise_multiplier(total, sens, sigma_b, k)
    plain = self.unamplified(float(z))
    total = adaptive_clipping.combined_noise_multiplier(z, sens, sigma_b, k)
    eps = math.inf if total == 0.0 else accounting.epsilon(total, self.delta, self.accountant)
    record = plain.replace(epsilon=eps, analysis=analyses.AdaptiveClipping.name,
                           noise_multiplier=float(z),
                           effective_noise_multiplier=total, count_participations=k,
                           clipped_count_stddev=sigma_b)
    return record.replace(candidates=[_candidate(record)],
                          analysis_label=analyses.AdaptiveClipping.label,
                          notes=["adaptive clipping: the count queries are accounted without "
                                 "amplification"] if self.amplified else [])


# What a candidate bound keeps: an amplified one both of its bounds (the statement shows each),
# an ε's β never left behind.
_CANDIDATE_FIELDS = ("analysis", "epsilon", "sensitivity", "accountant", "amplified_epsilon",
                     "unamplified_epsilon", "bound", "min_sep", "failure_probability",
                     "epsilon_label")


def _candidate(record: Bound) -> Bound:
  """A candidate bound of a run record: ``record``'s ``_CANDIDATE_FIELDS``."""
  form = record.json()
  return Bound.of_json({key: form[key] for key in _CANDIDATE_FIELDS if key in form})


# ----------------------------------------------------------------------------- ε by round

# Rounds at which the per-round ε is evaluated, at most (the others take the next evaluated
# round's value, a valid and non-decreasing upper bound): keeps long runs cheap.
MAX_EPSILON_POINTS = 64


def released_rows(c: np.ndarray, rounds: int) -> np.ndarray:
  """The rows of C released after ``rounds`` rounds, all n columns kept.

  Row i of a square (lower-triangular) C is released in round i; a C with more rows than
  rounds (TFF's tree, C_T/√levels) has its rows in release order, each released in the
  round of its last non-zero column (``tff_mf.accounting.mmcc.release_rounds``). Taken no earlier
  than any later column it touches, so the rows kept depend only on rounds 1..``rounds``.
  """
  m, n = c.shape
  nonzero = c != 0
  last = np.where(nonzero.any(axis=1), n - 1 - np.argmax(nonzero[:, ::-1], axis=1), -1)
  release = np.maximum(last, np.arange(m)) if m == n else np.maximum.accumulate(last)
  return c[release < rounds]


def prefix_encoder(c: np.ndarray, schema_n: participation_lib.Participation, rounds: int):
  """(C', schema'): what the first ``rounds`` rounds release, and the schema it is under.

  A square C under min_sep: the leading block C[:r, :r] under the same min_sep schema on
  r rounds (single when b > r), which is the n-round schema restricted to the first r
  rounds, and keeps C's structure (e.g. Toeplitz) for a fast exact sensitivity. Otherwise
  ``released_rows`` under the n-round schema: those rows have no column beyond round r.
  """
  m, n = c.shape
  prefix = schema_n.prefix(rounds)
  if m == n and prefix is not None and not np.any(np.triu(c, 1)):
    return c[:rounds, :rounds], prefix
  return released_rows(c, rounds), schema_n


def _evaluated_rounds(n: int) -> List[int]:
  return sorted(set(np.ceil(np.linspace(1, n, min(n, MAX_EPSILON_POINTS))).astype(int).tolist())
                | {n})


def epsilon_by_round(c: np.ndarray, schema: participation_lib.Participation, z: float,
                     delta: float, accountant: str, details: Mapping[str, Any]) -> List[float]:
  """ε spent after rounds 1..n: upper bounds, non-decreasing, the last ``details``' ε.

  After r rounds a run has released the rows of C of rounds ≤ r (``prefix_encoder``): the
  Gaussian mechanism at z / sens_r, sens_r the sensitivity of those rows under the
  schema (its patterns restricted to rounds ≤ r, since the rows have zero columns
  beyond), by ``accountant`` (Denisov et al. 2022, arXiv:2202.08312, Thm 4.1); with
  adaptive clipping composed with the count queries released by round r (a user joins at
  most ``schema.participations_by(n, r)`` of them). ε
  after r rounds is at most ε after any later round (the earlier release is a
  post-processing of the later one), so each value is the smallest of these bounds from r
  on, and the last is the record's ε (amplified where it is). Evaluated at
  ≤ ``MAX_EPSILON_POINTS`` rounds.
  """
  from tff_mf import accounting  # pylint: disable=g-import-not-at-top
  n = c.shape[1]
  details = Bound.of_json(details)
  final = float(details.epsilon)
  bounds = {}
  for r in _evaluated_rounds(n)[:-1]:
    rows, schema_r = prefix_encoder(c, schema, r)
    if not np.any(rows):
      bounds[r] = 0.0
      continue
    sens = accounting.sensitivity_report(rows, schema_r)["value"]
    bounds[r] = _epsilon_at(z, sens, delta, accountant, details,
                            count_participations=schema.participations_by(n, r))
  bounds[n] = final
  out, best = [0.0] * n, final
  for r in range(n, 0, -1):
    best = min(best, bounds.get(r, best))
    out[r - 1] = best
  return out


def _epsilon_at(z: float, sens: float, delta: float, accountant: str,
                details: Bound, count_participations: int) -> float:
  """ε of a released prefix with sensitivity ``sens`` (the record's analysis, unamplified);
  with adaptive clipping, composed with the ``count_participations`` count queries a user
  can have joined in it (docs/mechanisms.md, "Adaptive clipping", ε after each round)."""
  from tff_mf import accounting  # pylint: disable=g-import-not-at-top
  own = details.rest  # the analysis's own fields
  if own.get("noise_distribution") == "discrete_gaussian":
    # The prefix's rounding term is at most the whole run's (η times its sensitivity).
    return dg.epsilon(z, delta, sens, own["encoder_sensitivity"])
  if analyses.counts_clipping(details):
    from tff_mf.accounting import adaptive_clipping  # pylint: disable=g-import-not-at-top
    total = adaptive_clipping.combined_noise_multiplier(
        z, sens, own["clipped_count_stddev"],
        min(count_participations, own["count_participations"]))
    return math.inf if total == 0.0 else accounting.epsilon(total, delta, accountant)
  return accounting.epsilon(z, delta, accountant, sensitivity=sens)
