"""The planner: which mechanism, participation schema and family parameters give the least
expected error at a deployment's size and target ε (numpy core; no TensorFlow).

A deployment says: its population P, the n rounds, the K clients per round, the target
(ε, δ), the schemas it can enforce, optionally a cap on the server's noise state (in
model-sized rows) and the workload (prefix sums, or momentum β with a learning-rate
schedule). ``plan`` enumerates mechanism × schema × family parameters, builds each candidate
with ``tff_mf.mechanisms.build`` (z calibrated to the target as a training run calibrates
it: the smallest of the valid bounds, amplified where the schema's sampling amplifies, so
every reported ε is an upper bound ≤ the target) and scores it at its z:

- ``rmse``: z·‖B‖_F/√n, the root-mean-square error of the workload's released estimates
  (B·Z·z, in units of ζ/K per coordinate; the figure minimized; Denisov et al. 2022,
  arXiv:2202.08312, Eq. 2 at the calibrated z);
- ``max_error``: z·max_i ‖B[i, :]‖, the worst round's (Choquette-Choo et al. 2023,
  arXiv:2306.08153, Sec 2);
- ``rmse_per_participation``: rmse / E, E the expected participations of a client, the
  figure of jax_privacy's ``BandMFConfig.rmse`` (McKenna 2024, arXiv:2405.15913) that
  ``tff-mf calibrate-bands`` ranks bands by.

How each schema reaches K clients per round from P clients (``schema_options``):

- single: every client joins at most one round: needs P ≥ n·K;
- fixed_epoch (k epochs): b = n/k cohorts of K fixed clients, cohort j in rounds j, j + b, …;
  uses b·K ≤ P clients; k is the fewest epochs (a divisor of n) with b·K ≤ P;
- min_sep (separation b, cyclic Poisson): each client in one secret residue class mod b of
  the P clients, joining each round of its class with probability p = K·b/P (expected K per
  round); b from the powers of 2 up to min(n, ⌊P/K⌋), and ⌊P/K⌋ (p = 1 there: no
  amplification). p < 1 is accounted with amplification (amplified banded MF when C has at
  most b bands, arXiv:2306.08153 Thm 4; else MMCC, arXiv:2310.15526);
- balls_in_bins (k epochs): b·K clients, each in one secret uniformly random bin of b = n/k,
  joining every round of its bin (expected K per round), k as for fixed_epoch;
- random_allocation (k epochs): b·K clients, each in one uniformly random round of each of
  the k epochs of b = n/k rounds (expected K per round), k as for fixed_epoch.

Using fewer clients than P (b·K of them) is a choice made before training, independent of
the data: it changes no privacy analysis.

Speed. Factorizations come from ``tff_mf.factorization.cache`` and are shared by the
candidates (and by later runs). Calibrated records, and the ε evaluations of the pruning,
are kept in the cache directory's ``.planner`` folder keyed by everything they depend on
(``Records``): candidates with the same encoder, schema and privacy share one calibration,
and a later run reads them back. Candidates are calibrated likely winners first
(``search``), and a candidate is pruned, never guessed away, when one evaluation of its ε
proves its error above the best's by more than the calibration tolerance
(``prune_check``: rmse grows with z, and ε does not grow with z).
"""

from __future__ import annotations

import collections
import collections.abc
import dataclasses
import functools
import glob
import hashlib
import json
import math
import os
import sys
import tempfile
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from tff_mf import checks
from tff_mf import jsonio
from tff_mf import mechanisms
from tff_mf import participation as participation_lib
from tff_mf import planner_bounds
from tff_mf import planner_prefetch
from tff_mf import registry
from tff_mf import spec as spec_lib
from tff_mf import toeplitz_view
from tff_mf.accounting import band_calibration

TOLERANCE = 1e-3  # relative tolerance of each calibrated z (tff_mf.accounting.calibrate's)
BUFFERS = (1, 2, 3, 4)  # BLT buffers tried
PLOT_EPSILONS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)  # the ε axis of the plot, with the target

# What the deployment must enforce for each schema's privacy claim to hold.
DEMANDS = {
    "single": "every client joins at most one round, ever (n*K distinct clients)",
    "fixed_epoch": "b = n/k fixed cohorts of K clients chosen before training; cohort j joins "
                   "rounds j, j+b, j+2b, ... and no client ever joins another round",
    "min_sep": "each client gets a secret, uniformly random residue class mod b, checks in "
               "only in rounds of its class, each with an independent secret coin of "
               "probability p; who checked in stays secret (the server divides by the "
               "expected K, never the count); no client joins rounds less than b apart",
    "balls_in_bins": "each of the b*K clients gets one secret, uniformly random bin of b = n/k "
                     "and joins every round of that bin, no other; the bins stay secret",
    "random_allocation": "each of the b*K clients joins exactly one secret, uniformly random "
                         "round of each of the k epochs of b = n/k rounds, no other",
}
# Mechanisms the planner does not score, and why.
NOT_SCORED = {
    "tree": "TFF's own tree runs only inside TFF; its matrix form, honaker_online, is scored",
}


@dataclasses.dataclass(frozen=True)
class Deployment:
  """The facts of a deployment (checked; errors name the argument).

  Attributes:
    population: P, the clients that can join.
    total_rounds: n, the rounds.
    clients_per_round: K (the expected number for the sampled schemas).
    target_epsilon: the ε every candidate is calibrated to.
    delta: δ of the (ε, δ) guarantee.
    schemas: the participation kinds the deployment can enforce (default: all).
    max_state_rows: a cap on the noise state, in model-sized rows (None: no cap).
    momentum: β of the momentum workload (0 with a constant schedule: prefix sums).
    lr_schedule: the workload's learning-rate schedule.
    schedule_rounds: the rounds of a decay or cooldown schedule.
    mechanisms: the registry mechanisms tried (default: every trainable private one).
    accountant: the unamplified Gaussian's accountant.
    skip_mmcc: account a candidate whose amplified analysis would be MMCC without
      amplification instead (a valid, larger ε bound; MMCC takes minutes per calibration).
  """
  population: int
  total_rounds: int
  clients_per_round: int
  target_epsilon: float
  delta: float = checks.DEFAULT_DELTA
  schemas: Tuple[str, ...] = participation_lib.KINDS
  max_state_rows: Optional[int] = None
  momentum: float = 0.0
  lr_schedule: str = "constant"
  schedule_rounds: Optional[int] = None
  mechanisms: Optional[Tuple[str, ...]] = None
  accountant: str = "exact"
  skip_mmcc: bool = False

  def __post_init__(self):
    put = lambda **kw: [object.__setattr__(self, k, v) for k, v in kw.items()]
    put(population=checks.positive_int(self.population, "population"),
        total_rounds=checks.positive_int(self.total_rounds, "total_rounds"),
        clients_per_round=checks.positive_int(self.clients_per_round, "clients_per_round"),
        target_epsilon=checks.positive_float(self.target_epsilon, "target_epsilon"),
        delta=checks.delta(self.delta))
    if self.clients_per_round > self.population:
      raise checks.CheckError(f"clients_per_round={self.clients_per_round} exceeds the "
                              f"population={self.population}")
    kinds = tuple(participation_lib.canonical_kind(k) for k in self.schemas)
    for kind in kinds:
      if kind not in participation_lib.KINDS:
        raise checks.CheckError(f"unknown schema {kind!r}; expected some of "
                                f"{', '.join(participation_lib.KINDS)}")
    if not kinds:
      raise checks.CheckError("give at least one schema the deployment can enforce")
    put(schemas=kinds)
    if self.max_state_rows is not None:
      put(max_state_rows=checks.nonnegative_int(self.max_state_rows, "max_state_rows"))
    names = self.mechanisms or registry.mechanism_names(trainable=True, private=True)
    picked = tuple(registry.mechanism(name) for name in names)
    for m in picked:
      if not (m.trainable and m.private):
        raise checks.CheckError(f"mechanism {m.name!r} is not a trainable private mechanism")
    put(mechanisms=tuple(m.name for m in picked),
        skip_mmcc=bool(self.skip_mmcc))
    self.workload()  # checks momentum, lr_schedule, schedule_rounds

  def workload(self):
    """The training workload A (``tff_mf.spec.training_workload``)."""
    return spec_lib.training_workload(self.total_rounds, self.momentum, self.lr_schedule,
                                      self.schedule_rounds)

  @property
  def prefix_sum(self) -> bool:
    """Whether the workload is the prefix sum S (β = 0, constant schedule)."""
    return self.workload().kind == "prefix_sum"


