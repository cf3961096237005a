"""The noise key: the two int64 words of the Philox key a run's noise is drawn from (no TF).

Every framework layer draws Z from ``stateless_normal(…, seed=fold_in(fold_in(key, j), t))``
(Philox4x32-10, Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3"); one
Philox call turns the two words into the generator's 64-bit key and the high half of its
counter (TensorFlow's stateless kernels, ``tff_mf.noise.philox.key_counter``), a bijection,
so every bit of both words matters. The pair is all an attacker needs to regenerate and
subtract the noise. Its one rule:

- not pinned: both words are secret, HKDF-SHA256 over 256 bits of OS entropy
  (``tff_mf.entropy.new_key_pair``, RFC 5869): 126 secret bits;
- a pinned integer seed s: (s, ``SEED_TAG``), the form every pinned run and equality test
  has always used (s is the only secret; such runs are labelled ``pinned``);
- a pinned pair (s, k): used as it is: the full key a harness recorded for a run it drew
  unpinned, so a resumed run continues the identical noise.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import numpy as np

from tff_mf import checks
from tff_mf import entropy

# "mf_noise": the public second word of a pinned integer seed's key.
SEED_TAG = 0x6D665F6E6F697365
PURPOSE = "noise-seed"

Seed = Union[int, Tuple[int, int]]


def pinned(noise_seed, name: str = "noise_seed") -> Seed:
  """A pinned seed, checked: an int in [0, 2⁶³), or a pair of them (a full key)."""
  if isinstance(noise_seed, (tuple, list, np.ndarray)):
    words = np.asarray(noise_seed, dtype=object)
    if words.shape != (2,):
      raise checks.CheckError(f"{name} must be an integer or a pair of integers (a key), got "
                              f"shape {words.shape}")
    return (checks.seed(words[0], name), checks.seed(words[1], name))
  return checks.seed(noise_seed, name)


def noise_key(noise_seed: Optional[Seed] = None, name: str = "noise_seed") -> Tuple[int, int]:
  """The key's two words: a fresh secret pair when ``noise_seed`` is None, (seed, SEED_TAG)
  for a pinned int, a pinned pair as it is."""
  if noise_seed is None:
    return entropy.new_key_pair(PURPOSE)
  value = pinned(noise_seed, name)
  return value if isinstance(value, tuple) else (value, SEED_TAG)


def seed_pair(noise_seed: Optional[Seed] = None, name: str = "noise_seed") -> np.ndarray:
  """:func:`noise_key` as the int64 [2] array the frameworks take."""
  return np.array(noise_key(noise_seed, name), dtype=np.int64)
