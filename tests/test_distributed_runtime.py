"""training.distributed: two loopback worker_binary services, the MF aggregator, worker death and resume.

Each test runs a driver subprocess (this file run as a script) so that TFF's
default context and the worker processes never leak into other tests. All use
opt_prefix_sum (an optimal matrix factorization, Denisov Table 1) with a
pinned noise seed and 2 clients per round on 2 workers (one client per worker,
so the distributed sums equal the single-process sums bit for bit), and check
(1) the distributed rounds equal the single-process rounds, (2) killing a
worker mid-run fails the next round with the worker's address in the error,
(3) continuing from the last saved state with a healthy worker set finishes
with the same model.

* default (fast): FedAvg on a small dense model, state kept in memory;
* slow: the training loop (``training.loop.run_training``, tiny StackOverflow
  fixture, LSTM) with its checkpoints, and the real training binary killed
  and rerun as separate processes.
"""

import json
import os
import signal
import re
import subprocess
import sys
import time

import numpy as np
import pytest

import userenv

REPO = userenv.REPO
TINY_FLAGS = dict(mechanism="opt_prefix_sum", dataset="stackoverflow", total_rounds=4,
                  clients_per_round=2, noise_multiplier=1.0, noise_seed=1234,
                  rounds_per_eval=100, rounds_per_checkpoint=1, vocab_size=100,
                  embedding_size=8, lstm_size=16, projection_size=8,
                  max_validation_elements=40, max_test_elements=40, seed=3)


def _env():
  """A clean shell's environment; PYTHONPATH because the driver runs this file as a script."""
  return userenv.env(pythonpath=True)


def _run_driver(mode, tmp_path, timeout=600):
  proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), mode, str(tmp_path)],
                          cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          start_new_session=True, text=True)
  try:
    out, _ = proc.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGKILL)
    out, _ = proc.communicate()
    pytest.fail(f"distributed driver timed out:\n{out[-4000:]}")
  return proc.returncode, out


def _final_model(directory):
  with np.load(os.path.join(directory, "final_model.npz")) as f:
    return [f[k] for k in f.files]


def _assert_same_model(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x, y)


_EXIT_SCRIPT = """
import json
import tensorflow as tf
import tensorflow_federated as tff
from tff_mf.tf import runtime
runtime.install_exit_hook()

@tff.tensorflow.computation
def one():
  return tf.constant(1)

assert one() == 1
print(json.dumps([p.pid for p in runtime._worker_children()]), flush=True)
"""


def test_exit_hook_stops_tff_server_without_teardown_noise():
  """A program that ran a TFF computation exits cleanly: TFF's worker_binary is stopped and
  its ServiceManager finalizer prints nothing ("Exception ignored ... 'Popen'" in TFF 0.87)."""
  import psutil  # pylint: disable=g-import-not-at-top
  proc = subprocess.run([sys.executable, "-c", _EXIT_SCRIPT], cwd=REPO, env=_env(),
                        capture_output=True, text=True, timeout=300, start_new_session=True)
  assert proc.returncode == 0, proc.stderr[-3000:]
  pids = json.loads(proc.stdout.strip().splitlines()[-1])
  assert pids, "the computation should have started a worker_binary"
  assert "Exception ignored" not in proc.stderr and "Popen" not in proc.stderr, proc.stderr[-3000:]
  for pid in pids:
    try:
      assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, f"worker_binary {pid} survived"
    except psutil.NoSuchProcess:
      pass


def test_tff_server_signals_reach_only_live_children():
  """TFF's ServiceManager signals its server by pid (os.kill), also after that pid was reaped:
  guarded, a reaped or foreign pid (here this process's own thread) gets nothing, a live
  child still gets the SIGINT."""
  import threading  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.executor_stacks import executor_factory  # pylint: disable=g-import-not-at-top
  from tff_mf.tf import runtime  # pylint: disable=g-import-not-at-top
  runtime.guard_service_manager_signals()
  received = []
  previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
  try:
    reaped = subprocess.Popen(["true"])
    reaped.wait()
    executor_factory.os.kill(reaped.pid, signal.SIGINT)
    done = threading.Event()
    thread = threading.Thread(target=done.wait)
    thread.start()
    executor_factory.os.kill(thread.native_id, signal.SIGINT)  # another thread of ours
    done.set()
    thread.join()
    executor_factory.os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.2)
    assert received == []
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=_env())
    executor_factory.os.kill(live.pid, signal.SIGINT)
    assert live.wait(timeout=30) != 0  # stopped by the SIGINT (KeyboardInterrupt)
  finally:
    signal.signal(signal.SIGINT, previous)
  assert executor_factory.os.path is os.path  # everything else is the os module's


