"""End to end: TFF federated averaging + build_mechanism == numpy Algorithm 1 (Denisov et al.).

A linear model on synthetic clients; every round K clients take one full-batch
SGD step, TFF clips and sums their deltas, adds the mechanism's noise row and
the server optimizer applies momentum β and the learning-rate schedule. The
iterates must equal θ_i = −(η/K)·(A·G + B·Z)[i] of Algorithm 1 (Denisov et al. 2022, arXiv:2202.08312,
Sec 4) computed in numpy with the same seed and the same clipped gradients.
"""

import asyncio
import json
import os

import dp_accounting
from dp_accounting.pld import pld_privacy_accountant
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_mf.spec import MechanismSpec
from tff_mf.tf import aggregators
from tff_mf import participation
from tff_mf import registry
from tff_mf.tf import noise as noise_lib
from tff_mf.tf import runtime

D_IN, K, N = 3, 3, 5
CLIENT_LR, CLIP, SERVER_LR, Z_MULT, SEED = 0.1, 0.5, 0.5, 0.7, 42
MOMENTUM, SCHEDULE, SCHEDULE_ROUNDS = 0.9, "decay", 2
SPECS = [tf.TensorSpec([D_IN, 1], tf.float32), tf.TensorSpec([1], tf.float32)]
INPUT_SPEC = (tf.TensorSpec([None, D_IN], tf.float32), tf.TensorSpec([None, 1], tf.float32))

runtime.install_exit_hook()


def _client_data(rounds=N + 1):
  rng = np.random.default_rng(0)
  return [[(rng.normal(size=(4, D_IN)).astype(np.float32),
            rng.normal(size=(4, 1)).astype(np.float32)) for _ in range(K)]
          for _ in range(rounds)]


DATA = _client_data()


def model_fn():
  keras_model = tf.keras.Sequential([tf.keras.layers.Dense(
      1, kernel_initializer="zeros", bias_initializer="zeros", input_shape=(D_IN,))])
  return tff.learning.models.from_keras_model(
      keras_model, loss=tf.keras.losses.MeanSquaredError(), input_spec=INPUT_SPEC)


def _datasets(i):
  return [tf.data.Dataset.from_tensor_slices(d).batch(4) for d in DATA[i]]


def _weights(process, state):
  return np.concatenate([np.asarray(x, np.float64).ravel()
                         for x in process.get_model_weights(state).trainable])


def _run(process, state, rounds, start=0, cohorts=None):
  thetas = []
  for i in range(start, start + rounds):
    state = process.next(state, _datasets(i % cohorts if cohorts else i)).state
    thetas.append(_weights(process, state))
  return thetas, state


def algorithm1(setup, rounds=N, noise=True, cohorts=None, noise_rows=None):
  """Denisov Algorithm 1 in float64 with gradients of the same clients at the same iterates.

  ``cohorts``: the clients of round i are those of round i mod cohorts (repeated
  participation: the same clients contribute every ``cohorts`` rounds). ``noise_rows``: the
  per-round noise N·Z given instead of B·Z (released = A·(G + N·Z)).
  """
  f = setup.factorization
  a = f.a if f is not None else None
  theta = np.zeros(D_IN + 1)
  g = np.zeros((rounds, D_IN + 1))
  if noise:
    z = Z_MULT * CLIP * noise_lib.standard_normal_matrix(noise_lib.seed_pair(SEED), f.m, SPECS)
  out = []
  for i in range(rounds):
    for x, y in DATA[i % cohorts if cohorts else i]:
      x, y = x.astype(np.float64), y[:, 0].astype(np.float64)
      resid = x @ theta[:D_IN] + theta[D_IN] - y
      grad = np.concatenate([2 / len(y) * x.T @ resid, [2 / len(y) * resid.sum()]])
      delta = CLIENT_LR * grad
      g[i] += delta * min(1.0, CLIP / np.linalg.norm(delta))
    released = a[i, :i + 1] @ g[:i + 1]
    if noise_rows is not None:
      released = a[i, :i + 1] @ (g[:i + 1] + noise_rows[:i + 1])
    elif noise:
      released = released + f.b[i] @ z
    theta = -(SERVER_LR / K) * released
    out.append(theta)
  return np.array(out)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("tff_mf_cache"))


def _setup(mechanism, cache_dir, noise_multiplier=Z_MULT, noise_seed=SEED, **kw):
  args = dict(total_rounds=N, noise_multiplier=noise_multiplier, clients_per_round=K,
              clip_norm=CLIP, momentum=MOMENTUM, lr_schedule=SCHEDULE,
              schedule_rounds=SCHEDULE_ROUNDS)
  args.update(kw)
  return aggregators.build_mechanism(MechanismSpec.from_args(mechanism, **args),
                                     server_learning_rate=SERVER_LR, noise_seed=noise_seed,
                                     cache_dir=cache_dir)


