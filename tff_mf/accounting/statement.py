"""The privacy statement of a run, in words (numpy core, no TensorFlow).

In the spirit of TF Privacy's ``compute_dp_sgd_privacy_statement``: one function,
:func:`privacy_statement`, renders the privacy record of a run (``tff_mf.accounting``'s
``epsilon_for`` / ``calibrate`` record, or the training harness's record built from it)
as a structured, JSON-ready dict and a short text that names

- the unit of privacy: one client's whole data, under add/remove adjacency (the
  accountant's: ``tff_mf.accounting``);
- ε at δ, to 3 significant digits rounded UP (:func:`round_up`), so that the printed ε
  stays an upper bound;
- the analysis in words (which theorem, which multiplier, which accountant);
- the participation schema, and what the sampler recorded when there was a run;
- what the guarantee covers (the released models) and what it does not.
"""

from __future__ import annotations

import dataclasses
import decimal
import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from tff_mf import jsonio
from tff_mf.accounting import analyses
from tff_mf.accounting.bound import Bound

DIGITS = 3
UNIT = ("client-level: one client's whole data, in every round it joins. Adjacency is "
        "add/remove one client (equivalently, replacing all of its clipped updates by zero); "
        "a replace-one guarantee is not what is accounted (it would take twice the sensitivity)")
# With adaptive clipping a client also contributes one clipped-count bit per round it joins
# (its update's norm at most the clip norm, counted for the quantile estimate): a zero update
# still counts as unclipped, so replacing updates by zero is not removing the client.
UNIT_ADAPTIVE = (
    "client-level: one client's whole data, in every round it joins. Adjacency is add/remove "
    "one client: both its clipped updates (in the noisy sum) and its clipped-count bits (in the "
    "noisy count of the adaptive clip norm) are present or absent together. Replacing its "
    "updates by zero is not the same (a zero update still counts as unclipped); a "
    "replace-one guarantee is not what is accounted (it would take twice the sensitivity)")
COVERS_RUN = ("the models released after every round (the aggregator's noisy output), hence "
              "the final model and anything computed from the models and held-out data alone "
              "(validation and test metrics)")
COVERS_ACCOUNT = ("the models released after each of the {n} rounds of a run with this "
                  "configuration")
COVERS_ACCOUNT_ANY_N = ("the models released after every round of a run with this configuration "
                        "(any number of rounds: C is normalized to sensitivity 1 under single "
                        "participation)")
REPORTED_WHY = ("each is an upper bound on the same run's epsilon, so the smallest is reported")
NOT_COVERED_RUN = (
    "the per-round counters and timings of metrics.csv (clients, empty_clients_skipped, "
    "zeroed_client_updates, round_seconds) are computed without noise",
    "the held-out validation and test data are not protected by this guarantee",
)
NONPRIVATE_METRICS = ("metrics marked nonprivate_ ({names}) are computed on the clients' raw "
                      "data without noise: not covered")
PINNED = ("the noise seed was pinned: anyone who knows it can regenerate and subtract the "
          "noise, so this run has no privacy guarantee while the seed is known (the epsilon "
          "above is the mechanism's with a secret seed)")
SECRET_SEED = ("the secret noise seed lives in identity.json and the checkpoints: whoever "
               "reads them can remove the noise (keep them private)")
SECRET_SUMS = ("with the discrete Gaussian the checkpoints also hold the last b - 1 clipped "
               "sums without noise (the encoder's state): keep them as private as the seed")
NOT_COVERED_ACCOUNT = (
    "anything computed from the clients' data without noise (e.g. training metrics)",
    "a run whose noise seed is pinned or leaked, or whose clients join more rounds than the "
    "schema allows",
)



@dataclasses.dataclass(frozen=True, eq=False)
class Statement(jsonio.Record):
  """A privacy statement as written (``privacy_statement``'s JSON form), typed for the code
  that reads one back (a run's summary.json holds one): ``epsilon`` is ε rounded up (None:
  not reported, or no DP), ``epsilon_text`` its words, ``text`` the statement's lines."""
  epsilon: Optional[float] = None
  epsilon_text: Optional[str] = None
  delta: Optional[float] = None
  text: Optional[str] = None


