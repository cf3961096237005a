"""A training run adds the noise it reports (end to end, through the path users run).

``training.loop.run_training`` (and, in a clean shell, ``training/run_stackoverflow.py``)
trains with z > 0 while the client updates are negligible, so that the model after
round i is θ_0 − (η/K)·(B·Z)[i] (Denisov et al. 2022, arXiv:2202.08312, Algorithm 1
and Prop 4.2: the server optimizer releases A·G + B·Z; here G ≈ 0). Each model
coordinate is then an independent draw of an n-vector with covariance
(z·ζ·η/K)²·B·Bᵀ, B the decoder of the mechanism the run reports, ζ the clip norm, η
the server learning rate and K the clients per round. The thousands of coordinates
of a small model are the samples of a likelihood-ratio covariance test
(``tests/statcheck.py``) at false-alarm rate ``ALPHA`` per test, whose power is shown
on the same samples against a noise standard deviation 5% too small or too large
and against the covariance of a different mechanism.

Why the client updates are negligible: the client learning rate is ``CLIENT_LR`` =
1e-20 (the training binary refuses 0). A client's update is at most
lr × (steps ≤ 256/16) × its gradient norm, so the round's clipped sum G is below
1e-15 in every coordinate, against a noise standard deviation z·ζ ≥ 0.5 per
coordinate: G changes the samples by less than 1e-14 relative, far below float32
rounding of the model (about 6e-8 relative). Zeroing the updates by another route
(empty clients, zero clip) would not go through the path users run: empty clients
are skipped by the sampler, and the noise scales with the clip norm.

Baselines: ``gaussian`` (TFF's gaussian_fixed) adds independent noise each round, so
B = S (the prefix-sum matrix, built here). ``tree`` (TFF's tree_aggregation with
``use_efficient=True``) estimates each prefix sum from the complete dyadic subtrees
covering it, each subtree's sum by its best linear unbiased estimate from that
subtree's node values (Honaker 2015, "Efficient Use of Differentially Private Binary
Trees"); B is built here by least squares on each subtree, independently of
``tff_mf.factorization.families.tree``, and the covariance check uses the per-node multiplier the
run reports (``mechanism_info.noise_multiplier_per_node``), so a different value
passed to TFF fails the test.

Privacy: ε in summary.json is checked against the analytic Gaussian mechanism
(Balle & Wang 2018, arXiv:1805.06530, Thm 8; ``statcheck.gaussian_epsilon``) at
z/sens, with sens computed here from the reported matrices (single participation:
the largest column norm of C; for the tree, √(nodes per round) of the tree encoder).
"""

import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from tff_mf.accounting import analyses
from tff_mf.factorization.families import tree as tree_family
from training import config as config_lib
from training import loop
from training import task as task_lib

import statcheck
import userenv

ALPHA = 1e-4
CLIENT_LR = 1e-20
ROUNDS = 8
CLIENTS = 2
CLIP = 2.0
SERVER_LR = 0.5
DELTA = 1e-6
SEED = 987654321
MODEL = dict(dataset="synthetic", vocab_size=100, embedding_size=16, lstm_size=16,
             projection_size=16, max_validation_elements=16, max_test_elements=16, seed=3)


@pytest.fixture(name="configs", scope="module")
def _configs(tiny_config):
  """``configs(root, mechanism, **overrides)``: this file's run of ``mechanism``."""
  base = tiny_config.using(**MODEL, total_rounds=ROUNDS, clients_per_round=CLIENTS,
                           client_lr=CLIENT_LR, clip_norm=CLIP, server_lr=SERVER_LR, delta=DELTA,
                           rounds_per_eval=ROUNDS, rounds_per_checkpoint=1,
                           cache_subdir="cache_dir")
  return lambda root, mechanism, **kw: base(root, mechanism=mechanism,
                                            experiment_name=mechanism, **kw)


@pytest.fixture(scope="module")
def task(configs, tiny_task, tmp_path_factory):
  return tiny_task(configs(tmp_path_factory.mktemp("task"), "gaussian", noise_multiplier=1.0))


def _flat(arrays) -> np.ndarray:
  return np.concatenate([np.asarray(a, np.float64).ravel() for a in arrays])


def _checkpointed_model(run_dir, round_num) -> np.ndarray:
  """The trainable weights in ``checkpoints/checkpoint_<round>`` (training.checkpoints:
  the state's leaves with their paths), once it is written (in the background)."""
  directory = os.path.join(run_dir, "checkpoints")
  deadline = time.time() + 60
  path = os.path.join(directory, f"checkpoint_{round_num}")
  while not os.path.exists(path):
    assert time.time() < deadline, f"no checkpoint of round {round_num}"
    time.sleep(0.01)
  with np.load(path) as f:
    paths = list(f["program_state/__paths__"])
    prefix = "global_model_weights/trainable/"
    return _flat(f[f"program_state/{i}"] for i, p in enumerate(paths) if p.startswith(prefix))


