"""Ctrl-C (tff_mf.interrupt): the first SIGINT stops the tools at a safe point with one line
and exit 130, no traceback; a second exits at once. The training binary checkpoints the
current round and the same command resumes it to the uninterrupted run's model; the sweep
forwards the signal to its runs; `tff-mf` commands and the main job stop without writing
anything partial."""

import csv
import glob
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import userenv
from tff_mf import interrupt
from test_sweep_grids import FAKE_BINARY
from test_training_resume import group_processes
from training import config as config_lib
from training import grids
from training import loop
from training import outputs

REPO = userenv.REPO
# Three rounds, checkpoints scheduled every second round only: a Ctrl-C after round 1
# must write a checkpoint of its own.
FLAGS = dict(dataset="stackoverflow", mechanism="opt_prefix_sum", noise_multiplier=0.5,
             total_rounds=3, clients_per_round=3, vocab_size=100, embedding_size=8, lstm_size=8,
             projection_size=8, rounds_per_eval=2, rounds_per_checkpoint=2,
             max_validation_elements=32, max_test_elements=32, seed=3, server_momentum=0.5,
             noise_seed=5)
RESUME_LINE = re.compile(r"^interrupted at round (\d+); run the same command to resume$")


def _binary(data_dir, root):
  return [sys.executable, os.path.join(REPO, "training", "run_stackoverflow.py"),
          *[f"--{k}={v}" for k, v in FLAGS.items()], f"--data_dir={data_dir}",
          f"--root_output_dir={root}", "--experiment_name=run", f"--cache_dir={root}/cache"]


def _start(argv, tmp_path, name):
  """The command in its own process group; stderr to a file (the progress bar is long)."""
  err = open(tmp_path / f"{name}.err", "w")  # pylint: disable=consider-using-with
  proc = subprocess.Popen(argv, cwd=REPO, env=userenv.env(home=tmp_path),
                          start_new_session=True, stdout=subprocess.DEVNULL, stderr=err)
  proc.err_path = tmp_path / f"{name}.err"
  return proc


def _wait_for(proc, condition, what, timeout=400):
  deadline = time.time() + timeout
  while not condition():
    assert proc.poll() is None, f"exited ({proc.returncode}) before {what}: " + \
        proc.err_path.read_text()[-3000:]
    assert time.time() < deadline, f"no {what} within {timeout} s"
    time.sleep(0.05)


def _ctrl_c(proc):
  """SIGINT as a terminal's Ctrl-C sends it: to the whole process group (TFF's
  worker_binary included)."""
  os.killpg(proc.pid, signal.SIGINT)


def _finish(proc, timeout=300):
  """(exit code, stderr lines without progress-bar redraws)."""
  proc.wait(timeout=timeout)
  text = proc.err_path.read_text()
  assert "Traceback" not in text and "Exception ignored" not in text, text[-3000:]
  lines = [line.strip() for line in re.split(r"[\r\n]", text) if line.strip()]
  return proc.returncode, lines


def _metrics_rounds(run_dir):
  path = os.path.join(run_dir, outputs.METRICS_FILE)
  if not os.path.exists(path):
    return []
  with open(path, newline="") as f:
    return [int(r["round"]) for r in csv.DictReader(f)]


def _checkpoints(run_dir):
  return sorted(int(p.rsplit("_", 1)[1]) for p in glob.glob(
      os.path.join(run_dir, "checkpoints", "checkpoint_*")) if not p.endswith(".tmp"))


def _until(condition, timeout=10.0):
  deadline = time.time() + timeout
  while not condition() and time.time() < deadline:
    time.sleep(0.01)
  return condition()


def test_handled_defers_or_raises_then_restores_the_previous_handling():
  before = signal.getsignal(signal.SIGINT)
  with interrupt.handled(defer=True):
    assert signal.getsignal(signal.SIGINT) is not before
    os.kill(os.getpid(), signal.SIGINT)
    assert _until(interrupt.requested)  # a flag, nothing raised
    with pytest.raises(interrupt.Interrupted, match="^at round 4$"):
      interrupt.check("at round 4")
  assert signal.getsignal(signal.SIGINT) is before and not interrupt.requested()
  interrupt.check("not raised: no SIGINT since")
  with pytest.raises(interrupt.Interrupted):
    with interrupt.handled(defer=False):
      os.kill(os.getpid(), signal.SIGINT)
      _until(lambda: False, timeout=5.0)  # the handler raises in this loop
  assert signal.getsignal(signal.SIGINT) is before