# ----------------------------------------------------------------------------- ε, rounded up


def round_up(value: float, digits: int = DIGITS) -> float:
  """``value`` rounded UP to ``digits`` significant digits, as a float never below it.

  The exact binary value is rounded with ``decimal.ROUND_CEILING`` (7.999999994 → 8.00,
  1.2341 → 1.24, 1.23 → 1.23); the float nearest that decimal is still ≥ ``value``
  (rounding to nearest is monotone and ``value`` is itself a float). ∞ stays ∞.
  """
  value = float(value)
  if not math.isfinite(value) or value == 0.0:
    return value
  return float(_ceil_decimal(value, digits))


def _ceil_decimal(value: float, digits: int) -> decimal.Decimal:
  exact = decimal.Decimal(value)
  exponent = exact.adjusted()
  rounded = exact.quantize(decimal.Decimal(1).scaleb(exponent - digits + 1),
                           rounding=decimal.ROUND_CEILING)
  if rounded.adjusted() > exponent:  # 9.999 → 10.0: one digit more, requantize
    rounded = rounded.quantize(decimal.Decimal(1).scaleb(exponent - digits + 2),
                               rounding=decimal.ROUND_CEILING)
  return rounded


def epsilon_text(value: Optional[float], digits: int = DIGITS) -> str:
  """ε for people: ``digits`` significant digits rounded up ("8.00", "1.24", "0.0124",
  "1.24e+05"), "inf" when unbounded, "not reported" for None."""
  if value is None:
    return "not reported"
  value = float(value)
  if math.isinf(value):
    return "inf"
  if value == 0.0:
    return "0"
  rounded = _ceil_decimal(value, digits)
  exponent = rounded.adjusted()
  if -4 <= exponent < 4:
    return f"{rounded:.{max(0, digits - 1 - exponent)}f}"
  return f"{float(rounded):.{digits - 1}e}"


# ----------------------------------------------------------------------------- analysis


_fmt = analyses.fmt


def _sensitivity_words(record: Bound, schema_text: str) -> str:
  exact = record.sensitivity_exact
  kind = "exact" if exact else "an upper bound" if exact is not None else "as recorded"
  method = record.sensitivity_method
  return (f"sens = the sensitivity of the encoder C under {schema_text} ({kind}"
          f"{'; ' + str(method) if method else ''})")


def analysis_words(record: Mapping[str, Any], schema_text: str) -> str:
  """The analysis behind the record's ε, in its own words (``tff_mf.accounting.analyses``)."""
  record = Bound.of_json(record)
  z, sens = record.noise_multiplier, record.sensitivity
  named = record.rest.get("unamplified_accountant") or record.accountant
  accountant = (analyses.ACCOUNTANTS[named].words if named in analyses.ACCOUNTANTS
                else str(record.accountant))
  ratio = (f"z/sens = {_fmt(z)}/{_fmt(sens)} = {_fmt(z / sens)}" if z is not None and sens
           else f"z = {_fmt(z)}")
  analysis = analyses.described(record.analysis or "none")
  return analysis.words(record, ratio, accountant, _sensitivity_words(record, schema_text))


# ----------------------------------------------------------------------------- participation


def _schema_text(record: Bound, schema: Optional[Mapping[str, Any]]) -> str:
  from tff_mf import participation  # pylint: disable=g-import-not-at-top
  schema = schema if schema is not None else record.rest.get("schema")
  if isinstance(schema, Mapping):
    return participation.from_dict(dict(schema)).describe()
  if isinstance(schema, participation.Participation):
    return schema.describe()
  return str(record.rest.get("participation") or "single")