def _initial_model(task, seed) -> np.ndarray:
  trainable, _ = task_lib.initial_model_weights(task.keras_model_fn, seed)
  return _flat(trainable)


# -- the mechanisms' decoders, built here --------------------------------------------------------
def prefix_sum(n):
  return np.tril(np.ones((n, n)))


def momentum_workload(n, beta):
  """A = M(β) for constant learning rates: A[i, j] = Σ_{k=0}^{i-j} β^k (Denisov Eq. 9)."""
  i, j = np.indices((n, n))
  return np.where(i >= j, (1.0 - beta ** (i - j + 1)) / (1.0 - beta), 0.0)


def dyadic_nodes(n):
  """Complete nodes (start, end) of the binary tree over rounds 0..n-1 (end < n)."""
  return [(s, s + w - 1) for w in (2**h for h in range(int(math.log2(n)) + 1))
          for s in range(0, n, w) if s + w - 1 < n]


def honaker_decoder(n):
  """B (n x nodes): round t's prefix sum from the maximal complete subtrees inside [0, t],
  each subtree's sum estimated by least squares (BLUE, unit node noise) from the node
  values of that subtree; independent of tff_mf.factorization.families.tree."""
  nodes = dyadic_nodes(n)
  col = {node: k for k, node in enumerate(nodes)}
  b = np.zeros((n, len(nodes)))
  for t in range(n):
    start = 0
    while start <= t:  # greedily the largest aligned block inside [start, t]
      width = 1
      while start % (2 * width) == 0 and start + 2 * width - 1 <= t:
        width *= 2
      block = [nd for nd in nodes if start <= nd[0] and nd[1] <= start + width - 1]
      c_block = np.array([[1.0 if s <= leaf <= e else 0.0 for leaf in range(start, start + width)]
                          for s, e in block])
      # BLUE of 1ᵀx from y = C·x + noise: 1ᵀ·C⁺·y.
      weights = np.ones(width) @ np.linalg.pinv(c_block)
      for node, w in zip(block, weights):
        b[t, col[node]] += w
      start += width
  return b, np.array([[1.0 if s <= leaf <= e else 0.0 for leaf in range(n)] for s, e in nodes])


def plain_tree_decoder(n):
  """The tree without Honaker's weighting: round t adds the maximal complete nodes in [0, t]."""
  nodes = dyadic_nodes(n)
  b = np.zeros((n, len(nodes)))
  for t in range(n):
    start = 0
    while start <= t:
      width = 1
      while start % (2 * width) == 0 and start + 2 * width - 1 <= t:
        width *= 2
      b[t, nodes.index((start, start + width - 1))] = 1.0
      start += width
  return b


def _cov(b, sigma_over_k):
  return sigma_over_k**2 * b @ b.T


def _alternatives(b, scale, others):
  """The stated covariance with the noise std 5% off, and other mechanisms' covariances."""
  out = {"noise std 5% smaller": _cov(b, 0.95 * scale),
         "noise std 5% larger": _cov(b, 1.05 * scale)}
  out.update({name: _cov(other, scale) for name, other in others.items()})
  return out


def _check_epsilon(summary, effective_multiplier):
  """summary.json's ε: an upper bound within 1% of the analytic Gaussian ε at z/sens."""
  exact = statcheck.gaussian_epsilon(effective_multiplier, DELTA)
  assert summary["delta"] == DELTA
  assert exact <= summary["epsilon"] <= 1.01 * exact + 1e-6, (summary["epsilon"], exact)
  return exact


def _check_encoder(a, b, c):
  """B·C = A and every column of C has norm ≤ 1 (sens = 1 under single participation)."""
  np.testing.assert_allclose(b @ c, a, atol=1e-8)
  sens = float(np.max(np.linalg.norm(c, axis=0)))
  assert sens == pytest.approx(1.0, abs=1e-9)
  return sens


def _run(config, task):
  """run_training, reading the model after every round from its checkpoints."""
  models = {}

  def after_round(round_num):
    if round_num > 1:  # the callback runs before round_num's checkpoint is written
      models[round_num - 1] = _checkpointed_model(config.run_dir, round_num - 1)

  summary = loop.run_training(config, task=task, round_callback=after_round)
  models[config.total_rounds] = _checkpointed_model(config.run_dir, config.total_rounds)
  theta_0 = _initial_model(task, config.seed)
  deviations = np.stack([models[r] - theta_0 for r in range(1, config.total_rounds + 1)])
  return summary, deviations.T  # d x n: one sample per model coordinate


