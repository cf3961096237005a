"""An analysis's bound on ε at δ, typed: one frozen dataclass, its JSON form at the edge.

``tff_mf.accounting.epsilon_for`` and ``calibrate`` return a ``Bound``; a run's privacy record
(``tff_mf.mechanisms.PrivacyRecord.details``) is one too, its ``candidates`` the bounds it chose
from. Code reads the typed fields (``bound.epsilon``, ``bound.analysis``); an analysis's own
fields (its theorem, its PLD's grid, MMCC's rows) stay in ``rest``, which only the analysis
that wrote them describes. ``json()`` is the form written to files and printed; ``of_json``
reads it back (a record written before this type existed reads the same). Read access by key
(``bound["epsilon"]``) reads the JSON form, for code written against the dicts these functions
returned before; nothing in tff-mf reads a bound that way (``tests/test_run_core_counts``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Iterator, Mapping, Optional, Tuple

# The typed fields, in the order a record has always been written.
_TYPED = ("noise_multiplier", "delta", "analysis", "sampling_prob", "min_sep", "sensitivity",
          "sensitivity_exact", "sensitivity_method", "unamplified_epsilon", "exact",
          "accountant", "amplified_epsilon", "bound", "epsilon", "failure_probability",
          "epsilon_label", "target_epsilon", "tolerance", "evaluations", "candidates",
          "notes", "analysis_label")


@dataclasses.dataclass(frozen=True)
class Bound(Mapping[str, Any]):
  """An upper bound on a run's ε at δ, from one analysis (``tff_mf.accounting.analyses``).

  Attributes:
    epsilon: the reported upper bound (the smaller of ``amplified_epsilon`` and
      ``unamplified_epsilon`` for an amplified analysis; the smallest of ``candidates`` for a
      run's record); None only in a run record without δ.
    noise_multiplier, delta: z and δ.
    analysis: the analysis's registered name (``analyses.REGISTRY``).
    accountant: the accountant of the ε reported ("exact", "pld", "rdp", "mmcc", ...).
    sensitivity, sensitivity_exact, sensitivity_method: C's sensitivity under the schema,
      whether it is exact, and how it was computed.
    exact: ε is the run's exact ε (unamplified, exact accountant, exact sensitivity).
    bound: for an amplified analysis, which of its two valid bounds is reported
      ("amplified" or "unamplified"); else None.
    amplified_epsilon, unamplified_epsilon: an amplified analysis's two bounds.
    sampling_prob, min_sep: the amplified analyses' sampling (p per eligible round, b).
    failure_probability, epsilon_label: β of an ε that holds with probability ≥ 1 − β over
      the accountant's own sampling (Monte Carlo), and its words; else None.
    target_epsilon, tolerance, evaluations: a calibration's target, relative tolerance on z
      and the ε evaluations it took; else None.
    candidates: a run record's bounds it chose the smallest of (each a ``Bound``).
    notes: why an analysis was not applied, in words.
    analysis_label: a run record's analysis in words.
    rest: the analysis's own fields (JSON-ready), in the order written.
  """
  noise_multiplier: Optional[float] = None
  delta: Optional[float] = None
  analysis: Optional[str] = None
  sampling_prob: Optional[float] = None
  min_sep: Optional[int] = None
  sensitivity: Optional[float] = None
  sensitivity_exact: Optional[bool] = None
  sensitivity_method: Optional[str] = None
  unamplified_epsilon: Optional[float] = None
  exact: Optional[bool] = None
  accountant: Optional[str] = None
  amplified_epsilon: Optional[float] = None
  bound: Optional[str] = None
  epsilon: Optional[float] = None
  failure_probability: Optional[float] = None
  epsilon_label: Optional[str] = None
  target_epsilon: Optional[float] = None
  tolerance: Optional[float] = None
  evaluations: Optional[int] = None
  candidates: Tuple["Bound", ...] = ()
  notes: Optional[Tuple[str, ...]] = None
  analysis_label: Optional[str] = None
  rest: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  order: Tuple[str, ...] = dataclasses.field(default=(), repr=False, compare=False)

  @classmethod
  def of_json(cls, record: Mapping[str, Any]) -> "Bound":
    """The bound a JSON-form record describes (a ``Bound`` is returned as it is)."""
    if isinstance(record, Bound):
      return record
    typed = {k: record[k] for k in _TYPED if k in record}
    if "candidates" in typed:
      typed["candidates"] = tuple(cls.of_json(c) for c in typed["candidates"] or ())
    if "notes" in typed:
      typed["notes"] = tuple(typed["notes"] or ())
    rest = {k: v for k, v in record.items() if k not in typed}  # a dict: a Bound pickles
    return cls(**typed, rest=rest, order=tuple(record))

  def replace(self, **fields: Any) -> "Bound":
    """This bound with ``fields`` set (typed or the analysis's own); new fields go last."""
    return Bound.of_json(dict(self._items(), **fields))

  def without(self, *keys: str) -> "Bound":
    """This bound without ``keys`` (e.g. MMCC's per-row details, too large for a run record)."""
    return Bound.of_json({k: v for k, v in self._items() if k not in keys})

  def json(self) -> Dict[str, Any]:
    """The JSON-ready form written to files and printed (candidates as their JSON forms)."""
    return {k: ([c.json() for c in v] if k == "candidates" else
                list(v) if k == "notes" else v) for k, v in self._items()}

  def _items(self):
    values = {k: getattr(self, k) for k in _TYPED}
    present = {k: v for k, v in values.items()
               if v is not None and not (k == "candidates" and not v and k not in self.order)}
    present.update(self.rest)
    keys = [k for k in self.order if k in present]
    keys += [k for k in present if k not in keys]
    return [(k, present[k]) for k in keys]

  # Read access by key: the JSON form (see the module docstring).
  def __getitem__(self, key: str) -> Any:
    for k, v in self._items():
      if k == key:
        return [c.json() for c in v] if k == "candidates" else (
            list(v) if k == "notes" else v)
    raise KeyError(key)

  def __iter__(self) -> Iterator[str]:
    return iter([k for k, _ in self._items()])

  def __len__(self) -> int:
    return len(self._items())

  def __eq__(self, other: Any) -> bool:
    if isinstance(other, Bound):
      return self.json() == other.json()
    if isinstance(other, Mapping):
      return self.json() == dict(other)
    return NotImplemented

  __hash__ = None  # type: ignore[assignment]  # its fields hold dicts
