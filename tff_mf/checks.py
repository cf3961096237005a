"""Every input and privacy check of tff-mf, in one place (numpy core, no TensorFlow).

Each check returns the value it accepted, normalized (a float64 array, a Python
float or int), or raises ``CheckError`` with a one-line message that names the
argument and what is wrong. Other modules call these instead of writing their own.

The privacy-relevant checks are here too: that B·C reproduces A entry by entry,
that C is normalized (γ(C) = max column norm = 1, Denisov et al. 2022,
arXiv:2202.08312, App I), that a noise multiplier is positive (zero only with an
explicit opt-in), that a noise seed is a valid integer, and that the dense
matrices a size needs fit in memory before anything is allocated.
"""

from __future__ import annotations

import math
import os
from typing import Optional, Sequence

import numpy as np

from tff_mf import entropy
from tff_mf import toeplitz_view


class CheckError(ValueError):
  """An argument, matrix or file fails a check (the message says which and why).

  ``arguments``: the Python arguments the message names as a remedy; a command line
  spells them as its flags (``tff_mf.clitools.flag_message``).
  """

  def __init__(self, message: str = "", arguments: Sequence[str] = ()):
    super().__init__(message)
    self.arguments = tuple(arguments)


# Starts the message of every check tff-mf runs inside a TensorFlow graph (e.g. a round past
# the n rounds a matrix was built for), so callers can find it inside TF/TFF/gRPC errors.
IN_GRAPH_PREFIX = "tff-mf check failed: "


def closest(word: str, choices: Sequence[str]) -> Optional[str]:
  """The closest valid spelling of ``word`` among ``choices`` (difflib), or None."""
  import difflib  # pylint: disable=g-import-not-at-top
  choices = [str(c) for c in choices]
  key = str(word).replace("-", "_").lower()
  by_key = {c.replace("-", "_").lower(): c for c in choices}
  match = difflib.get_close_matches(key, list(by_key), n=1, cutoff=0.6)
  return by_key[match[0]] if match else None


# ----------------------------------------------------------------------------- numbers


def _is_number(x) -> bool:
  return not isinstance(x, bool) and isinstance(x, (int, float, np.integer, np.floating))


def positive_int(x, name: str) -> int:
  """An integer ≥ 1 (bools and non-integral floats are refused)."""
  if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
    if isinstance(x, (float, np.floating)) and math.isfinite(x) and float(x).is_integer():
      x = int(x)
    else:
      raise CheckError(f"{name} must be a positive integer, got {x!r}")
  if x < 1:
    raise CheckError(f"{name} must be a positive integer, got {x}")
  return int(x)


def nonnegative_int(x, name: str) -> int:
  if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 0:
    raise CheckError(f"{name} must be a non-negative integer, got {x!r}")
  return int(x)


def finite_float(x, name: str) -> float:
  if not _is_number(x) or not math.isfinite(float(x)):
    raise CheckError(f"{name} must be a finite real number, got {x!r}")
  return float(x)


def positive_float(x, name: str) -> float:
  """A finite number > 0."""
  value = finite_float(x, name)
  if value <= 0:
    raise CheckError(f"{name} must be positive, got {value:g}")
  return value


def in_range(x, name: str, low: float, high: float, low_open: bool = False,
             high_open: bool = True) -> float:
  """A finite number in the interval given (closed or open at either end)."""
  value = finite_float(x, name)
  too_low = value <= low if low_open else value < low
  too_high = value >= high if high_open else value > high
  if too_low or too_high:
    interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    raise CheckError(f"{name} must be in {interval}, got {value:g}")
  return value


def probability(p, name: str = "sampling probability") -> float:
  """A probability in (0, 1]."""
  return in_range(p, name, 0.0, 1.0, low_open=True, high_open=False)


DEFAULT_DELTA = 1e-6  # δ of every (ε, δ) guarantee whose δ is not given: one value everywhere


def delta(x, name: str = "delta") -> float:
  """δ of an (ε, δ) guarantee, in (0, 1)."""
  return in_range(x, name, 0.0, 1.0, low_open=True, high_open=True)


def noise_multiplier(z, name: str = "noise_multiplier", allow_zero: bool = False,
                     no_noise_hint: str = "") -> float:
  """z > 0; z = 0 (no noise, ε = ∞) only when the caller passes ``allow_zero=True``.

  ``no_noise_hint``: how the caller's surface runs without noise, if it can (e.g. the
  Python API's ``allow_no_noise=True``, the training binary's ``--mechanism=none``); the
  z = 0 error names it, and nothing where there is no such way.
  """
  value = finite_float(z, name)
  if value < 0 or (value == 0 and not allow_zero):
    hint = "" if value < 0 else (" (z = 0 adds no noise and gives ε = ∞" +
                                 (f"; {no_noise_hint}" if no_noise_hint else "") + ")")
    raise CheckError(f"{name} must be positive, got {value:g}{hint}")
  return value


