"""What the accounting derives from one encoder C, computed once where C is fixed (numpy core).

A calibration evaluates one C at many noise multipliers, and a run's privacy record several
analyses of it; each evaluation would otherwise check C again and recompute its band count,
γ(C) and its sensitivity with every eligible round joined (O(n²) each at n = 2048, about the
cost of one PLD). ``same_encoder(c)`` marks a block in which ``c`` does not change;
``derived(c, key, compute)`` computes once per block what depends on ``c`` alone.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Dict, Optional

import numpy as np


class _Encoder(threading.local):
  """The encoder of the innermost ``same_encoder`` block of this thread, and what was
  derived from it there."""
  c: Optional[np.ndarray] = None
  facts: Optional[Dict[Any, Any]] = None


_ENCODER = _Encoder()


@contextlib.contextmanager
def same_encoder(c: Optional[np.ndarray]):
  """Within the block, what the accounting derives from the array ``c`` itself (its checks,
  band count, γ, the sensitivity with every eligible round joined, random allocation's Gram
  summary: ``derived``) is computed once: a calibration evaluates one C at many z, and a
  run's record several analyses of it. The array must not change inside the block (nothing
  in the library writes an encoder)."""
  outer = (_ENCODER.c, _ENCODER.facts)
  if c is not None and c is not _ENCODER.c:
    _ENCODER.c, _ENCODER.facts = c, {}
  try:
    yield
  finally:
    _ENCODER.c, _ENCODER.facts = outer


def derived(c, key, compute: Callable[[], Any]) -> Any:
  """``compute()``, once per ``same_encoder`` block when ``c`` is its encoder."""
  if c is None or c is not _ENCODER.c:
    return compute()
  if key not in _ENCODER.facts:
    _ENCODER.facts[key] = compute()
  return _ENCODER.facts[key]
