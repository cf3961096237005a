"""The compiled engine (``training.engine``) equals TFF's learning process, by test.

Both processes are built from one ``training.run_setup`` setup (one pinned noise seed), start
from one state and train the same clients in the same order.

Noise: with a client learning rate of 0 (``state.client_work``, the hyperparameter both
engines read) every client update is exactly 0, so each round's released model is the
initial model moved by the server optimizer along the query's noise alone. The models and
the aggregator states (the query's state: seeds, round index, the noise rows a stateful
stream keeps, TFF's tree buffers; and the DpEvent) must be bit-identical in every round.

Training: each round starts both engines from the same state (TFF's state after the round
before), so the only difference allowed is the float32 summation order of the round's sum of
K clipped records (TFF's ``federated_sum`` against the compiled engine's running sum; the
client updates are TFF's own function, the same steps over the same batches on the same
kernels, its loop a dataset iterator instead of ``dataset.reduce``). Higham 2002 (Accuracy and
Stability of Numerical Algorithms, Eq. 4.4): a sum of K terms in any order is within
γ_K·Σ_k|x_k| of the exact sum, γ_K = K·u/(1 − K·u), u = 2⁻²⁴; a clipped record has
|x_k,j| ≤ ‖x_k‖ ≤ ζ (for ``none``, B = the largest client update coordinate, measured with
one-client rounds), so two orders differ by at most 2·γ_K·K·B in the sum and 2·γ_K·B in the
mean the server optimizer steps along, scaled by η_server (momentum adds the same difference
to its accumulator once). The last operations (the division by K, the momentum update and
θ − η·a) round once more in each engine: 4·u·M with M the largest magnitude among the
weights, the step and the accumulator. The tolerance is the sum of the two, per round.

Privacy: the DpEvent of every round is identical; ε, the DpEvent ledger and the privacy
statement of the training loop are identical between the engines, and a run checkpointed
on one engine resumes on the other with the same releases (client learning rate 1e-20, as
in tests/test_training_noise.py: the model is then the noise path, bit for bit).
"""

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from training import config as config_lib
from training import engine
from training import loop
from training import run_setup
from training import task as task_lib

import userenv

ROUNDS = 4
CLIENTS = 3
CLIENT_LR = 0.5
SERVER_LR = 0.7
CLIP = 0.5
SEED = 20261126
U = 2.0 ** -24
MODEL = dict(client_batch_size=4, max_elements_per_client=8, seed=1)  # on conftest's tiny one
# (mechanism, participation, adaptive clipping); the default suite keeps TFF's tree, a
# dense MF mechanism with momentum, and a stateful stream with adaptive clipping.
# opt_momentum's equality runs by default on the block LSTM (below), the tree's here.
DEFAULT_CASES = [("tree", "single", False), ("banded", "fixed_epoch", True),
                 ("nonprivate_clipped", "fixed_epoch", False)]
ALL_CASES = [(m, p, False) for m in ("none", "nonprivate_clipped", "tree", "gaussian",
                                     "opt_momentum", "banded",
                                     "blt", "bisr") for p in ("single", "fixed_epoch")] + [
                                         ("gaussian", p, True) for p in ("single",
                                                                         "fixed_epoch")] + [
                                         ("banded", "single", True)]
SLOW_CASES = [c for c in ALL_CASES if c not in DEFAULT_CASES]


def _config(tiny_config, root, mechanism, participation, adaptive, **kw):
  values = dict(MODEL, mechanism=mechanism, total_rounds=ROUNDS, clients_per_round=CLIENTS,
                client_lr=CLIENT_LR, server_lr=SERVER_LR, clip_norm=CLIP,
                server_momentum=0.0 if mechanism in ("tree", "gaussian", "banded", "blt",
                                                     "bisr") else 0.9,
                participation=participation, noise_seed=SEED, cache_dir=str(root / "cache"))
  if config_lib.is_private(mechanism):
    values["noise_multiplier"] = 0.8
  else:
    values["noise_seed"] = None
  if participation == "fixed_epoch":
    values["epochs"] = 2
  if adaptive:
    values.update(clip_norm="adaptive", initial_clip_norm=CLIP, clipped_count_stddev=1.0,
                  noise_multiplier=0.4)
  values.update(kw)
  return tiny_config(root, **values)


