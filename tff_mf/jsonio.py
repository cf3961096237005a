"""The one JSON policy of tff-mf for every file and line it writes (numpy core, no TensorFlow).

Strict JSON only (no ``Infinity``/``NaN`` constants, which most JSON readers refuse):
numpy scalars and arrays become Python values, +∞/−∞ become the strings ``"inf"`` and
``"-inf"`` (an unbounded ε is an honest answer), and a NaN is refused: it is always a bug
upstream, never a value to store. ``number`` reads the strings back.
"""

from __future__ import annotations

import json
import math
from typing import Any

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
