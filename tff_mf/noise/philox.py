"""TensorFlow's stateless Philox normals in numpy: the Z rows of the TF aggregator, TF-free.

``standard_normal_row(seed, row, shapes)`` returns what ``tff_mf.tf.noise.standard_normal_row``
draws for the same int64 seed pair, row and variable shapes: ``stateless_fold_in`` by row,
then by variable index, then ``stateless_normal`` (float32). The generator is Philox-4x32-10
(Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3", SC'11, Fig. 2 and
Table 2); a seed pair becomes a key and counter by one Philox call on the seed words, as
TensorFlow's stateless kernels do, and two 23-bit uniforms become two normals by the
Box–Muller transform (Box & Muller 1958) with TensorFlow's rounding: u₁ clamped to 1e-7,
v = float32(2π·u₂) formed in double, the log, square root and sine/cosine rounded to
float32. numpy's Philox (``np.random.Philox``) is Philox-4x64, a different generator.

The integer part is exact. By default the transcendental functions are evaluated in
float64 and rounded once to float32 (correctly rounded nearly always); the C library that
TensorFlow calls (logf, sincosf) is within one float32 ulp of the true value, so a normal
differs from TensorFlow's by at most 3 float32 ulps (measured: at most 3, about 1.4% of
values not bit-identical). ``exact=True`` calls the process's C library (logf, and sincosf
on Linux, sinf and cosf elsewhere, as TensorFlow's Box–Muller does) for every value: the
normals are then TensorFlow's bit for bit on the same machine, at about 3 µs per value.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math
import sys
from typing import Callable, List, Sequence, Tuple

import numpy as np

from tff_mf import checks

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_MASK32 = np.uint64(0xFFFFFFFF)
_SCRAMBLE_KEY = (0x3EC8F720, 0x02461E29)
_ROUNDS = 10


def philox4x32(counters: np.ndarray, key: Tuple[int, int]) -> np.ndarray:
  """Philox-4x32-10 of ``counters`` (uint64 array [g, 4] of 32-bit words) under ``key``
  (two 32-bit words): uint64 [g, 4] holding the 32-bit outputs."""
  c = [counters[:, j].astype(np.uint64) for j in range(4)]
  k0, k1 = np.uint64(key[0]), np.uint64(key[1])
  for r in range(_ROUNDS):
    p0 = _M0 * c[0]
    p1 = _M1 * c[2]
    c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & _MASK32,
         (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & _MASK32]
    if r < _ROUNDS - 1:
      k0 = np.uint64((int(k0) + _W0) & 0xFFFFFFFF)
      k1 = np.uint64((int(k1) + _W1) & 0xFFFFFFFF)
  return np.stack(c, axis=1)


def _words(value: int) -> Tuple[int, int]:
  value &= 0xFFFFFFFFFFFFFFFF
  return value & 0xFFFFFFFF, value >> 32


def key_counter(seed: Sequence[int]) -> Tuple[Tuple[int, int], Tuple[int, int, int, int]]:
  """(key, counter) of a seed pair (each word taken as a signed 64-bit integer): one Philox
  call on the seed words under a fixed key, as TensorFlow's stateless kernels scramble it."""
  s0, s1 = (int(s) for s in seed)
  counter = np.array([[*_words(s0), *_words(s1)]], np.uint64)
  mix = [int(x) for x in philox4x32(counter, _SCRAMBLE_KEY)[0]]
  return (mix[0], mix[1]), (0, 0, mix[2], mix[3])


def _stream(seed: Sequence[int], groups: int) -> np.ndarray:
  """The first ``groups`` Philox outputs of a seed's stream: uint64 [groups, 4]."""
  key, counter = key_counter(seed)
  low = counter[0] | (counter[1] << 32)
  high = counter[2] | (counter[3] << 32)
  idx = [low + g for g in range(groups)] if groups <= 4 else None
  if idx is None:
    steps = np.arange(groups, dtype=np.uint64)
    lo = np.uint64(low) + steps  # wraps modulo 2⁶⁴; the carry goes into the high word
    carry = (lo < steps).astype(np.uint64)
    hi = np.uint64(high) + carry
  else:
    lo = np.array([v & 0xFFFFFFFFFFFFFFFF for v in idx], np.uint64)
    hi = np.array([high + (v >> 64) for v in idx], np.uint64)
  counters = np.stack([lo & _MASK32, lo >> np.uint64(32), hi & _MASK32, hi >> np.uint64(32)],
                      axis=1)
  return philox4x32(counters, key)


def _signed(value: int, bits: int) -> int:
  return value - (1 << bits) if value >> (bits - 1) else value


def fold_in(seed: Sequence[int], data: int, bits: int = 64) -> Tuple[int, int]:
  """``tf.random.experimental.stateless_fold_in(seed, data)`` for ``data`` of ``bits``-bit
  integer dtype: (a full-range integer drawn from ``seed``, ``data``). A Python int is int32
  to TensorFlow; a seed of int32 words is widened with its sign."""
  x = [int(v) for v in _stream(seed, 1)[0]]
  drawn = x[0] | (x[1] << 32) if bits == 64 else x[0]
  return _signed(drawn, bits), int(data)