@pytest.fixture(scope="module")
def task(tiny_config, tiny_task, tmp_path_factory):
  return tiny_task(_config(tiny_config, tmp_path_factory.mktemp("task"), "none", "single",
                           False))


def _cohort(task, participation, round_num, engine_name="tff"):
  """The clients of round ``round_num`` (1-based): fresh ones, or cohort (r - 1) mod b, in
  the form the engine takes in a run (TFF: datasets; compiled: ``ClientBatches``)."""
  index = round_num - 1
  if participation == "fixed_epoch":
    index %= ROUNDS // 2
  ids = task.train_client_ids[index * CLIENTS:(index + 1) * CLIENTS]
  load = task.client_datasets.load if engine_name == "tff" else task.client_datasets.batches
  return [load(i) for i in ids]


def _with_client_lr(state, lr):
  work = type(state.client_work)((k, np.float32(lr) if k == "learning_rate" else v)
                                 for k, v in state.client_work.items())
  return state._replace(client_work=work)


def _leaves(structure):
  return tf.nest.flatten(structure)


def _assert_bit_identical(a, b, what):
  tf.nest.assert_same_structure(a, b)
  for i, (x, y) in enumerate(zip(_leaves(a), _leaves(b))):
    x, y = np.asarray(x), np.asarray(y)
    assert x.dtype == y.dtype and x.shape == y.shape, (what, i, x.dtype, y.dtype)
    assert np.array_equal(x, y), (what, i, x, y)


def _gamma(k):
  return k * U / (1.0 - k * U)


class _Pair:
  """TFF's process and the compiled one, built from one setup."""

  def __init__(self, task, config):
    setup, _, _ = run_setup.resolve_privacy(config, config.noise_seed)
    self.config = config
    self.tff = run_setup.build_process(task.model_fn, setup, config.client_lr)
    self.compiled = engine.build_process("compiled", task.model_fn, setup, config.client_lr)
    trainable, non_trainable = task_lib.initial_model_weights(task.keras_model_fn, config.seed)
    weights = tff.learning.models.ModelWeights(trainable=trainable, non_trainable=non_trainable)
    self.initial = {name: process.set_model_weights(process.initialize(), weights)
                    for name, process in (("tff", self.tff), ("compiled", self.compiled))}


def _noise_rounds(pair, task, participation, rounds=ROUNDS):
  """Zero client updates: models, aggregator and optimizer states bit-identical each round."""
  states = {k: _with_client_lr(s, 0.0) for k, s in pair.initial.items()}
  _assert_bit_identical(states["tff"], states["compiled"], "initial state")
  moved = False
  for r in range(1, rounds + 1):
    out = {k: getattr(pair, k).next(states[k], _cohort(task, participation, r, k))
           for k in states}
    states = {k: o.state for k, o in out.items()}
    _assert_bit_identical(states["tff"], states["compiled"], f"round {r}")
    assert out["tff"].metrics["aggregator"]["zeroed_client_updates"] == CLIENTS
    assert out["compiled"].metrics["aggregator"]["zeroed_client_updates"] == CLIENTS
    before = pair.initial["tff"].global_model_weights.trainable
    moved |= any(not np.array_equal(a, b) for a, b in
                 zip(before, states["tff"].global_model_weights.trainable))
  assert moved == config_lib.is_private(pair.config.canonical_mechanism)  # noise moved it


def _update_bound(pair, task, participation, state, round_num, clip):
  """B: the largest |coordinate| of a record the round sums (clip ζ, or measured for none)."""
  if pair.config.canonical_mechanism != "none":  # clipped (privately or not) to ζ
    return clip
  bound = 0.0
  state = state._replace(finalizer=pair.initial["compiled"].finalizer)  # no momentum yet
  for batches in _cohort(task, participation, round_num, "compiled"):
    alone = pair.compiled.next(state, [batches]).state
    for before, after in zip(state.global_model_weights.trainable,
                             alone.global_model_weights.trainable):
      delta = np.abs(np.asarray(before, np.float64) - after) / SERVER_LR
      bound = max(bound, float(np.max(delta)) * (1 + 8 * U))
  return bound