def test_servers_tff_starts_are_tracked_and_none_starts_once_exiting():
  """A computation still in flight on TFF's event-loop thread when the process exits found
  the server that the exit hook had just stopped "not ready", started a new one, and left
  it orphaned (Ctrl-C of `tff-mf audit` about 7 s in). Guarded, every server TFF starts is
  stopped by stop_worker_binaries whatever its name, and once exiting none is started: a
  thread that asks waits (silently, for the process to end), the main thread gets an error."""
  import threading  # pylint: disable=g-import-not-at-top
  import psutil  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.executor_stacks import executor_factory  # pylint: disable=g-import-not-at-top
  from tff_mf.tf import runtime  # pylint: disable=g-import-not-at-top
  runtime.guard_service_manager_signals()
  assert executor_factory.subprocess.Popen is runtime._TrackedPopen  # pylint: disable=protected-access
  assert executor_factory.subprocess.PIPE is subprocess.PIPE  # everything else is subprocess's
  server = executor_factory.subprocess.Popen(["sleep", "60"])  # not named worker_binary
  assert isinstance(server, subprocess.Popen)
  assert runtime.stop_worker_binaries(timeout=5) >= 1
  server.wait(timeout=5)  # stopped (and reaped: its pid is gone)
  assert not psutil.pid_exists(server.pid)
  try:
    with runtime._launch_lock:  # pylint: disable=protected-access
      runtime._exiting = True  # pylint: disable=protected-access
    started = []
    thread = threading.Thread(
        target=lambda: started.append(executor_factory.subprocess.Popen(["sleep", "60"])),
        daemon=True)
    thread.start()
    thread.join(timeout=1.0)
    assert thread.is_alive() and not started  # waiting, nothing started
    with pytest.raises(RuntimeError, match="exiting"):
      executor_factory.subprocess.Popen(["sleep", "60"])
  finally:
    with runtime._launch_lock:  # pylint: disable=protected-access
      runtime._exiting = False  # pylint: disable=protected-access


# Slow: a whole pytest session in a subprocess; the exit hook it relies on is checked in the
# default suite by test_exit_hook_stops_tff_server_without_teardown_noise.
@pytest.mark.slow
def test_test_session_exits_without_tff_teardown_noise():
  """Inside pytest, TFF 0.87's ServiceManager outlives the `subprocess` module at teardown and
  its finalizer printed "Exception ignored ... 'NoneType' object has no attribute 'Popen'"
  (reproduced with the conftest's previous stop_worker_binaries-only hook)."""
  proc = subprocess.run(
      [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
       "tests/test_query_noise.py", "-k", "restored_state_continues"],
      cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300, start_new_session=True)
  output = proc.stdout + proc.stderr
  assert proc.returncode == 0, output[-3000:]
  assert re.search(r"\b[1-9]\d* passed", output) and " failed" not in output, output[-3000:]
  assert "Exception ignored" not in output, output[-3000:]


def test_address_parsing_and_unreachable_worker_error():
  from training import distributed
  assert distributed.parse_worker_addresses("a:1, b.c:65535") == ["a:1", "b.c:65535"]
  assert distributed.parse_worker_addresses(["[::1]:80"]) == ["[::1]:80"]
  for bad in ("", "host", "host:0", "host:70000", "a:1,a:1"):
    with pytest.raises(ValueError):
      distributed.parse_worker_addresses(bad)
  port = distributed._pick_loopback_port()  # pylint: disable=protected-access
  with pytest.raises(distributed.WorkerError, match=f"127.0.0.1:{port}.*not reachable"):
    distributed.wait_for_worker(f"127.0.0.1:{port}", timeout=0.5)
  assert os.access(distributed.worker_binary_path(), os.X_OK)