def _process(setup, weighted=False):
  build = (tff.learning.algorithms.build_weighted_fed_avg if weighted
           else tff.learning.algorithms.build_unweighted_fed_avg)
  return build(model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(CLIENT_LR),
               server_optimizer_fn=setup.server_optimizer,
               model_aggregator=setup.aggregation_factory)


_PROCESSES = {}


def _built(mechanism, cache_dir):
  if mechanism not in _PROCESSES:
    setup = _setup(mechanism, cache_dir)
    _PROCESSES[mechanism] = (setup, _process(setup))
  return _PROCESSES[mechanism]


MATRIX_MECHANISMS = tuple(m for m in registry.mechanism_names(trainable=True)
                          if registry.mechanism(m).noise in ("dense_rows", "linear"))


@pytest.mark.parametrize("mechanism", MATRIX_MECHANISMS)
def test_iterates_equal_numpy_algorithm1(mechanism, cache_dir):
  setup, process = _built(mechanism, cache_dir)
  thetas, state = _run(process, process.initialize(), N)
  expected = algorithm1(setup)
  np.testing.assert_allclose(np.array(thetas), expected, rtol=1e-4, atol=1e-5)
  assert np.max(np.abs(expected - algorithm1(setup, noise=False))) > 1e-2  # noise is present
  if mechanism == "honaker_online":
    with pytest.raises(Exception, match="past the n=5 rounds"):
      process.next(state, _datasets(N))


@pytest.mark.parametrize("mechanism", ["banded", "blt"])
def test_record_stream_run_in_numpy_is_the_aggregators_noise(mechanism, cache_dir):
  """The numpy layer (tff_mf.mechanisms): the resolved mechanism's LinearStream, run in float64
  numpy for a few rounds on the Z the query draws, is the noise the TFF aggregator adds, and
  its privacy record holds the z and z/sens the aggregator was built with."""
  setup, process = _built(mechanism, cache_dir)
  resolved, record = setup.mechanism, setup.privacy
  assert resolved.stream is not None and resolved.encoder is setup.factorization.c
  assert record.noise_multiplier == Z_MULT
  assert record.effective_noise_multiplier == setup.info["effective_noise_multiplier"]
  assert record.effective_noise_multiplier == pytest.approx(Z_MULT / resolved.sensitivity)
  thetas, _ = _run(process, process.initialize(), N)
  z = Z_MULT * CLIP * noise_lib.standard_normal_matrix(noise_lib.seed_pair(SEED),
                                                       resolved.stream.n, SPECS)
  expected = algorithm1(setup, noise_rows=resolved.stream.run(z))
  np.testing.assert_allclose(np.array(thetas), expected, rtol=1e-4, atol=1e-5)
  assert np.max(np.abs(expected - algorithm1(setup, noise=False))) > 1e-2  # noise is present


@pytest.mark.parametrize("mechanism,schema", [
    ("opt_momentum", participation.fixed_epoch(2)),
    ("opt_prefix_sum", participation.fixed_epoch(2)),
    ("banded", participation.min_sep(3, 2)),
    ("banded_toeplitz", participation.min_sep(3, 2)),
    ("blt", participation.min_sep(3, 2)),
    ("honaker_online", participation.fixed_epoch(2)),
])
def test_repeated_participation_iterates_equal_numpy_algorithm1(mechanism, schema, cache_dir):
  """The same clients contribute in rounds i and i + 3 (6 rounds, 3 cohorts): their clipped
  updates enter G in each of those rounds, and the noise is the schema's mechanism's."""
  rounds, cohorts = 6, 3
  kw = {"bands": 3} if mechanism in ("banded", "banded_toeplitz") else {}
  setup = _setup(mechanism, cache_dir, total_rounds=rounds, participation=schema, **kw)
  process = _process(setup)
  thetas, _ = _run(process, process.initialize(), rounds, cohorts=cohorts)
  expected = algorithm1(setup, rounds=rounds, cohorts=cohorts)
  np.testing.assert_allclose(np.array(thetas), expected, rtol=1e-4, atol=1e-5)
  assert setup.info["participation"]["kind"] == schema.kind
  assert setup.info["sensitivity"] > 1.0  # k = 2 participations cost more than one
  assert setup.info["effective_noise_multiplier"] == pytest.approx(
      Z_MULT / setup.info["sensitivity"])


