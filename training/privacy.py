"""The ε of a training run under its participation schema, and the DpEvent cross-check.

Every number comes from ``tff_mf.accounting`` and is an upper bound on the run's ε at δ:

- ``single`` and ``fixed_epoch`` (and ``min_sep`` with a participation cap or p = 1):
  the run is one Gaussian mechanism with multiplier z / sens, sens the sensitivity of
  the encoder C under the schema (Denisov et al. 2022, arXiv:2202.08312, Thm 4.1;
  Choquette-Choo et al. 2023, arXiv:2211.06530), no amplification.
- ``min_sep`` Poisson sampling (p < 1, no cap): amplification by sampling, the
  amplified banded analysis when C has at most b bands (Choquette-Choo et al. 2023,
  arXiv:2306.08153, Thm 4), MMCC otherwise (Choquette-Choo et al. 2024,
  arXiv:2310.15526, App D). Both also bound the unamplified ε with every eligible
  round joined (``accounting.poisson_sensitivity``); the unamplified Gaussian at
  z / sens under the min-sep schema is a third valid bound. The run reports the
  smallest and names the analysis that gave it.

C is the encoder the mechanism adds noise for: the factorization's C for the matrix
mechanisms, C_T / √levels for TFF's tree (the nodes it adds z·√levels noise to) and
C = I for ``gaussian``. ``check_against_mechanism`` refuses a run
whose aggregator computed another sensitivity than the accountant.

The aggregators also report DpEvents each round; :class:`EventLedger` keeps them
(``dp_events.jsonl``) and :func:`dp_event_epsilon` composes them with dp_accounting's
PLD accountant, a cross-check of the unamplified guarantee recorded beside ε.
"""

from __future__ import annotations

import collections
import hashlib
import json
import math
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from training.config import TrainingConfig
from training.config import TrainingError

ANALYSIS_LABELS = {
    "none": "unamplified Gaussian mechanism at z / sensitivity",
    "banded": "amplified banded MF (Poisson sampling within residue classes)",
    "mmcc": "MMCC (Poisson sampling within residue classes)",
    "adaptive": "unamplified Gaussian at z / sensitivity composed with the adaptive clip norm's "
                "count queries (one Gaussian at 1/mu)",
}
EVENTS_FILE = "dp_events.jsonl"
# MMCC in this process only: no forked workers inside a process that runs TensorFlow and
# TFF's gRPC threads.
MMCC_OPTIONS = {"workers": 1}
# Relative tolerance between the aggregator's and the accountant's z / sensitivity.
SENSITIVITY_RTOL = 1e-9


def schema(config: TrainingConfig):
  """The participation schema of the run (min_sep without a cap: k = ⌈n/b⌉)."""
  return config.schema()


