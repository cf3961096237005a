"""The Flower layer's noise rows for every trainable private mechanism (no engine needed):
row i is σ·(N·Z)[i] for the mechanism's N (C⁻¹, or A⁻¹·B) and the seed's Z, and no row
is added past round n."""

import numpy as np
import pytest

from tff_mf import checks
from tff_mf import mechanisms
from tff_mf import registry
from tff_mf import spec as spec_lib
from tff_mf.noise import rows as noise_lib
from tff_mf.noise import philox
from tff_mf.noise import keys

N = 8
MECHANISMS = [m for m in registry.mechanism_names(trainable=True, private=True) if m != "tree"]


@pytest.mark.parametrize("name", MECHANISMS)
def test_rows_are_sigma_n_z_for_the_seed(name):
  spec = spec_lib.MechanismSpec.from_args(name, total_rounds=N, clients_per_round=2,
                                          clip_norm=1.0, noise_multiplier=2.0)
  resolved, _ = mechanisms.build(spec)
  shapes = [(7,), (2, 3)]
  seed = noise_lib.seed_pair(11)
  rows = noise_lib.NoiseRows(resolved, shapes, seed)
  got = np.stack([np.concatenate([p.ravel() for p in rows.next(2.0)]) for _ in range(N)])
  f = resolved.factorization
  z = np.stack([np.concatenate([p.ravel() for p in philox.standard_normal_row(seed, j, shapes)])
                for j in range(f.m)]).astype(np.float64)
  want = 2.0 * f.noise_matrix() @ z
  # float64 sums of at most m terms of size |N_ij·z_j|: a few ulps of their total.
  scale = 2.0 * np.abs(f.noise_matrix()) @ np.abs(z)
  assert np.all(np.abs(got - want) <= 1e-12 * scale)
  with pytest.raises(checks.CheckError, match="past the n=8 rounds"):
    rows.next(2.0)


def test_tree_is_refused_with_its_matrix_form_named():
  from tff_mf.flower import strategy  # pylint: disable=g-import-not-at-top
  from flwr.serverapp.strategy import FedAvg  # pylint: disable=g-import-not-at-top
  with pytest.raises(checks.CheckError, match="honaker_online") as err:
    strategy.MatrixFactorizationFixedClipping(
        FedAvg(fraction_train=1.0), "tree", total_rounds=N, clients_per_round=2, clip_norm=1.0,
        noise_multiplier=2.0)
  assert "\n" not in str(err.value)


def test_unpinned_seeds_differ():
  """Both words of an unpinned key are fresh secrets, never the public tag (issue 46 item 7)."""
  a, b = noise_lib.seed_pair(None), noise_lib.seed_pair(None)
  assert a[0] != b[0] and a[1] != b[1] and keys.SEED_TAG not in (a[1], b[1])
  assert list(noise_lib.seed_pair(11)) == [11, keys.SEED_TAG]


@pytest.mark.parametrize("name", ["blt", "opt_prefix_sum", "banded", "honaker_online"])
def test_exact_rows_are_tfs_arithmetic_on_the_same_z(name):
  """``exact=True`` (the TF aggregator's draws and float32 arithmetic, bit for bit; checked
  against TF in tests/test_flower_tf_noise.py): float32 rows, the same for the same seed,
  and within float32 rounding of the float64 rows (the normals within 3 float32 ulps of the
  float64-rounded ones, each float32 operation within 2⁻²⁴ on terms no larger than
  |N|·|Z|, at most 2·(k + m) + 2 of them in a row)."""
  spec = spec_lib.MechanismSpec.from_args(name, total_rounds=N, clients_per_round=2,
                                          clip_norm=1.0, noise_multiplier=2.0)
  resolved, _ = mechanisms.build(spec)
  shapes = [(3000,), (4, 5)]
  seed = noise_lib.seed_pair(23)
  exact = noise_lib.NoiseRows(resolved, shapes, seed, exact=True)
  again = noise_lib.NoiseRows(resolved, shapes, seed, exact=True)
  plain = noise_lib.NoiseRows(resolved, shapes, seed)
  f = resolved.factorization
  z = np.stack([np.concatenate([p.ravel() for p in philox.standard_normal_row(seed, j, shapes)])
                for j in range(f.m)]).astype(np.float64)
  scale = 2.0 * np.abs(f.noise_matrix()) @ np.abs(z)
  k = resolved.stream.k if resolved.stream is not None else 0
  ops = 2 * (k + f.m) + 2
  for i in range(N):
    a = np.concatenate([p.ravel() for p in exact.next(2.0)])
    assert a.dtype == np.float32
    assert np.array_equal(a, np.concatenate([p.ravel() for p in again.next(2.0)]))
    b = np.concatenate([p.ravel() for p in plain.next(2.0)])
    assert np.all(np.abs(a - b) <= (3 * 2.0**-23 + ops * 2.0**-24) * scale[i])