@pytest.mark.parametrize("mechanism", ["gaussian_fixed", "tree_aggregation"])
def test_tff_baselines_share_the_server_algebra(mechanism, cache_dir):
  """With z = 0 the TFF baselines release A·G exactly (their noise RNG is TFF's own)."""
  setup = _setup(mechanism, cache_dir, noise_multiplier=0.0, noise_seed=None,
                 allow_no_noise=True)
  process = _process(setup)
  thetas, _ = _run(process, process.initialize(), 3)
  reference = _setup("honaker_online", cache_dir)
  np.testing.assert_allclose(np.array(thetas), algorithm1(reference, rounds=3, noise=False),
                             rtol=1e-4, atol=1e-5)


def test_weighted_fed_avg_accepts_the_aggregator(cache_dir):
  setup = _setup("opt_momentum", cache_dir)
  process = _process(setup, weighted=True)
  thetas, _ = _run(process, process.initialize(), 2)
  np.testing.assert_allclose(np.array(thetas), algorithm1(setup)[:2], rtol=1e-4, atol=1e-5)


def test_checkpoint_restore_continues_identically(cache_dir, tmp_path):
  setup, process = _built("structured", cache_dir)
  start = process.initialize()
  straight, _ = _run(process, start, N)
  manager = tff.program.FileProgramStateManager(str(tmp_path / "program_state"))
  first, state = _run(process, start, 2)
  asyncio.run(manager.save(state, 2))
  restored, version = asyncio.run(manager.load_latest(process.initialize()))
  assert version == 2
  rest, _ = _run(process, restored, N - 2, start=2)
  np.testing.assert_array_equal(np.array(first + rest), np.array(straight))


def test_dp_events_from_tff_state_compose_to_thm41(cache_dir):
  setup, process = _built("honaker_online", cache_dir)
  state = process.initialize()
  events = []
  for i in range(N):
    state = process.next(state, _datasets(i)).state
    events.append(aggregators.dp_event_from_state(state.aggregator))
  accountant = pld_privacy_accountant.PLDAccountant()
  accountant.compose(dp_accounting.ComposedDpEvent(events))
  reference = pld_privacy_accountant.PLDAccountant()
  reference.compose(dp_accounting.GaussianDpEvent(Z_MULT))
  assert accountant.get_epsilon(1e-6) == pytest.approx(reference.get_epsilon(1e-6), rel=1e-9)


def test_unpinned_seed_runs_differ(cache_dir):
  setup = _setup("opt_prefix_sum", cache_dir, noise_seed=None)
  process = _process(setup)
  a, _ = _run(process, process.initialize(), 1)
  b, _ = _run(process, process.initialize(), 1)
  assert not np.allclose(a, b)


def test_a_new_family_is_one_module_and_one_registry_entry(cache_dir, capsys):
  """The family protocol (tff_mf.factorization.families): a family module (tests/toy_family.py) plus one
  registry entry added at run time factorizes, caches, accounts and trains through
  build_mechanism; no other file names it."""
  from tff_mf.factorization import cache, strategies, workloads  # pylint: disable=g-import-not-at-top
  from tff_mf import cli, mechanisms  # pylint: disable=g-import-not-at-top
  registry.register(
      registry.Strategy("toy_geometric", "toy_family", "toy", "Toeplitz C with taps 2^-j, j < b",
                        "none (a test family)"),
      registry.Mechanism("toy_geometric", ("toy",), "toy", "the toy family for the training "
                         "workload", "toy_geometric", "training", "dense_rows",
                         registry.PARTICIPATIONS))
  try:
    rounds, cohorts, schema = 6, 3, participation.min_sep(3, 2)
    assert registry.default_parameters("toy_geometric", rounds, schema) == {"bands": 3}
    assert strategies.cached("toy_geometric")
    # tff-mf factorize computes it, then serves it from the cache.
    argv = ["factorize", "--mechanism", "toy_geometric", "--total_rounds", str(rounds), "--bands",
            "2", "--cache-dir", cache_dir, "--json"]
    records = []
    for _ in range(2):
      assert cli.main(argv) == 0
      records.append(json.loads(capsys.readouterr().out))
    assert records[0]["strategy"] == "toy_geometric"
    assert records[0]["sensitivity"] == pytest.approx(1.0, rel=1e-12)  # γ(C) = 1 after normalizing
    assert records[1]["seconds"] == records[0]["seconds"]  # the second run read the stored entry
    spec = strategies.FactorizationSpec(workload=workloads.WorkloadSpec("prefix_sum", rounds),
                                        strategy="toy_geometric", bands=2)
    f, entry = cache.load_or_factorize(spec, cache_dir=cache_dir)
    assert entry.cache_hit and os.path.basename(os.path.dirname(entry.npz_path)).startswith(
        "toy_geometric-b2-prefix_sum-n6")
    np.testing.assert_allclose(f.b @ f.c, f.a, atol=1e-12)
    # It accounts: tff-mf account on its cached matrix, and the mechanism layer's calibration.
    assert cli.main(["account", "--matrix", entry.npz_path, "--noise-multiplier", "2",
                     "--delta", "1e-5", "--json"]) == 0
    accounted = json.loads(capsys.readouterr().out)
    resolved = mechanisms.resolve(registry.mechanism("toy"), spec.workload, participation.SINGLE,
                                  cache_dir=cache_dir, bands=2)
    record = mechanisms.privacy(resolved, 2.0, None, 1e-5, "exact")
    assert record.epsilon == pytest.approx(accounted["epsilon"], rel=1e-9)
    calibrated = mechanisms.privacy(resolved, None, record.epsilon, 1e-5, "exact")
    # The smallest z meeting ε(z = 2) is 2; calibration returns it within its 1e-3 tolerance.
    assert calibrated.epsilon <= record.epsilon
    assert calibrated.noise_multiplier <= 2.0 * (1 + 1e-3)
    # It trains: TFF FedAvg with its noise equals numpy Algorithm 1 under the min-sep schema.
    with capsys.disabled():  # TFF may start its worker binary here, which needs a real stdout
      setup = _setup("toy", cache_dir, total_rounds=rounds, participation=schema)
      process = _process(setup)
      thetas, _ = _run(process, process.initialize(), rounds, cohorts=cohorts)
    np.testing.assert_allclose(np.array(thetas), algorithm1(setup, rounds=rounds, cohorts=cohorts),
                               rtol=1e-4, atol=1e-5)
    assert setup.info["mechanism"] == "toy_geometric" and setup.info["bands"] == 3
    assert setup.info["sensitivity"] > 1.0
  finally:
    registry.unregister(strategy_name="toy_geometric", mechanism_name="toy_geometric")
  with pytest.raises(registry.RegistryError, match="unknown mechanism 'toy'"):
    registry.mechanism("toy")


