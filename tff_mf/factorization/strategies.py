"""How A = B·C is chosen: one entry point for every strategy (numpy core).

``factorize(spec)`` builds the workload A of ``spec``, runs the strategy's family
module (``tff_mf.factorization.families``, named by ``tff_mf.registry.STRATEGIES``), normalizes
the result so that γ(C) = 1 (Denisov et al. 2022, arXiv:2202.08312, App I),
validates it, and records its sensitivity, rmse and max_error under the
participation schema of the spec (``tff_mf.participation``).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

from tff_mf import checks
from tff_mf.factorization import dense_run
from tff_mf import factorization as fz
from tff_mf.factorization import families
from tff_mf.factorization import lbfgs
from tff_mf.factorization import toeplitz_factorization
from tff_mf import participation as participation_lib
from tff_mf import registry
from tff_mf.noise import streams
from tff_mf.factorization import workloads
from tff_mf.factorization.families import structured

STRATEGIES = tuple(registry.STRATEGIES)
DEFAULT_TARGET_GAP = 1e-6
ERRORS = ("mean", "max")


@dataclasses.dataclass(frozen=True)
class FactorizationSpec:
  """Everything that determines a factorization; its fields form the cache key."""
  workload: workloads.WorkloadSpec
  strategy: str = registry.OPTIMAL.name
  participation: participation_lib.Participation = participation_lib.SINGLE
  target_gap: float = DEFAULT_TARGET_GAP  # optimal, structured: relative duality gap to reach
  max_iterations: int = 10_000  # optimal (structured: of its optimal decoder): iteration limit
  allow_unconverged: bool = False  # optimal: opt-in to return a result above target_gap
  bands: int = 0  # structured: h; banded, banded_toeplitz: b
  rank: int = 0  # structured: r
  buffers: int = 0  # blt: m
  error: str = "mean"  # banded_toeplitz, blt: the error optimized (mean or max)
  als_iterations: int = structured.DEFAULT_ALS_ITERATIONS  # structured: ALS sweeps (limit)
  # ((name, value), ...): parameters a family declares itself (``Declaration.own_parameters``),
  # read as attributes (``spec.<name>``).
  family_parameters: Tuple[Tuple[str, Any], ...] = ()

  def __getattr__(self, name: str) -> Any:
    for key, value in self.__dict__.get("family_parameters", ()):
      if key == name:
        return value
    raise AttributeError(f"FactorizationSpec has no parameter {name!r}")

  @classmethod
  def with_parameters(cls, params: Mapping[str, Any], **fields) -> "FactorizationSpec":
    """A spec with family parameters ``params`` (bands, rank, buffers or a family's own)."""
    own = tuple(sorted((k, v) for k, v in params.items() if k not in families.SPEC_PARAMETERS))
    shared = {k: v for k, v in params.items() if k in families.SPEC_PARAMETERS}
    return cls(**fields, **shared, family_parameters=own)

  @property
  def n(self) -> int:
    return self.workload.n

  def validate(self) -> None:
    """Raises CheckError naming the first bad or unused parameter."""
    entry = registry.strategy(self.strategy)
    if not isinstance(self.participation, participation_lib.Participation):
      raise checks.CheckError(f"participation must be a tff_mf.participation schema, got "
                              f"{self.participation!r}")
    if self.participation.kind not in entry.participations:
      raise checks.CheckError(
          f"strategy {self.strategy!r} supports participation "
          f"{', '.join(entry.participations)}, not {self.participation.kind!r}")
    self.participation.check(self.n)
    declared = entry.declaration
    defaults = FactorizationSpec(workload=self.workload)
    for name in families.SPEC_PARAMETERS:
      if name not in declared.parameters and getattr(self, name) != getattr(defaults, name):
        raise checks.CheckError(f"{name} does not apply to strategy {self.strategy!r}")
    for name, value in self.family_parameters:
      if name not in declared.own_parameters:
        raise checks.CheckError(f"{name} does not apply to strategy {self.strategy!r}")
      declared.own_parameters[name](value, name)
    if "target_gap" in declared.parameters:
      checks.in_range(self.target_gap, "target_gap", 0.0, 1.0, low_open=True)
      checks.positive_int(self.max_iterations, "max_iterations")
    if "als_iterations" in declared.parameters:
      checks.positive_int(self.als_iterations, "als_iterations")
    if declared.check_spec is not None:
      declared.check_spec(self)
    if self.error not in ERRORS:
      raise checks.CheckError(f"error must be one of {ERRORS}, got {self.error!r}")

  def key_params(self) -> Dict[str, Any]:
    """The parameters that determine the stored matrices (part of the cache key)."""
    declared = registry.strategy(self.strategy).declaration
    params: Dict[str, Any] = {"strategy": self.strategy}
    for name in declared.parameters:
      if name in ("max_iterations", "allow_unconverged") and not self.allow_unconverged:
        continue  # a converged result does not depend on the iteration limit
      value = getattr(self, name)
      params[name] = float(value) if name == "target_gap" else value
    if not self.participation.at_most_once or declared.schema_dependent:
      params["participation"] = self.participation.cache_key(self.n)
    return params


def toeplitz_workload(spec: FactorizationSpec):
  """A's first column when ``spec``'s family computes Toeplitz first columns
  (``factorize_toeplitz``) and its workload is Toeplitz; else None (the dense path)."""
  return toeplitz_column(spec.strategy, spec.workload)


def toeplitz_column(strategy: str, workload: workloads.WorkloadSpec):
  """``toeplitz_workload`` of a strategy and a workload (no spec needed)."""
  if not hasattr(family_module(strategy), "factorize_toeplitz"):
    return None
  return workload.toeplitz_column()


def check_size(spec: FactorizationSpec) -> float:
  """Refuses, before A is built, a size whose dense matrices would not fit in memory.

  Returns the bytes of memory the computation plans for (O(n) first columns on the
  Toeplitz path, ``toeplitz_workload``).
  """
  if toeplitz_workload(spec) is not None:
    return 8.0 * spec.n * 16
  declared = registry.strategy(spec.strategy).declaration
  copies = declared.peak_matrices
  m = declared.encoder_rows * spec.n
  checks.dense_matrices_fit(spec.n, copies, f"strategy {spec.strategy} at n = {spec.n}", m=m)
  return 8.0 * spec.n * m * copies


def factorize(spec: FactorizationSpec, progress: bool = False,
              context: Optional[families.Context] = None) -> fz.Factorization:
  """Computes the factorization described by ``spec`` (normalized, validated, measured)."""
  spec.validate()
  check_size(spec)
  start = time.perf_counter()
  context = context or families.Context(progress=progress)
  a_column = toeplitz_workload(spec)
  if a_column is not None:  # Toeplitz A and C: first columns only, O(n) memory
    column_result = family_module(spec.strategy).factorize_toeplitz(a_column, spec, context)
    info = dict(column_result.info)
    info.setdefault("seconds", time.perf_counter() - start)
    f = toeplitz_factorization.from_columns(
        a_column, column_result.b_column, column_result.c_column, spec.strategy, info,
        column_result.extras).validate()
  else:
    a = spec.workload.build()
    result = family_module(spec.strategy).factorize(a, spec, context).normalized()
    info = dict(result.info)
    info.setdefault("seconds", time.perf_counter() - start)
    f = fz.Factorization(a=a, b=result.b, c=result.c, strategy=spec.strategy, info=info,
                         extras=result.extras).validate()
  f.info.update(error_figures(f, spec.participation))
  f.info[OUTCOME] = solver_outcome(spec, f.info)
  if f.info[OUTCOME] is None:
    raise checks.CheckError(f"strategy {spec.strategy!r} returned other parameters than "
                            "requested without saying why")
  return f


class SolverOutcomeError(checks.CheckError):
  """``strict``: a solver returned other parameters than requested, or did not converge."""


# The info key of the record of what was asked and what was done (``solver_outcome``).
OUTCOME = "outcome"
# Family parameters a solver may return changed (e.g. BLT buffers it switched off).
_RETURNED = ("bands", "rank", "buffers")


def solver_outcome(spec: FactorizationSpec, info: Dict[str, Any]) -> Optional[Dict[str, Any]]:
  """What was asked and what was done, in one shape for every family.

  ``requested`` and ``returned``: the family parameters (bands, rank, buffers) of the spec
  and of the result; ``converged``: the solver's own verdict (for structured, also those of
  the optimal decoder and of the ALS fit); ``why``: one line, empty unless they differ or
  it did not converge. Computed from the factorization info alone; None when that info
  (cached before the outcome was recorded) cannot say why parameters differ or whether
  the ALS fit converged.
  """
  declared = registry.strategy(spec.strategy).declaration.parameters
  requested = {k: getattr(spec, k) for k in _RETURNED if k in declared}
  returned = {k: int(info.get(k, v)) for k, v in requested.items()}
  # A strategy that reads als_iterations (structured) also fits B̂ by ALS, whose verdict counts.
  if ((returned != requested and "returned_why" not in info)
      or ("als_iterations" in declared and "als_converged" not in info)):
    return None
  converged = all(bool(info.get(k, True))
                  for k in ("converged", "optimal_converged", "als_converged"))
  why = [f"{key} {returned[key]} returned for {value} requested: {info['returned_why']}"
         for key, value in requested.items() if returned[key] != value]
  if not converged:
    why.append(f"not converged: {_why_unconverged(info)}")
  return {"requested": requested, "returned": returned, "converged": converged,
          "why": "; ".join(why)}


def _why_unconverged(info: Dict[str, Any]) -> str:
  """Each solver that did not converge, and why (one line)."""
  reasons = []
  if not info.get("converged", True):
    if "gradient_norm" in info and "message" in info:
      reasons.append(lbfgs.why_unconverged(info["message"], info["gradient_norm"]))
    elif "relative_gap" in info:
      reasons.append(f"relative duality gap {info['relative_gap']:.3g} above the target "
                     f"({dense_run.STOP_REASONS.get(info.get('stop_reason'), 'stopped')})")
    else:
      reasons.append(str(info.get("message") or info.get("solver_message") or "stopped"))
  if not info.get("optimal_converged", True):
    reasons.append(f"the optimal decoder's relative duality gap "
                   f"{info.get('optimal_relative_gap', float('nan')):.3g} is above the target")
  if not info.get("als_converged", True):
    reasons.append(structured.why_als_unconverged(info))
  return "; ".join(reasons)


def deviates(outcome: Dict[str, Any]) -> bool:
  """Whether a ``solver_outcome`` differs from the request or did not converge."""
  return outcome["requested"] != outcome["returned"] or not outcome["converged"]


def error_figures(f: fz.Factorization,
                  schema: participation_lib.Participation) -> Dict[str, Any]:
  """sensitivity (under ``schema``), rmse, max_error and the analysis that gave them."""
  report = f.sensitivity_report(schema)
  sens = report["value"]
  if isinstance(f, toeplitz_factorization.ToeplitzFactorization):
    errors = {"rmse": float(sens * np.sqrt(f.decoder_frobenius_sq() / f.n)),
              "max_error": float(sens * np.sqrt(np.max(f.decoder_row_norms_sq())))}
  else:
    errors = {"rmse": fz.rmse(f.b, sens), "max_error": fz.max_error(f.b, sens)}
  return {"participation": schema.as_dict(), "sensitivity": sens,
          "sensitivity_exact": report["exact"], "sensitivity_method": report["method"],
          **errors}


def post_processed(f_prefix: fz.Factorization, a, name: str) -> fz.Factorization:
  """A = (A·S⁻¹·B_S)·C_S: a prefix-sum factorization serving workload A (Denisov Table 1)."""
  b = fz.post_process_prefix_decoder(a, f_prefix.b)
  info = dict(f_prefix.info, post_processed_from=f_prefix.strategy)
  f = fz.Factorization(a=a, b=b, c=f_prefix.c, strategy=name, info=info,
                       extras=dict(f_prefix.extras)).validate(atol=1e-6)
  f._sensitivity_reports.update(f_prefix._sensitivity_reports)  # pylint: disable=protected-access
  return f



def family_module(strategy: str):
  """The family module that computes ``strategy``."""
  return registry.strategy(strategy).module


def cached(strategy: str) -> bool:
  """Whether a mechanism loads this strategy's factorization through ``tff_mf.factorization.cache``
  (its family's declaration; closed forms are cheaper to rebuild than to load and check)."""
  return bool(registry.strategy(strategy).declaration.cached)


def stream(strategy: str, extras: Dict[str, Any], a) -> streams.LinearStream:
  """The LinearStream of a normalized factorization, rebuilt from its stored extras.

  The family rebuilds the stream of its unnormalized C⁻¹; the outputs are then
  multiplied by the stored ``normalization`` γ, since (C/γ)⁻¹ = γ·C⁻¹.
  """
  if not registry.strategy(strategy).streams:
    raise checks.CheckError(f"strategy {strategy!r} has no streaming form")
  gamma = extras.get("normalization")
  if gamma is None or getattr(gamma, "shape", None) != (1,):
    raise checks.CheckError(f"{strategy}: stored parameters lack the normalization γ")
  return family_module(strategy).stream(extras, a).scaled(
      checks.positive_float(float(gamma[0]), f"{strategy}: normalization γ"))