def test_a_sigint_read_after_its_handling_ended_is_ignored():
  """The watcher thread may read a SIGINT the main thread's handler already took, after the
  ``handled`` block ended (it used to request a stop then, so that a later in-process run
  raised Interrupted at its first safe point; a second stale one exited the process)."""
  with interrupt.handled(defer=True):
    generation = interrupt._state["generation"]  # pylint: disable=protected-access
  assert not interrupt.requested()
  for _ in range(2):  # the first would request a stop, the second exit at once
    read_fd, write_fd = os.pipe()
    os.write(write_fd, bytes([signal.SIGINT]))
    os.close(write_fd)
    interrupt._watch(read_fd, generation)  # pylint: disable=protected-access
  assert not interrupt.requested()
  interrupt.check("not raised: the SIGINT belonged to the ended block")
  with interrupt.handled(defer=True):  # nor in the next block
    read_fd, write_fd = os.pipe()
    os.write(write_fd, bytes([signal.SIGINT]))
    os.close(write_fd)
    interrupt._watch(read_fd, generation)  # pylint: disable=protected-access
    assert not interrupt.requested()


def _interrupt_at_start_up_then_mid_run(tmp_path, tiny_stackoverflow):
  """Two runs of the same command, each stopped by one SIGINT; (argv, run dir, round)."""
  data_dir = tiny_stackoverflow(num_train_clients=30, num_empty_train_clients=3)
  root = tmp_path / "runs"
  run_dir = str(root / "run")
  argv = _binary(data_dir, root)

  # 1. During TFF's start-up (the run directory exists, no round has run): nothing to lose.
  proc = _start(argv, tmp_path, "startup")
  _wait_for(proc, lambda: os.path.exists(os.path.join(run_dir, outputs.CONFIG_FILE)),
            "the run directory")
  _ctrl_c(proc)
  code, lines = _finish(proc)
  assert code == 130 and lines[-1] == "interrupted at round 0; run the same command to resume"
  assert _checkpoints(run_dir) == [] and _metrics_rounds(run_dir) == []
  assert not group_processes(proc.pid)

  # 2. Mid-run, before the first scheduled checkpoint (round 2): the current round is
  # checkpointed before the run stops.
  proc = _start(argv, tmp_path, "midrun")
  _wait_for(proc, lambda: _metrics_rounds(run_dir), "round 1")
  _ctrl_c(proc)
  code, lines = _finish(proc)
  assert code == 130, lines[-5:]
  match = RESUME_LINE.match(lines[-1])
  assert match, lines[-5:]
  stopped = int(match.group(1))
  assert 1 <= stopped < FLAGS["total_rounds"]
  assert _checkpoints(run_dir)[-1] == stopped
  assert _metrics_rounds(run_dir) == list(range(1, stopped + 1))
  assert not os.path.exists(os.path.join(run_dir, outputs.SUMMARY_FILE))
  assert sum(1 for line in lines if RESUME_LINE.match(line)) == 1
  assert not group_processes(proc.pid)
  return argv, root, stopped, data_dir


def test_ctrl_c_at_start_up_and_mid_run_checkpoints_the_current_round(tmp_path,
                                                                       tiny_stackoverflow):
  _interrupt_at_start_up_then_mid_run(tmp_path, tiny_stackoverflow)


@pytest.mark.slow
def test_ctrl_c_then_rerun_ends_like_an_uninterrupted_run(tmp_path, tiny_stackoverflow):
  argv, root, stopped, data_dir = _interrupt_at_start_up_then_mid_run(tmp_path,
                                                                      tiny_stackoverflow)
  run_dir = str(root / "run")

  # The same command resumes from the interrupted round and finishes.
  proc = _start(argv, tmp_path, "rerun")
  code, lines = _finish(proc, timeout=600)
  assert code == 0, lines[-5:]
  assert any(f"from round {stopped}" in line for line in lines), lines[-5:]
  assert _metrics_rounds(run_dir) == [1, 2, 3]

  # The uninterrupted run (same flags and seeds) ends with the same model.
  reference = config_lib.TrainingConfig(
      **FLAGS, data_dir=data_dir, root_output_dir=str(root), experiment_name="reference",
      cache_dir=str(root / "cache"), progress=False)
  assert loop.run_training(reference)["finished"]
  with np.load(os.path.join(run_dir, outputs.FINAL_MODEL_FILE)) as a, \
       np.load(root / "reference" / outputs.FINAL_MODEL_FILE) as b:
    assert a.files == b.files
    for key in a.files:
      np.testing.assert_allclose(a[key], b[key], rtol=0, atol=1e-6)


