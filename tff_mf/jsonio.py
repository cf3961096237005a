"""The one JSON policy of tff-mf for every file and line it writes (numpy core, no TensorFlow).

Strict JSON only (no ``Infinity``/``NaN`` constants, which most JSON readers refuse):
numpy scalars and arrays become Python values, +∞/−∞ become the strings ``"inf"`` and
``"-inf"`` (an unbounded ε is an honest answer), and a NaN is refused: it is always a bug
upstream, never a value to store. ``number`` reads the strings back. ``Record`` types a
record of such a file: code reads its fields, its JSON form is written and read at the edge.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Dict, Iterator, Mapping, Tuple

import numpy as np

INFINITIES = {"inf": math.inf, "-inf": -math.inf}


def jsonable(x: Any) -> Any:
  """``x`` as strict-JSON-ready Python values (see the module docstring); NaN raises. A typed
  record with a ``json()`` method (``tff_mf.accounting.Bound``) becomes its JSON form."""
  if callable(getattr(x, "json", None)) and not isinstance(x, (dict, np.ndarray)):
    return jsonable(x.json())
  if isinstance(x, dict):
    return {str(k): jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [jsonable(v) for v in x]
  if isinstance(x, np.ndarray):
    return jsonable(x.tolist())
  if isinstance(x, (bool, np.bool_)):
    return bool(x)
  if isinstance(x, np.integer):
    return int(x)
  if isinstance(x, (float, np.floating)):
    x = float(x)
    if math.isnan(x):
      raise ValueError("internal error: a NaN reached the JSON output")
    if math.isinf(x):
      return "inf" if x > 0 else "-inf"
    return x
  return x


def dumps(x: Any, **kwargs) -> str:
  """``json.dumps`` of ``jsonable(x)``: strict, keys sorted unless told otherwise."""
  kwargs.setdefault("sort_keys", True)
  return json.dumps(jsonable(x), allow_nan=False, **kwargs)


def number(x: Any) -> Any:
  """A value read back: ``"inf"``/``"-inf"`` as floats, everything else unchanged."""
  if isinstance(x, str) and x in INFINITIES:
    return INFINITIES[x]
  return x


@dataclasses.dataclass(frozen=True, eq=False)
class Record(Mapping[str, Any]):
  """A record of a JSON file, typed: subclasses are frozen dataclasses (``eq=False``) whose
  fields are the keys code reads, each defaulting to None; the JSON form is only at the edge
  (``tff_mf.accounting.Bound`` is the privacy bound's own, with its nested candidates).

  ``of_json`` reads a record (a dict as written, or a record, returned as it is): its keys
  named by fields become them, every other key is kept in ``rest``, and ``order`` keeps the
  keys in the order written, so ``json()`` writes back exactly what was read (a key absent
  stays absent, a null stays null) and a file written before a field was typed reads the
  same. ``replace`` returns the record with keys set (new ones last). Read access by key
  (``record["epsilon"]``) reads the JSON form, for code written against the dicts; code in
  tff-mf reads the typed fields (``tests/test_run_core_counts``).
  """
  rest: Mapping[str, Any] = dataclasses.field(default_factory=dict, repr=False)
  order: Tuple[str, ...] = dataclasses.field(default=(), repr=False)

  @classmethod
  def of_json(cls, record: Mapping[str, Any]):
    """The record ``record`` (its JSON form) describes."""
    if isinstance(record, cls):
      return record
    if not isinstance(record, Mapping):
      raise TypeError(f"a {cls.__name__} is a JSON object, not {type(record).__name__}")
    names = cls._names()
    typed = {k: v for k, v in record.items() if k in names}
    return cls(**typed, rest={k: v for k, v in record.items() if k not in names},
               order=tuple(record))

  @classmethod
  def _names(cls) -> Tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.name not in ("rest", "order"))

  def replace(self, **keys: Any):
    """This record with ``keys`` set (typed or not); keys it did not have go last."""
    return type(self).of_json(dict(self.json(), **keys))

  def json(self) -> Dict[str, Any]:
    """The JSON form, key for key as read (typed records inside as their JSON forms)."""
    names = self._names()
    return {k: _json_form(getattr(self, k) if k in names else self.rest[k])
            for k in self.order}

  def __getitem__(self, key: str) -> Any:
    if key not in self.order:
      raise KeyError(key)
    return self.json()[key]

  def __iter__(self) -> Iterator[str]:
    return iter(self.order)

  def __len__(self) -> int:
    return len(self.order)

  def __eq__(self, other: Any) -> bool:
    if isinstance(other, Mapping):
      return self.json() == dict(other)
    return NotImplemented

  __hash__ = None  # type: ignore[assignment]  # its fields hold dicts


def _json_form(value: Any) -> Any:
  if isinstance(value, Record):
    return value.json()
  if isinstance(value, (list, tuple)):
    return [_json_form(v) for v in value]
  return value
