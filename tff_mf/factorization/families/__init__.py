"""Strategy families: each module owns the math of one family of encoders C (numpy core).

The family protocol. A family module exposes

- ``VERSION`` (part of cache keys);
- ``STRATEGIES``: ``{strategy name: Declaration}`` — for each strategy it computes, the
  parameters it reads and their defaults for (n, schema), the schemas it supports, its
  peak memory, whether it streams its noise and whether mechanisms load it from the
  cache (see ``Declaration``);
- ``factorize(a, spec, context) -> FamilyResult``: an unnormalized B, C with B·C = A,
  JSON-ready info and the float64 parameters the cache stores beside A, B and C;
- optionally ``check_extras(factorization)`` (its stored parameters rebuild its
  matrices) and, when it streams, ``stream(extras, a) -> tff_mf.noise.streams.LinearStream``;
- optionally, for a lower-triangular Toeplitz C, ``factorize_toeplitz(a_column, spec,
  context) -> ToeplitzFamilyResult``: the first columns of B and C for the Toeplitz workload
  with first column ``a_column``, never an n x n matrix (then the factorization is a
  ``tff_mf.factorization.toeplitz_factorization.ToeplitzFactorization`` and the cache stores
  the first columns).

``tff_mf.registry`` names each strategy's family module (``Strategy.family``: a module of
this package, or any importable module path); ``tff_mf.factorization.strategies``,
``tff_mf.factorization.cache``, ``tff_mf.mechanisms``, the commands and the TF layer read the declarations, so a new
family is one module plus one registry entry (``registry.register``). This package
module holds only the types the families share.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import numpy as np

from tff_mf import checks


@dataclasses.dataclass
class FamilyResult:
  """What a family computes for one workload A (not yet normalized)."""
  b: np.ndarray
  c: np.ndarray
  info: Dict[str, Any] = dataclasses.field(default_factory=dict)
  extras: Dict[str, np.ndarray] = dataclasses.field(default_factory=dict)

  def normalized(self) -> "FamilyResult":
    """(γ·B, C/γ) with γ = γ(C): C's largest column norm becomes 1 (Denisov et al. 2022,
    arXiv:2202.08312, App I). The extras keep describing the unnormalized C; γ is added
    to them as ``normalization`` so the stream is rebuilt for the normalized C."""
    gamma = checks.gamma(self.c)
    if not np.isfinite(gamma) or gamma <= 0:
      raise checks.CheckError(f"C has invalid largest column norm γ = {gamma}")
    info = dict(self.info, gamma_before_normalization=gamma)
    extras = dict(self.extras, normalization=np.array([gamma]))
    return FamilyResult(b=self.b * gamma, c=self.c / gamma, info=info, extras=extras)


@dataclasses.dataclass
class ToeplitzFamilyResult:
  """What a Toeplitz family computes for a Toeplitz workload: first columns of the
  unnormalized B and C (A = B·C), JSON-ready info and float64 parameters."""
  b_column: np.ndarray
  c_column: np.ndarray
  info: Dict[str, Any] = dataclasses.field(default_factory=dict)
  extras: Dict[str, np.ndarray] = dataclasses.field(default_factory=dict)


def toeplitz_family_result(optimize, size: int, a_column: np.ndarray,
                           spec) -> ToeplitzFamilyResult:
  """A Toeplitz family's ``factorize_toeplitz``: its ``optimize(n, size, min_sep=,
  max_participations=, error=, workload=, dense=False)`` (a
  ``tff_mf.factorization.toeplitz_ops.Result``) for the Toeplitz workload with first column
  ``a_column`` under the spec's schema and error, returned as first columns."""
  from tff_mf.participation import toeplitz_bounds  # pylint: disable=g-import-not-at-top
  n = a_column.shape[0]
  min_sep, k = toeplitz_bounds.schema_arguments(spec.participation, n)
  result = optimize(n, size, min_sep=min_sep, max_participations=k, error=spec.error,
                    workload=a_column, dense=False)
  if result.columns is None:
    raise checks.CheckError("a Toeplitz family's result for a non-Toeplitz workload has no "
                            "first columns")
  c_column, b_column = result.columns
  return ToeplitzFamilyResult(b_column=b_column, c_column=c_column, info=dict(result.info),
                              extras=dict(result.extras))