def participation_words(schema_text: str, observed: Optional[Mapping[str, Any]],
                        sampling_prob: Optional[float]) -> str:
  """The schema, and what the sampler recorded (None: no run, accounting only)."""
  text = schema_text
  if sampling_prob is not None:
    text += f", Poisson sampling with probability {sampling_prob:g} per eligible round"
  if observed is None:
    return text
  gap = observed.get("min_separation")
  return (f"{text}; as sampled: {observed.get('distinct_clients')} distinct clients over "
          f"{observed.get('rounds')} rounds, at most {observed.get('max_participations')} "
          f"rounds per client, "
          + ("no client in two rounds" if gap is None else
             f"two rounds of one client at least {gap} apart"))


# ----------------------------------------------------------------------------- the setup


def setup_words(record: Mapping[str, Any], setup: Mapping[str, Any], run: bool) -> str:
  """The configuration the guarantee is for: mechanism, n, clients per round, clip norm, z.

  ``setup``: ``mechanism`` and ``label`` (or ``matrix``: the C accounted for), ``rounds``,
  ``clients_per_round``, ``clip_norm`` (a number, or "adaptive" with ``adaptive_clipping``:
  the estimator's parameters). Accounting without a run has no clients or clip norm: ε
  depends on the noise multiplier z = noise std / clip norm alone, which is said instead.
  """
  parts = []
  mechanism, matrix = setup.get("mechanism"), setup.get("matrix")
  if mechanism:
    label = setup.get("label")
    parts.append(f"mechanism {mechanism}" + (f" ({label})" if label and label != mechanism
                                              else ""))
  elif matrix:
    parts.append(f"encoder C from {matrix}")
  else:
    parts.append("any encoder C normalized to max column norm 1")
  record = Bound.of_json(record)
  n = _rounds(record, setup)
  parts.append(f"n = {n} rounds" if n is not None else
               "any number of rounds n (single participation)")
  z = record.noise_multiplier
  parts.append(f"noise multiplier z = {_fmt(z)} (noise std / clip norm)")
  clients, clip = setup.get("clients_per_round"), setup.get("clip_norm")
  if clients is not None:
    parts.append(f"{_fmt(clients)} clients per round")
  if clip == "adaptive":
    a = setup.get("adaptive_clipping") or {}
    rate = a.get("learning_rate", a.get("clip_learning_rate"))
    sigma_b = a.get("clipped_count_stddev") or record.rest.get("clipped_count_stddev")
    parts.append(f"adaptive clip norm (starting at {_fmt(a.get('initial_clip_norm'))}, "
                 f"tracking the {_fmt(a.get('target_quantile'))} quantile of the update norms "
                 f"at learning rate {_fmt(rate)}, clipped-count noise std {_fmt(sigma_b)})")
  elif clip is not None:
    parts.append(f"fixed clip norm {_fmt(clip)}")
  if clients is None and clip is None and not run:
    parts.append("any clip norm and number of clients per round (epsilon depends on z alone)")
  return ", ".join(parts)


def _rounds(record: Bound, setup: Mapping[str, Any]) -> Optional[int]:
  n = setup.get("rounds", record.rest.get("n"))
  return None if n is None else int(n)


# ----------------------------------------------------------------------------- ε by analysis