def _training_rounds(pair, task, participation, release_unit=None):
  """Real client updates, each round from one start state: weights within the tolerance.

  ``release_unit``: 1/γ of the discrete Gaussian, whose records both engines sum in float64.
  Two orders of that sum differ by at most 2·γ_K·K·ζ (u = 2⁻⁵³), far below 1/γ, so γ·x rounds
  to integers at most one apart and s differs by at most 1/γ a coordinate, η_server/(K·γ) in
  the model; each engine then rounds s to float32, divides and steps (at most 4 roundings
  of magnitude ≤ 2M each): 8·u·M with u = 2⁻²⁴."""
  state = pair.initial["tff"]
  clip = CLIP
  for r in range(1, ROUNDS + 1):
    bound = _update_bound(pair, task, participation, state, r, clip)
    out = {k: getattr(pair, k).next(state, _cohort(task, participation, r, k))
           for k in ("tff", "compiled")}
    a, b = out["tff"].state, out["compiled"].state
    tf.nest.assert_same_structure(a, b)
    _assert_bit_identical(a.aggregator, b.aggregator, f"aggregator state, round {r}")
    magnitudes = [np.abs(np.asarray(x, np.float64)) for x in _leaves(
        (state.global_model_weights.trainable, a.global_model_weights.trainable, a.finalizer))]
    m = max(float(np.max(x)) for x in magnitudes if x.size)
    if release_unit is None:
      tolerance = SERVER_LR * 2.0 * _gamma(CLIENTS) * bound + 4.0 * U * m
    else:
      tolerance = SERVER_LR * release_unit / CLIENTS * (1 + 4 * U) + 8.0 * U * m
    diff = max(float(np.max(np.abs(np.asarray(x, np.float64) - y)))
               for x, y in zip(a.global_model_weights.trainable,
                               b.global_model_weights.trainable))
    assert diff <= tolerance, (r, diff, tolerance)
    moved = max(float(np.max(np.abs(np.asarray(x, np.float64) - y)))
                for x, y in zip(state.global_model_weights.trainable,
                                a.global_model_weights.trainable))
    assert moved > 100 * tolerance  # the round trained: the check is not vacuous
    for x, y in zip(_leaves(a.finalizer), _leaves(b.finalizer)):
      assert np.max(np.abs(np.asarray(x, np.float64) - y), initial=0.0) <= tolerance / SERVER_LR
    assert (out["tff"].metrics["aggregator"]["zeroed_client_updates"] ==
            out["compiled"].metrics["aggregator"]["zeroed_client_updates"])
    clip_after = loop._find_metric(out["tff"].metrics["aggregator"], "clip_norm")  # pylint: disable=protected-access
    assert clip_after == loop._find_metric(out["compiled"].metrics["aggregator"], "clip_norm")  # pylint: disable=protected-access
    if clip_after is not None:
      clip = max(clip, float(clip_after))
    state = a


def _check_case(tiny_config, tmp_path, task, case):
  mechanism, participation, adaptive = case
  pair = _Pair(task, _config(tiny_config, tmp_path, mechanism, participation, adaptive))
  _noise_rounds(pair, task, participation)
  _training_rounds(pair, task, participation)


@pytest.mark.parametrize("case", DEFAULT_CASES, ids=lambda c: f"{c[0]}-{c[1]}" + (
    "-adaptive" if c[2] else ""))
def test_compiled_engine_equals_tff(tiny_config, tmp_path, task, case):
  _check_case(tiny_config, tmp_path, task, case)


@pytest.mark.slow
@pytest.mark.parametrize("case", SLOW_CASES, ids=lambda c: f"{c[0]}-{c[1]}" + (
    "-adaptive" if c[2] else ""))
def test_compiled_engine_equals_tff_every_mechanism(tiny_config, tmp_path, task, case):
  _check_case(tiny_config, tmp_path, task, case)


@pytest.mark.parametrize("mechanism", ["blt", pytest.param("tree", marks=pytest.mark.slow)])
def test_compiled_engine_equals_tff_with_state_rows_as_their_own_vectors(
    tiny_config, tmp_path, task, monkeypatch, mechanism):
  """A large model's state rows (``engine._OWN_VECTOR`` entries or more) cross the engine's
  functions as vectors of their own, not copied into one concatenation a round: lowered to
  one entry here, so that the tiny model's rows do; both engines stay bit for bit equal."""
  monkeypatch.setattr(engine, "_OWN_VECTOR", 1)
  _check_case(tiny_config, tmp_path, task, (mechanism, "single", False))