# The Python API's way to run without noise (build_mechanism, the queries).
PYTHON_NO_NOISE_HINT = "pass allow_no_noise=True to run without privacy"


def seed(x, name: str = "noise_seed") -> int:
  """A pinned noise seed: an integer in [0, 2⁶³)."""
  if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
    raise CheckError(f"{name} must be an integer, got {x!r}")
  if not 0 <= int(x) < 2**63:
    raise CheckError(f"{name} must be in [0, 2**63), got {x}")
  return int(x)


def new_seed(purpose: str = "seed") -> int:
  """A fresh secret int64 seed in [0, 2⁶³): HKDF-SHA256 of OS entropy (``tff_mf.entropy``)."""
  return entropy.new_seed(purpose)


def path_component(x, name: str) -> str:
  """A single path component: non-empty, no separator, not '.' or '..'."""
  if not isinstance(x, str) or not x or x in (".", "..") or "/" in x or os.sep in x \
      or (os.altsep and os.altsep in x) or "\0" in x:
    raise CheckError(f"{name} must be a single directory name (no '/', not '.' or '..'), "
                     f"got {x!r}")
  return x


# ----------------------------------------------------------------------------- memory

# Fraction of physical memory a single job may plan to use for dense matrices.
MEMORY_FRACTION = 0.8
MEMORY_ENV = "TFF_MF_MAX_MEMORY_GB"


def memory_limit_bytes() -> int:
  """``$TFF_MF_MAX_MEMORY_GB`` if set, else 80% of physical memory."""
  env = os.environ.get(MEMORY_ENV)
  if env:
    try:
      return int(float(env) * 2**30)
    except ValueError:
      raise CheckError(f"${MEMORY_ENV} must be a number of GiB, got {env!r}") from None
  try:
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (ValueError, OSError, AttributeError):
    total = 16 * 2**30
  return int(MEMORY_FRACTION * total)


def fits_in_memory(n_bytes: float, what: str) -> None:
  """Refuses, before anything is allocated, a job that would need more than the limit."""
  limit = memory_limit_bytes()
  if n_bytes > limit:
    raise CheckError(f"{what} needs about {_gib(n_bytes)} of memory, more than the "
                     f"{_gib(limit)} allowed (set ${MEMORY_ENV} to change the limit)")


def dense_matrices_fit(n: int, copies: float, what: str, m: Optional[int] = None) -> None:
  """``copies`` float64 matrices of n x m (m = n) fit in memory."""
  m = n if m is None else m
  fits_in_memory(8.0 * float(n) * float(m) * copies, what)


def _gib(n_bytes: float) -> str:
  if n_bytes >= 2**40:
    return f"{n_bytes / 2**40:.1f} TiB"
  if n_bytes >= 2**30:
    return f"{n_bytes / 2**30:.1f} GiB"
  return f"{n_bytes / 2**20:.0f} MiB"


# ----------------------------------------------------------------------------- arrays


def real_array(x, name: str) -> np.ndarray:
  """A finite real float64 array (complex, boolean, object and string arrays are refused)."""
  arr = np.asarray(x)
  if arr.dtype == np.bool_ or not (np.issubdtype(arr.dtype, np.integer)
                                   or np.issubdtype(arr.dtype, np.floating)):
    raise CheckError(f"{name} must be real numbers, got dtype {arr.dtype}")
  arr = arr.astype(np.float64, copy=False)
  column = toeplitz_view.column_of(arr)  # a Toeplitz view holds its column's numbers only
  if not np.all(np.isfinite(arr if column is None else column)):
    raise CheckError(f"{name} has non-finite entries")
  return arr


def matrix(x, name: str, square: bool = False) -> np.ndarray:
  """A 2-D finite real float64 matrix (square if asked)."""
  arr = real_array(x, name)
  if arr.ndim != 2:
    raise CheckError(f"{name} must be a 2-D matrix, got shape {arr.shape}")
  if square and arr.shape[0] != arr.shape[1]:
    raise CheckError(f"{name} must be square, got shape {arr.shape}")
  if arr.size == 0:
    raise CheckError(f"{name} is empty (shape {arr.shape})")
  return arr


def is_lower_triangular(x: np.ndarray, atol: float = 0.0) -> bool:
  """x[i, j] = 0 (within atol) for j > i; for m x n with m > n, rows in release order."""
  return bool(np.all(np.abs(np.triu(x, 1)) <= atol))