def epsilon_table(record: Mapping[str, Any]) -> List[Dict[str, Any]]:
  """ε under each analysis computed for the run (each a valid upper bound), in words.

  From ``candidates`` (``tff_mf.mechanisms.run_privacy``) or the record itself
  (``tff_mf.accounting.epsilon_for``); an amplified record also holds the unamplified
  Gaussian for the same sampling (one row per analysis: the smaller of its bounds). Rows:
  {analysis, label, epsilon, epsilon_text, reported} (and ``failure_probability`` beside an ε
  that needs it); ``reported`` marks the smallest, the ε the statement reports. Empty without
  an ε.
  """
  record = Bound.of_json(record)
  if record.epsilon is None:
    return []
  rows: List[Tuple[str, str, float, Optional[float]]] = []  # analysis, label, ε, β
  for c in record.candidates or (record,):
    beta = high_probability(c)  # its ε never appears without β
    label = _label(c.analysis) + (
        f" ({analyses.high_probability_words(beta)})" if beta is not None else "")
    if c.amplified_epsilon is not None and c.unamplified_epsilon is not None:
      b = c.min_sep if c.min_sep is not None else record.min_sep
      rows.append(("none", "unamplified Gaussian at z / sensitivity" + (
          f", every round of a residue class mod {b} joined" if b is not None else ""),
                   float(c.unamplified_epsilon), None))
      rows.append((c.analysis, label, float(c.amplified_epsilon), beta))
    elif c.epsilon is not None:
      rows.append((c.analysis, label, float(c.epsilon), beta))
  smallest: Dict[str, Tuple[str, str, float, Optional[float]]] = {}  # one row per analysis
  for row in rows:
    if row[0] not in smallest or row[2] < smallest[row[0]][2]:
      smallest[row[0]] = row
  best = min(row[2] for row in smallest.values())
  return [dict({"analysis": analysis, "label": label, "epsilon": eps,
                "epsilon_text": epsilon_text(eps), "reported": eps == best},
               **({"failure_probability": beta} if beta is not None else {}))
          for analysis, label, eps, beta in smallest.values()]


def high_probability(record: Mapping[str, Any]) -> Optional[float]:
  """β when the record's analysis gives an ε that holds with probability ≥ 1 − β over the
  accountant's own sampling (``tff_mf.accounting.monte_carlo``), else None."""
  record = Bound.of_json(record)
  cls = analyses.of_record(record.analysis)
  if cls is None or not cls.high_probability:
    return None
  return record.failure_probability


def _label(analysis: str) -> str:
  described = analyses.described(analysis)
  return analysis if described is None else described.label


# ----------------------------------------------------------------------------- the statement

# The analyses a record may name: the registered bounds (``tff_mf.accounting.analyses``).
ANALYSES = tuple(name for name, cls in analyses.REGISTRY.items() if cls.bound)


def _not_a_record(record: Any) -> Exception:
  """The refusal of a dataclass passed as the record (a schema of any kind: a Participation)."""
  from tff_mf import checks  # pylint: disable=g-import-not-at-top
  from tff_mf import participation  # pylint: disable=g-import-not-at-top
  what = ("Participation" if isinstance(record, participation.Participation)
          else type(record).__name__)
  return checks.CheckError(f"privacy_statement takes a privacy record, not a {what}")


def _checked_record(record: Any) -> Bound:
  """``record`` as a ``Bound`` the statement can describe truthfully; CheckError otherwise."""
  from tff_mf import checks  # pylint: disable=g-import-not-at-top
  if not isinstance(record, Mapping):
    raise checks.CheckError(f"privacy_statement takes a privacy record (a dict from "
                            f"tff_mf.accounting.epsilon_for, or a PrivacyRecord), got "
                            f"{type(record).__name__}")
  record = Bound.of_json(record)
  cls = analyses.of_record(record.analysis)
  if cls is None or not cls.bound:
    raise checks.CheckError(f"privacy_statement: the record names no analysis it can describe "
                            f"(analysis = {record.analysis!r}; expected one of "
                            f"{', '.join(ANALYSES)}): pass the record "
                            f"tff_mf.accounting.epsilon_for returns, or a PrivacyRecord "
                            f"(setup.privacy)")
  if cls.amplified and record.bound not in ("amplified", "unamplified"):
    raise checks.CheckError(f"privacy_statement: the {record.analysis} record does not say "
                            f"which bound its epsilon is (bound = {record.bound!r})")
  for c in (record,) + record.candidates:
    cls = analyses.of_record(c.analysis)
    beta = c.failure_probability
    if cls is not None and cls.high_probability and not (
        isinstance(beta, float) and 0.0 < beta < 1.0):
      raise checks.CheckError(
          f"privacy_statement: the {c.analysis} epsilon holds only with probability "
          f">= 1 - beta over the accountant's own sampling, and the record carries no "
          f"failure_probability (got {beta!r}): it is never reported without that label")
  computed = [c.epsilon for c in record.candidates if c.epsilon is not None]
  if record.epsilon is not None and computed and float(record.epsilon) < min(computed):
    raise checks.CheckError(f"privacy_statement: epsilon {record.epsilon} is below every "
                            f"bound its record computed (smallest {min(computed)})")
  return record