# The FactorizationSpec fields a strategy may read (tff_mf.factorization.strategies.FactorizationSpec).
SPEC_PARAMETERS = ("target_gap", "max_iterations", "allow_unconverged", "bands", "rank",
                   "buffers", "error", "als_iterations")
# Short names of parameters in cache entry names ("blt-m4", "banded-b8").
PARAMETER_LABELS = {"bands": "b", "rank": "r", "buffers": "m"}
# The check of each parameter a caller may set (``value, name -> checked value``); a family
# declares the checks of its own parameters (``Declaration.own_parameters``).
# The flag of each shared parameter a caller may set: (metavar, meaning); a family declares
# the flags of its own (``Declaration.own_parameter_flags``); ``tff_mf.spec.family_flags``.
PARAMETER_FLAGS: Mapping[str, Tuple[str, str]] = {
    "bands": ("B", "structured: diagonals h kept exactly (default: ⌈log₂n/2⌉); banded, "
                   "banded_toeplitz, bsr, bisr, banded_inverse: bands b of C (default: the "
                   "schema's separation, at most 64; 16 under single participation)"),
    "rank": ("R", "structured: rank r of the low-rank part (default: ⌊log₂n/2⌋)"),
    "buffers": ("M", "blt: buffers m (default: 4)"),
}
PARAMETER_CHECKS: Mapping[str, Callable[[Any, str], Any]] = {
    "bands": checks.positive_int, "rank": checks.nonnegative_int,
    "buffers": checks.positive_int}


def no_defaults(n: int, schema) -> Dict[str, Any]:
  del n, schema
  return {}


