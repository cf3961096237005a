"""Secret seeds and keys: HKDF-SHA256 of OS entropy (``tff_mf.entropy``), and the unpinned
queries' in-graph seeds keyed by such a secret (``tff_mf.tf.query.initial_seed``)."""

import numpy as np
import pytest

from tff_mf import checks
from tff_mf import entropy


def test_hkdf_matches_rfc_5869_test_case_1():
  """RFC 5869, Appendix A.1 (SHA-256): the published OKM for its IKM, salt and info."""
  okm = entropy.hkdf_sha256(bytes([0x0b] * 22), bytes(range(0xf0, 0xfa)), 42,
                            salt=bytes(range(0x0d)))
  assert okm.hex() == ("3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf"
                       "34007208d5b887185865")


def test_hkdf_matches_rfc_5869_test_case_3():
  """RFC 5869, Appendix A.3: empty salt and info."""
  okm = entropy.hkdf_sha256(bytes([0x0b] * 22), b"", 42)
  assert okm.hex() == ("8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d"
                       "9d201395faa4b61a96c8")


def test_seeds_are_fresh_in_range_and_need_a_purpose(monkeypatch):
  seeds = {checks.new_seed() for _ in range(200)}
  assert len(seeds) == 200 and all(0 <= s < 2**63 for s in seeds)
  key = entropy.new_key_pair("k")
  assert len(key) == 2 and all(0 <= k < 2**63 for k in key)
  with pytest.raises(ValueError):
    entropy.secret_bytes("", 8)
  # The value is the KDF of the OS bytes, never the OS bytes themselves.
  monkeypatch.setattr(entropy.os, "urandom", lambda n: bytes(n))
  assert entropy.new_seed("a") != entropy.new_seed("b")
  assert entropy.secret_bytes("a", 8) != bytes(8)


def test_an_unpinned_seed_is_a_keyed_hash_fresh_at_every_computation():
  """The in-graph seed: a new pair at every call (the fresh draw), and a function of the key
  (two keys give unrelated seeds for the same draw, checked on the hash itself)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tff_mf.tf import query  # pylint: disable=g-import-not-at-top
  key = query.seed_key()
  draw = tf.function(lambda: query.initial_seed(None, key))
  seeds = {tuple(draw().numpy()) for _ in range(20)}
  assert len(seeds) == 20
  assert all(0 <= s < 2**63 - 1 for pair in seeds for s in pair)
  words = tf.constant(["1:2|seed-0"])
  one = tf.strings.to_hash_bucket_strong(words, 2**63 - 1, key=list(key)).numpy()
  other = tf.strings.to_hash_bucket_strong(words, 2**63 - 1,
                                           key=list(query.seed_key())).numpy()
  assert one[0] != other[0]
  with pytest.raises(ValueError):
    query.initial_seed(None, None)
  pinned = np.array([5, 7], np.int64)
  np.testing.assert_array_equal(query.initial_seed(pinned, key).numpy(), pinned)


def test_an_unpinned_noise_key_is_two_secret_words_and_a_pinned_one_keeps_the_tag():
  """Issue 46 item 7: an unpinned key is both Philox words from HKDF over OS entropy (126
  secret bits), never the public tag; a pinned int keeps (seed, tag), a pinned pair is used
  as it is, and a malformed one is refused in one line."""
  from tff_mf.noise import keys  # pylint: disable=g-import-not-at-top
  drawn = [keys.noise_key(None) for _ in range(50)]
  assert len(set(drawn)) == 50 and len({k for _, k in drawn}) == 50
  assert all(k != keys.SEED_TAG and 0 <= s < 2**63 and 0 <= k < 2**63 for s, k in drawn)
  assert keys.SEED_TAG == int.from_bytes(b"mf_noise", "big")
  assert keys.noise_key(17) == (17, keys.SEED_TAG)
  assert keys.noise_key((17, 5)) == (17, 5) == keys.noise_key(np.array([17, 5], np.int64))
  pair = keys.seed_pair(None)
  assert pair.dtype == np.int64 and pair.shape == (2,) and pair[1] != keys.SEED_TAG
  for bad in [(1,), (1, 2, 3), [[1, 2]], (1, -1), (1, 2.0), 2**63, True, "7"]:
    with pytest.raises(checks.CheckError) as e:
      keys.noise_key(bad)
    assert "\n" not in str(e.value)