def _unit_floats(words: np.ndarray) -> np.ndarray:
  """23 random bits as a float32 in [0, 1): (1.m) − 1."""
  bits = (words.astype(np.uint32) & np.uint32(0x7FFFFF)) | np.uint32(127 << 23)
  return bits.view(np.float32) - np.float32(1.0)


@functools.lru_cache(maxsize=1)
def _libm() -> Tuple[Callable[[float], float], Callable[[float], Tuple[float, float]]]:
  """The C library's float32 logf and sin/cos pair (ctypes), as TensorFlow's kernels call
  them: sincosf on Linux, sinf and cosf elsewhere."""
  name = ctypes.util.find_library("m") or ("libm.so.6" if sys.platform.startswith("linux")
                                            else None)
  try:
    lib = ctypes.CDLL(name)
  except OSError as e:
    raise checks.CheckError(f"exact noise needs the C math library (libm), which could not "
                            f"be loaded here ({e}); use exact=False") from None
  logf = lib.logf
  logf.restype, logf.argtypes = ctypes.c_float, [ctypes.c_float]
  if sys.platform.startswith("linux"):
    sincosf = lib.sincosf
    sincosf.restype = None
    sincosf.argtypes = [ctypes.c_float, ctypes.POINTER(ctypes.c_float),
                        ctypes.POINTER(ctypes.c_float)]
    s, c = ctypes.c_float(), ctypes.c_float()
    ps, pc = ctypes.byref(s), ctypes.byref(c)

    def sin_cos(x: float) -> Tuple[float, float]:
      sincosf(x, ps, pc)
      return s.value, c.value
  else:
    sinf, cosf = lib.sinf, lib.cosf
    for fn in (sinf, cosf):
      fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float]

    def sin_cos(x: float) -> Tuple[float, float]:
      return sinf(x), cosf(x)
  return logf, sin_cos


def _log_sin_cos(u1: np.ndarray, v: np.ndarray, exact: bool):
  """float32 log(u1), sin(v), cos(v): from float64 rounded once, or the C library's."""
  if not exact:
    v64 = v.astype(np.float64)
    return (np.log(u1.astype(np.float64)).astype(np.float32),
            np.sin(v64).astype(np.float32), np.cos(v64).astype(np.float32))
  logf, sin_cos = _libm()
  log_u1 = np.fromiter(map(logf, u1.tolist()), np.float32, u1.size)
  pairs = np.array([sin_cos(x) for x in v.tolist()], np.float32).reshape(-1, 2)
  return log_u1, pairs[:, 0], pairs[:, 1]


def standard_normal(seed: Sequence[int], size: int, exact: bool = False) -> np.ndarray:
  """``tf.random.stateless_normal([size], seed, float32, alg=PHILOX)`` (float32); bit for
  bit with ``exact`` (see the module's docstring)."""
  groups = -(-int(size) // 4)
  words = _stream(seed, groups).reshape(-1, 2)  # Box–Muller pairs, in output order
  u1 = np.maximum(_unit_floats(words[:, 0]), np.float32(1e-7))
  v = (2.0 * np.pi * _unit_floats(words[:, 1]).astype(np.float64)).astype(np.float32)
  log_u1, sin, cos = _log_sin_cos(u1, v, exact)
  radius = np.sqrt(np.float32(-2.0) * log_u1)  # float32 sqrt: correctly rounded
  out = np.stack([sin * radius, cos * radius], axis=1).reshape(-1)
  return out[:size]


def standard_normal_row(seed: Sequence[int], row: int, shapes: Sequence[Tuple[int, ...]],
                        exact: bool = False) -> List[np.ndarray]:
  """Z̃[row] shaped like ``shapes`` (float32): the TF aggregator's row for the same seed pair
  (``fold_in`` by the int64 row, then by the int32 variable index)."""
  row_seed = fold_in(seed, int(row), bits=64)
  out = []
  for t, shape in enumerate(shapes):
    var_seed = fold_in(row_seed, t, bits=32)
    size = int(np.prod(shape, dtype=np.int64))
    out.append(standard_normal(var_seed, size, exact).reshape(shape))
  return out


def standard_normal_float64(seed: Sequence[int]) -> float:
  """``tf.random.stateless_normal([], seed, float64, alg=PHILOX)``: one Box–Muller pair from
  four words (52-bit uniforms), its first value; ``math`` calls the C library, as TF does."""
  x = [int(v) for v in _stream(seed, 1)[0]]

  def unit(hi: int, lo: int) -> float:
    bits = (1023 << 52) | ((hi & 0xFFFFF) << 32) | lo
    return float(np.array([bits], np.uint64).view(np.float64)[0]) - 1.0

  u1 = max(unit(x[0], x[1]), 1e-7)
  v = 2 * math.pi * unit(x[2], x[3])
  return math.sin(v) * math.sqrt(-2.0 * math.log(u1))