def test_decoders_built_here_agree_with_the_library_tree():
  """The least-squares Honaker decoder equals tff_mf's honaker_online (as B·Bᵀ, node order
  aside), and both factor the prefix sums through the tree encoder."""
  for n in (1, 2, 6, 8, 16):
    b, c_tree = honaker_decoder(n)
    np.testing.assert_allclose(b @ c_tree, prefix_sum(n), atol=1e-12)
    lib = tree_family.honaker_online_decoder(n)
    np.testing.assert_allclose(b @ b.T, lib @ lib.T, atol=1e-12)
    np.testing.assert_allclose(plain_tree_decoder(n) @ c_tree, prefix_sum(n), atol=1e-12)


# Dense matrix noise through the binary is also checked in a clean shell (opt_momentum,
# test_binary_adds_the_reported_noise_in_a_clean_shell): opt_prefix_sum is slow here.
# gaussian (TFF's gaussian_fixed with the seeded query of tests/test_query_noise.py) is slow
# here too: the suite keeps one TFF-owned aggregator (tree) and the clean-shell MF run.
@pytest.mark.parametrize("mechanism", [pytest.param("opt_prefix_sum", marks=pytest.mark.slow),
                                       pytest.param("gaussian", marks=pytest.mark.slow),
                                       "tree"])
def test_run_training_adds_the_reported_noise(configs, mechanism, task, tmp_path):
  if mechanism == "opt_prefix_sum":  # ε calibrated by the run (--target_epsilon)
    config = configs(tmp_path, mechanism, target_epsilon=3.0, noise_seed=SEED)
  elif mechanism == "gaussian":  # TFF's stateful RNG: no pinned seed
    config = configs(tmp_path, mechanism, noise_multiplier=0.8)
  else:
    config = configs(tmp_path, mechanism, noise_multiplier=0.8, noise_seed=SEED)
  summary, samples = _run(config, task)
  assert summary["finished"]
  z = summary["noise_multiplier"]
  info = summary["mechanism_info"]
  s = prefix_sum(ROUNDS)
  honaker, c_tree = honaker_decoder(ROUNDS)
  if mechanism == "opt_prefix_sum":
    with np.load(info["cache_npz"]) as f:  # the factorization the run reports it used
      a, b, c = f["A"], f["B"], f["C"]
    np.testing.assert_array_equal(a, s)
    sens = _check_encoder(a, b, c)
    scale = z * CLIP * SERVER_LR / CLIENTS
    others = {"independent noise (B = S)": s}
    exact = _check_epsilon(summary, z / sens)
    assert exact <= 3.0 < statcheck.gaussian_epsilon(0.99 * z / sens, DELTA)  # calibrated
  elif mechanism == "gaussian":
    b = s
    scale = z * CLIP * SERVER_LR / CLIENTS
    others = {"Honaker tree": honaker}
    _check_epsilon(summary, z)  # each client in one round: sens = 1
  else:
    z_node = info["noise_multiplier_per_node"]  # the value the run says it gave TFF
    sens_node = math.sqrt(np.max(c_tree.sum(axis=0)))  # √(nodes covering a round) = 2
    assert sens_node == 2.0 and z_node == pytest.approx(z * sens_node, rel=1e-12)
    b = honaker
    scale = z_node * CLIP * SERVER_LR / CLIENTS
    others = {"per-node multiplier z instead of z·sqrt(levels)": honaker / sens_node,
              "tree without Honaker weighting": plain_tree_decoder(ROUNDS)}
    _check_epsilon(summary, z_node / sens_node)
  statcheck.assert_covariance(samples, _cov(b, scale), ALPHA,
                              _alternatives(b, scale, others), what=mechanism)


