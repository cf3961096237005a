"""The streaming form of a residual noise matrix N: one linear recurrence (numpy core).

A residual-form matrix mechanism adds, in round i, row i of N·Z (N = A⁻¹·B, which
is C⁻¹ for square C; ``docs/notation.md``). Several strategy families have an N
whose rows can be produced from a fixed number k of model-sized rows of state:

- banded + low rank B̂ (Denisov et al. 2022, arXiv:2202.08312, App H, Algorithm 3):
  a ring of recent Z rows and r accumulated low-rank rows;
- banded C (Choquette-Choo et al. 2023, arXiv:2306.08153, Sec 4): C⁻¹·Z by forward
  substitution over the last b − 1 outputs;
- banded Toeplitz C and buffered linear Toeplitz (BLT) C⁻¹ (Dvijotham et al. 2024,
  arXiv:2404.16706): b − 1 past outputs, or m decaying buffers.

``LinearStream`` is that recurrence written once. Round i (0-based) draws Z[i] and

  s_i[l] = s_{i−1}[copies[l]]                      when copies[l] ≥ 0 (a plain copy)
  s_i[l] = F[t, l, :]·s_{i−1} + g[t, l]·Z[i]       otherwise (a computed row)
  y_i    = w_old[t]·s_{i−1} + w_new[t]·s_i + c[t]·Z[i]

with s_{−1} = 0 and t = i for time-varying tables (leading dimension n) or t = 0
for time-invariant ones (leading dimension 1); y_i is row i of N·Z. The family
modules build the tables in float64; ``run`` is the float64 reference and the
TensorFlow layer (``tff_mf.tf.noise.LinearNoise``) evaluates exactly the same
recurrence, with the same tables, in the model's dtype.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional, Tuple

import numpy as np

from tff_mf import checks


@dataclasses.dataclass(frozen=True)
class LinearStream:
  """Tables of the recurrence above (all float64).

  Attributes:
    n: rounds.
    copies: int array [k]; copies[l] = m ≥ 0 makes state row l a copy of old row m.
    f: [T, k, k]; row l is used only when copies[l] < 0.
    g: [T, k]; weight of Z[i] in computed row l.
    w_old: [T, k]; output weights on the previous state.
    w_new: [T, k]; output weights on the new state.
    c: [T]; output weight of Z[i].
    name: what the stream realizes, for messages.
  """
  n: int
  copies: np.ndarray
  f: np.ndarray
  g: np.ndarray
  w_old: np.ndarray
  w_new: np.ndarray
  c: np.ndarray
  name: str = "linear stream"

  def __post_init__(self):
    n = checks.positive_int(self.n, "stream rounds n")
    copies = np.asarray(self.copies)
    if copies.ndim != 1 or not np.issubdtype(copies.dtype, np.integer):
      raise checks.CheckError(f"{self.name}: copies must be a 1-D integer array")
    k = copies.shape[0]
    if np.any(copies >= k) or np.any(copies < -1):
      raise checks.CheckError(f"{self.name}: copies must name rows in [0, {k}) or be -1")
    t = None
    for label, shape_tail in (("f", (k, k)), ("g", (k,)), ("w_old", (k,)), ("w_new", (k,)),
                              ("c", ())):
      x = checks.real_array(getattr(self, label), f"{self.name}: table {label}")
      if x.ndim != 1 + len(shape_tail) or x.shape[1:] != shape_tail:
        raise checks.CheckError(f"{self.name}: table {label} must have shape [T, "
                                f"{', '.join(map(str, shape_tail))}], got {x.shape}")
      t = x.shape[0] if t is None else t
      if x.shape[0] != t or t not in (1, n):
        raise checks.CheckError(f"{self.name}: every table needs the same leading dimension, "
                                f"1 or n={n}; table {label} has {x.shape[0]}")
      object.__setattr__(self, label, x)
    object.__setattr__(self, "n", n)
    object.__setattr__(self, "copies", copies.astype(np.int64))

  @property
  def k(self) -> int:
    """Model-sized rows of state carried between rounds."""
    return int(self.copies.shape[0])

  @property
  def time_varying(self) -> bool:
    return self.c.shape[0] > 1

  @property
  def computed_rows(self) -> np.ndarray:
    return np.flatnonzero(self.copies < 0)

  def tables(self, i: int) -> Tuple[np.ndarray, ...]:
    """(f, g, w_old, w_new, c) of round i."""
    t = i if self.time_varying else 0
    return self.f[t], self.g[t], self.w_old[t], self.w_new[t], self.c[t]

  def step(self, state: np.ndarray, z_row: np.ndarray, i: int) -> Tuple[np.ndarray, np.ndarray]:
    """(y_i, s_i) from s_{i−1} (k x d) and Z[i] (d,), in float64.

    Only the nonzero coefficients are applied (in index order), as the TF layer does: a
    BLT's F is diagonal, so a computed row costs one scaled add, not k, at any model size.
    """
    f, g, w_old, w_new, c = self.tables(i)
    new = np.empty_like(state)
    for l in range(self.k):
      m = self.copies[l]
      new[l] = state[m] if m >= 0 else _combination(f[l], state, g[l], z_row)
    y = _combination(w_old, state, c, z_row)
    for m in np.flatnonzero(w_new):
      y += w_new[m] * new[m]
    return y, new

  def run(self, z: np.ndarray) -> np.ndarray:
    """N·Z for Z of shape [n, d] (or [n]): the float64 reference of the stream."""
    z = np.asarray(z, dtype=np.float64)
    vector = z.ndim == 1
    z2 = z[:, None] if vector else z
    if z2.shape[0] != self.n:
      raise checks.CheckError(f"{self.name}: Z has {z2.shape[0]} rows for {self.n} rounds")
    state = np.zeros((self.k, z2.shape[1]))
    out = np.empty_like(z2)
    for i in range(self.n):
      out[i], state = self.step(state, z2[i], i)
    return out[:, 0] if vector else out

  def noise_matrix(self) -> np.ndarray:
    """N (n x n): the stream run on Z = I."""
    return self.run(np.eye(self.n))

  def scaled(self, factor: float) -> "LinearStream":
    """The stream of factor·N: outputs scaled, state recursion unchanged."""
    return dataclasses.replace(self, w_old=self.w_old * factor, w_new=self.w_new * factor,
                               c=self.c * factor)

  def support(self) -> Dict[str, np.ndarray]:
    """Which coefficients are nonzero in some round (the TF layer skips the others)."""
    return {label: np.any(getattr(self, label) != 0, axis=0)
            for label in ("f", "g", "w_old", "w_new", "c")}

  def arrays(self, prefix: str = "stream_") -> Dict[str, np.ndarray]:
    """The tables as float64 arrays (for storing beside a factorization)."""
    out = {f"{prefix}{label}": np.asarray(getattr(self, label), np.float64)
           for label in ("f", "g", "w_old", "w_new", "c")}
    out[f"{prefix}copies"] = self.copies.astype(np.float64)
    return out

  @classmethod
  def from_arrays(cls, arrays: Dict[str, np.ndarray], n: int, prefix: str = "stream_",
                  name: str = "linear stream") -> Optional["LinearStream"]:
    """The inverse of ``arrays`` (None when the arrays hold no stream)."""
    if f"{prefix}copies" not in arrays:
      return None
    copies = np.asarray(arrays[f"{prefix}copies"])
    if not np.all(copies == np.round(copies)):
      raise checks.CheckError(f"{name}: copies must be integers")
    return cls(n=n, copies=copies.astype(np.int64), name=name,
               **{label: arrays[f"{prefix}{label}"]
                  for label in ("f", "g", "w_old", "w_new", "c")})


def _combination(weights: np.ndarray, rows: np.ndarray, z_weight: float,
                 z_row: np.ndarray) -> np.ndarray:
  """Σ_m weights[m]·rows[m] + z_weight·z_row over the nonzero weights, in index order."""
  out = np.multiply(z_weight, z_row, dtype=np.float64)
  for m in np.flatnonzero(weights):
    out += weights[m] * rows[m]
  return out


def independent(n: int) -> LinearStream:
  """C = I: y_i = Z[i], no state (DP-SGD / DP-FedAvg with independent noise)."""
  return LinearStream(n=n, copies=np.zeros(0, np.int64), f=np.zeros((1, 0, 0)),
                      g=np.zeros((1, 0)), w_old=np.zeros((1, 0)), w_new=np.zeros((1, 0)),
                      c=np.ones(1), name="independent noise")


def lower_banded_inverse(c_bands: np.ndarray, n: int, name: str = "banded C⁻¹") -> LinearStream:
  """C⁻¹·Z for a lower-triangular C with b bands, by forward substitution.

  ``c_bands[t, k]`` = C[i, i − k] (t = i, shape [n, b], or t = 0, shape [1, b], for a
  Toeplitz C; entries with k > i are ignored). State: the
  last b − 1 outputs, newest first; y_i = (Z[i] − Σ_{k≥1} C[i, i−k]·y_{i−k}) / C[i, i]
  (Choquette-Choo et al. 2023, arXiv:2306.08153, Sec 4; Toeplitz: McKenna 2024,
  arXiv:2405.15913).
  """
  cb = checks.real_array(c_bands, f"{name}: band coefficients")
  if cb.ndim != 2 or cb.shape[1] < 1:
    raise checks.CheckError(f"{name}: band coefficients must be [T, b], got {cb.shape}")
  t, b = cb.shape
  if np.any(cb[:, 0] == 0):
    raise checks.CheckError(f"{name}: C has a zero on its diagonal (singular)")
  k = b - 1
  if k == 0:
    return LinearStream(n=n, copies=np.zeros(0, np.int64), f=np.zeros((t, 0, 0)),
                        g=np.zeros((t, 0)), w_old=np.zeros((t, 0)), w_new=np.zeros((t, 0)),
                        c=1.0 / cb[:, 0], name=name)
  copies = np.concatenate([[-1], np.arange(k - 1)]).astype(np.int64)
  f = np.zeros((t, k, k))
  f[:, 0, :] = -cb[:, 1:] / cb[:, :1]
  g = np.zeros((t, k))
  g[:, 0] = 1.0 / cb[:, 0]
  w_new = np.zeros((t, k))
  w_new[:, 0] = 1.0
  return LinearStream(n=n, copies=copies, f=f, g=g, w_old=np.zeros((t, k)), w_new=w_new,
                      c=np.zeros(t), name=name)