@dataclasses.dataclass(frozen=True)
class SchemaOption:
  """One way the deployment reaches K clients per round under a schema.

  Attributes:
    schema: the participation schema.
    sampling_prob: p of cyclic Poisson sampling (min_sep), else None.
    clients_used: the clients the schema draws from.
    participations: E, the expected rounds a client joins.
  """
  schema: participation_lib.Participation
  sampling_prob: Optional[float]
  clients_used: int
  participations: float


def _fewest_epochs(n: int, max_cohorts: int) -> Optional[int]:
  """The fewest epochs k dividing n with n/k ≤ ``max_cohorts`` (None: none)."""
  return next((k for k in range(1, n + 1) if n % k == 0 and n // k <= max_cohorts), None)


def schema_options(dep: Deployment) -> Tuple[List[SchemaOption], Dict[str, str]]:
  """(the options of the schemas the deployment enforces, {kind: why skipped})."""
  n, pop, k_round = dep.total_rounds, dep.population, dep.clients_per_round
  cohorts = pop // k_round  # the most disjoint groups of K the population holds
  out: List[SchemaOption] = []
  skipped: Dict[str, str] = {}
  for kind in dep.schemas:
    kind_class = participation_lib.CLASSES[kind]
    if kind_class.at_most_once:
      if n * k_round > pop:
        skipped[kind] = (f"needs n*K = {n * k_round} distinct clients, the population has "
                         f"{pop}")
      else:
        out.append(SchemaOption(participation_lib.SINGLE, None, n * k_round, 1.0))
    elif kind_class.poisson:
      for b in band_calibration.candidate_bands(n, min(n, cohorts)):
        schema = participation_lib.from_args("min_sep", n, min_sep=b)
        p = k_round * b / pop
        out.append(SchemaOption(schema, p, pop, p * schema.max_participations_in(n)))
    else:
      epochs = _fewest_epochs(n, cohorts)
      schema = participation_lib.from_args(kind, n, epochs=epochs)
      out.append(SchemaOption(schema, None, (n // epochs) * k_round, float(epochs)))
  return out, skipped


def family_grid(mechanism: registry.Mechanism, option: SchemaOption,
                n: int) -> List[Dict[str, int]]:
  """The family parameters tried: bands in powers of 2 up to the schema's separation (the
  epoch length for the epoch kinds), buffers 1..4, else the family's defaults ({})."""
  if mechanism.strategy is None:
    return [{}]
  defaults = registry.default_parameters(mechanism.strategy, n, option.schema)
  schema = option.schema
  if "buffers" in defaults:
    return [{"buffers": m} for m in BUFFERS]
  if "bands" in defaults and "rank" not in defaults:  # structured keeps its defaults
    epochs = getattr(schema, "epochs", None)
    limit = schema.separation(n) if epochs is None else n // epochs
    grid = band_calibration.candidate_bands(n, limit)
    return [{"bands": b} for b in sorted(set(grid) | {min(defaults["bands"], limit)})]
  return [{}]


@dataclasses.dataclass(frozen=True)
class Candidate:
  """A scored candidate (see the module docstring for the figures): one row of
  ``tff-mf plan``'s table; ``json()`` its JSON form (``plan``'s ``candidates``), ``of_json``
  reads one back."""
  mechanism: str
  schema: Dict[str, Any]
  params: Dict[str, int]
  sampling_prob: Optional[float]
  clients_used: int
  participations: float
  noise_multiplier: float
  epsilon: float
  bound: str
  rmse: float
  max_error: float
  rmse_per_participation: float
  state_rows: int
  sensitivity: float
  sensitivity_exact: bool
  mmcc_skipped: bool
  seconds: float
  cache_hit: Optional[bool] = None
  calibration_cached: Optional[bool] = None

  def json(self) -> Dict[str, Any]:
    """The JSON-ready fields, in their order."""
    return dataclasses.asdict(self)

  @classmethod
  def of_json(cls, row: Mapping[str, Any]) -> "Candidate":
    """The candidate a row of ``plan``'s ``candidates`` describes (a ``Candidate`` as it is)."""
    if isinstance(row, Candidate):
      return row
    return cls(**{f.name: row[f.name] for f in dataclasses.fields(cls) if f.name in row})


@dataclasses.dataclass(frozen=True, eq=False)
class Calibration(jsonio.Record):
  """A record the planner stores (``Records``): a candidate's z calibrated to its target ε,
  or its ε at a given z (``epsilon_at``, with ``amplified_banded_epsilon``: the amplified
  banded analysis's own ε, None when it gave none), and the bound reported."""
  noise_multiplier: Optional[float] = None
  epsilon: Optional[float] = None
  bound: Optional[str] = None
  amplified_banded_epsilon: Optional[float] = None
  failed: Optional[str] = None  # a stored lower bound's: why it has no proof (``_stored_bound``)


def spec_of(dep: Deployment, mechanism: str, option: SchemaOption, params: Dict[str, int],
            target_epsilon: Optional[float] = None, amplified: bool = True):
  """The ``MechanismSpec`` a candidate trains with (``amplified=False``: without its
  sampling probability, so that its ε is the unamplified bound), from its typed parts."""
  privacy = spec_lib.Privacy(target_epsilon=target_epsilon or dep.target_epsilon,
                             delta=dep.delta, accountant=dep.accountant,
                             sampling_prob=option.sampling_prob if amplified else None)
  return spec_lib.MechanismSpec(
      mechanism=registry.mechanism(mechanism), workload=dep.workload(),
      participation=option.schema, privacy=privacy, clipping=spec_lib.Clipping(1.0),
      clients_per_round=dep.clients_per_round, params=dict(params))


def state_rows(resolved: mechanisms.Resolved) -> int:
  """Model-sized rows of noise state the server keeps between rounds: the ``LinearStream``'s
  k (``tff_mf.noise.rows.NoiseRows``' stream state); 0 for noise regenerated from the seed
  each round (dense rows, independent noise)."""
  return 0 if resolved.stream is None else int(resolved.stream.k)


def mmcc_would_run(resolved: mechanisms.Resolved, option: SchemaOption) -> bool:
  """Whether the record's amplified analysis for this candidate would be MMCC."""
  schema, n = option.schema, resolved.n
  return (mechanisms.amplification_applies(schema, n, option.sampling_prob)
          and schema.poisson and mechanisms.amplified_analysis(resolved.encoder, schema) == "mmcc")


@dataclasses.dataclass
class Prepared:
  """A candidate whose factorization is known and whose z is next to calibrate.

  Attributes:
    name, option, params: what ``enumerate_candidates`` gave.
    spec: the ``MechanismSpec`` it trains with (without its sampling probability where MMCC
      is skipped).
    mmcc_skipped: accounted without MMCC (``Deployment.skip_mmcc``).
    figures: ``figures`` of its resolved mechanism, with ``analysis`` (the amplified
      analysis that calibrates z, or "none": the Gaussian at z/sens) and ``z_upper`` (the
      unamplified calibration at C's sensitivity, where the amplified search starts: it
      orders the candidates and spares prune tests that cannot succeed).
    seconds: the time preparing took.
    cache_dir: the factorization cache.
    resolved: its ``mechanisms.Resolved`` (None until a calibration needs it: a warm run
      reads ``figures`` from ``Records`` and loads no factorization it does not calibrate;
      ``search`` drops it once the candidate is calibrated or pruned, so that a run holds
      one dense factorization at a time, not hundreds: 128 MB each at n = 2048).
    computed: its figures were computed in this run (not read back from ``Records``).
    loaded: the run's ``Loaded`` factorizations (``Records.loaded``), or None.
  """
  name: str
  option: SchemaOption
  params: Dict[str, int]
  spec: Any
  mmcc_skipped: bool
  figures: Dict[str, Any]
  seconds: float
  cache_dir: Optional[str] = None
  resolved: Optional[mechanisms.Resolved] = None
  computed: bool = False
  loaded: Optional[Loaded] = None

  @property
  def group(self) -> Tuple[str, Optional[float], str]:
    """Candidates whose z/z_upper is alike: one schema option, one analysis."""
    return (self.option.schema.label, self.option.sampling_prob, self.figures["analysis"])

  @property
  def amplified(self) -> bool:
    return self.figures["amplified"]

  @property
  def error_norm(self) -> float:
    return self.figures["error_norm"]

  @property
  def z_upper(self) -> float:
    return self.figures["z_upper"]

  def describe(self) -> str:
    return describe(self.name, self.option, self.params)

  def resolve(self) -> mechanisms.Resolved:
    if self.resolved is None:
      self.resolved = mechanisms.resolve_spec(self.spec, cache_dir=self.cache_dir,
                                              loaded=self.loaded)
    return self.resolved


def figures(resolved: mechanisms.Resolved,
            encoder: Optional[np.ndarray] = None) -> Dict[str, Any]:
  """What the planner needs of a resolved mechanism besides its z: the error norms
  (‖B‖_F/√n and max_i ‖B[i, :]‖, so that rmse and max are z times them), the noise state,
  C's sensitivity report and C's sha256 (``Records``' key), and where C was read from
  (``encoder``: ``encoder_view(resolved)``, where the caller holds it)."""
  b = resolved.factorization.b
  column = toeplitz_view.column_of(encoder_view(resolved) if encoder is None else encoder)
  if column is not None:  # T(column): the column says it all (O(n))
    digest = ["toeplitz", int(column.shape[0]), _sha256(column)]
  else:
    c = np.ascontiguousarray(resolved.encoder, dtype=np.float64)
    digest = [list(c.shape), _sha256(c)]
  report = resolved.sensitivity_report
  return {"error_norm": float(np.linalg.norm(b)) / math.sqrt(b.shape[0]),
          "max_row_norm": float(np.sqrt(np.max(np.sum(np.square(b), axis=1)))),
          "state_rows": state_rows(resolved), "mechanism": resolved.mechanism.name,
          "encoder": digest,
          "schema": resolved.participation.as_dict(),
          "sensitivity": {k: report[k] for k in ("value", "exact", "method")},
          "cache_hit": resolved.info.get("cache_hit"), "npz": resolved.info.get("cache_npz")}


def encoder_view(resolved: mechanisms.Resolved) -> np.ndarray:
  """The encoder as the figures read it: ``tff_mf.toeplitz_view``'s T(c) where the
  factorization keeps C as its first column c (O(n) norms and digest), else C itself."""
  f = resolved.factorization
  column = f.encoder_column() if f is not None and resolved.encoder is f.c else None
  return resolved.encoder if column is None else toeplitz_view.view(column)


def prepare(dep: Deployment, mechanism: str, option: SchemaOption, params: Dict[str, int], *,
            cache_dir: Optional[str] = None, records: Optional["Records"] = None) -> Any:
  """The ``Prepared`` candidate, or a string saying why it cannot run (state cap, a check);
  its figures from ``records`` when they were stored for the same candidate and the same
  factorization (``Records.summary``)."""
  start = time.time()
  records = records or Records(cache_dir, read=False)
  try:
    spec = spec_of(dep, mechanism, option, params)
    holder: Dict[str, Any] = {}

    def compute():
      holder["resolved"] = resolved = mechanisms.resolve_spec(spec, cache_dir=cache_dir,
                                                              loaded=records.loaded)
      return _prepared_figures(dep, resolved, option)
    value, _ = records.summary(_candidate_material(dep, mechanism, option, params), compute)
  except ValueError as e:  # CheckError, AccountingError: this candidate does not apply
    return " ".join(str(e).split())
  if dep.max_state_rows is not None and value["state_rows"] > dep.max_state_rows:
    return f"noise state of {value['state_rows']} rows exceeds the cap of {dep.max_state_rows}"
  if value["mmcc_skipped"]:
    spec = spec_of(dep, mechanism, option, params, amplified=False)
  return Prepared(mechanism, option, dict(params), spec, value["mmcc_skipped"], value,
                  time.time() - start, cache_dir, holder.get("resolved"),
                  "resolved" in holder, records.loaded)


def _prepared_figures(dep: Deployment, resolved: mechanisms.Resolved,
                      option: SchemaOption) -> Dict[str, Any]:
  from tff_mf import accounting  # pylint: disable=g-import-not-at-top
  skipped = dep.skip_mmcc and mmcc_would_run(resolved, option)
  p = None if skipped else option.sampling_prob
  amplified = mechanisms.amplification_applies(option.schema, dep.total_rounds, p)
  c = encoder_view(resolved)
  out = figures(resolved, c)
  if amplified and resolved.participation.poisson:  # shared_banded_bound's
    from tff_mf.accounting import analyses  # pylint: disable=g-import-not-at-top
    b = analyses.sampling_min_sep(resolved.participation, dep.total_rounds)
    out.update(gamma=checks.gamma(c), class_norm=planner_bounds.class_norm(c, b))
  if amplified and planner_bounds.true_bound_applies(option.schema, dep.total_rounds, p):
    out.update(order_norms=planner_bounds.order_norms(c, option.schema.min_sep))
  if amplified and planner_bounds.has_components(resolved.participation):
    out.update(component_shifts=planner_bounds.component_shifts(
        c, resolved.participation, dep.total_rounds))
  out.update(mmcc_skipped=bool(skipped), amplified=bool(amplified), analysis=(
      mechanisms.amplified_analysis(resolved.encoder, resolved.participation)
      if amplified else "none"), z_upper=float(accounting.calibrate_noise_multiplier(
          dep.target_epsilon, dep.delta, dep.accountant, TOLERANCE,
          sensitivity=resolved.sensitivity)))
  return out


def _candidate_material(dep: Deployment, mechanism: str, option: SchemaOption,
                        params: Dict[str, int]) -> Dict[str, Any]:
  """Everything a candidate's figures depend on besides the factorization's arrays."""
  fields = ("total_rounds", "clients_per_round", "target_epsilon", "delta", "momentum",
            "lr_schedule", "schedule_rounds", "accountant", "skip_mmcc")
  return {"code": code_fingerprint(whole=True), "mechanism": mechanism,
          "params": dict(params), "schema": option.schema.as_dict(),
          "sampling_prob": option.sampling_prob,
          "deployment": {k: getattr(dep, k) for k in fields}}


# The most bytes of factorizations ``Loaded`` keeps (at n = 2048: 16 dense ones with CᵀC).
LOADED_MAX_BYTES = 2 * 2**30


class Loaded(collections.abc.MutableMapping):
  """Factorizations loaded (and checked) or computed in this run, by cache entry: the
  ``mechanisms.resolve`` memo with which the candidates that share an entry (one C for every
  schema: single-participation C's, ``families.Declaration.schema_free``) load it once, not
  once per schema option (about 2 s each at n = 2048: its sha256, the full B·C = A check;
  a closed form not cached, as the Honaker trees', takes as long to build), and analyze its
  C under each schema with one CᵀC (``Factorization.gram_of_encoder``). The least recently
  used go beyond ``max_bytes`` of ``resident_bytes`` (and are loaded again when asked
  for)."""

  def __init__(self, max_bytes: Optional[int] = None):
    self.max_bytes = LOADED_MAX_BYTES if max_bytes is None else max_bytes
    self._entries: "collections.OrderedDict[str, Tuple[Any, str]]" = collections.OrderedDict()

  def __getitem__(self, key: str) -> Tuple[Any, str]:
    value = self._entries[key]
    self._entries.move_to_end(key)
    return value

  def __setitem__(self, key: str, value: Tuple[Any, Optional[str]]) -> None:
    self._entries[key] = value
    self._entries.move_to_end(key)
    while len(self._entries) > 1 and sum(f.resident_bytes() for f, _ in
                                         self._entries.values()) > self.max_bytes:
      self._entries.popitem(last=False)

  def __delitem__(self, key: str) -> None:
    del self._entries[key]

  def __iter__(self):
    return iter(self._entries)

  def __len__(self) -> int:
    return len(self._entries)


class Records:
  """Calibrated records and ε evaluations kept across candidates and runs.

  An entry is ``<cache_dir>/.planner/<sha256>.json`` holding the key's material and the
  value: the material is everything the computation reads (the sha256 of the encoder C's
  bytes, the schema, C's sensitivity report, the privacy spec: target or z, δ, accountant,
  p) and a fingerprint of the code that computes it (the sources of the accounting, the
  mechanisms, the spec and the schemas, the versions of numpy, scipy and dp_accounting).
  A read checks the entry's sha256 (of its material and value), that the stored material
  is the one asked for and that the value is well-formed (finite z > 0; a calibrated ε at
  most its target); anything else (a corrupt, truncated or foreign file) is a miss,
  computed again and rewritten atomically. ``plan`` checks the winner whenever its figures
  or record were read back (``confirmed``: its arrays' figures, and its ε evaluated again at
  the stored z and just below); were it to fail, no stored record is trusted and the search
  runs again without them.
  """

  def __init__(self, cache_dir: Optional[str], read: bool = True):
    from tff_mf.factorization import cache  # pylint: disable=g-import-not-at-top
    self.cache_dir, self.read = cache_dir, read
    self.root = os.path.join(cache.resolve_dir(cache_dir), ".planner")
    self.memory: Dict[str, Dict[str, Any]] = {}
    self.hits = self.misses = 0
    # {(p, schema label, δ): [(z/γ, amplified banded ε there)]}: shared_banded_bound's
    self.banded_fails: Dict[Tuple, List[Tuple[float, float]]] = {}
    # The dense factorizations this run loaded, shared by the candidates that read one entry.
    self.loaded = Loaded()

  def material(self, prep: Prepared, **privacy) -> Dict[str, Any]:
    """The key's material: what the record of ``prep`` at ``privacy`` depends on."""
    f = prep.figures
    return {"code": code_fingerprint(), "encoder": f["encoder"], "schema": f["schema"],
            "sensitivity": f["sensitivity"],
            "privacy": dict(dataclasses.asdict(prep.spec.privacy), **privacy)}

  def get(self, material: Dict[str, Any], compute,
          valid=None) -> Tuple[Dict[str, Any], bool]:
    """(the value for ``material``, whether it was stored); ``compute()`` on a miss;
    ``valid(material, value)``: whether a stored value may be used (default: a record's)."""
    key = _material_key(material)
    if key in self.memory:
      self.hits += 1
      return self.memory[key], True
    value = self._read(key, material, valid or _record_valid) if self.read else None
    stored = value is not None
    if stored:
      self.hits += 1
    else:
      self.misses += 1
      value = compute()
      self.put(material, value)
    self.memory[key] = value
    return value, stored

  def peek(self, material: Dict[str, Any], valid) -> Optional[Dict[str, Any]]:
    """The stored value for ``material`` if there is a valid one (nothing computed)."""
    return self._read(_material_key(material), material, valid) if self.read else None

  def put(self, material: Dict[str, Any], value: Dict[str, Any]) -> None:
    """Stores ``value`` for ``material`` (atomically; not at all in a read-only cache)."""
    self._write(_material_key(material), {"material": material, "value": value,
                                          "sha256": _entry_sha256(material, value)})

  def summary(self, material: Dict[str, Any], compute) -> Tuple[Dict[str, Any], bool]:
    """A candidate's ``figures`` (``prepare``): stored ones are used only while the
    factorization cache entry they were computed from still holds the same arrays (its
    sidecar names the same ``.npz``, whose name is its sha256's first 16 digits)."""
    return self.get(dict(material, kind="figures"), compute, self._summary_valid)

  def _summary_valid(self, material: Dict[str, Any], value: Dict[str, Any]) -> bool:
    from tff_mf.factorization import cache  # pylint: disable=g-import-not-at-top
    numbers = [value[k] for k in ("error_norm", "max_row_norm", "z_upper")]
    if not all(isinstance(x, float) and math.isfinite(x) and x > 0 for x in numbers):
      return False
    if value["npz"] is None:  # not a cached strategy: its figures are the code's
      return True
    sidecar = os.path.join(os.path.dirname(value["npz"]), cache.METADATA_FILE)
    with open(sidecar, encoding="utf-8") as f:
      metadata = json.load(f)
    return (os.path.dirname(value["npz"]).startswith(cache.resolve_dir(self.cache_dir))
            and metadata["npz_file"] == os.path.basename(value["npz"])
            and os.path.exists(value["npz"]))

  def _read(self, key: str, material: Dict[str, Any], valid) -> Optional[Dict[str, Any]]:
    try:
      with open(os.path.join(self.root, key + ".json"), encoding="utf-8") as f:
        entry = json.load(f)
      value = entry["value"]
      if entry["sha256"] != _entry_sha256(entry["material"], value):
        return None
      return value if entry["material"] == material and valid(material, value) else None
    except (OSError, ValueError, KeyError, TypeError):
      return None

  def _write(self, key: str, entry: Dict[str, Any]) -> None:
    try:
      os.makedirs(self.root, exist_ok=True)
      fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=self.root)
      with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(entry, f, sort_keys=True)
      os.replace(tmp, os.path.join(self.root, key + ".json"))
    except OSError:  # a read-only cache: the run goes on without storing
      pass


def _record_valid(material: Dict[str, Any], value: Dict[str, Any]) -> bool:
  """A record's z is finite and positive, its ε a number, at most the target it was
  calibrated to."""
  target = material["privacy"].get("target_epsilon")
  record = Calibration.of_json(value)
  z, eps = float(record.noise_multiplier), float(record.epsilon)
  return (math.isfinite(z) and z > 0 and not math.isnan(eps)
          and isinstance(record.bound, str) and (target is None or eps <= target))


def _material_key(material: Dict[str, Any]) -> str:
  return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def _entry_sha256(material: Dict[str, Any], value: Dict[str, Any]) -> str:
  text = json.dumps({"material": material, "value": value}, sort_keys=True)
  return hashlib.sha256(text.encode()).hexdigest()


def _sha256(a: np.ndarray) -> str:
  return hashlib.sha256(a.tobytes()).hexdigest()


@functools.lru_cache(maxsize=None)
def code_fingerprint(whole: bool = False) -> str:
  """sha256 of the sources that compute a record (``whole``: of the numpy core, which
  resolves a candidate's factorization too) and of the numeric packages' versions."""
  import dp_accounting  # pylint: disable=g-import-not-at-top
  import scipy  # pylint: disable=g-import-not-at-top
  here = os.path.dirname(os.path.abspath(__file__))
  if whole:
    paths = [p for p in glob.glob(os.path.join(here, "**", "*.py"), recursive=True)
             if os.path.relpath(p, here).split(os.sep)[0] not in ("tf", "flower", "commands")]
  else:
    paths = (glob.glob(os.path.join(here, "accounting", "*.py"))
             + glob.glob(os.path.join(here, "participation", "*.py"))
             + [os.path.join(here, name) for name in (
                 "mechanisms.py", "spec.py", "checks.py", "planner.py", "planner_bounds.py",
                 "toeplitz_view.py", "registry.py", "jsonio.py",
                 os.path.join("factorization", "workloads.py"),
                 os.path.join("factorization", "families", "tree.py"))])
  digest = hashlib.sha256(f"{np.__version__} {scipy.__version__} "
                          f"{getattr(dp_accounting, '__version__', '')}".encode())
  for path in sorted(paths):
    with open(path, "rb") as f:
      digest.update(os.path.relpath(path, here).encode() + f.read())
  return digest.hexdigest()


def calibrate(prep: Prepared, records: Records) -> Candidate:
  """The candidate calibrated as training calibrates it (``mechanisms.build``), its record
  from ``records`` when an identical one was calibrated before."""
  start = time.time()

  def compute():
    _, record = mechanisms.build(prep.spec, resolved=prep.resolve())
    return {"noise_multiplier": float(record.noise_multiplier),
            "epsilon": float(record.epsilon), "bound": record.bound}
  value, stored = records.get(records.material(prep), compute)
  c = candidate_of(prep.figures, Calibration.of_json(value), prep.option, prep.params,
                   prep.mmcc_skipped, prep.seconds + time.time() - start)
  return dataclasses.replace(c, calibration_cached=stored)


def epsilon_at(prep: Prepared, z: float, records: Records) -> float:
  """The ε training reports for the candidate at noise multiplier z (``mechanisms.privacy``:
  the same analyses, the smallest valid bound)."""
  def compute():
    record = mechanisms.privacy(prep.resolve(), z, None, prep.spec.privacy.delta,
                                prep.spec.privacy.accountant,
                                sampling_prob=prep.spec.privacy.sampling_prob)
    amplified = [c.amplified_epsilon for c in record.details.candidates
                 if _is_banded(c.analysis)]
    return {"noise_multiplier": z, "epsilon": float(record.epsilon), "bound": record.bound,
            "amplified_banded_epsilon": next((float(x) for x in amplified if x is not None),
                                             None)}
  material = records.material(prep, noise_multiplier=z, target_epsilon=None)
  value = Calibration.of_json(records.get(material, compute)[0])
  f = value.amplified_banded_epsilon
  if f is not None and _is_banded(prep.figures["analysis"]):  # shared_banded_bound's
    group = (prep.option.sampling_prob, prep.option.schema.label, prep.spec.privacy.delta)
    records.banded_fails.setdefault(group, []).append((z / prep.figures["gamma"], f))
  return float(value.epsilon)


def prune_check(dep: Deployment, prep: Prepared, best_rmse: float,
                records: Records) -> Optional[Dict[str, Any]]:
  """Why the candidate cannot beat the best found (rmse ``best_rmse``), or None.

  The bound: rmse = z·‖B‖_F/√n grows with z, so the candidate's rmse exceeds
  r = (1 + 2·TOLERANCE)·best_rmse exactly when its calibrated z exceeds z_r = r/(‖B‖_F/√n).
  The calibrated z is a z whose reported ε is at most the target (the search returns only
  z it evaluated to pass: ``tff_mf.accounting.calibrate``); the reported ε is
  non-increasing in z (the assumption the calibration's search itself rests on: each
  analysis is the ε of a Gaussian mechanism, subsampled or not, whose noise grows with z).
  So ε(z_r) > target proves calibrated z > z_r, hence rmse > r: the candidate is worse
  than the best by more than the calibration tolerance, and cannot be the winner nor a
  runner-up within the tolerance (``fragile``). ε(z_r) ≤ target proves nothing, and the
  candidate is calibrated in full. ε(z_r) is one evaluation as training computes it, or a
  lower bound on it where one proves ε(z_r) > target first: ``shared_banded_bound`` (the
  amplified banded analysis), ``component_bound`` (fixed-bin, random allocation),
  ``true_bound`` (cyclic Poisson sampling) and ``mmcc_bound`` (where MMCC accounts it).
  """
  cut = _cut_above(best_rmse)
  z_cut = cut / prep.error_norm
  if z_cut >= prep.z_upper or not prep.amplified:  # cheap, or cannot be shown worse
    return None
  how = "its epsilon is"
  eps = shared_banded_bound(dep, prep, z_cut, records)
  if eps is None:
    eps = component_bound(dep, prep, z_cut)
  if eps is None:
    eps = true_bound(dep, prep, z_cut, records)
  if eps is None:
    eps = mmcc_bound(dep, prep, z_cut, records)
  if eps is not None:
    how = "its epsilon is at least"
  else:
    try:
      eps = epsilon_at(prep, z_cut, records)
    except ValueError:  # the analysis refused this z: no proof, calibrate in full
      return None
  if not eps > dep.target_epsilon:
    return None
  return {"what": prep.describe(), "z_above": z_cut, "rmse_above": cut,
          "epsilon_at_z": eps,
          "why": f"at z = {z_cut:.6g} {how} {eps:.6g} > {dep.target_epsilon:g}, so "
                 f"its calibrated z is larger and its rmse above {cut:.6g} (the best's "
                 f"{best_rmse:.6g} times 1 + {2 * TOLERANCE:g})"}


def _is_banded(analysis: Optional[str]) -> bool:
  """Whether ``analysis`` names the amplified banded analysis (``shared_banded_bound``)."""
  from tff_mf.accounting import analyses  # pylint: disable=g-import-not-at-top
  return analyses.of_record(analysis) is analyses.AmplifiedBanded


def component_bound(dep: Deployment, prep: Prepared, z: float) -> Optional[float]:
  """A lower bound above the target on every valid analysis's ε at z for a fixed-bin or
  random-allocation candidate, or None (``planner_bounds.component_lower_epsilon``: one
  component of the mixture over the user's secret pattern; milliseconds, no PLD)."""
  shifts = prep.figures.get("component_shifts")
  if not shifts:
    return None
  eps = planner_bounds.component_lower_epsilon(shifts, z, prep.option.schema,
                                               dep.total_rounds, dep.delta)
  return eps if eps > dep.target_epsilon else None


def true_bound(dep: Deployment, prep: Prepared, z: float,
               records: Optional[Records] = None) -> Optional[float]:
  """A lower bound above the target on the true ε at z, so on every valid analysis's (MMCC's
  included), for a candidate under cyclic Poisson sampling, or None
  (``planner_bounds.true_lower_epsilon``: the composed subsampled Gaussians of a residue
  class's largest columns; at most a second, where MMCC takes minutes). ``records``: the
  value stored and read back (``_stored_bound``)."""
  norms = prep.figures.get("order_norms")
  if not norms:
    return None
  eps = _stored_bound(records, prep, z, dep, "true_lower_epsilon",
                      lambda: planner_bounds.true_lower_epsilon(
                          norms, z, prep.option.sampling_prob, dep.delta,
                          target=dep.target_epsilon))
  return eps if eps > dep.target_epsilon else None


def mmcc_bound(dep: Deployment, prep: Prepared, z: float,
               records: Optional[Records] = None) -> Optional[float]:
  """A lower bound above the target on the candidate's reported ε at z where MMCC accounts
  it, or None: the least of ``tff_mf.accounting.mmcc.lower_bound_epsilon`` (below MMCC's
  own ε; seconds where MMCC takes minutes) and the two unamplified Gaussians
  (``_unamplified_at_least``). ``records``: as ``true_bound``'s."""
  from tff_mf.accounting import mmcc  # pylint: disable=g-import-not-at-top
  figs = prep.figures
  if figs["analysis"] != "mmcc" or "class_norm" not in figs:
    return None
  gaussians = _unamplified_at_least(dep, figs, z)
  if not gaussians > dep.target_epsilon:
    return None
  b = prep.option.schema.min_sep
  def compute():
    c = encoder_view(prep.resolve())  # a failure here (the cache) is not stored
    try:
      return mmcc.lower_bound_epsilon(c, prep.option.sampling_prob / b, z, dep.delta,
                                      min_sep=b, target=dep.target_epsilon)
    except (ValueError, ArithmeticError) as e:  # this C's refusal: stored as one
      raise _Refused(" ".join(str(e).split()) or type(e).__name__) from e

  try:  # (computed and stored, or read back)
    low = _stored_bound(records, prep, z, dep, "mmcc_lower_bound", compute)
  except (ValueError, ArithmeticError, TypeError, MemoryError):  # no proof: MMCC decides
    return None  # (CheckError: MMCC does not take this C, and its analysis fails too)
  eps = min(low, gaussians)
  return eps if eps > dep.target_epsilon else None


class _Refused(Exception):
  """A lower bound's computation refused the candidate's C, a refusal its record material
  decides (MMCC does not take this C): ``_stored_bound`` stores it."""


def _stored_bound(records: Optional[Records], prep: Prepared, z: float, dep: Deployment,
                  kind: str, compute) -> float:
  """``compute()``, a lower bound on an ε at z (0.0: no proof), stored in ``records`` under
  the candidate's record material (the code's fingerprint included) and read back by a
  warm run instead of computed again (seconds each at n = 2048). A computation that raises
  ``_Refused`` is stored as that, and raises CheckError with its reason, computed or read
  back; any other failure is raised and not stored."""
  def value() -> Dict[str, Any]:
    try:
      return {"noise_multiplier": z, "epsilon": float(compute()), "bound": kind}
    except _Refused as e:
      return {"noise_multiplier": z, "epsilon": 0.0, "bound": kind, "failed": str(e)}
  if records is None:
    record = Calibration.of_json(value())
  else:
    material = dict(records.material(prep, noise_multiplier=z, target_epsilon=None),
                    kind=kind, stop_above=dep.target_epsilon)
    record = Calibration.of_json(records.get(material, value, _bound_valid)[0])
  if record.failed is not None:
    raise checks.CheckError(record.failed)
  return float(record.epsilon)


def _bound_valid(material: Dict[str, Any], value: Dict[str, Any]) -> bool:
  """A stored lower bound is a number, at least 0 (``_stored_bound``)."""
  record = Calibration.of_json(value)
  return (isinstance(record.epsilon, float) and record.epsilon >= 0.0
          and not math.isnan(record.epsilon)
          and (record.failed is None or isinstance(record.failed, str)))


def shared_banded_bound(dep: Deployment, prep: Prepared, z: float,
                        records: Records) -> Optional[float]:
  """A lower bound on the candidate's reported ε at z without a PLD, or None.

  Under the amplified banded analysis (Choquette-Choo et al. 2023, arXiv:2306.08153,
  Thm 4) the amplified ε is f(z/γ(C)), f the ⌈n/b⌉-fold composition of the
  Poisson-subsampled Gaussian at rate p, the same function for every C of the group (p, b,
  δ); f does not grow with its argument. The reported ε is the least of f(z/γ) and two
  Gaussians at z/sens (sens under the schema, and with every eligible round joined). Once
  f(u_f) > target was evaluated for some candidate of the group (``epsilon_at``), every
  z/γ ≤ u_f has f(z/γ) ≥ f(u_f) > target, and the reported ε at z is at least the least of
  f(u_f) and the two Gaussians (milliseconds). The second Gaussian's sensitivity (every
  eligible round joined, ``analyses.poisson_sensitivity``) is replaced by a lower bound on
  it, the largest residue class's √(Σ_j ‖C[:, j]‖²) (``planner_bounds.class_norm``), which
  can only lower the Gaussian's ε: the bound stays a lower bound, at O(n²) instead of the
  class Gram matrices' cost.
  """
  figs = prep.figures
  if not _is_banded(figs["analysis"]):
    return None
  group = (prep.option.sampling_prob, prep.option.schema.label, dep.delta)
  known = [(u, f) for u, f in records.banded_fails.get(group, ()) if u >= z / figs["gamma"]]
  if not known:
    return None
  return min(min(f for _, f in known), _unamplified_at_least(dep, figs, z))


def _unamplified_at_least(dep: Deployment, figs: Dict[str, Any], z: float) -> float:
  """The least of the two unamplified Gaussians' ε at z under cyclic Poisson sampling (the
  schema's sensitivity, and every eligible round joined, the latter at its lower bound
  ``class_norm``, which only lowers it): a lower bound on what they report."""
  from tff_mf.accounting import analyses  # pylint: disable=g-import-not-at-top
  return min(analyses.gaussian_epsilon(z, dep.delta, dep.accountant, s)
             for s in (figs["sensitivity"]["value"], figs["class_norm"]))


def search(dep: Deployment, prepared: Sequence[Prepared], records: Records, *,
           prune: bool = True, progress: bool = False, incumbent: Optional[float] = None):
  """(scored ``Candidate``s, pruned [{what, why, ...}], failed [{what, why}]);
  ``incumbent``: the least rmse calibrated before (pruning bounds against it too).

  Order: the unamplified candidates first (their calibration is one Gaussian's), then
  each group's (schema option and analysis) candidate of least upper-bound error, then the
  rest by upper-bound error times the least z/z_upper seen in their group: likely winners
  first, so that the best rmse, and with it the pruning, is tight early. The order decides
  only how much is pruned, never the result (``prune_check``).
  """
  pending = list(prepared)
  ratio: Dict[Tuple, float] = {}
  scored: List[Candidate] = []
  pruned: List[Dict[str, Any]] = []
  failed: List[Dict[str, str]] = []
  # The bar counts the amplified candidates (the unamplified take milliseconds and come
  # first): its rate is the seconds per amplified candidate, calibrated or pruned, so its
  # ETA is a mean over them (the first of each group are calibrated in full, and more of
  # the later ones are pruned, so it errs long).
  bar = _bar(None, "plan: calibrations", progress,
             total=sum(p.amplified for p in pending))
  while pending:
    def estimate(p):  # (unamplified, a group's first, the rest; the estimated error)
      upper = p.z_upper * p.error_norm
      if not p.amplified:
        return 0, upper
      return (1, upper) if p.group not in ratio else (2, ratio[p.group] * upper)
    prep = min(pending, key=estimate)
    pending.remove(prep)
    # Shown as it starts where it may take long (MMCC: minutes), not after it ends.
    bar.set_postfix_str(f"{prep.describe()}; {len(pruned)} pruned", refresh=prep.amplified)
    best = min([c.rmse for c in scored] + ([] if incumbent is None else [incumbent]),
               default=None)
    why = prune_check(dep, prep, best, records) if prune and best is not None else None
    if why is not None:
      pruned.append(why)
      ratio.setdefault(prep.group, why["z_above"] / prep.z_upper)
    else:
      try:
        c = calibrate(prep, records)
      except ValueError as e:  # CheckError, AccountingError: this candidate does not apply
        failed.append({"what": prep.describe(), "why": " ".join(str(e).split())})
      else:
        scored.append(c)
        ratio[prep.group] = min(ratio.get(prep.group, math.inf),
                                c.noise_multiplier / prep.z_upper)
    prep.resolved = None  # its arrays are in the cache; ``confirmed`` loads the winner's
    bar.update(int(prep.amplified))
  bar.close()
  return scored, pruned, failed


def candidate_of(figs: Dict[str, Any], record: Any, option: SchemaOption,
                 params: Dict[str, int], mmcc_skipped: bool, seconds: float) -> Candidate:
  """The figures of a built candidate at its calibrated z (``figs``: ``figures`` of its
  resolved mechanism; ``record``: its ``mechanisms.PrivacyRecord``, or its stored
  ``Calibration``)."""
  z = float(record.noise_multiplier)
  rmse = z * figs["error_norm"]
  return Candidate(
      mechanism=figs["mechanism"], schema=option.schema.as_dict(), params=dict(params),
      sampling_prob=option.sampling_prob, clients_used=option.clients_used,
      participations=option.participations, noise_multiplier=z,
      epsilon=float(record.epsilon), bound=record.bound, rmse=rmse,
      max_error=z * figs["max_row_norm"],
      rmse_per_participation=rmse / option.participations, state_rows=figs["state_rows"],
      sensitivity=float(figs["sensitivity"]["value"]),
      sensitivity_exact=bool(figs["sensitivity"]["exact"]),
      mmcc_skipped=mmcc_skipped, seconds=seconds, cache_hit=figs["cache_hit"])


def enumerate_candidates(dep: Deployment) -> Tuple[List[Tuple[str, SchemaOption, Dict]],
                                                   List[Dict[str, str]]]:
  """(every (mechanism, schema option, params) to score, [{what, why}] left out)."""
  options, skipped_kinds = schema_options(dep)
  left_out = [{"what": f"schema {kind}", "why": why} for kind, why in skipped_kinds.items()]
  todo = []
  for name in dep.mechanisms:
    m = registry.mechanism(name)
    why = NOT_SCORED.get(name)
    if why is None and m.momentum_workload and dep.prefix_sum:
      why = "for a prefix-sum workload its C is opt_prefix_sum's, which is scored"
    if why is not None:
      left_out.append({"what": f"mechanism {name}", "why": why})
      continue
    for option in options:
      if option.schema.kind in m.participations:
        todo.extend((name, option, params) for params in family_grid(m, option,
                                                                     dep.total_rounds))
  return todo, left_out


def cheap_first(dep: Deployment, name: str) -> bool:
  """Whether a mechanism's C is computed in seconds at any n: C = I, or a Toeplitz family
  computing first columns (``tff_mf.factorization.strategies.toeplitz_column``). These are
  prepared and calibrated first, so that the best rmse is known before the dense families."""
  from tff_mf.factorization import strategies  # pylint: disable=g-import-not-at-top
  m = registry.mechanism(name)
  if m.strategy is None or not m.noise_kind.factorized:  # C = I
    return True
  return strategies.toeplitz_column(m.strategy, dep.workload()) is not None


def error_lower_bounds(dep: Deployment, todo: Sequence[Tuple[str, SchemaOption, Dict]],
                       records: "Records") -> Dict[int, Dict[str, Any]]:
  """{index in ``todo``: {"rmse": a lower bound on its calibrated rmse, "why": ...}}, from
  ``tff_mf.planner_bounds``: ‖A‖_* (computed in every run) and each schema option's
  thresholds (kept in ``records``, evaluated again when read back), no factorization."""
  n = dep.total_rounds
  nuclear = planner_bounds.nuclear_norm(dep.workload())
  units: Dict[str, Tuple[float, str]] = {}
  out = {}
  for i, (_, option, _) in enumerate(todo):
    label = f"{option.schema.label} {option.sampling_prob}"
    if label not in units:
      amplified = mechanisms.amplification_applies(option.schema, n, option.sampling_prob)
      privacy = dict(target=dep.target_epsilon, delta=dep.delta, accountant=dep.accountant)
      args = (option.schema, n, option.sampling_prob)
      material = dict(privacy, kind="thresholds", code=code_fingerprint(), n=n,
                      amplified=amplified, skip_mmcc=dep.skip_mmcc,
                      schema=option.schema.as_dict(), sampling_prob=option.sampling_prob)
      found = records.get(material, lambda: planner_bounds.thresholds(
          *args, amplified=amplified, mmcc_possible=bool(
              amplified and option.schema.poisson and not dep.skip_mmcc), **privacy),
                          lambda m, v: planner_bounds.verified(v, *args, **privacy))[0]
      units[label] = planner_bounds.unit(found, option.schema, n)
    unit, why = units[label]
    out[i] = {"rmse": planner_bounds.error_lower_bound(unit, nuclear, n),
              "why": f"{why}; ||A||_*/n = {nuclear / n:.6g}"}
  return out


def staged_search(dep: Deployment, todo: Sequence[Tuple[str, SchemaOption, Dict]],
                  records: "Records", *, cache_dir: Optional[str], prune: bool,
                  progress: bool, prefetch: bool = True):
  """(prepared, unfit, scored, pruned, failed): the cheap families (``cheap_first``)
  prepared and searched first (``search``); then the others by their lower bound on rmse
  (``error_lower_bounds``), least first, each pruned before its factorization when the
  bound exceeds the best rmse by more than the calibration tolerance, else prepared and
  searched against the best so far. ``prefetch``: the others' missing cache entries are
  computed meanwhile by a child process (``tff_mf.planner_prefetch``), in that order, but
  for those the pruning cut (sent as it falls; at first the last run's, stored) prunes."""
  first = [t for t in todo if cheap_first(dep, t[0])]
  rest = [t for t in todo if not cheap_first(dep, t[0])]
  bounds = error_lower_bounds(dep, rest, records) if prune else {}
  order = sorted(range(len(rest)), key=lambda i: bounds.get(i, {"rmse": 0.0})["rmse"])
  rest, bounds = [rest[i] for i in order], [bounds.get(i) for i in order]
  entries = [_entry_of(dep, item, cache_dir) for item in rest]
  hint = json.loads(json.dumps(dict(kind="cut", code=code_fingerprint(),  # tuples as read
                                    deployment=dataclasses.asdict(dep))))
  beside = planner_prefetch.Prefetch(
      planner_prefetch.missing([e[1] for e in entries if e is not None], cache_dir),
      cache_dir, bounds=_entry_bounds(entries, bounds),
      cut=_stored_cut(records, hint) if prune else None) if prefetch else None
  try:
    prepared, unfit = _prepare_all(dep, first, records, cache_dir, progress,
                                   "plan: cheap families")
    scored, pruned, failed = search(dep, prepared, records, prune=prune, progress=progress)
    # One candidate per step; a pruned one takes milliseconds, a factorized one of a dense
    # family minutes at n = 2048, so the ETA (the mean so far) errs long once pruning starts.
    bar = _bar(None, "plan: dense families", progress, total=len(rest))
    for (name, option, params), bound, entry in zip(rest, bounds, entries):
      bar.set_postfix_str(describe(name, option, params), refresh=False)
      best, cut = _cut(scored)
      if beside is not None and prune:
        beside.lower_cut(cut)  # the child skips the entries pruned below
      if prune and planner_prefetch.above_cut(bound["rmse"], cut):
        pruned.append(_pruned_by_bound(name, option, params, bound, cut, best))
      else:
        bar.set_postfix_str(describe(name, option, params))  # shown as it starts
        if beside is not None and entry is not None and beside.pending(entry[0]):
          bar.set_postfix_str(f"{describe(name, option, params)} (factorized beside)")
          beside.wait(entry[0])
        more, why = _prepare_all(dep, [(name, option, params)], records, cache_dir, False, "")
        prepared += more
        unfit += why
        s, p, f = search(dep, more, records, prune=prune, incumbent=best)
        scored, pruned, failed = scored + s, pruned + p, failed + f
      bar.update(1)
    bar.close()
    if prune and scored:
      records.put(hint, {"cut": _cut(scored)[1]})
  finally:
    if beside is not None:
      beside.close()
  return prepared, unfit, scored, pruned, failed


def _cut_above(best_rmse: float) -> float:
  """The pruning cut: a candidate is pruned once its rmse is shown above the best's by
  more than the calibration tolerance of both."""
  return (1.0 + 2.0 * TOLERANCE) * best_rmse


def _cut(scored: Sequence[Candidate]) -> Tuple[Optional[float], Optional[float]]:
  """(the best rmse so far, its pruning cut), None without one."""
  best = min((c.rmse for c in scored), default=None)
  return best, None if best is None else _cut_above(best)


def _stored_cut(records: "Records", hint: Dict[str, Any]) -> Optional[float]:
  """The final pruning cut of the last run of this deployment (same code), if stored: the
  prefetch child's first cut, so that a warm run's child does not compute the entries that
  run skipped. Only a hint: were it wrong, the planner computes a skipped entry itself."""
  value = records.peek(hint, lambda m, v: isinstance(v.get("cut"), float)
                       and math.isfinite(v["cut"]) and v["cut"] > 0)
  return None if value is None else value["cut"]


def _entry_bounds(entries: Sequence[Optional[Tuple[str, Any]]],
                  bounds: Sequence[Optional[Dict[str, Any]]]) -> Dict[str, float]:
  """{cache entry directory: the least rmse bound of the candidates using it}; an entry with
  an unbounded candidate has none (the child computes it whatever the cut)."""
  least: Dict[str, Optional[float]] = {}
  for entry, bound in zip(entries, bounds):
    if entry is not None:
      rmse = None if bound is None else bound["rmse"]
      known = least.get(entry[0], math.inf)
      least[entry[0]] = None if rmse is None or known is None else min(known, rmse)
  return {d: b for d, b in least.items() if b is not None}


def _entry_of(dep: Deployment, item: Tuple[str, SchemaOption, Dict[str, int]],
              cache_dir: Optional[str]) -> Optional[Tuple[str, Any]]:
  """(cache entry directory, ``FactorizationSpec``) of a candidate whose C the factorization
  cache holds, as ``mechanisms.resolve`` will ask for it; None for other candidates."""
  from tff_mf.factorization import cache  # pylint: disable=g-import-not-at-top
  from tff_mf.factorization import strategies  # pylint: disable=g-import-not-at-top
  name, option, params = item
  m = registry.mechanism(name)
  if m.strategy is None or not m.noise_kind.factorized or not strategies.cached(m.strategy):
    return None
  try:
    spec = spec_of(dep, name, option, params)
    f_spec = mechanisms.factorization_spec(m, spec.workload, spec.participation, spec.params)[0]
    return cache.entry_paths(f_spec, cache_dir)[0], f_spec
  except ValueError:  # the candidate does not apply: ``prepare`` says why
    return None


def _pruned_by_bound(name: str, option: SchemaOption, params: Dict[str, int],
                     bound: Dict[str, Any], cut: float, best: float) -> Dict[str, Any]:
  return {"what": describe(name, option, params), "rmse_at_least": bound["rmse"],
          "rmse_above": cut, "before_factorizing": True,
          "why": f"before factorizing: its rmse is at least {bound['rmse']:.6g} > "
                 f"{cut:.6g} (the best's {best:.6g} times 1 + {2 * TOLERANCE:g}) for every "
                 f"factorization, since ||B||_F*||C||_F >= ||A||_* and {bound['why']}"}


def _prepare_all(dep: Deployment, items, records: "Records", cache_dir: Optional[str],
                 progress: bool, desc: str):
  """(the ``Prepared`` candidates, [{what, why}] of those that cannot run)."""
  prepared, unfit = [], []
  for name, option, params in _bar(items, desc, progress):
    result = prepare(dep, name, option, params, cache_dir=cache_dir, records=records)
    if isinstance(result, Prepared):
      if len(items) > 1:  # all prepared before any is calibrated: reloaded when needed
        result.resolved = None
      prepared.append(result)
    else:
      unfit.append({"what": describe(name, option, params), "why": result})
  return prepared, unfit


def plan(dep: Deployment, *, cache_dir: Optional[str] = None, progress: bool = False,
         prune: bool = True, prefetch: bool = True) -> Dict[str, Any]:
  """Every candidate scored and ranked by expected error (rmse), the recommendation, where
  the answer is fragile, what the winner's schema demands and the flags that run it.

  ``prune``: skip, with the proof in ``pruned``, each candidate whose calibrated rmse is
  shown to exceed (1 + 2·TOLERANCE)× the best found so far (``prune_check``); False builds
  and calibrates every candidate. ``prefetch``: a child process computes the dense
  families' missing factorizations while the cheap families are calibrated
  (``tff_mf.planner_prefetch``; the result is the same without it). Calibrated records are kept in the cache directory's
  ``.planner`` folder (``Records``) and reused by later runs.

  Returns a JSON-ready dict: ``candidates`` (ranked, ``Candidate`` dicts), ``recommended``
  (the first), ``fragile`` (sentences), ``demands``, ``training_flags``,
  ``flower_arguments``, ``left_out`` ([{what, why}]), ``pruned`` ([{what, why, ...}]),
  ``deployment`` and ``seconds``.
  """
  start = time.time()
  todo, left_out = enumerate_candidates(dep)
  for read in (True, False):  # the second time only if a stored record was wrong
    records = Records(cache_dir, read=read)
    prepared, unfit, scored, pruned, failed = staged_search(
        dep, todo, records, cache_dir=cache_dir, prune=prune, progress=progress,
        prefetch=prefetch)
    if not scored or confirmed(_ranked(scored)[0], prepared, records):
      break
  left_out.extend(unfit + failed)
  if not scored:
    reasons = "; ".join(f"{x['what']}: {x['why']}" for x in left_out[:3])
    raise checks.CheckError(f"no candidate can run this deployment ({reasons})")
  scored = _ranked(scored)
  best = scored[0]
  return {
      "deployment": dataclasses.asdict(dep), "candidates": [c.json() for c in scored],
      "recommended": best.json(), "fragile": fragile(scored),
      "demands": demands(best), "training_flags": training_flags(dep, best),
      "flower_arguments": flower_arguments(dep, best), "left_out": left_out,
      "pruned": pruned, "tolerance": TOLERANCE,
      "error": "rmse = z * ||B||_F / sqrt(n) of the workload's estimates, in units of "
               "clip_norm / clients_per_round per coordinate",
      "seconds": time.time() - start}


def _ranked(scored: Sequence[Candidate]) -> List[Candidate]:
  return sorted(scored, key=lambda c: (c.rmse, c.state_rows, c.mechanism))


def confirmed(best: Candidate, prepared: Sequence[Prepared], records: Records) -> bool:
  """Whether the winner read back from ``records`` holds what its calibration guarantees.

  Where its figures or its record were read back, its factorization is resolved (the
  figures must be the arrays' own) and its ε is evaluated again, as training evaluates it,
  at the stored z (it must be the stored ε, at most the target) and at z·(1 − TOLERANCE)
  (it must exceed the target): the stored z is then the calibration's answer to within its
  tolerance, with the ε training reports at it. Two evaluations, not a search.
  """
  prep = next(p for p in prepared
              if p.describe() == describe(best.mechanism, p.option, best.params)
              and p.option.schema.as_dict() == best.schema)
  if prep.computed and not best.calibration_cached:
    return True  # resolved and calibrated in this run
  now = figures(prep.resolve())
  same_figures = all(prep.figures[k] == v for k, v in now.items() if k != "cache_hit")
  prep.figures.update(now)
  fresh = Records(records.cache_dir, read=False)
  z, target = best.noise_multiplier, prep.spec.privacy.target_epsilon
  try:
    at_z = epsilon_at(prep, z, fresh)
  except ValueError:
    return False
  try:
    below = epsilon_at(prep, z * (1.0 - TOLERANCE), fresh)
  except ValueError:  # the analysis gave up below a z that passed: failing, as in the search
    below = math.inf
  return same_figures and at_z == best.epsilon and at_z <= target < below


def _bar(items, desc: str, progress: bool, total: Optional[int] = None):
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  return tqdm(items, desc=desc, total=total, unit="candidate", file=sys.stderr,
              disable=not progress, dynamic_ncols=True)


def describe(name: str, option: SchemaOption, params: Dict[str, int]) -> str:
  """A candidate in one line: mechanism, schema label, p and family parameters."""
  extra = "".join(f" {k}={v}" for k, v in params.items())
  p = "" if option.sampling_prob is None else f" p={option.sampling_prob:.4g}"
  return f"{name} {option.schema.label}{p}{extra}"


def fragile(ranked: Sequence[Candidate]) -> List[str]:
  """Where the recommendation could change: runners-up within the calibration tolerance of
  the winner's error, a winner whose sensitivity is an upper bound, candidates accounted
  without their MMCC amplification."""
  best, out = ranked[0], []
  close = [c for c in ranked[1:] if c.rmse <= best.rmse * (1 + 2 * TOLERANCE)]
  for c in close:
    out.append(f"{c.mechanism} under {participation_lib.from_dict(c.schema).label}"
               f"{_params_text(c.params)} is within the calibration tolerance "
               f"({2 * TOLERANCE:g} relative; rmse {c.rmse:.5g} vs {best.rmse:.5g}): either "
               "may be the better one")
  if not best.sensitivity_exact:
    out.append("the winner's sensitivity is an upper bound (not attained): its true error "
               "at the target could be lower, and so could others'")
  skipped = [c for c in ranked if c.mmcc_skipped]
  if skipped:
    out.append(f"{len(skipped)} candidates were accounted without MMCC (skip_mmcc): their ε "
               "bound and error are pessimistic; with MMCC they could rank higher")
  return out


def _params_text(params: Dict[str, int]) -> str:
  return "".join(f" {k}={v}" for k, v in params.items())


def demands(c: Candidate) -> str:
  """What the deployment must enforce for the candidate's privacy claim."""
  schema = participation_lib.from_dict(c.schema)
  n_b = {"min_sep": f"b = {getattr(schema, 'min_sep', None)}, p = {c.sampling_prob}"}
  detail = n_b.get(schema.kind, f"k = {getattr(schema, 'epochs', 1)}")
  return f"{schema.describe()} ({detail}, {c.clients_used} clients): {DEMANDS[schema.kind]}"


def _schema_arguments(c: Candidate) -> Dict[str, Any]:
  schema = participation_lib.from_dict(c.schema)
  out: Dict[str, Any] = {"participation": schema.kind}
  for name in schema.takes:
    if name != "max_participations":  # all that fit: the CLI's own default
      out[name] = getattr(schema, name)
  if c.sampling_prob is not None:
    out["sampling_prob"] = c.sampling_prob
  return out


def _workload_arguments(dep: Deployment) -> Dict[str, Any]:
  if dep.prefix_sum:
    return {}
  out: Dict[str, Any] = {"lr_schedule": dep.lr_schedule}
  if dep.schedule_rounds is not None:
    out["schedule_rounds"] = dep.schedule_rounds
  return out


def training_flags(dep: Deployment, c: Candidate) -> str:
  """The ``training/run_stackoverflow.py`` command line that trains the candidate."""
  args: Dict[str, Any] = {"mechanism": c.mechanism, "total_rounds": dep.total_rounds,
                          "clients_per_round": dep.clients_per_round,
                          "target_epsilon": dep.target_epsilon, "delta": dep.delta,
                          "accountant": dep.accountant}
  args.update(_schema_arguments(c), **c.params)
  if not dep.prefix_sum:
    args["server_momentum"] = dep.momentum
  args.update(_workload_arguments(dep))
  return "python training/run_stackoverflow.py " + " ".join(f"--{k}={v:g}" if isinstance(
      v, float) else f"--{k}={v}" for k, v in args.items())


def flower_arguments(dep: Deployment, c: Candidate) -> str:
  """The Flower wrapper's call (``tff_mf.flower.strategy.MatrixFactorizationFixedClipping``)
  that runs the candidate; ``strategy`` and ``clip_norm`` are the deployment's own."""
  schema = participation_lib.from_dict(c.schema)
  params = [f"{name}={getattr(schema, name)}" for name in schema.takes
            if name != "max_participations"]
  args = [f"total_rounds={dep.total_rounds}", f"clients_per_round={dep.clients_per_round}",
          "clip_norm=CLIP_NORM", f"target_epsilon={dep.target_epsilon:g}",
          f"delta={dep.delta:g}", f"accountant={dep.accountant!r}",
          f"participation=tff_mf.participation.{schema.kind}({', '.join(params)})"]
  if c.sampling_prob is not None:
    args.append(f"sampling_prob={c.sampling_prob:g}")
  args += [f"{k}={v}" for k, v in c.params.items()]
  if not dep.prefix_sum:
    args.append(f"momentum={dep.momentum:g}")
  args += [f"{k}={v!r}" for k, v in _workload_arguments(dep).items()]
  args.append(f"population={c.clients_used}")
  return (f"MatrixFactorizationFixedClipping(strategy, {c.mechanism!r}, " + ", ".join(args)
          + ")")


def error_against_epsilon(dep: Deployment, result: Dict[str, Any], *, best: int = 3,
                          epsilons: Sequence[float] = PLOT_EPSILONS,
                          cache_dir: Optional[str] = None) -> Dict[str, List[Tuple[float, float]]]:
  """{label: [(ε, rmse)]} of the ``best`` first candidates recalibrated at each ε (and the
  target), as the plan built them (their factorizations from the cache)."""
  out = {}
  for c in map(Candidate.of_json, result["candidates"][:best]):
    option = SchemaOption(participation_lib.from_dict(c.schema), c.sampling_prob,
                          c.clients_used, c.participations)
    points = []
    for eps in sorted(set(epsilons) | {dep.target_epsilon}):
      spec = spec_of(dep, c.mechanism, option, c.params, target_epsilon=eps,
                     amplified=not c.mmcc_skipped)
      resolved, record = mechanisms.build(spec, cache_dir=cache_dir)
      points.append((eps, candidate_of(figures(resolved), record, option, c.params,
                                       c.mmcc_skipped, 0.0).rmse))
    out[describe(c.mechanism, option, c.params)] = points
  return out
