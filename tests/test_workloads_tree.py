"""Workload matrices (Denisov Prop 4.2) and the binary tree (McMahan Sec 2.1, Prop 2.1)."""

import numpy as np
import pytest

from tff_mf.factorization import strategies
from tff_mf.factorization.families import tree
from tff_mf.factorization import workloads


# --- workloads ---------------------------------------------------------------

def test_prefix_sum_is_lower_triangular_ones():
  s = workloads.prefix_sum(4)
  np.testing.assert_array_equal(s, [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]])
  assert s.dtype == np.float64


@pytest.mark.parametrize("n", (1, 7, 64))
def test_momentum_without_momentum_and_unit_rates_is_the_prefix_sum(n):
  np.testing.assert_array_equal(workloads.momentum_matrix(n, 0.0, np.ones(n)),
                                workloads.prefix_sum(n))


def test_momentum_matrix_entries():
  # M(η)[i, j] = η_j (i ≥ j), M(β)[i, j] = β^(i−j) (i ≥ j), M = M(η)·M(β) (Denisov Eq. 9).
  m = workloads.momentum_matrix(3, 0.5, np.array([1.0, 2.0, 3.0]))
  np.testing.assert_allclose(m, [[1, 0, 0], [2, 2, 0], [2.75, 3.5, 3]], rtol=1e-15)


def test_momentum_matrix_releases_sgd_with_momentum_iterates():
  """Row t of M·G is the model delta of SGD with heavy-ball momentum after round t."""
  n, beta = 6, 0.9
  etas = np.linspace(1.0, 0.5, n)
  rng = np.random.default_rng(0)
  grads = rng.normal(size=n)
  buf, delta, deltas = 0.0, 0.0, []
  for t in range(n):
    buf = beta * buf + grads[t]
    delta += etas[t] * buf
    deltas.append(delta)
  np.testing.assert_allclose(workloads.momentum_matrix(n, beta, etas) @ grads, deltas, rtol=1e-12)


def test_learning_rate_schedules():
  n, k = 16, 4
  np.testing.assert_array_equal(workloads.learning_rates(n), np.ones(n))
  decay = workloads.learning_rates(n, "decay", k)
  np.testing.assert_array_equal(decay[:n - k], 1.0)
  np.testing.assert_array_equal(decay[n - k:], workloads.DECAY_FACTOR)
  assert workloads.DECAY_FACTOR == 0.15
  cool = workloads.learning_rates(n, "cooldown", k)
  np.testing.assert_array_equal(cool[:n - k], 1.0)
  np.testing.assert_allclose(cool[n - k:], [1.0, 1.0 - 0.95 / 3, 1.0 - 1.9 / 3, 0.05], rtol=1e-14)
  assert cool[-1] == pytest.approx(0.05) and cool[n - k] == 1.0
  assert np.all(np.diff(cool) <= 0)


def test_paper_schedule_k512_of_2048():
  cool = workloads.learning_rates(2048, "cooldown", 512)
  assert cool[1535] == 1.0 and cool[1536] == 1.0 and cool[-1] == pytest.approx(0.05)
  decay = workloads.learning_rates(2048, "decay", 512)
  assert decay[1535] == 1.0 and decay[1536] == 0.15


def test_schedule_errors():
  with pytest.raises(workloads.WorkloadError, match="unknown learning-rate schedule"):
    workloads.learning_rates(8, "exponential", 2)
  with pytest.raises(workloads.WorkloadError, match="needs schedule_rounds"):
    workloads.learning_rates(8, "decay")
  with pytest.raises(workloads.WorkloadError, match="schedule_rounds must be in"):
    workloads.learning_rates(8, "cooldown", 9)
  with pytest.raises(workloads.WorkloadError, match="momentum"):
    workloads.momentum_matrix(8, 1.0)
  with pytest.raises(workloads.WorkloadError, match="positive"):
    workloads.momentum_matrix(3, 0.5, np.array([1.0, 0.0, 1.0]))
  with pytest.raises(workloads.WorkloadError, match="n must be a positive integer"):
    workloads.prefix_sum(0)


@pytest.mark.parametrize("matrix, message", [
    (np.ones((3, 4)), "square"),
    (np.ones((3,)), "2-D matrix"),
    (np.array([[1.0, 2.0], [3.0, 4.0]]), r"lower triangular; entry \[0, 1\]"),
    (np.array([[1.0, 0.0], [3.0, 0.0]]), r"singular .*\[1, 1\]"),
    (np.array([[1.0, 0.0], [np.nan, 1.0]]), "non-finite"),
    (np.array([["a", ""], ["b", "c"]]), "real numbers"),
    (np.array([[1.0 + 1j, 0.0], [0.5, 1.0]]), "real numbers"),
    (np.array([[True, False], [True, True]]), "real numbers"),
])
def test_validate_workload_errors(matrix, message):
  with pytest.raises(workloads.WorkloadError, match=message):
    workloads.validate_workload(matrix)


def test_validate_workload_accepts_and_converts():
  a = workloads.validate_workload(np.tril(np.ones((3, 3), dtype=np.int32)))
  assert a.dtype == np.float64