def test_packed_layout_round_trips_small_and_large_leaves(monkeypatch):
  """Small leaves share one vector per dtype, each large leaf has its own; both directions
  give back every leaf, and the arrays are read-only views of the vectors (no copy)."""
  monkeypatch.setattr(engine, "_OWN_VECTOR", 100)
  state = {"round": np.int64(3), "seed": np.array([5, -7], np.int64),
           "rows": (np.arange(120, dtype=np.float32), np.arange(6, dtype=np.float32)),
           "wide": np.arange(200, dtype=np.float64).reshape(10, 20),
           "scale": np.float32(0.25)}
  flat = tf.nest.flatten(state)
  layout = engine._PackedLayout.of_arrays(state, flat)  # pylint: disable=protected-access
  assert sorted(len(g) for g in layout.groups) == [1, 1, 2, 2]
  vectors = layout.pack_arrays(flat)
  back = layout.unpack_arrays(vectors)
  for a, b in zip(tf.nest.flatten(back), flat):
    assert np.asarray(a).dtype == np.asarray(b).dtype and np.array_equal(a, b)
  big = back["rows"][0]
  assert not big.flags.writeable
  assert any(np.shares_memory(big, np.asarray(v)) for v in vectors)
  traced = tf.function(lambda v: layout.pack_tensors(layout.unpack_tensors(v)),
                       input_signature=[layout.signature()])
  for a, b in zip(traced(vectors), vectors):
    assert np.array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("mechanism", ["opt_momentum",
                                       pytest.param("tree", marks=pytest.mark.slow)])
def test_compiled_engine_equals_tff_on_the_block_lstm(tiny_config, tiny_task, tmp_path,
                                                      mechanism):
  """The fused LSTM kernel the main job trains with (``--lstm_kernel=block``): both engines
  run it, with the same noise bit for bit and weights within the same tolerance."""
  config = _config(tiny_config, tmp_path, mechanism, "fixed_epoch", False,
                   lstm_kernel="block")
  block_task = tiny_task(config)
  pair = _Pair(block_task, config)
  _noise_rounds(pair, block_task, "fixed_epoch")
  _training_rounds(pair, block_task, "fixed_epoch")


def test_compiled_engine_equals_tff_for_the_discrete_gaussian(tiny_config, tmp_path, task):
  """``gaussian`` with the discrete Gaussian: both engines sum the float64 records the query
  makes (TFF's sum of its record type, the compiled engine's accumulator shaped by its sample
  state) with their count; two noise rounds are bit-identical and the trained rounds within
  1/γ of the integer release."""
  pair = _Pair(task, _config(tiny_config, tmp_path, "gaussian", "single", False,
                             noise_distribution="discrete_gaussian"))
  compiled = pair.compiled
  query = compiled._query._numerator  # pylint: disable=protected-access
  accumulator, count = compiled._sum  # pylint: disable=protected-access
  assert {v.dtype for v in accumulator} == {tf.float64} and count.dtype == tf.float64
  _noise_rounds(pair, task, "single", rounds=2)
  _training_rounds(pair, task, "single", release_unit=1.0 / query.plan.granularity)


