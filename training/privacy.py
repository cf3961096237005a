"""A run's ε as the rounds go, its privacy statement, and the DpEvent ledger.

The run's ε is decided by the library, once, for the encoder it built
(``tff_mf.mechanisms.run_privacy``, read through ``training.run_setup.resolve_privacy``):
every number is an upper bound on the run's ε at δ. This module adds what only a run has:

- the run's privacy statement (``tff_mf.accounting.statement``);
- the DpEvents the aggregators report each round: :class:`EventLedger` keeps them
  (``dp_events.jsonl``) and :func:`dp_event_epsilon` composes them with dp_accounting's
  PLD accountant, a cross-check of the unamplified guarantee recorded beside ε.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from training.config import TrainingConfig

EVENTS_FILE = "dp_events.jsonl"


def sampling_secret(config: TrainingConfig, noise_seed: Optional[int]) -> int:
  """The secret seed of min_sep's Poisson coins, balls_in_bins' bins and random_allocation's
  rounds (-1 for the others).

  Derived from a pinned ``--noise_seed`` (so pinning it pins the whole run), else fresh
  from OS entropy. Kept only in the checkpoints, like the noise seed.
  """
  if not config.participation_kind.secret_sampling:
    return -1
  from tff_mf import checks  # pylint: disable=g-import-not-at-top
  if config.noise_seed is None and noise_seed is None:
    return checks.new_seed()
  seed = int(config.noise_seed if config.noise_seed is not None else noise_seed)
  digest = hashlib.sha256(f"tff_mf {config.participation} sampling {seed}".encode()).digest()
  return int.from_bytes(digest[:8], "little") >> 1


# ----------------------------------------------------------------------------- statement


def run_statement(config: TrainingConfig, record: Optional[Dict[str, Any]],
                  epsilon: Optional[float], reason: Optional[str],
                  participation: Dict[str, Any], seed_source: str,
                  nonprivate_metrics: Sequence[str] = (),
                  mechanism_info: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
  """The run's privacy statement (``tff_mf.accounting.statement``) for summary.json and stdout;
  ``nonprivate_metrics``: those released over the whole run (named as not covered);
  ``mechanism_info``: the aggregator's description (the discrete Gaussian's γ, σ and
  rounding share, fixed once TFF knew the model size, are named in the statement)."""
  from tff_mf.accounting import statement  # pylint: disable=g-import-not-at-top
  if record is None:
    return statement.no_privacy_statement(f"--mechanism={config.mechanism} adds no noise")
  record = dict(record, epsilon=epsilon)
  info = mechanism_info or {}
  if record.get("noise_distribution") == "discrete_gaussian" and "granularity" in info:
    record.update(granularity=info["granularity"],
                  discrete_gaussian_sigma=info["discrete_gaussian_sigma"],
                  rounding_share=info["rounding_inflation"])
  return statement.privacy_statement(
      record, schema=participation["schema"], setup=statement_setup(config),
      observed=participation["observed"],
      sampling_prob=config.sampling_prob if config.participation_kind.poisson else None,
      noise_seed_source=seed_source, epsilon_reason=reason,
      nonprivate_metrics=tuple(nonprivate_metrics))


def statement_setup(config: TrainingConfig) -> Dict[str, Any]:
  """What the run's privacy statement names beside ε (``tff_mf.accounting.statement.setup_words``)."""
  from tff_mf import registry  # pylint: disable=g-import-not-at-top
  mechanism = config.canonical_mechanism
  out: Dict[str, Any] = {"mechanism": mechanism, "label": registry.label(mechanism),
                         "rounds": config.total_rounds,
                         "clients_per_round": config.clients_per_round,
                         "clip_norm": config.clip_norm}
  if config.clip_norm == "adaptive":
    out["adaptive_clipping"] = {k: getattr(config, k) for k in (
        "target_quantile", "initial_clip_norm", "clip_learning_rate", "clipped_count_stddev")}
  return out


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
