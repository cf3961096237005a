"""The Flower wrapper in Flower's own simulation engine (``make test-flower``, .venv-flower).

Clients return fixed updates, so each released model is the wrapper's output: the noise has
covariance σ²/K²·C⁻¹C⁻ᵀ, the iterates are Algorithm 1's (Denisov et al. 2022,
arXiv:2202.08312), ε matches ``tff-mf account``, the budget and the n rounds stop a run, and
a restarted server continues the same stream.
"""

import json
import os
import stat
import subprocess
import sys

import numpy as np
import pytest
import scipy.linalg
from flwr.serverapp import NeighboringRelation, PrivacyConfig, SamplingMethod
from flwr.serverapp.exception import PrivacyBudgetExhausted
from flwr.serverapp.strategy import FedAvg

import simulation
import userenv
from tff_mf.accounting import adaptive_clipping
from tff_mf import checks
from tff_mf import participation
from tff_mf.noise import rows as noise_lib
from tff_mf.flower import strategy as strategy_lib

N, K, CLIP, Z = 8, 2, 1.0, 1.5


def fedavg(fraction=1.0):
  return FedAvg(fraction_train=fraction, fraction_evaluate=0.0)


def wrapper(mechanism="blt", cls=strategy_lib.MatrixFactorizationFixedClipping, **overrides):
  kwargs = dict(total_rounds=N, clients_per_round=K, clip_norm=CLIP, noise_multiplier=Z,
                delta=1e-5, participation=participation.fixed_epoch(2), noise_seed=7,
                sampling_seed=1, sampling_secret=2, population=8)
  kwargs.update(overrides)
  return cls(fedavg(), mechanism, **kwargs)


def test_released_noise_has_the_mechanism_covariance_and_stops_at_n():
  """Zero updates, momentum 0.9 and a cooldown: A⁻¹·(θ_i − θ_0) are the noise rows, whose
  covariance over d = 20,480 coordinates is σ²/K²·C⁻¹C⁻ᵀ within 6 standard errors of its
  estimate; n + 1 rounds are refused in one line before round 1."""
  shapes = [(20000,), (10, 48)]

  def make():
    return wrapper(momentum=0.9, lr_schedule="cooldown", schedule_rounds=3)
  with pytest.raises(checks.CheckError) as err:
    simulation.run(make, shapes, N + 1, 8, record=True)
  assert "num_rounds=9 is more than the 8 rounds" in str(err.value)
  assert "\n" not in str(err.value) and simulation.LAST["models"] == []
  out = simulation.run(make, shapes, N, 8, record=True)
  w = out["strategy"]
  models = np.stack(out["models"])
  assert models.shape == (N + 1, 20480)  # θ_0 .. θ_n, then the refusal
  a = w.spec.workload.build()
  x = scipy.linalg.solve_triangular(a, models[1:] - models[0], lower=True)  # η_server = 1
  c = w.resolved.factorization.c
  c_inv = scipy.linalg.solve_triangular(c, np.eye(N), lower=True)
  want = (Z * CLIP / K) ** 2 * c_inv @ c_inv.T
  d = x.shape[1]
  got = x @ x.T / d
  stderr = np.sqrt((np.outer(np.diag(want), np.diag(want)) + want ** 2) / d)
  assert np.all(np.abs(got - want) <= 6 * stderr), np.max(np.abs(got - want) / stderr)