def test_ctrl_c_while_tensorflow_loads_writes_nothing(tmp_path):
  root = tmp_path / "runs"
  proc = _start(_binary(tmp_path / "no_data", root), tmp_path, "import")
  time.sleep(1.5)  # the handler is installed before TensorFlow's import, which takes longer
  _ctrl_c(proc)
  code, lines = _finish(proc)
  assert code == 130 and lines[-1] == "interrupted; nothing was written", lines[-5:]
  assert not root.exists()


def test_a_second_ctrl_c_exits_at_once(tmp_path, tiny_stackoverflow):
  data_dir = tiny_stackoverflow(num_train_clients=12)
  root = tmp_path / "runs"
  proc = _start(_binary(data_dir, root), tmp_path, "twice")
  _wait_for(proc, lambda: (root / "run" / outputs.CONFIG_FILE).exists(), "the run directory")
  _ctrl_c(proc)
  # The second Ctrl-C as soon as the first is acknowledged, while the run is still on its way
  # to the safe point (a fixed pause let a fast run reach it and exit first).
  _wait_for(proc, lambda: "Ctrl-C: stopping" in proc.err_path.read_text(),
            "the first Ctrl-C's acknowledgment", timeout=60)
  _ctrl_c(proc)
  sent = time.time()
  code, lines = _finish(proc, timeout=60)
  assert code == 130 and time.time() - sent < 20
  assert lines[-1] == "run_stackoverflow.py: interrupted again: stopped at once", lines[-5:]
  assert not group_processes(proc.pid)


# A sweep run that checkpoints its round when interrupted, resumes from it, then writes the
# summary of test_sweep_grids.FAKE_BINARY.
INTERRUPTIBLE = textwrap.dedent("""
    import os, sys, time
    from tff_mf import interrupt
    interrupt.install(defer=True)
    flags = dict(a[2:].split("=", 1) for a in sys.argv[1:])
    run_dir = os.path.join(flags["root_output_dir"], flags["experiment_name"])
    checkpoint = os.path.join(run_dir, "checkpoint")
    done = int(open(checkpoint).read()) if os.path.exists(checkpoint) else 0
    with open(os.path.join(run_dir, "starts"), "a") as f:
      f.write(f"{done}\\n")
    while done < 40:
      time.sleep(0.1)
      done += 1
      if interrupt.requested():
        with open(checkpoint, "w") as f:
          f.write(str(done))
        print(f"interrupted at round {done}; run the same command to resume", file=sys.stderr)
        sys.exit(interrupt.EXIT_CODE)
    """) + FAKE_BINARY