def test_a_client_as_arrays_trains_exactly_as_its_dataset(tiny_config, tmp_path, task):
  """The compiled engine takes a client as ``ClientBatches`` (the harness's form, sliced in
  the traced update) or as its tf.data.Dataset (TFF's form, TFF's own update): the same
  batches on the same kernels, so the rounds are bit-identical, metrics included. Batches
  of 3 rows: clients of several batches, the last one partial."""
  from stackoverflow import preprocessing  # pylint: disable=g-import-not-at-top
  config = _config(tiny_config, tmp_path, "banded", "fixed_epoch", False)
  setup, _, _ = run_setup.resolve_privacy(config, config.noise_seed)
  process = engine.build_process("compiled", task.model_fn, setup, CLIENT_LR,
                                 report_train_metrics=True)
  states = {form: process.initialize() for form in ("dataset", "arrays")}
  shapes = set()
  for r in (1, 2, 3):
    ids = [task.client_datasets.token_ids(i)
           for i in task.train_client_ids[(r - 1) * CLIENTS:r * CLIENTS]]
    batches = [preprocessing.ClientBatches(x, 3) for x in ids if len(x)]
    shapes.update((len(b) > 3, len(b) % 3 > 0) for b in batches)
    out = {"dataset": process.next(states["dataset"], [b.dataset() for b in batches]),
           "arrays": process.next(states["arrays"], batches)}
    _assert_bit_identical(out["dataset"].state, out["arrays"].state, f"round {r}")
    _assert_bit_identical(out["dataset"].metrics, out["arrays"].metrics, f"metrics, round {r}")
    states = {form: o.state for form, o in out.items()}
  assert (True, True) in shapes, "no client of several batches, the last one partial"


def _run(tiny_config, root, engine_name, total_rounds=ROUNDS, **kw):
  config = _config(tiny_config, root, "opt_momentum", "fixed_epoch", False, engine=engine_name,
                   client_lr=1e-20, experiment_name=kw.pop("experiment_name", engine_name),
                   rounds_per_checkpoint=1, rounds_per_eval=2, **kw)
  if total_rounds != ROUNDS:  # a run stopped after total_rounds: the same flags, cut short
    stop = {"round": total_rounds}

    def callback(round_num):
      if round_num == stop["round"]:
        raise KeyboardInterrupt
    try:
      loop.run_training(config, log=lambda _: None, round_callback=callback)
    except KeyboardInterrupt:
      pass
    return config
  loop.run_training(config, log=lambda _: None)
  return config


def _outputs(config):
  run_dir = config.run_dir
  with open(os.path.join(run_dir, "summary.json"), encoding="utf-8") as f:
    summary = json.load(f)
  with open(os.path.join(run_dir, "dp_events.jsonl"), encoding="utf-8") as f:
    events = f.read()
  with open(os.path.join(run_dir, "releases.jsonl"), encoding="utf-8") as f:
    releases = [json.loads(line) for line in f if line.strip()]
  return summary, events, releases


@pytest.mark.slow  # four training runs (about 40 s); each engine's equality is tested above
def test_training_loop_is_the_same_on_both_engines_and_resumes_across_them(tiny_config, tmp_path,
                                                                            task):
  """A run checkpointed on one engine resumes on the other (both ways) with the releases,
  DpEvents, ε, privacy statement and test metrics of a run on the compiled engine alone;
  the resumed run replays its last logged round on the other engine bit for bit
  (``releases.jsonl`` refuses a different release)."""
  del task
  # auto: compiled on one machine
  alone = _outputs(_run(tiny_config, tmp_path, config_lib.DEFAULT_ENGINE))
  summary, events, releases = alone
  assert summary["config"]["engine"] == "compiled" and summary["epsilon"] is not None
  with open(os.path.join(tmp_path, config_lib.DEFAULT_ENGINE, "config.json"),
            encoding="utf-8") as f:
    assert json.load(f)["config"]["engine"] == "compiled"  # the record names the engine used
  for first, second in (("tff", "compiled"), ("compiled", "tff")):
    name = f"{first}-then-{second}"
    _run(tiny_config, tmp_path, first, total_rounds=2, experiment_name=name)
    resumed_summary, resumed_events, resumed_releases = _outputs(
        _run(tiny_config, tmp_path, second, experiment_name=name))
    assert resumed_events == events
    assert [(r["round"], r["sha256"]) for r in resumed_releases] == [
        (r["round"], r["sha256"]) for r in releases]
    assert resumed_summary["epsilon"] == summary["epsilon"]
    assert (resumed_summary["privacy_statement"]["text"] ==
            summary["privacy_statement"]["text"])
    assert resumed_summary["test_metrics"] == summary["test_metrics"]
    assert resumed_summary["config"]["engine"] == second