def test_iterates_are_algorithm_1_and_max_epsilon_stops_the_run():
  """Clients with updates of norms 0.5..3 (clipped to 1): θ_i = θ_0 + η·(A·X)[i], X the
  clipped mean plus the released noise; Flower's PrivacyConfig(max_epsilon) between ε after
  rounds 3 and 4 stops the run before round 4, and ε is reported through the accountant."""
  def update(node, model):
    v = np.zeros(model.size)
    v[node % model.size] = 0.5 * (node % 5 + 1)
    return v

  probe = wrapper(momentum=0.5)
  eps = probe.record.epsilon_by_round()
  config = PrivacyConfig(target_delta=1e-5, population_size=8,
                         neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
                         sampling_method=SamplingMethod.NO_AMPLIFICATION,
                         max_epsilon=(eps[2] + eps[3]) / 2)

  def make():
    return wrapper(momentum=0.5, server_learning_rate=0.5, privacy_config=config)

  with pytest.raises(PrivacyBudgetExhausted):
    simulation.run(make, [(6,)], N, 8, update=update, record=True)
  out = simulation.LAST
  w = out["strategy"]
  assert w.rounds_done == 3
  spent = w.privacy_spent()
  assert spent.epsilon == pytest.approx(eps[2], rel=1e-12) and spent.num_releases == 3
  models = np.stack(out["models"])
  # The noise rows the seed gives (an independent NoiseRows on the wrapper's seed); the
  # clients of round i are fixed-epoch cohort (i − 1) mod b, with their clipped mean:
  rows = noise_lib.NoiseRows(w.resolved, [(6,)], w.noise.seed)
  cohorts = [[w.sampler.client_ids[j] for j in row] for row in w.sampler.cohorts]
  x = []
  for i in range(3):
    total = np.zeros(6)
    for node in cohorts[i % len(cohorts)]:
      u = update(int(node), np.zeros(6))
      total += u * min(1.0, CLIP / np.linalg.norm(u))
    x.append(total / K + rows.next(Z * CLIP)[0] / K)
  a = w.spec.workload.build()[:3, :3]
  want = models[0] + 0.5 * a @ np.stack(x)
  # float32 models: each round rounds θ_i once (relative 2⁻²⁴), three rounds at most.
  assert np.allclose(models[1:4], want, rtol=0, atol=4 * 2.0 ** -24 * np.max(np.abs(want)) + 1e-7)


def test_fixed_epoch_epsilon_equals_tff_mf_account():
  w = wrapper()
  cmd = [sys.executable, "-m", "tff_mf.cli", "account", "--mechanism", "blt", "--total_rounds",
         str(N), "--participation", "fixed_epoch", "--epochs", "2", "--noise_multiplier",
         str(Z), "--delta", "1e-5", "--json"]
  res = subprocess.run(cmd, env=userenv.env(pythonpath=True), capture_output=True, text=True,
                       timeout=300, check=True)
  account = json.loads(res.stdout)["epsilon"]
  assert w.record.epsilon_by_round()[-1] == account
  assert w.record.epsilon == account


def test_restarted_server_continues_the_same_stream(tmp_path):
  """4 rounds straight equal 2 rounds, a restart from the private state file (seeds read
  from it, not pinned), then 2 more: the same cohorts and models, so the same noise. (The
  simulation engine gives its nodes new ids each run, so every client sends the same update.)
  """
  def update(node, model):
    del node
    return np.full(model.size, 0.3)

  first = simulation.run(lambda: wrapper(total_rounds=4, momentum=0.5, population=4), [(5,)],
                         4, 4, update=update, record=True)
  straight, cohorts = first["models"][-1], first["strategy"].sampler.cohorts.copy()
  path = str(tmp_path / "state.npz")
  simulation.run(lambda: wrapper(total_rounds=4, momentum=0.5, state_path=path, population=4), [(5,)], 2, 4,
                 update=update, record=True)
  assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
  saved = strategy_lib.saved_model(path)
  resumed = simulation.run(
      lambda: wrapper(total_rounds=4, momentum=0.5, state_path=path, noise_seed=None,
                      sampling_seed=None, sampling_secret=None, population=4),
      [(5,)], 2, 4, update=update, initial=list(saved.values()), record=True)
  assert np.array_equal(resumed["models"][-1], straight)
  assert np.array_equal(resumed["strategy"].sampler.cohorts, cohorts)