@pytest.mark.parametrize("mechanism", ["opt_momentum", "blt"])
def test_a_cache_hit_checks_the_product_and_the_sensitivity_once(mechanism, cache_dir,
                                                                  monkeypatch):
  """build_mechanism on a cached entry: checks.factors, the full B·C product and the
  sensitivity under the schema each run once (the cache's load computes them; the mechanism
  layer and the noise reuse them)."""
  from tff_mf import checks  # pylint: disable=g-import-not-at-top
  schema = participation.fixed_epoch(2) if mechanism == "opt_momentum" \
      else participation.min_sep(3, 2)
  _setup(mechanism, cache_dir, total_rounds=6, participation=schema)  # fills the cache
  calls = {}
  for module, name in ((checks, "factors"), (checks, "product"),
                       (participation, "sensitivity_report")):
    original = getattr(module, name)

    def counted(*args, _original=original, _name=name, **kwargs):
      calls[_name] = calls.get(_name, 0) + 1
      return _original(*args, **kwargs)
    monkeypatch.setattr(module, name, counted)
  setup = _setup(mechanism, cache_dir, total_rounds=6, participation=schema)
  assert setup.info["cache_hit"]
  assert calls == {"factors": 1, "product": 1, "sensitivity_report": 1}


def test_stateless_and_stateful_banded_inverse_streams_add_the_same_noise(cache_dir):
  """BISR's C⁻¹ is banded: regenerating round i's b rows of Z from the seed (no state) and
  running the FIR recurrence (b − 1 state rows) add the same noise C⁻¹·Z, Algorithm 1's."""
  from tff_mf import checks  # pylint: disable=g-import-not-at-top
  setups = {kind: _setup("bisr", cache_dir, bands=3, noise_stream=kind)
            for kind in ("stateful", "stateless")}
  assert setups["stateful"].info["state_rows"] == 2 and setups["stateless"].info["state_rows"] == 0
  assert setups["stateless"].noise.row_nonzeros(N - 1) == 3  # b rows of Z, not i + 1
  thetas = {}
  for kind, setup in setups.items():
    process = _process(setup)
    thetas[kind] = np.array(_run(process, process.initialize(), N)[0])
  expected = algorithm1(setups["stateless"])
  for kind in setups:
    np.testing.assert_allclose(thetas[kind], expected, rtol=1e-4, atol=1e-5)
  for mechanism, kind in (("opt_momentum", "stateful"), ("tree", "stateless"),
                          ("bisr", "cheap")):
    with pytest.raises(checks.CheckError, match="noise_stream"):
      _setup(mechanism, cache_dir, noise_stream=kind)