def privacy_statement(record: Any, *, schema=None,
                      observed: Optional[Mapping[str, Any]] = None,
                      sampling_prob: Optional[float] = None, run: Optional[bool] = None,
                      noise_seed_source: Optional[str] = None,
                      nonprivate_metrics: Sequence[str] = (),
                      epsilon_reason: Optional[str] = None,
                      setup: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
  """The privacy statement of ``record`` (see the module docstring), JSON-ready.

  Args:
    record: the privacy record: ``epsilon`` (None: not reported, ``epsilon_reason``
      says why), ``delta``, ``analysis``, ``accountant``, ``noise_multiplier``,
      ``sensitivity`` (and ``sensitivity_exact``/``_method``), ``schema`` and, for the
      amplified analyses, ``bound``, ``sampling_prob``, ``min_sep``... as
      ``tff_mf.accounting.epsilon_for`` returns them, or ``tff_mf.mechanisms``'s
      ``PrivacyRecord`` (``setup.privacy`` of ``build_mechanism``: its ``details`` and
      ``setup`` are used). A record the statement cannot describe truthfully (no analysis,
      an amplified analysis that does not say which bound it reports) raises CheckError.
    schema: the participation schema (a ``Participation`` or its dict), if not in record.
    observed: what the sampler recorded (max participations, min separation, distinct
      clients, rounds); None for accounting without a run.
    sampling_prob: Poisson sampling probability per eligible round, if any.
    run: a training run (True, the default for a dict) or a configuration (False, the
      default for a ``PrivacyRecord``).
    noise_seed_source: "pinned" voids the guarantee; "os_entropy" (secret) otherwise.
    nonprivate_metrics: names of metrics written without noise.
    epsilon_reason: why ε is not reported, when it is not.
    setup: the configuration (``setup_words``): mechanism, rounds, clients per round, clip
      norm; over the ``PrivacyRecord``'s own.

  Returns {setup, unit, epsilon, epsilon_text, epsilon_unrounded, delta, epsilons,
  reported_why, analysis, participation, covers, not_covered, void, text}; ``epsilon`` is
  rounded up; ``epsilons`` is ``epsilon_table``.
  """
  statement_input = getattr(record, "statement_input", None)
  if callable(statement_input):  # a tff_mf.mechanisms.PrivacyRecord
    record, defaults = statement_input()
    if record is None:
      return no_privacy_statement("the mechanism adds no noise")
    setup = dict(defaults.get("setup") or {}, **(setup or {}))
    schema = schema if schema is not None else defaults.get("schema")
    noise_seed_source = noise_seed_source or defaults.get("noise_seed_source")
    epsilon_reason = epsilon_reason or defaults.get("epsilon_reason")
    run = defaults.get("run") if run is None else run
  elif dataclasses.is_dataclass(record) and not isinstance(record, Bound):
    raise _not_a_record(record)
  record = _checked_record(record)
  run = True if run is None else run
  setup = dict(setup or {})
  eps = None if record.epsilon is None else float(record.epsilon)
  if eps is not None and math.isnan(eps):
    raise ValueError("internal error: a NaN epsilon reached the privacy statement")
  schema_text = _schema_text(record, schema)
  if sampling_prob is None:
    sampling_prob = record.sampling_prob
  not_covered, void = _not_covered(run, noise_seed_source, nonprivate_metrics)
  if run and record.rest.get("noise_distribution") == "discrete_gaussian":
    not_covered.append(SECRET_SUMS)
  n = _rounds(record, setup)
  covers = COVERS_RUN if run else (COVERS_ACCOUNT.format(n=n) if n is not None
                                   else COVERS_ACCOUNT_ANY_N)
  adaptive = analyses.counts_clipping(record) or setup.get("clip_norm") == "adaptive"
  table = epsilon_table(record) if eps is not None else []
  out = {"setup": setup_words(record, setup, run),
         "unit": UNIT_ADAPTIVE if adaptive else UNIT,
         "epsilon": None if eps is None else round_up(eps),
         "epsilon_text": None if eps is None else epsilon_text(eps), "epsilon_unrounded": eps,
         "delta": record.delta,
         "epsilons": table,
         "reported_why": REPORTED_WHY if len(table) > 1 else None,
         "analysis": analysis_words(record, schema_text),
         "participation": participation_words(schema_text, observed, sampling_prob),
         "covers": covers,
         "not_covered": not_covered, "void": void}
  out.update(_label_fields(record) if eps is not None else {})
  if eps is None:
    out["epsilon_reason"] = epsilon_reason or "not reported"
  out["text"] = statement_text(out)
  return out


def _label_fields(record: Mapping[str, Any]) -> Dict[str, Any]:
  """β and the words every ε of a high-probability analysis carries (else nothing)."""
  beta = high_probability(record)
  if beta is None:
    return {}
  return {"failure_probability": beta,
          "epsilon_label": analyses.high_probability_words(beta)}


def _not_covered(run: bool, noise_seed_source: Optional[str],
                 nonprivate_metrics: Sequence[str]):
  """(what the guarantee does not cover, whether a pinned seed voids it)."""
  not_covered = list(NOT_COVERED_RUN if run else NOT_COVERED_ACCOUNT)
  if nonprivate_metrics:
    not_covered.insert(0, NONPRIVATE_METRICS.format(names=", ".join(nonprivate_metrics)))
  void = noise_seed_source == "pinned"
  if void:
    not_covered.insert(0, PINNED)
  elif run and noise_seed_source is not None:
    not_covered.append(SECRET_SEED)
  return not_covered, void


def no_privacy_statement(reason: str) -> Dict[str, Any]:
  """The statement of a run without DP noise: nothing it releases is private."""
  return {"setup": None, "unit": None, "epsilon": None, "epsilon_text": "inf",
          "epsilon_unrounded": None, "delta": None, "epsilons": [], "reported_why": None,
          "analysis": None, "participation": None, "covers": None,
          "not_covered": ["everything this run releases"], "void": True,
          "epsilon_reason": reason,
          "text": f"Privacy statement\n  None: {reason}; nothing this run releases is "
                  "differentially private."}


def statement_text(statement: Mapping[str, Any]) -> str:
  """The statement as lines of text (what a run prints at its end)."""
  eps = statement["epsilon_text"]
  delta = statement.get("delta")
  delta = "?" if delta is None else f"{float(delta):g}"
  if statement["epsilon"] is None:
    guarantee = f"no epsilon is reported: {statement.get('epsilon_reason')}"
  else:
    guarantee = (f"(epsilon = {eps}, delta = {delta})-DP, epsilon rounded up to "
                 f"{DIGITS} significant digits" +
                 (f"; this epsilon {statement['epsilon_label']}"
                  if statement.get("epsilon_label") else "") +
                 (" (VOID for this run: see below)" if statement.get("void") else ""))
  lines = ["Privacy statement"]
  if statement.get("setup"):
    lines.append(f"  Setup: {statement['setup']}.")
  lines += [f"  Unit of privacy: {statement['unit']}.",
            f"  Guarantee: {guarantee}."]
  table = statement.get("epsilons") or []
  if len(table) > 1:
    lines.append(f"  Epsilon at delta = {delta} under each analysis computed "
                 f"({statement['reported_why']}):")
    lines += [f"    - {row['label']}: {row['epsilon_text']}"
              + (" (reported)" if row["reported"] else "") for row in table]
  lines += [f"  Analysis: {statement['analysis']}.",
            f"  Participation: {statement['participation']}.",
            f"  Covers: {statement['covers']}.",
            "  Not covered:"]
  lines += [f"    - {item}." for item in statement["not_covered"]]
  return "\n".join(lines)