@pytest.mark.parametrize("make, words", [
    (lambda: wrapper("no_such_mechanism"), "no_such_mechanism"),
    (lambda: strategy_lib.MatrixFactorizationFixedClipping(
        fedavg(0.5), "blt", total_rounds=N, clients_per_round=K, clip_norm=CLIP,
        noise_multiplier=Z, participation=participation.fixed_epoch(2)),
     "fraction_train=0.5"),
    (lambda: wrapper(cls=strategy_lib.MatrixFactorizationAdaptiveClipping), "clip_norm=1.0"),
    (lambda: wrapper("tree"), "honaker_online"),
    (lambda: wrapper(participation=participation.fixed_epoch(3)), "epochs"),
    (lambda: wrapper(clip_norm="adaptive"), "MatrixFactorizationAdaptiveClipping"),
    (lambda: wrapper("gaussian", noise_distribution="discrete_gaussian"), "continuous noise"),
])
def test_bad_configuration_is_a_one_line_error(make, words):
  with pytest.raises(checks.CheckError) as err:
    make()
  assert words in str(err.value) and "\n" not in str(err.value)


def test_too_few_clients_for_the_schema_is_refused_in_the_engine():
  """b = 4 cohorts of K = 2 need 8 clients; 5 is a one-line error before round 1."""
  with pytest.raises(checks.CheckError) as err:
    simulation.run(lambda: wrapper(population=5), [(3,)], N, 5)
  assert "too few" in str(err.value) and "\n" not in str(err.value)


def test_adaptive_clipping_follows_the_noisy_quantile_estimate():
  """ζ_{i+1} is the geometric update from the count of unclipped updates plus σ_b times the
  TF query's count draw for the seed (``adaptive_clipping.reference_clips``); each round's
  noise is scaled to its ζ_i; ε composes the count queries (the core's record)."""
  def update(node, model):
    return np.full(model.size, 0.037 * (node % 7 + 1))

  def make():
    return wrapper(cls=strategy_lib.MatrixFactorizationAdaptiveClipping, clip_norm="adaptive",
                   adaptive=adaptive_clipping.AdaptiveClipping(0.5, 0.2, 0.5))

  out = simulation.run(make, [(4,)], N, 8, update=update)
  w = out["strategy"]
  a = w.spec.adaptive
  cohorts = [[int(w.sampler.client_ids[j]) for j in row] for row in w.sampler.cohorts]
  # the norms the server sees: of the float32 updates the clients sent
  norms = [[np.linalg.norm(update(node, np.zeros(4)).astype(np.float32).astype(np.float64))
            for node in cohorts[i % len(cohorts)]] for i in range(N)]
  draws = [a.clipped_count_stddev * noise_lib.count_noise(w.noise.seed, i) for i in range(N)]
  clips = adaptive_clipping.reference_clips(norms, a, K, count_noise=draws)
  assert w.clip_norm == pytest.approx(clips[-1], rel=1e-12)
  rows = noise_lib.NoiseRows(w.resolved, [(4,)], w.noise.seed)
  models = np.stack(out["models"])
  for i in range(N):
    total = sum(update(node, np.zeros(4)) * min(1.0, clips[i] / norm)
                for node, norm in zip(cohorts[i % len(cohorts)], norms[i]))
    want = total / K + rows.next(Z * clips[i])[0] / K
    # float32 models: θ_i and the clients' θ_i + u are rounded (relative 2⁻²⁴ each)
    tol = 8 * 2.0**-24 * (np.max(np.abs(models[i:i + 2])) + np.max(np.abs(want)))
    assert np.allclose(models[i + 1] - models[i], want, rtol=0, atol=tol)
  assert len(set(np.round(clips, 12))) > 1  # the estimate moved
  assert w.record.epsilon_by_round()[-1] == w.record.epsilon
  assert w.record.details.get("clipped_count_stddev") == a.clipped_count_stddev