def test_auto_is_the_default_compiled_on_one_machine_and_tff_with_workers(tiny_config, tmp_path):
  """The default engine is auto: the compiled engine on one machine, TFF's process (its
  distributed runtime) with --workers; an explicit engine stays what it says."""
  assert config_lib.TrainingConfig().engine == config_lib.DEFAULT_ENGINE == "auto"
  config = _config(tiny_config, tmp_path, "tree", "single", False)
  assert config.with_used_engine().engine == "compiled"
  distributed = dataclasses.replace(config, workers=("localhost:1",))
  distributed.validate()
  assert distributed.with_used_engine().engine == "tff"
  assert dataclasses.replace(config, engine="tff").with_used_engine().engine == "tff"
  assert config_lib.used_engine("compiled") == "compiled"
  assert config.fingerprint() == dataclasses.replace(config, engine="tff").fingerprint()
  with pytest.raises(ValueError, match="auto"):
    engine.build_process("auto", None, None, CLIENT_LR)


def test_the_lstm_kernel_is_part_of_the_run(tiny_config, tmp_path):
  """--lstm_kernel=block is fingerprinted (a checkpoint resumes only on its kernel); the
  default keras is not recorded, so runs from before the flag keep their fingerprint."""
  config = _config(tiny_config, tmp_path, "tree", "single", False)
  block = dataclasses.replace(config, lstm_kernel="block")
  assert "lstm_kernel" not in config.public_dict()
  assert block.public_dict()["lstm_kernel"] == "block"
  assert block.fingerprint() != config.fingerprint()
  assert block.changed_fields(config.public_dict()) == ("lstm_kernel",)
  with pytest.raises(config_lib.TrainingError, match="lstm_kernel"):
    dataclasses.replace(config, lstm_kernel="cudnn").validate()


def test_thread_policy_one_thread_for_small_models_on_the_compiled_engine(
    tiny_config, tmp_path, monkeypatch):
  """configure_threads: one thread for the compiled engine on a model under 1M parameters,
  TensorFlow's default on a larger one or on TFF's process, the environment's own
  TF_NUM_*_THREADS first; it never changes pools TensorFlow already runs with."""
  calls = []
  monkeypatch.setattr(tf.config.threading, "set_intra_op_parallelism_threads",
                      lambda n: calls.append(("intra", n)))
  monkeypatch.setattr(tf.config.threading, "set_inter_op_parallelism_threads",
                      lambda n: calls.append(("inter", n)))
  monkeypatch.setattr(tf.config.threading, "get_intra_op_parallelism_threads", lambda: 0)
  monkeypatch.setattr(tf.config.threading, "get_inter_op_parallelism_threads", lambda: 0)
  for name in engine.THREAD_VARIABLES:
    monkeypatch.delenv(name, raising=False)
  small = _config(tiny_config, tmp_path, "tree", "single", False, engine="compiled")
  assert engine.configure_threads(small) == "one thread"
  assert calls == [("intra", 1), ("inter", 1)]
  calls.clear()
  assert engine.configure_threads(dataclasses.replace(small, engine="tff")) == (
      "TensorFlow's default")
  paper = dataclasses.replace(small, vocab_size=10000, embedding_size=96, lstm_size=670,
                              projection_size=96)
  assert engine.configure_threads(paper) == "TensorFlow's default" and not calls
  monkeypatch.setenv("TF_NUM_INTRAOP_THREADS", "2")
  assert engine.configure_threads(small) == "set by TF_NUM_INTRAOP_THREADS=2" and not calls
  monkeypatch.delenv("TF_NUM_INTRAOP_THREADS")

  def running(_):
    raise RuntimeError("Intra op parallelism cannot be modified after initialization.")
  monkeypatch.setattr(tf.config.threading, "set_intra_op_parallelism_threads", running)
  assert engine.configure_threads(small).startswith("TensorFlow's default (it was running")


def _new_function():
  @tf.function
  def doubled():
    return tf.constant(1.0) * 2
  return doubled