def test_run_training_with_the_discrete_gaussian(configs, task, tmp_path):
  """--noise_distribution discrete_gaussian with gaussian (C = I): the models are
  θ_0 − (η/K)·S·(N/γ) up to rounding, N ~ N_ℤ(0, (zγζ)²) (variance σ²(1 − e^{−2π²σ²}·…), σ in
  the tens of thousands here, so the covariance test of (zζη/K)²·S·Sᵀ applies); summary.json
  names the analysis and reports its zCDP ε (Canonne, Kamath, Steinke 2020, Cor 13)."""
  from tff_mf.noise import discrete_gaussian as dg  # pylint: disable=g-import-not-at-top
  config = configs(tmp_path, "gaussian", noise_multiplier=0.8, noise_seed=SEED,
                   noise_distribution="discrete_gaussian")
  summary, samples = _run(config, task)
  assert summary["finished"]
  info = summary["mechanism_info"]
  assert info["noise_distribution"] == "discrete_gaussian"
  assert info["rounding_inflation"] <= dg.ROUNDING_INFLATION
  assert info["discrete_gaussian_sigma"] == 0.8 * CLIP * info["granularity"] > 1000
  assert summary["privacy"]["analysis"] == "discrete_gaussian"
  text = summary["privacy_statement"]["text"]
  assert "discrete Gaussian" in text and "sums without noise" in text
  # The statement names the run's own gamma, sigma and rounding share, and the conversion.
  for figure in (info["granularity"], info["discrete_gaussian_sigma"]):
    assert analyses.fmt(figure) in text
  assert f"this run's rounding: {100 * info['rounding_inflation']:.2g}%" in text
  assert "Cor 13" in text
  sens = summary["privacy"]["encoder_sensitivity"]  # C = I: 1, as an upper bound
  assert 1.0 <= sens <= 1.0 + 1e-9
  assert summary["epsilon"] == pytest.approx(dg.epsilon(0.8, DELTA, sens), rel=1e-12)
  assert summary["epsilon"] > statcheck.gaussian_epsilon(0.8 / (1 + dg.ROUNDING_INFLATION), DELTA)
  s = prefix_sum(ROUNDS)
  scale = 0.8 * CLIP * SERVER_LR / CLIENTS
  statcheck.assert_covariance(samples, _cov(s, scale), ALPHA,
                              _alternatives(s, scale, {"banded-like decoder": 0.5 * (s + np.eye(
                                  ROUNDS))}), what="discrete_gaussian")


def test_binary_adds_the_reported_noise_in_a_clean_shell(tiny_task, tmp_path):
  """training/run_stackoverflow.py from a clean environment: opt_momentum (β = 0.9, so the
  server optimizer's momentum is part of A = B·C), z calibrated to --target_epsilon. The
  run keeps its last three checkpoints; their rounds are the samples' coordinates."""
  n, beta, target = 6, 0.9, 5.0
  flags = dict(MODEL, mechanism="opt_momentum", total_rounds=n, clients_per_round=CLIENTS,
               client_lr=CLIENT_LR, clip_norm=CLIP, server_lr=SERVER_LR, server_momentum=beta,
               target_epsilon=target, delta=DELTA, noise_seed=SEED, rounds_per_eval=n,
               rounds_per_checkpoint=1, root_output_dir=tmp_path / "runs",
               experiment_name="momentum", cache_dir=tmp_path / "cache", progress=False)
  args = [f"--{k}={v}" if not isinstance(v, bool) else f"--{'' if v else 'no'}{k}"
          for k, v in flags.items()]
  (tmp_path / "home").mkdir()
  result = subprocess.run([sys.executable, os.path.join(userenv.REPO, "training",
                                                        "run_stackoverflow.py"), *args],
                          cwd=tmp_path, env=userenv.env(home=tmp_path / "home"),
                          capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-4000:]
  run_dir = tmp_path / "runs" / "momentum"
  summary = json.loads((run_dir / "summary.json").read_text())
  assert summary["finished"]
  rounds = sorted(int(name.rsplit("_", 1)[1]) for name in os.listdir(run_dir / "checkpoints")
                  if name.startswith("checkpoint_"))
  assert rounds == [n - 2, n - 1, n]
  config = config_lib.TrainingConfig(**{k: v for k, v in flags.items()
                                        if k not in ("root_output_dir", "cache_dir")})
  task = tiny_task(config)  # the module's task: the same data and model
  theta_0 = _initial_model(task, config.seed)
  models = [_checkpointed_model(run_dir, r) for r in rounds]
  with np.load(run_dir / "final_model.npz") as final:
    np.testing.assert_array_equal(_flat(final[k] for k in final.files), models[-1])
  samples = np.stack([m - theta_0 for m in models]).T
  with np.load(summary["mechanism_info"]["cache_npz"]) as f:
    a, b, c = f["A"], f["B"], f["C"]
  np.testing.assert_allclose(a, momentum_workload(n, beta), atol=1e-12)
  sens = _check_encoder(a, b, c)
  z = summary["noise_multiplier"]
  exact = _check_epsilon(summary, z / sens)
  assert exact <= target < statcheck.gaussian_epsilon(0.99 * z / sens, DELTA)
  scale = z * CLIP * SERVER_LR / CLIENTS
  rows = [r - 1 for r in rounds]
  sub = b[rows]
  prefix_b = prefix_sum(n)[rows]  # the same noise without the momentum
  statcheck.assert_covariance(samples, _cov(sub, scale), ALPHA,
                              _alternatives(sub, scale, {"momentum left out of A": prefix_b}),
                              what="binary opt_momentum")