def test_serve_and_check_work_from_a_clean_shell(tmp_path):
  """`python -m training.distributed serve` (the worker) and `check`, as a user starts them."""
  from training import distributed  # pylint: disable=g-import-not-at-top
  port = distributed._pick_loopback_port()  # pylint: disable=protected-access
  env = userenv.env(home=tmp_path)
  server = subprocess.Popen([sys.executable, "-m", "training.distributed", "serve", "--port",
                             str(port)], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
  try:
    check = subprocess.run([sys.executable, "-m", "training.distributed", "check", "--workers",
                            f"127.0.0.1:{port}", "--timeout", "60"], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stderr
    assert f"127.0.0.1:{port}: ready" in check.stdout
  finally:
    os.killpg(server.pid, signal.SIGKILL)
    server.wait(timeout=30)


@pytest.mark.slow  # two TFF workers, a kill and a resume (about 25 s)
def test_mf_fedavg_two_workers_equal_single_process_kill_and_resume(tmp_path):
  returncode, out = _run_driver("fast", tmp_path)
  assert returncode == 0, out[-6000:]
  report = json.loads((tmp_path / "report.json").read_text())
  assert report["equal_before_kill"] and report["equal_after_resume"], report
  assert report["max_abs_difference"] == 0.0
  assert report["error_type"] == "WorkerError"
  assert report["killed_address"] in report["error"]
  assert "rerun the same command to resume" in report["error"]
  assert report["healthy_address"] not in report["error"]
  # The resumed rounds 3 and 4 ran on the new worker set; get_model_weights on the coordinator.
  assert report["distributed_calls"] == 2 and report["coordinator_calls"] >= 1
  assert report["worker_processes_alive"] == 0


@pytest.mark.slow
def test_training_loop_two_workers_equal_single_process_kill_then_resume(tmp_path):
  returncode, out = _run_driver("loop", tmp_path)
  assert returncode == 0, out[-6000:]
  report = json.loads((tmp_path / "report.json").read_text())
  assert report["distributed_calls"] == 2  # the resumed run's rounds 3 and 4
  # The round after the kill failed, naming the dead worker.
  assert report["killed_address"] in report["error"]
  assert report["error_type"] == "WorkerError"
  assert report["rounds_at_failure"] == 2
  single = _final_model(tmp_path / "single" / "run")
  _assert_same_model(single, _final_model(tmp_path / "dist" / "run"))
  _assert_same_model(single, _final_model(tmp_path / "killed" / "run"))
  for name in ("single", "dist", "killed"):
    summary = json.loads((tmp_path / name / "run" / "summary.json").read_text())
    assert summary["finished"] and summary["rounds_completed"] == 4
  assert report["resumed_from_round"] == 2
  assert report["worker_processes_alive"] == 0


def _binary_command(root, data_dir, cache, workers=None):
  flags = dict(TINY_FLAGS, data_dir=data_dir, cache_dir=cache, root_output_dir=root,
               experiment_name="run")
  del flags["max_test_elements"]  # a TrainingConfig field without a binary flag
  if workers:
    flags["workers"] = ",".join(workers)
  return [sys.executable, "-m", "training.run_stackoverflow"] + [
      f"--{k}={v}" for k, v in flags.items()]


@pytest.mark.slow
def test_binary_kill_worker_mid_run_then_resume_with_healthy_workers(tmp_path):
  from stackoverflow import fixtures
  from training import distributed
  data_dir = fixtures.write_tiny_stackoverflow(str(tmp_path / "data"))
  cache = str(tmp_path / "cache")
  single = subprocess.run(_binary_command(str(tmp_path / "single"), data_dir, cache), cwd=REPO,
                          env=_env(), capture_output=True, text=True, timeout=600)
  assert single.returncode == 0, single.stderr[-4000:]
  with distributed.local_workers(3) as workers:
    (a, _), (b, b_proc), (c, _) = workers
    proc = subprocess.Popen(_binary_command(str(tmp_path / "dist"), data_dir, cache, [a, b]),
                            cwd=REPO, env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    meta_2 = tmp_path / "dist" / "run" / "checkpoints" / "checkpoint_2"
    try:
      deadline = time.time() + 600
      while not meta_2.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
      b_proc.kill()  # after round 2's checkpoint: round 3 needs the dead worker
      _, stderr = proc.communicate(timeout=600)
    finally:
      if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0, stderr[-4000:]
    assert b in stderr, stderr[-4000:]
    resumed = subprocess.run(
        _binary_command(str(tmp_path / "dist"), data_dir, cache, [a, c]), cwd=REPO, env=_env(),
        capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "resuming" in resumed.stderr
  _assert_same_model(_final_model(tmp_path / "single" / "run"),
                     _final_model(tmp_path / "dist" / "run"))


def _fast_driver(out_dir):
  """FedAvg with the opt_prefix_sum MF aggregator: single process vs two workers, kill, resume."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_mf.spec import MechanismSpec  # pylint: disable=g-import-not-at-top
  from tff_mf.tf import aggregators  # pylint: disable=g-import-not-at-top
  from tff_mf.tf import runtime  # pylint: disable=g-import-not-at-top
  from training import distributed  # pylint: disable=g-import-not-at-top
  runtime.install_exit_hook()
  rounds, clients = 4, 2
  setup = aggregators.build_mechanism(MechanismSpec.from_args(
      "opt_prefix_sum", total_rounds=rounds, noise_multiplier=1.0, clients_per_round=clients,
      clip_norm=1.0,
      momentum=0.9), server_learning_rate=0.5, noise_seed=7, cache_dir=os.path.join(out_dir,
      "cache"))

  def model_fn():
    model = tf.keras.Sequential([
        tf.keras.layers.Dense(8, input_shape=(5,), activation="relu",
                              kernel_initializer=tf.keras.initializers.GlorotUniform(seed=1)),
        tf.keras.layers.Dense(3, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=2))])
    return tff.learning.models.from_keras_model(
        model, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        input_spec=(tf.TensorSpec([None, 5], tf.float32), tf.TensorSpec([None], tf.int32)))

  process = tff.learning.algorithms.build_unweighted_fed_avg(
      model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=0.1),
      server_optimizer_fn=setup.server_optimizer, model_aggregator=setup.aggregation_factory)
  rng = np.random.default_rng(0)
  data = [[tf.data.Dataset.from_tensor_slices(
      (rng.normal(size=(12, 5)).astype(np.float32), rng.integers(0, 3, 12).astype(np.int32))
  ).batch(4) for _ in range(clients)] for _ in range(rounds)]

  def train(state, first, last):
    for r in range(first, last):
      state = process.next(state, data[r]).state
    return state

  def weights(state):
    return [np.asarray(w) for w in process.get_model_weights(state).trainable]

  single_2 = train(process.initialize(), 0, 2)
  single_4 = weights(train(single_2, 2, 4))
  single_2 = weights(single_2)
  report = {}
  with distributed.local_workers(3) as workers:
    (a, _), (b, b_proc), (c, _) = workers
    distributed.configure_execution_context([a, b])
    state = train(process.initialize(), 0, 2)  # the last "checkpoint"
    report["equal_before_kill"] = all(
        np.array_equal(x, y) for x, y in zip(single_2, weights(state)))
    b_proc.kill()
    b_proc.wait()
    try:
      process.next(state, data[2])
      report["error"], report["error_type"] = "no error", None
    except Exception as e:  # pylint: disable=broad-except
      report["error"], report["error_type"] = str(e), type(e).__name__
    report["killed_address"], report["healthy_address"] = b, a
    distributed.configure_execution_context([a, c])
    resumed = weights(train(state, 2, 4))
    context = distributed.active_context()
    report["distributed_calls"] = context.distributed_calls
    report["coordinator_calls"] = context.coordinator_calls
  report["equal_after_resume"] = all(np.array_equal(x, y) for x, y in zip(single_4, resumed))
  report["max_abs_difference"] = max(float(np.max(np.abs(x - y)))
                                     for x, y in zip(single_4, resumed))
  time.sleep(0.2)
  report["worker_processes_alive"] = sum(p.poll() is None for _, p in workers)
  with open(os.path.join(out_dir, "report.json"), "w") as f:
    json.dump(report, f)


def _loop_driver(out_dir):
  """Single-process run, distributed run, killed-and-resumed distributed run; writes report.json."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  from stackoverflow import fixtures  # pylint: disable=g-import-not-at-top
  from training import config as config_lib  # pylint: disable=g-import-not-at-top
  from training import distributed  # pylint: disable=g-import-not-at-top
  from training import loop  # pylint: disable=g-import-not-at-top
  data_dir = fixtures.write_tiny_stackoverflow(os.path.join(out_dir, "data"))
  base = dict(TINY_FLAGS, data_dir=data_dir, cache_dir=os.path.join(out_dir, "cache"),
              experiment_name="run")

  def config(name, workers=()):
    return config_lib.TrainingConfig(**dict(base, root_output_dir=os.path.join(out_dir, name),
                                            workers=tuple(workers), progress=False))

  report = {}
  quiet = lambda message: print(message, flush=True)
  loop.run_training(config("single"), log=quiet)
  with distributed.local_workers(3) as workers:
    (a, _), (b, b_proc), (c, _) = workers
    loop.run_training(config("dist", [a, b]), log=quiet)

    def kill_after_round_2(round_num):
      if round_num == 2:
        b_proc.kill()
        b_proc.wait()

    try:
      loop.run_training(config("killed", [a, b]), log=quiet, round_callback=kill_after_round_2)
      report["error"] = "no error"
      report["error_type"] = None
    except Exception as e:  # pylint: disable=broad-except
      report["error"] = str(e)
      report["error_type"] = type(e).__name__
    with open(os.path.join(out_dir, "killed", "run", "metrics.csv")) as f:
      report["rounds_at_failure"] = sum(1 for line in f) - 1
    report["killed_address"] = b
    messages = []

    def record(message):
      messages.append(message)
      print(message, flush=True)

    loop.run_training(config("killed", [a, c]), log=record)
    resumed = [m for m in messages if m.startswith("resuming")]
    report["resumed_from_round"] = int(resumed[0].rsplit(" ", 1)[1]) if resumed else None
    report["distributed_calls"] = distributed.active_context().distributed_calls
  time.sleep(0.2)
  report["worker_processes_alive"] = sum(p.poll() is None for _, p in workers)
  with open(os.path.join(out_dir, "report.json"), "w") as f:
    json.dump(report, f)


if __name__ == "__main__":
  {"fast": _fast_driver, "loop": _loop_driver}[sys.argv[1]](sys.argv[2])