def test_a_job_of_many_runs_does_not_warn_of_retracing():
  """Each run builds its process anew, and TensorFlow warns of retracing from the fifth fresh
  tf.function of one name (the main job has 7 runs): the compiled engine drops that warning
  (and only that one) from TensorFlow's logger."""
  import logging  # pylint: disable=g-import-not-at-top
  logger = tf.get_logger()
  installed = [f for f in logger.filters if isinstance(f, engine._NoRetracingWarning)]  # pylint: disable=protected-access
  for f in installed:
    logger.removeFilter(f)
  records = []
  handler = logging.Handler(logging.WARNING)
  handler.emit = lambda record: records.append(record.getMessage())
  logger.addHandler(handler)
  try:
    for _ in range(7):
      _new_function()()
    assert any("retracing" in r for r in records)
    records.clear()
    engine.quiet_retracing_warnings()
    engine.quiet_retracing_warnings()  # once
    assert sum(isinstance(f, engine._NoRetracingWarning) for f in logger.filters) == 1  # pylint: disable=protected-access
    for _ in range(7):
      _new_function()()
    logger.warning("another warning")
    assert records == ["another warning"]
  finally:
    logger.removeHandler(handler)


def test_compiled_engine_with_workers_is_refused_in_one_line(tiny_config, tmp_path):
  config = _config(tiny_config, tmp_path, "tree", "single", False, engine="compiled",
                   workers=("localhost:1",))
  with pytest.raises(config_lib.TrainingError) as error:
    config.validate()
  assert "\n" not in str(error.value) and "--workers" in str(error.value)
  with pytest.raises(config_lib.TrainingError, match="--engine='jax'"):
    dataclasses.replace(config, engine="jax", workers=()).validate()


# Slow: the engine is tested in-process above, and the clean-shell binary (absl's app.run, the
# LSTM) in tests/test_training_binary.py; this is the two together.
@pytest.mark.slow
def test_binary_trains_on_the_compiled_engine_from_a_clean_shell(tmp_path):
  """``--engine=compiled`` as a user types it (a clean shell: absl's app.run, the LSTM)."""
  root = tmp_path / "runs"
  result = subprocess.run(
      [sys.executable, os.path.join(userenv.REPO, "training", "run_stackoverflow.py"),
       "--dataset=synthetic", "--mechanism=banded", "--noise_multiplier=1", "--total_rounds=2",
       "--clients_per_round=2", "--vocab_size=50", "--embedding_size=4", "--lstm_size=4",
       "--projection_size=4", "--max_validation_elements=16", "--max_test_elements=16",
       "--engine=compiled", "--no_progress", f"--root_output_dir={root}",
       "--experiment_name=x", f"--cache_dir={tmp_path / 'cache'}"],
      cwd=tmp_path, env=userenv.env(home=tmp_path), capture_output=True, text=True,
      timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  with open(root / "x" / "summary.json", encoding="utf-8") as f:
    summary = json.load(f)
  assert summary["finished"] and summary["config"]["engine"] == "compiled"
  assert summary["epsilon"] is not None and summary["test_metrics"]["loss"] > 0


def test_a_failed_library_check_in_the_compiled_round_is_one_line(tiny_config, tmp_path, task):
  """Past the n rounds its matrix was built for, the query's in-graph check stops the round
  with the query's own one-line message, as on TFF's process (``loop.run_round``)."""
  config = _config(tiny_config, tmp_path, "banded", "single", False, total_rounds=1)
  setup, _, _ = run_setup.resolve_privacy(config, config.noise_seed)
  process = engine.build_process("compiled", task.model_fn, setup, CLIENT_LR,
                                 report_train_metrics=True)
  state = process.initialize()
  output = loop.run_round(process, state, _cohort(task, "single", 1, "compiled"), 1)
  assert np.isfinite(output.metrics["client_work"]["train"]["loss"])
  with pytest.raises(config_lib.TrainingError) as error:
    loop.run_round(process, output.state, [], 2)
  assert str(error.value).startswith("round 2: ") and "\n" not in str(error.value)


def test_an_unpinned_noise_seed_is_fresh_at_every_initialize(tiny_config, tmp_path, task):
  """Without a pinned seed the compiled engine's query state draws its seed from OS entropy
  at every ``initialize`` (never one traced constant), as on TFF's process."""
  config = _config(tiny_config, tmp_path, "banded", "single", False, noise_seed=None)
  setup, _, _ = run_setup.resolve_privacy(config, None)
  process = engine.build_process("compiled", task.model_fn, setup, CLIENT_LR)
  seeds = [tuple(process.initialize().aggregator.query_state.numerator_state.seed)
           for _ in range(3)]
  assert len(set(seeds)) == 3, seeds