def lower_triangular(x, name: str, atol: float = 0.0, nonsingular: bool = False,
                     square: bool = True) -> np.ndarray:
  """A matrix with no entry above the diagonal beyond ``atol`` (and no zero on it, if asked)."""
  arr = matrix(x, name, square=square)
  upper = np.abs(np.triu(arr, 1)) > atol
  if np.any(upper):
    i, j = np.argwhere(upper)[0]
    raise CheckError(f"{name} must be lower triangular; entry [{i}, {j}] = {arr[i, j]:g} is "
                     "above the diagonal")
  if nonsingular:
    diag = np.abs(np.diag(arr))
    scale = max(float(np.max(np.abs(arr))), 1e-300)
    if np.any(diag <= 1e-12 * scale):
      i = int(np.argmin(diag))
      raise CheckError(f"{name} is singular (not full rank): diagonal entry [{i}, {i}] = {arr[i, i]:g}")
  return arr


def workload(a, name: str = "A") -> np.ndarray:
  """A workload: square, lower triangular, full rank (Denisov et al. 2022, Sec 2)."""
  return lower_triangular(a, name, nonsingular=True)


# ----------------------------------------------------------------------------- factorizations


def gamma(c: np.ndarray) -> float:
  """γ(C) = max_j ‖C[:, j]‖₂, the single-participation sensitivity (Denisov et al. Eq. 2);
  O(n) for a lower-triangular Toeplitz view (its first column is its largest)."""
  column = toeplitz_view.column_of(c)
  if column is not None:
    return float(np.sqrt(np.cumsum(np.square(column))[-1]))
  return float(np.sqrt(np.max(np.sum(np.square(c), axis=0))))


def normalized(c: np.ndarray, name: str = "C", tol: float = 1e-9) -> float:
  """Refuses a C whose largest column norm is not 1 (the cache convention); returns γ."""
  g = gamma(c)
  if not abs(g - 1.0) <= tol:
    raise CheckError(f"{name} is not normalized: its largest column norm is {g:.12g}, "
                     "expected 1 (a scaled C changes the noise the stated ε assumes)")
  return g


def product(a: np.ndarray, b: np.ndarray, c: np.ndarray, name: str, atol: float = 1e-8) -> float:
  """B·C = A on every entry, to ``atol`` relative to max |A|; returns the largest error."""
  err = float(np.max(np.abs(b @ c - a)))
  scale = max(1.0, float(np.max(np.abs(a))))
  if not err <= atol * scale:
    raise CheckError(f"{name}: B·C differs from A by {err:.3g} (tolerance {atol * scale:.3g})")
  return err


def factors(a, b, c, name: str = "factorization", atol: float = 1e-8,
            require_normalized: bool = True, check_product: bool = True) -> None:
  """A (n x n), B (n x m), C (m x n): float64, finite, real, triangular, B·C = A, γ(C) = 1.

  C may have more rows than columns (the binary tree); then its rows must be in
  release order (row r reads no round after r). B·C = A is checked by the full
  product unless the caller checks it otherwise (``check_product=False``).
  """
  for label, x in (("A", a), ("B", b), ("C", c)):
    if not isinstance(x, np.ndarray) or x.ndim != 2:
      raise CheckError(f"{name}: {label} must be a 2-D array")
    if x.dtype != np.float64:
      raise CheckError(f"{name}: {label} must be float64, got {x.dtype}")
    if not np.all(np.isfinite(x)):
      raise CheckError(f"{name}: {label} has non-finite entries")
  n = a.shape[0]
  if a.shape != (n, n):
    raise CheckError(f"{name}: A must be square, got {a.shape}")
  m = c.shape[0]
  if c.shape != (m, n) or b.shape != (n, m):
    raise CheckError(f"{name}: shapes do not chain: A {a.shape}, B {b.shape}, C {c.shape} "
                     f"(expected B n x m, C m x n with n={n})")
  if m < n:
    raise CheckError(f"{name}: C has {m} rows for {n} rounds (rank below n)")
  if not is_lower_triangular(a):
    raise CheckError(f"{name}: A is not lower triangular")
  if not is_lower_triangular(c, atol=1e-12 * max(1.0, float(np.max(np.abs(c))))):
    raise CheckError(f"{name}: C is not lower triangular (in release order)")
  if m == n and not is_lower_triangular(b, atol=1e-10 * max(1.0, float(np.max(np.abs(b))))):
    raise CheckError(f"{name}: B is not lower triangular")
  if require_normalized:
    normalized(c, f"{name}: C")
  if check_product:
    product(a, b, c, name, atol=atol)