def test_load_workload_from_npy(tmp_path):
  good = tmp_path / "a.npy"
  a = np.tril(np.arange(1.0, 17.0).reshape(4, 4))
  np.save(good, a)
  np.testing.assert_array_equal(workloads.load_workload(str(good)), a)
  spec = workloads.WorkloadSpec(kind="file", n=4, matrix_file=str(good))
  np.testing.assert_array_equal(spec.build(), a)
  with pytest.raises(workloads.WorkloadError, match="is 4x4, but n=5"):
    workloads.WorkloadSpec(kind="file", n=5, matrix_file=str(good)).build()
  with pytest.raises(workloads.WorkloadError, match="does not exist"):
    workloads.load_workload(str(tmp_path / "missing.npy"))
  corrupt = tmp_path / "corrupt.npy"
  corrupt.write_bytes(b"not a numpy file")
  with pytest.raises(workloads.WorkloadError, match="cannot read matrix file"):
    workloads.load_workload(str(corrupt))
  upper = tmp_path / "upper.npy"
  np.save(upper, a.T)
  with pytest.raises(workloads.WorkloadError, match="upper.npy.* lower triangular"):
    workloads.load_workload(str(upper))


def test_workload_spec_builds_each_kind():
  np.testing.assert_array_equal(workloads.WorkloadSpec(kind="prefix_sum", n=5).build(),
                                workloads.prefix_sum(5))
  m = workloads.WorkloadSpec(kind="momentum", n=8, momentum=0.9, lr_schedule="decay",
                             schedule_rounds=2).build()
  np.testing.assert_allclose(
      m, workloads.momentum_matrix(8, 0.9, workloads.learning_rates(8, "decay", 2)))
  with pytest.raises(workloads.WorkloadError, match="unknown workload"):
    workloads.WorkloadSpec(kind="other", n=3).build()


# --- binary tree -------------------------------------------------------------

@pytest.mark.parametrize("n", (1, 2, 8, 13, 16, 100))
def test_tree_release_order(n):
  nodes = tree.tree_nodes(n)
  keys = [(nd.end, nd.height) for nd in nodes]
  assert keys == sorted(keys)
  assert all(nd.end < n and nd.end - nd.start + 1 == 1 << nd.height for nd in nodes)
  if n & (n - 1) == 0:
    assert len(nodes) == 2 * n - 1
  # Row r of C_T involves only rounds up to the round it is released in.
  c = tree.tree_encoder(n)
  for r, nd in enumerate(nodes):
    assert np.all(c[r, nd.end + 1:] == 0) and c[r, nd.end] == 1


@pytest.mark.parametrize("n", (1, 2, 8, 16, 256))
def test_tree_column_norms_equal_the_number_of_levels(n):
  c = tree.tree_encoder(n)
  levels = tree.tree_levels(n)
  assert levels == int(np.log2(n)) + 1
  np.testing.assert_array_equal(np.sum(c ** 2, axis=0), levels)


@pytest.mark.parametrize("n", (3, 13, 100))
def test_tree_column_norms_for_non_power_of_two_n(n):
  """Only complete nodes are used, so round j lies in one node per complete level above it.

  The largest column norm² (γ² of C_T) is ⌊log₂ n⌋ + 1: the root of the next
  power of two never completes; later rounds lie in fewer complete nodes.
  """
  c = tree.tree_encoder(n)
  col = np.sum(c ** 2, axis=0)
  assert np.max(col) == int(np.floor(np.log2(n))) + 1 == col[0]
  assert np.all(col >= 1) and np.all(col <= tree.tree_levels(n))


@pytest.mark.parametrize("n", (8, 13, 16, 100))
def test_honaker_online_is_streaming_and_exact(n):
  nodes = tree.tree_nodes(n)
  c = tree.tree_encoder(n)
  b = tree.honaker_online_decoder(n)
  np.testing.assert_allclose(b @ c, workloads.prefix_sum(n), atol=1e-12)
  release_round = np.array([nd.end for nd in nodes])
  for t in range(n):
    used = np.nonzero(b[t])[0]
    assert np.all(release_round[used] <= t), f"round {t} uses a node released later"


@pytest.mark.parametrize("n", (8, 13, 64))
def test_honaker_full_is_the_least_squares_decoder(n):
  c = tree.tree_encoder(n)
  s = workloads.prefix_sum(n)
  b_full = tree.honaker_full_decoder(n)
  np.testing.assert_allclose(b_full @ c, s, atol=1e-10)
  np.testing.assert_allclose(b_full, s @ np.linalg.pinv(c), atol=1e-9)
  b_online = tree.honaker_online_decoder(n)
  assert np.sum(b_full ** 2) <= np.sum(b_online ** 2) + 1e-9


def test_tree_dyadic_decomposition():
  assert tree.dyadic_decomposition(0, 8) == [(0, 0)]
  assert tree.dyadic_decomposition(6, 8) == [(0, 3), (4, 5), (6, 6)]
  assert tree.dyadic_decomposition(7, 8) == [(0, 7)]


@pytest.mark.parametrize("strategy", ("honaker_online", "honaker_full"))
def test_tree_for_momentum_by_post_processing(strategy):
  """B = A·S⁻¹·B_tree reproduces a momentum workload (Denisov Table 1)."""
  n = 24  # not a power of two
  spec = strategies.FactorizationSpec(
      workload=workloads.WorkloadSpec(kind="momentum", n=n, momentum=0.95,
                                      lr_schedule="cooldown", schedule_rounds=6),
      strategy=strategy)
  f = strategies.factorize(spec)
  np.testing.assert_allclose(f.b @ f.c, f.a, atol=1e-9)
  assert f.gamma == pytest.approx(1.0)
  assert f.c.shape == (len(tree.tree_nodes(n)), n)
