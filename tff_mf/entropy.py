"""Secret seeds and keys from OS entropy through a cryptographic KDF (numpy-free, stdlib).

Every secret tff-mf draws (the noise seed, the sampling secret, the canary seed, the key
of an unpinned query's in-graph seed) is HKDF-SHA256 (Krawczyk & Eronen 2010, RFC 5869,
Sec 2.2–2.3) of 32 bytes of ``os.urandom``, with the purpose as HKDF's ``info``: 256 bits
of OS entropy behind every value, and values drawn for different purposes are independent
even if one source were reused. ``os.urandom`` is the kernel's CSPRNG (getrandom(2)).

Why not TensorFlow's own draw: an op with seed attributes (0, 0) takes its Philox key from
``tsl::random::New64()``, a Mersenne Twister seeded once per process with one 32-bit value of
``std::random_device`` (tsl/platform/random.cc), so such a key has at most 2^32 values per
process and its stream is predictable from earlier outputs (docs/threat_model.md).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import Tuple

_HASH = hashlib.sha256
_HASH_BYTES = 32
_SOURCE_BYTES = 32


def hkdf_sha256(ikm: bytes, info: bytes, length: int, salt: bytes = b"") -> bytes:
  """HKDF-SHA256 (RFC 5869): Extract (PRK = HMAC(salt, IKM)) then Expand to ``length``
  bytes (T(i) = HMAC(PRK, T(i−1) ‖ info ‖ i)); an empty salt is HashLen zero bytes."""
  if not 0 < length <= 255 * _HASH_BYTES:
    raise ValueError(f"HKDF length must be in [1, {255 * _HASH_BYTES}], got {length}")
  prk = hmac.new(salt or bytes(_HASH_BYTES), ikm, _HASH).digest()
  out, block, counter = b"", b"", 1
  while len(out) < length:
    block = hmac.new(prk, block + info + bytes([counter]), _HASH).digest()
    out += block
    counter += 1
  return out[:length]


def secret_bytes(purpose: str, length: int) -> bytes:
  """``length`` secret bytes for ``purpose``: HKDF-SHA256 of fresh OS entropy."""
  if not purpose:
    raise ValueError("a secret needs a purpose (HKDF's info)")
  return hkdf_sha256(os.urandom(_SOURCE_BYTES), b"tff-mf/" + purpose.encode(), length)


def new_seed(purpose: str = "seed") -> int:
  """A fresh secret int64 seed in [0, 2⁶³) for ``purpose``."""
  return int.from_bytes(secret_bytes(purpose, 8), "little") >> 1


def new_key_pair(purpose: str) -> Tuple[int, int]:
  """Two fresh secret 63-bit integers for ``purpose`` (a 126-bit key of non-negative
  int64 values, the form a TensorFlow int-list attribute holds)."""
  raw = secret_bytes(purpose, 16)
  return (int.from_bytes(raw[:8], "little") >> 1, int.from_bytes(raw[8:], "little") >> 1)