@dataclasses.dataclass(frozen=True)
class Declaration:
  """What a family declares about one strategy it computes (the family protocol).

  Attributes:
    parameters: the ``FactorizationSpec`` fields the strategy reads (every other field
      must keep its default), and its ``own_parameters``.
    defaults: ``(n, schema) -> {parameter: value}``, the values used when a caller gives
      none (the keys are the parameters a caller may set: bands, rank, buffers and the
      family's own).
    participations: the schema kinds C can be optimized for; a mechanism under another
      schema uses the single-participation C and its sensitivity under the schema.
    schema_dependent: C depends on the schema even under single participation, so the
      schema is part of the cache key.
    schema_free: C reads only A and the parameters, whatever schema it is optimized for
      (the schema bounds the parameters only, ``check_spec``): a mechanism checks its
      parameters against its schema, then shares the single-participation factorization
      with every other schema and computes the sensitivity under its own.
    peak_matrices: dense n × (encoder_rows·n) float64 matrices held at the peak (checked
      against memory before A is built).
    encoder_rows: C has encoder_rows·n rows (2 for the tree's C_T).
    streams: the family rebuilds C⁻¹·Z as a ``LinearStream`` (``stream``).
    cached: mechanisms load it through ``tff_mf.factorization.cache`` (False for closed forms, cheaper
      to rebuild than to load and check).
    check_spec: ``spec -> None``, the strategy's own parameter checks (raises
      ``CheckError``).
    parameter_labels: short names in cache entry names, overriding ``PARAMETER_LABELS``.
    own_parameters: ``{name: check}`` for parameters of this family beyond the
      ``FactorizationSpec`` fields (``check(value, name)`` returns the checked value); a
      ``tff_mf.spec.MechanismSpec`` carries them in ``params`` and the family reads them as
      ``spec.<name>``, so a new parameter touches only its family.
    own_parameter_flags: ``{name: (type, metavar, meaning)}``, the command-line flag of each
      own parameter: every tool defines it (``tff_mf.spec.family_flags``).
    optimum: C minimizes the error for A under the schema it is optimized for (a certified
      optimum, not a family with parameters): a table names it by its schema.
  """
  parameters: Tuple[str, ...] = ()
  defaults: Callable[[int, Any], Dict[str, Any]] = no_defaults
  participations: Tuple[str, ...] = ("single",)
  schema_dependent: bool = False
  schema_free: bool = False
  peak_matrices: int = 12
  encoder_rows: int = 1
  streams: bool = False
  cached: bool = True
  check_spec: Optional[Callable[[Any], None]] = None
  parameter_labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
  own_parameters: Mapping[str, Callable[[Any, str], Any]] = dataclasses.field(
      default_factory=dict)
  own_parameter_flags: Mapping[str, Tuple[type, str, str]] = dataclasses.field(
      default_factory=dict)
  optimum: bool = False

  def __post_init__(self):
    unknown = set(self.parameters) - set(SPEC_PARAMETERS) - set(self.own_parameters)
    if unknown:
      raise checks.CheckError(f"family declaration names unknown parameters {sorted(unknown)}")
    clash = set(self.own_parameters) & set(SPEC_PARAMETERS)
    if clash:
      raise checks.CheckError(f"family declaration redeclares parameters {sorted(clash)}")
    if set(self.own_parameter_flags) != set(self.own_parameters):
      raise checks.CheckError("family declaration: every own parameter declares its flag "
                              "(own_parameter_flags), and only they do")

  def parameter_check(self, parameter: str) -> Callable[[Any, str], Any]:
    """The check of a parameter a caller may set (the family's own, else the shared one)."""
    return self.own_parameters.get(parameter) or PARAMETER_CHECKS.get(
        parameter, lambda value, name: value)

  def check_parameters(self, given: Mapping[str, Any], n: int, schema,
                       owner: str) -> Dict[str, Any]:
    """The parameters a caller gave (None: not given), checked: each one a caller may set
    for (n, schema) (``defaults``), by its check; CheckError "<name> does not apply to
    <owner>" for any other."""
    accepted = self.defaults(n, schema)
    for name, value in given.items():
      if value is not None and name not in accepted:
        raise checks.CheckError(f"{name} does not apply to {owner}")
    return {name: self.parameter_check(name)(value, name) for name, value in given.items()
            if value is not None}

  def label(self, parameter: str) -> str:
    return self.parameter_labels.get(parameter, PARAMETER_LABELS.get(parameter, parameter))


# ----------------------------------------------------------------------------- shared defaults

# Largest default band count of banded strategies: their noise state is b − 1 model rows.
DEFAULT_MAX_BANDS = 64
DEFAULT_SINGLE_PARTICIPATION_BANDS = 16


def separation_bands(n: int, schema) -> Dict[str, int]:
  """Default b of banded strategies: the schema's separation (min-sep b, or n/k for k fixed
  epochs; bands ≤ separation make the sensitivity exact, Choquette-Choo et al. 2023,
  arXiv:2306.08153), at most ``DEFAULT_MAX_BANDS``; ``DEFAULT_SINGLE_PARTICIPATION_BANDS``
  under single participation."""
  cover = schema.cyclic_cover(n) if schema is not None else None
  bands = DEFAULT_SINGLE_PARTICIPATION_BANDS if cover is None else cover[0]
  return {"bands": max(1, min(n, bands, DEFAULT_MAX_BANDS))}


def check_bands(spec, at_most_separation: bool = False) -> None:
  """1 ≤ b ≤ n; with ``at_most_separation`` also b within the schema's separation where
  the schema requires it (``Participation.check_bands``)."""
  checks.positive_int(spec.bands, f"{spec.strategy} bands b")
  if spec.bands > spec.n:
    raise checks.CheckError(f"{spec.strategy} bands b={spec.bands} exceed n={spec.n}")
  if at_most_separation:
    spec.participation.check_bands(spec.bands, spec.strategy)


@dataclasses.dataclass(frozen=True)
class Context:
  """What a family may need besides A: the optimal decoder for A (structured)."""
  optimal: Optional[Callable[[], Any]] = None
  progress: bool = False
