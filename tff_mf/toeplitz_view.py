"""The n x n lower-triangular Toeplitz matrix as a read-only view of 2n − 1 floats (numpy core).

T(c), C[i, j] = c_{i−j} for i ≥ j and 0 above the diagonal, is every entry of the buffer
[0, …, 0, c_0, …, c_{n−1}] (n − 1 zeros) read with row stride +1 and column stride −1:
``view(c)`` is a genuine ``np.ndarray`` of shape (n, n) that holds O(n) memory. Every numpy
operation on it is correct (it reads the same numbers a dense T(c) holds), and code that
knows the structure asks ``column_of(x)`` for c and works in O(n) instead.

``column_of`` recognizes a view by its memory layout alone (shape (n, n), strides (8, −8),
its data pointer at entry n − 1 of a buffer this module made and registered, read-only), so
no flag can go stale: an array with that layout over that buffer is T(c) by construction.
"""

from __future__ import annotations

import weakref
from typing import Optional

import numpy as np

_ITEM = np.dtype(np.float64).itemsize
# Buffers made by ``view`` (id -> buffer), kept only while some view is alive.
_BUFFERS: "weakref.WeakValueDictionary[int, np.ndarray]" = weakref.WeakValueDictionary()


def view(column) -> np.ndarray:
  """T(column) as a read-only (n, n) float64 view of 2n − 1 floats."""
  column = np.asarray(column, dtype=np.float64).reshape(-1)
  n = column.shape[0]
  buffer = np.concatenate([np.zeros(n - 1), column])
  buffer.setflags(write=False)
  _BUFFERS[id(buffer)] = buffer
  return np.lib.stride_tricks.as_strided(buffer[n - 1:], shape=(n, n),
                                         strides=(_ITEM, -_ITEM), writeable=False)


def _root(x) -> object:
  while getattr(x, "base", None) is not None:
    x = x.base
  return x


def column_of(x) -> Optional[np.ndarray]:
  """c when ``x`` is a ``view(c)`` (or an array with exactly its layout over its buffer),
  else None. The returned column is read-only."""
  if not isinstance(x, np.ndarray) or x.ndim != 2 or x.dtype != np.float64:
    return None
  n = x.shape[0]
  if x.shape != (n, n) or x.strides != (_ITEM, -_ITEM):
    return None
  root = _root(x)
  buffer = _BUFFERS.get(id(root))
  if buffer is not root or buffer.shape != (2 * n - 1,) or buffer.flags.writeable:
    return None
  if x.__array_interface__["data"][0] != buffer.__array_interface__["data"][0] + _ITEM * (n - 1):
    return None
  return buffer[n - 1:]