@pytest.mark.slow  # a sweep of runs stopped and resumed (about 10 s)
def test_sweep_forwards_ctrl_c_to_its_runs_which_resume(tmp_path):
  binary = tmp_path / "interruptible.py"
  binary.write_text(INTERRUPTIBLE)
  root = tmp_path / "runs"
  names = [r.name for r in grids.get_grid("table4_repeats").runs[:3]]
  argv = [sys.executable, "-m", "training.sweep", "--grid", "table4_repeats", "--slice", "0:3",
          "--processes", "2", "--root_output_dir", str(root), "--no_progress",
          "--binary", f"{shlex.quote(sys.executable)} {shlex.quote(str(binary))}"]
  env = userenv.env(home=tmp_path, FAKE_CALLS=str(tmp_path / "calls.txt"))
  proc = subprocess.Popen(argv, cwd=REPO, env=env, start_new_session=True,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 120
  while sum((root / n / "starts").exists() for n in names) < 2:
    assert proc.poll() is None and time.time() < deadline
    time.sleep(0.05)
  _ctrl_c(proc)  # the sweep only: its runs are in their own sessions
  _, err = proc.communicate(timeout=60)
  assert proc.returncode == 130 and "Traceback" not in err, err
  assert err.strip().splitlines()[-1] == "sweep: interrupted; run the same command to resume"
  with open(root / "sweep_table4_repeats.jsonl") as f:
    statuses = {r["name"]: r["status"] for r in map(json.loads, f)}
  interrupted = [n for n in names if statuses.get(n) == "interrupted"]
  assert len(interrupted) == 2 and statuses[names[2]] == "not_started", statuses
  stopped = {n: int((root / n / "checkpoint").read_text()) for n in interrupted}
  assert all(1 <= r < 40 for r in stopped.values())

  rerun = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
  assert rerun.returncode == 0, rerun.stderr
  for name in interrupted:  # each run resumed from its checkpoint, then finished
    assert (root / name / "starts").read_text().split() == ["0", str(stopped[name])]
    assert json.loads((root / name / "summary.json").read_text())["finished"]


def test_tff_mf_factorize_ctrl_c_writes_no_partial_entry(tmp_path):
  cache_dir = tmp_path / "cache"
  argv = [sys.executable, "-m", "tff_mf.cli", "factorize", "--mechanism", "optimal",
          "--total_rounds", "2000", "--cache-dir", str(cache_dir)]
  proc = _start(argv, tmp_path, "factorize")
  # Ctrl-C as soon as the solver's bar shows (it runs for seconds at n = 2000; a fixed sleep
  # raced it on an idle machine).
  assert _until(lambda: "optimal n=2000" in proc.err_path.read_text(), timeout=60.0), (
      proc.err_path.read_text()[-500:])
  _ctrl_c(proc)
  # Taken at once, also while the main thread is inside one long eigendecomposition (the
  # solver stops after it): a "stopping…" line within seconds (it took the call's ~1-9 s).
  assert _until(lambda: "tff-mf factorize: stopping…" in proc.err_path.read_text(),
                timeout=5.0), proc.err_path.read_text()[-500:]
  code, lines = _finish(proc, timeout=60)
  assert code == 130
  assert lines.count("tff-mf factorize: stopping…") == 1
  assert lines[-1] == ("tff-mf factorize: interrupted; no partial cache entry was written "
                       "(finished ones stay cached)")
  assert not cache_dir.exists() or not any(cache_dir.iterdir())


def test_main_job_ctrl_c_during_the_table_keeps_finished_factorizations(tmp_path):
  cache_dir = tmp_path / "cache"
  out = tmp_path / "demo"
  argv = [sys.executable, "-m", "training.main_job", "--output_dir", str(out), "--cache_dir",
          str(cache_dir), "--table_rounds", "600", "--skip_training"]
  proc = _start(argv, tmp_path, "main_job")
  _wait_for(proc, lambda: cache_dir.exists() and any(cache_dir.iterdir()),
            "the first factorization")
  _ctrl_c(proc)
  code, lines = _finish(proc, timeout=120)
  assert code == 130, lines[-5:]
  assert lines[-1] == ("interrupted; the factorizations done so far are cached, nothing else "
                       "was written; run the same command to go on")
  assert not (out / "sqrt_loss_table.md").exists()
  assert all((d / "metadata.json").exists() for d in cache_dir.iterdir())


def test_tff_mf_account_and_audit_stop_at_once_on_ctrl_c(tmp_path):
  commands = {
      "account": ["account", "--mechanism", "honaker_online", "--total_rounds", "256",
                  "--amplification", "mmcc", "--sampling-prob", "0.1", "--noise-multiplier", "1",
                  "--delta", "1e-6", "--processes", "2"],  # MMCC: minutes of row PLDs in two processes
      "audit": ["audit", "--mechanism", "opt_prefix_sum", "--total_rounds", "8",
                "--noise-multiplier", "0.5", "--participation", "fixed_epoch", "--epochs", "2",
                "--plot", str(tmp_path / "audit.png")],  # TFF start-up, then many TFF rounds
  }
  for name, args in commands.items():
    proc = _start([sys.executable, "-m", "tff_mf.cli", *args], tmp_path, name)
    time.sleep(5)
    _ctrl_c(proc)
    sent = time.time()
    code, lines = _finish(proc, timeout=60)
    assert code == 130 and time.time() - sent < 30, (name, lines[-3:])
    assert lines[-1] == f"tff-mf {name}: interrupted; nothing was written"
    assert not group_processes(proc.pid)  # MMCC workers, TFF's worker_binary: all gone
  assert not (tmp_path / "audit.png").exists()


def test_an_interrupt_python_swallows_in_a_gc_callback_still_stops(tmp_path):
  """Python cannot propagate an exception raised inside a gc callback (jax's
  _xla_gc_callback once swallowed the Ctrl-C of `tff-mf audit`, which then ran on and exited
  0): the tool still stops with its one line and 130, without "Exception ignored"."""
  code = textwrap.dedent("""
      import gc, time
      from tff_mf import interrupt
      def callback(phase, info):
        if phase == "start":
          raise interrupt.Interrupted("interrupted")
      with interrupt.handled(defer=False, prog="t", stop_line="t: interrupted; nothing was written"):
        gc.callbacks.append(callback)
        gc.collect()
        time.sleep(5)
        print("ran on")
  """)
  done = subprocess.run([sys.executable, "-c", code], env=userenv.env(home=str(tmp_path),
                                                                      pythonpath=True),
                        capture_output=True, text=True, timeout=120, cwd=userenv.REPO)
  assert done.returncode == 130 and "ran on" not in done.stdout, done.stderr
  assert done.stderr.strip().splitlines() == ["t: interrupted; nothing was written"]