def amplified(config: TrainingConfig) -> bool:
  """Whether an amplified analysis applies: min_sep Poisson sampling with p < 1, no binding cap."""
  if config.participation != "min_sep" or config.sampling_prob >= 1.0:
    return False
  fit = -(-config.total_rounds // config.min_sep)
  return config.max_participations is None or config.max_participations >= fit


def sampling_secret(config: TrainingConfig, noise_seed: Optional[int]) -> int:
  """The secret seed of min_sep's Poisson coins and balls_in_bins' rounds (-1 for the others).

  Derived from a pinned ``--noise_seed`` (so pinning it pins the whole run), else fresh
  from OS entropy. Kept only in the checkpoints, like the noise seed.
  """
  if config.participation not in ("min_sep", "balls_in_bins"):
    return -1
  from tff_mf import checks  # pylint: disable=g-import-not-at-top
  if config.noise_seed is None and noise_seed is None:
    return checks.new_seed()
  seed = int(config.noise_seed if config.noise_seed is not None else noise_seed)
  digest = hashlib.sha256(f"tff_mf {config.participation} sampling {seed}".encode()).digest()
  return int.from_bytes(digest[:8], "little") >> 1


def encoder(config: TrainingConfig, factorization) -> np.ndarray:
  """C the mechanism adds unit-multiplier noise for: z·C's rows are what the run adds.

  Matrix mechanisms: the factorization's C (γ(C) = 1); TFF's tree: C_T/√levels; TFF's
  gaussian_fixed: C = I — the encoders of ``tff_mf.mechanisms`` (where they are stated
  once, with the reason), which ``training.mechanisms.resolve_privacy`` reads from the
  resolved mechanism.
  """
  if factorization is not None:
    return np.asarray(factorization.c, np.float64)
  from tff_mf import mechanisms  # pylint: disable=g-import-not-at-top
  from tff_mf import registry  # pylint: disable=g-import-not-at-top
  mechanism = registry.mechanism(config.canonical_mechanism)
  if mechanism.noise != "tff_tree":
    raise TrainingError(f"--mechanism={config.mechanism} has no encoder to account for")
  return mechanisms.tree_encoder(config.total_rounds)


def _amplification(config: TrainingConfig, c: np.ndarray) -> str:
  from tff_mf import accounting  # pylint: disable=g-import-not-at-top
  return "banded" if accounting.band_count(c) <= config.min_sep else "mmcc"


def _candidate(record: Dict[str, Any]) -> Dict[str, Any]:
  return {"analysis": record["analysis"], "epsilon": record["epsilon"],
          "sensitivity": record.get("sensitivity"), "accountant": record.get("accountant")}


def _unamplified(config: TrainingConfig, c: np.ndarray, z: float) -> Dict[str, Any]:
  from tff_mf import accounting  # pylint: disable=g-import-not-at-top
  return accounting.epsilon_for(c, schema(config), z, config.delta, None,
                                accountant=config.accountant)


def _amplified(config: TrainingConfig, c: np.ndarray, z: float,
               target: Optional[float] = None) -> Tuple[Optional[Dict[str, Any]], str]:
  """(record, note): the amplified analysis at z (or calibrated to ``target``)."""
  from tff_mf import accounting  # pylint: disable=g-import-not-at-top
  analysis = _amplification(config, c)
  try:
    if target is not None:
      record = accounting.calibrate(c, schema(config), target, config.delta, analysis,
                                    config.sampling_prob, config.accountant,
                                    mmcc_options=MMCC_OPTIONS)
    else:
      record = accounting.epsilon_for(c, schema(config), z, config.delta, analysis,
                                      config.sampling_prob, config.accountant,
                                      mmcc_options=MMCC_OPTIONS)
  except ValueError as e:  # AccountingError, CheckError: the analysis does not apply
    return None, f"{analysis} analysis not applicable: {' '.join(str(e).split())}"
  return record, ""


def guarantee(config: TrainingConfig, c: np.ndarray) -> Tuple[float, Dict[str, Any]]:
  """(z, record): the noise multiplier (given or calibrated) and the run's ε record.

  The record holds the reported bound (``epsilon``, ``analysis``, ``theorem``,
  ``sensitivity``...), every ``candidates`` bound computed, and ``notes``.
  """
  from tff_mf import accounting  # pylint: disable=g-import-not-at-top
  target = config.target_epsilon
  notes: List[str] = []
  if config.adaptive_clipping:
    return _adaptive_guarantee(config, c)
  try:
    if amplified(config):
      record, note = _amplified(config, c, config.noise_multiplier, target)
      if record is not None:
        z = float(record["noise_multiplier"])
      else:
        notes.append(note)
        z = float(config.noise_multiplier) if target is None else float(accounting.calibrate(
            c, schema(config), target, config.delta, None,
            accountant=config.accountant)["noise_multiplier"])
      plain = _unamplified(config, c, z)
      candidates = [plain] + ([record] if record is not None else [])
    else:
      if target is not None:
        plain = accounting.calibrate(c, schema(config), target, config.delta, None,
                                     accountant=config.accountant)
        z = float(plain["noise_multiplier"])
      else:
        z = float(config.noise_multiplier)
        plain = _unamplified(config, c, z)
      candidates = [plain]
  except ValueError as e:
    raise TrainingError(f"privacy accounting: {' '.join(str(e).split())}") from None
  if config.participation == "balls_in_bins":
    notes.append(f"balls_in_bins: {accounting.NO_BALLS_IN_BINS_AMPLIFICATION}")
  best = dict(min(candidates, key=lambda r: r["epsilon"]))
  best.update(candidates=[_candidate(r) for r in candidates], notes=notes,
              analysis_label=ANALYSIS_LABELS[best["analysis"]],
              **_unamplified_fields(best, plain))
  if target is not None:
    best["target_epsilon"] = float(target)
    if not best["epsilon"] <= target:
      raise TrainingError(f"calibration gave epsilon {best['epsilon']} above the target {target}")
  best.pop("mmcc", None)  # per-row details: too large for summary.json
  return z, best


def _unamplified_fields(best: Dict[str, Any], plain: Dict[str, Any]) -> Dict[str, Any]:
  """The unamplified Gaussian's sensitivity (what the aggregator calibrates its noise for),
  when the reported bound is an amplified one: its ``sensitivity`` then means every
  eligible round joined. Otherwise ``sensitivity`` is already that one (one field a meaning).
  """
  if best["analysis"] not in ("banded", "mmcc"):
    return {}
  return {"unamplified_sensitivity": plain["sensitivity"],
          "unamplified_sensitivity_exact": plain["sensitivity_exact"],
          "unamplified_sensitivity_method": plain["sensitivity_method"]}


def _adaptive_guarantee(config: TrainingConfig, c: np.ndarray) -> Tuple[float, Dict[str, Any]]:
  """(z, record) with adaptive clipping: the MF Gaussian and the count queries composed.

  μ² = (sens/z)² + k·(½/σ_b)² (``tff_mf.adaptive_clipping``); no amplification is claimed
  for the count queries, so min_sep Poisson runs report this unamplified bound.
  """
  from tff_mf import accounting  # pylint: disable=g-import-not-at-top
  from tff_mf import adaptive_clipping  # pylint: disable=g-import-not-at-top
  s = schema(config)
  k = s.max_participations_in(config.total_rounds)
  adaptive = adaptive_clipping.AdaptiveClipping(
      config.target_quantile, config.initial_clip_norm, config.clip_learning_rate,
      config.clipped_count_stddev).checked(config.clients_per_round)
  sigma_b = adaptive.clipped_count_stddev
  try:
    sens = accounting.sensitivity_report(c, s)["value"]
    if config.target_epsilon is not None:
      total = accounting.calibrate_noise_multiplier(config.target_epsilon, config.delta,
                                                    config.accountant)
      z = adaptive_clipping.value_noise_multiplier(total, sens, sigma_b, k)
    else:
      z = float(config.noise_multiplier)
    plain = _unamplified(config, c, z)
    total = adaptive_clipping.combined_noise_multiplier(z, sens, sigma_b, k)
    eps = math.inf if total == 0.0 else accounting.epsilon(total, config.delta,
                                                           config.accountant)
  except ValueError as e:
    raise TrainingError(f"privacy accounting: {' '.join(str(e).split())}") from None
  record = dict(plain, epsilon=eps, analysis="adaptive", noise_multiplier=z,
                effective_noise_multiplier=total, count_participations=k,
                clipped_count_stddev=sigma_b)
  record.update(candidates=[_candidate(record)], analysis_label=ANALYSIS_LABELS["adaptive"],
                notes=["adaptive clipping: the count queries are accounted without "
                       "amplification"] if amplified(config) else [])
  if config.target_epsilon is not None:
    record["target_epsilon"] = float(config.target_epsilon)
    if not eps <= config.target_epsilon:
      raise TrainingError(f"calibration gave epsilon {eps} above the target "
                          f"{config.target_epsilon}")
  return z, record


# ----------------------------------------------------------------------------- ε per round


# Rounds at which the per-round ε is evaluated, at most (the others take the next evaluated
# round's value, a valid and non-decreasing upper bound): keeps long runs cheap.
MAX_EPSILON_POINTS = 64


def released_rows(c: np.ndarray, rounds: int) -> np.ndarray:
  """The rows of C released after ``rounds`` rounds, all n columns kept.

  Row i of a square (lower-triangular) C is released in round i; a C with more rows than
  rounds (TFF's tree, C_T/√levels) has its rows in release order, each released in the
  round of its last non-zero column (``tff_mf.mmcc.release_rounds``). Taken no earlier
  than any later column it touches, so the rows kept depend only on rounds 1..``rounds``.
  """
  m, n = c.shape
  nonzero = c != 0
  last = np.where(nonzero.any(axis=1), n - 1 - np.argmax(nonzero[:, ::-1], axis=1), -1)
  release = np.maximum(last, np.arange(m)) if m == n else np.maximum.accumulate(last)
  return c[release < rounds]


def prefix_encoder(c: np.ndarray, schema_n, rounds: int):
  """(C', schema'): what the first ``rounds`` rounds release, and the schema it is under.

  A square C under min_sep: the leading block C[:r, :r] under the same min_sep schema on
  r rounds (single when b > r), which is the n-round schema restricted to the first r
  rounds, and keeps C's structure (e.g. Toeplitz) for a fast exact sensitivity. Otherwise
  ``released_rows`` under the n-round schema: those rows have no column beyond round r.
  """
  from tff_mf import participation  # pylint: disable=g-import-not-at-top
  m, n = c.shape
  if m == n and schema_n.kind == "min_sep" and not np.any(np.triu(c, 1)):
    if schema_n.min_sep > rounds:
      return c[:rounds, :rounds], participation.SINGLE
    return c[:rounds, :rounds], schema_n
  return released_rows(c, rounds), schema_n


def _evaluated_rounds(n: int) -> List[int]:
  return sorted(set(np.ceil(np.linspace(1, n, min(n, MAX_EPSILON_POINTS))).astype(int).tolist())
                | {n})


def epsilon_per_round(config: TrainingConfig, c: np.ndarray, z: float,
                      record: Dict[str, Any]) -> List[float]:
  """ε spent after rounds 1..n: upper bounds, non-decreasing, the last one ``record``'s ε.

  After r rounds the run has released the rows of C of rounds ≤ r (``prefix_encoder``): the
  Gaussian mechanism at z / sens_r, sens_r the sensitivity of those rows under the
  schema (its patterns restricted to rounds ≤ r, since the rows have zero columns
  beyond), by the run's accountant; with adaptive clipping composed with the count
  queries (all k of them: an upper bound). ε after r rounds is at most ε after any later
  round (the earlier release is a post-processing of the later one), so each value is
  the smallest of these bounds from r on, and the last is the run's reported ε (amplified
  where the run is). Computed once, before round 1, at ≤ ``MAX_EPSILON_POINTS`` rounds.
  """
  from tff_mf import accounting  # pylint: disable=g-import-not-at-top
  n = config.total_rounds
  final = float(record["epsilon"])
  s = schema(config)
  bounds = {}
  for r in _evaluated_rounds(n)[:-1]:
    rows, schema_r = prefix_encoder(c, s, r)
    if not np.any(rows):
      bounds[r] = 0.0
      continue
    sens = accounting.sensitivity_report(rows, schema_r)["value"]
    bounds[r] = _epsilon_at(config, z, sens, record)
  bounds[n] = final
  out, best = [0.0] * n, final
  for r in range(n, 0, -1):
    best = min(best, bounds.get(r, best))
    out[r - 1] = best
  return out


def _epsilon_at(config: TrainingConfig, z: float, sens: float, record: Dict[str, Any]) -> float:
  """ε of the released prefix with sensitivity ``sens`` (the run's analysis, unamplified)."""
  from tff_mf import accounting  # pylint: disable=g-import-not-at-top
  if record.get("analysis") == "adaptive":
    from tff_mf import adaptive_clipping  # pylint: disable=g-import-not-at-top
    total = adaptive_clipping.combined_noise_multiplier(
        z, sens, record["clipped_count_stddev"], record["count_participations"])
    return math.inf if total == 0.0 else accounting.epsilon(total, config.delta,
                                                            config.accountant)
  return accounting.epsilon(z, config.delta, config.accountant, sensitivity=sens)


# ----------------------------------------------------------------------------- statement


def run_statement(config: TrainingConfig, record: Optional[Dict[str, Any]],
                  epsilon: Optional[float], reason: Optional[str],
                  participation: Dict[str, Any], seed_source: str) -> Dict[str, Any]:
  """The run's privacy statement (``tff_mf.statement``) for summary.json and stdout."""
  from tff_mf import statement  # pylint: disable=g-import-not-at-top
  from training import outputs  # pylint: disable=g-import-not-at-top
  if record is None:
    return statement.no_privacy_statement(f"--mechanism={config.mechanism} adds no noise")
  return statement.privacy_statement(
      dict(record, epsilon=epsilon), schema=participation["schema"],
      observed=participation["observed"],
      sampling_prob=config.sampling_prob if config.participation == "min_sep" else None,
      noise_seed_source=seed_source, epsilon_reason=reason,
      nonprivate_metrics=outputs.NONPRIVATE_TRAIN_KEYS if config.report_train_metrics else ())


def without_epsilons(value, key: str = ""):
  """``value`` with every ε in it (but the target) set to None: for a run that broke its schema."""
  if isinstance(value, dict):
    return {k: without_epsilons(v, k) for k, v in value.items()}
  if isinstance(value, list):
    return [without_epsilons(v, key) for v in value]
  if "epsilon" in key and key != "target_epsilon" and (
      isinstance(value, (int, float)) or value in ("inf", "-inf")):
    return None
  return value


def check_against_mechanism(z: float, record: Dict[str, Any], info: Dict[str, Any]) -> None:
  """The aggregator's z / sens (from its own C and schema) equals the accountant's."""
  mechanism_value = info.get("effective_noise_multiplier_value",
                             info.get("effective_noise_multiplier"))
  if mechanism_value is None:
    return
  accountant_value = z / record.get("unamplified_sensitivity", record["sensitivity"])
  if not math.isclose(mechanism_value, accountant_value, rel_tol=SENSITIVITY_RTOL):
    raise TrainingError(
        f"the aggregator adds noise for z / sensitivity = {mechanism_value:.12g}, the accountant "
        f"computed {accountant_value:.12g}; refusing to report an epsilon for another C")


# ----------------------------------------------------------------------------- DpEvents


# DpEvents are stored in dp_accounting's own named-tuple form (``DpEvent.to_named_tuple``,
# ``DpEvent.from_named_tuple``) as JSON objects; only classes of this module are rebuilt.
DP_EVENT_MODULE = "dp_accounting.dp_event"


def event_to_json(event) -> Dict[str, Any]:
  """A dp_accounting DpEvent as JSON: the fields of its ``to_named_tuple`` (an event that has
  no named-tuple form, or is not a DpEvent, becomes UnsupportedDpEvent)."""
  import dp_accounting  # pylint: disable=g-import-not-at-top
  if isinstance(event, dp_accounting.DpEvent):
    try:
      return _tuple_to_json(event.to_named_tuple())
    except (TypeError, ValueError):
      pass
  return _tuple_to_json(dp_accounting.UnsupportedDpEvent().to_named_tuple())


def _tuple_to_json(value):
  if hasattr(value, "_fields"):
    return {k: _tuple_to_json(getattr(value, k)) for k in value._fields}
  if isinstance(value, (list, tuple)):
    return [_tuple_to_json(v) for v in value]
  if isinstance(value, bytes):
    return value.decode()
  if isinstance(value, (np.ndarray, np.generic)):
    return value.item()
  return value


def event_from_json(value: Dict[str, Any]):
  """The DpEvent ``event_to_json`` wrote (``DpEvent.from_named_tuple``); lines written before
  the named-tuple form ({"type": class name, fields...}) are read too; anything else, or a
  class outside dp_accounting.dp_event, is UnsupportedDpEvent."""
  import dp_accounting  # pylint: disable=g-import-not-at-top
  try:
    return dp_accounting.DpEvent.from_named_tuple(_json_to_tuple(value))
  except (AttributeError, KeyError, TypeError, ValueError):
    return dp_accounting.UnsupportedDpEvent()


def _json_to_tuple(value):
  if isinstance(value, list):
    return [_json_to_tuple(v) for v in value]
  if not isinstance(value, dict):
    return value
  if "class_name" not in value and "type" in value:  # the format before the named-tuple form
    value = dict({k: v for k, v in value.items() if k not in ("type", "was")},
                 module_name=DP_EVENT_MODULE, class_name=value["type"])
  if value.get("module_name") != DP_EVENT_MODULE:
    raise ValueError(f"not a dp_accounting DpEvent: {value!r}")
  fields = {k: _json_to_tuple(v) for k, v in value.items()}
  return collections.namedtuple("DpEventNamedTuple", sorted(fields))(**fields)


def round_event(aggregator_state) -> Optional[Dict[str, Any]]:
  """The JSON DpEvent a DP aggregator reported for its last round (None: it has none)."""
  from tff_mf.tf import aggregators  # pylint: disable=g-import-not-at-top
  try:
    return event_to_json(aggregators.dp_event_from_state(aggregator_state))
  except (AttributeError, KeyError, TypeError, ValueError):
    return None


# The first line of dp_events.jsonl: what its lines mean (readers skip it: it has no "round").
EVENTS_HEADER = {"dp_events": (
    "one JSON line per round after this one: {round, event}; event is the DpEvent the "
    "aggregator reported for that round, in dp_accounting's DpEvent.to_named_tuple form "
    "(module_name, class_name, then its fields), or null when it reported none. A tff-mf "
    "matrix mechanism accounts for the whole run in round 1: PoissonSampledDpEvent with "
    "sampling_probability 1.0 around GaussianDpEvent(z/sens), the one Gaussian mechanism the "
    "run is; in rounds 2..n the same event has sampling_probability 0.0, i.e. no further "
    "privacy loss (the probability is a field, not a different event, because TFF fixes the "
    "event's type). With adaptive clipping each round holds two such events, the second for "
    "the count queries. TFF's gaussian reports GaussianDpEvent(z) every round (composing "
    "them over-counts: an upper bound); TFF's tree reports UnsupportedDpEvent. Amplification "
    "by sampling is never in these events: summary.json's privacy block reports it.")}


class EventLedger:
  """``<run dir>/dp_events.jsonl``: a header line (``EVENTS_HEADER``), then one line per
  round, kept up to the resumed round."""

  def __init__(self, run_dir: str, resume_round: int):
    self.path = os.path.join(run_dir, EVENTS_FILE)
    kept = []
    if resume_round > 0 and os.path.exists(self.path):
      kept = [json.dumps(line, sort_keys=True) + "\n" for line in read_event_lines(self.path)
              if line["round"] <= resume_round]
    with open(self.path, "w", encoding="utf-8") as f:
      f.write(json.dumps(EVENTS_HEADER, sort_keys=True) + "\n")
      f.writelines(kept)

  def write(self, round_num: int, event: Optional[Dict[str, Any]]) -> None:
    with open(self.path, "a", encoding="utf-8") as f:
      f.write(json.dumps({"round": int(round_num), "event": event}, sort_keys=True) + "\n")

  def events(self) -> List[Optional[Dict[str, Any]]]:
    return [line["event"] for line in read_event_lines(self.path)]


def read_event_lines(path: str) -> List[Dict[str, Any]]:
  """The round lines of a dp_events.jsonl ({round, event}), without its header line."""
  with open(path, encoding="utf-8") as f:
    lines = [json.loads(line) for line in f if line.strip()]
  return [line for line in lines if "round" in line]


def dp_event_epsilon(events: Sequence[Optional[Dict[str, Any]]], delta: float,
                     rounds: int) -> Dict[str, Any]:
  """ε of the composed per-round DpEvents (dp_accounting PLD), or None with the reason."""
  out: Dict[str, Any] = {"accountant": "pld (dp_accounting)", "events": len(events)}
  if len(events) != rounds or any(e is None for e in events):
    return dict(out, epsilon=None, reason="not every round reported a DpEvent")
  if any("Unsupported" in json.dumps(e) for e in events):
    return dict(out, epsilon=None, reason="the aggregator reports UnsupportedDpEvent")
  import dp_accounting  # pylint: disable=g-import-not-at-top
  counts = collections.Counter(json.dumps(e, sort_keys=True) for e in events)
  composed = dp_accounting.ComposedDpEvent([
      dp_accounting.SelfComposedDpEvent(event_from_json(json.loads(k)), count)
      for k, count in sorted(counts.items())])
  accountant = dp_accounting.pld.PLDAccountant()
  accountant.compose(composed)
  with np.errstate(all="ignore"):
    eps = float(accountant.get_epsilon(delta))
  return dict(out, epsilon=eps, distinct_events=len(counts))
