"""The secret noise seed stays secret; one run per run directory.

Run directories are private whatever the umask; a run refuses directories and
checkpoints that another user owns or that group/others can write; the default
root is per user; a second run on a held directory refuses at once and changes
nothing (two processes).
"""

import collections
import os
import stat
import subprocess
import sys
import time

import numpy as np
import pytest

import userenv
from training import checkpoints
from training import config as config_lib
from training import loop
from training import rundir
from training.config import TrainingError

REPO = userenv.REPO


@pytest.fixture(name="configs", scope="module")
def _configs(tiny_config):
  return tiny_config.using(mechanism="none", total_rounds=2, clients_per_round=2,
                           experiment_name="run")


def snapshot(directory):
  """{relative path: (mode, size, mtime_ns, bytes)} of everything under ``directory``."""
  out = {}
  for dirpath, dirnames, filenames in os.walk(directory):
    for name in dirnames + filenames:
      path = os.path.join(dirpath, name)
      st = os.stat(path)
      content = open(path, "rb").read() if stat.S_ISREG(st.st_mode) else None
      out[os.path.relpath(path, directory)] = (st.st_mode, st.st_size, st.st_mtime_ns, content)
  return out


def write_checkpoint(directory, round_num=1):
  ckpt = checkpoints.Checkpointer(str(directory))
  state = collections.OrderedDict(model=np.zeros([3, 2], np.float32))
  ckpt.save(state, checkpoints.RunProgress(round=round_num, cursor=2, noise_seed=123),
            collections.OrderedDict(sampler_order=np.arange(3)))
  return ckpt


def test_checkpoint_files_are_private_under_umask_000(tmp_path):
  previous = os.umask(0)
  try:
    directory = tmp_path / "run" / "checkpoints"
    os.makedirs(tmp_path / "run", mode=0o777)
    write_checkpoint(directory)
    loose = tmp_path / "loose"
    loose.write_text("x")  # the umask really is 000 here
    assert stat.S_IMODE(os.stat(loose).st_mode) == 0o666
  finally:
    os.umask(previous)
  modes = []
  for dirpath, dirnames, filenames in os.walk(directory):
    modes.append((dirpath, stat.S_IMODE(os.stat(dirpath).st_mode), 0o700))
    modes += [(name, stat.S_IMODE(os.stat(os.path.join(dirpath, name)).st_mode), 0o600)
              for name in filenames]
  assert len(modes) == 2  # the directory and checkpoint_1
  assert all(mode == want for _, mode, want in modes), [(p, oct(m)) for p, m, _ in modes]


def test_new_run_directory_is_0700_whatever_the_umask(tmp_path):
  previous = os.umask(0)
  try:
    path = rundir.open_run_dir(str(tmp_path / "root" / "exp"))
  finally:
    os.umask(previous)
  assert stat.S_IMODE(os.stat(path).st_mode) == 0o700


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o722])
def test_group_or_other_writable_run_directory_is_refused_and_left_alone(configs, tmp_path, mode):
  run_dir = tmp_path / "runs" / "run"
  run_dir.mkdir(parents=True)
  (run_dir / "config.json").write_text("{}")
  os.chmod(run_dir, mode)
  before = snapshot(tmp_path / "runs")
  with pytest.raises(TrainingError, match=f"refusing to use {run_dir}: .*writable") as error:
    loop.run_training(configs(tmp_path / "runs"))
  assert "\n" not in str(error.value)
  assert snapshot(tmp_path / "runs") == before


def test_writable_checkpoint_file_is_refused_before_resuming(configs, tmp_path):
  run_dir = tmp_path / "runs" / "run"
  rundir.open_run_dir(str(run_dir))
  write_checkpoint(run_dir / "checkpoints")
  victim = next(os.path.join(d, f) for d, _, files in os.walk(run_dir / "checkpoints")
                for f in sorted(files))
  os.chmod(victim, 0o666)
  with pytest.raises(TrainingError, match=f"refusing to use {victim}: .*writable"):
    loop.run_training(configs(tmp_path / "runs"))
  with pytest.raises(TrainingError, match="writable"):
    checkpoints.Checkpointer(str(run_dir / "checkpoints"))


def test_run_directory_of_another_user_is_refused(configs, tmp_path, monkeypatch):
  run_dir = tmp_path / "runs" / "run"
  rundir.open_run_dir(str(run_dir))
  real_uid = os.getuid()
  monkeypatch.setattr(os, "getuid", lambda: real_uid + 1)
  with pytest.raises(TrainingError, match=f"refusing to use {run_dir}: it is owned by uid "
                     f"{real_uid}, not by you"):
    loop.run_training(configs(tmp_path / "runs"))


def test_checkpoint_of_another_user_is_refused(configs, tmp_path, monkeypatch):
  run_dir = tmp_path / "runs" / "run"
  rundir.open_run_dir(str(run_dir))
  write_checkpoint(run_dir / "checkpoints")
  victim = next(os.path.join(d, f) for d, _, files in os.walk(run_dir / "checkpoints")
                for f in sorted(files))
  real_stat = os.stat

  def stat_with_foreign_owner(path, *args, **kwargs):
    st = real_stat(path, *args, **kwargs)
    if os.fspath(path) == victim:
      fields = list(st)
      fields[stat.ST_UID] = st.st_uid + 1
      return os.stat_result(fields)
    return st

  monkeypatch.setattr(os, "stat", stat_with_foreign_owner)
  with pytest.raises(TrainingError, match=f"refusing to use {victim}: it is owned by uid"):
    loop.run_training(configs(tmp_path / "runs"))


def test_symlinked_run_directory_of_another_user_is_refused(configs, tmp_path, monkeypatch):
  target = tmp_path / "elsewhere"
  target.mkdir(mode=0o700)
  (tmp_path / "runs").mkdir()
  os.symlink(target, tmp_path / "runs" / "run")
  rundir.check_private(str(tmp_path / "runs" / "run"))  # our own link to our own directory
  real_stat = os.stat

  def link_of_another_user(path, *args, follow_symlinks=True, **kwargs):
    st = real_stat(path, *args, follow_symlinks=follow_symlinks, **kwargs)
    if not follow_symlinks and stat.S_ISLNK(st.st_mode):
      fields = list(st)
      fields[stat.ST_UID] = st.st_uid + 1
      return os.stat_result(fields)
    return st

  monkeypatch.setattr(os, "stat", link_of_another_user)
  with pytest.raises(TrainingError, match="owned by uid"):
    loop.run_training(configs(tmp_path / "runs"))


@pytest.mark.parametrize("home", ["/home/alice", "/tmp/ci home/alice"])
def test_default_root_output_dir_is_per_user_and_not_shared(home, monkeypatch):
  """The default lives in the user's HOME, wherever HOME is (CI containers put it under /tmp)."""
  monkeypatch.setenv("HOME", home)
  default = config_lib.TrainingConfig().root_output_dir
  assert default == config_lib.DEFAULT_ROOT_OUTPUT_DIR == "~/tff_mf_runs"
  assert os.path.expanduser(default) == os.path.join(home, "tff_mf_runs")


def test_run_lock_is_exclusive_and_private(tmp_path):
  run_dir = rundir.open_run_dir(str(tmp_path / "run"))
  with rundir.RunLock(run_dir) as lock:
    assert stat.S_IMODE(os.stat(lock.path).st_mode) == 0o600
    with pytest.raises(TrainingError, match=f"{run_dir} is in use by another run .*pid "
                       f"{os.getpid()}"):
      rundir.RunLock(run_dir)
  rundir.RunLock(run_dir).release()  # free again once released


_HOLDER = """
import sys, time
from training import rundir
lock = rundir.RunLock(rundir.open_run_dir(sys.argv[1]))
print("locked", flush=True)
sys.stdin.read()  # hold the lock until the test closes stdin
"""


def test_second_run_on_a_held_directory_refuses_at_once_and_changes_nothing(tmp_path):
  root = tmp_path / "runs"
  run_dir = root / "run"
  env = userenv.env(home=tmp_path)
  holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(run_dir)], cwd=REPO, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "locked"
    (run_dir / "config.json").write_text('{"config": {}}')
    (run_dir / "metrics.csv").write_text("round\n1\n")
    before = snapshot(root)
    start = time.monotonic()
    second = subprocess.run(
        [sys.executable, os.path.join(REPO, "training", "run_stackoverflow.py"),
         "--dataset=synthetic", "--mechanism=none", "--total_rounds=2", "--clients_per_round=2",
         f"--root_output_dir={root}", "--experiment_name=run"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    elapsed = time.monotonic() - start
  finally:
    holder.stdin.close()
    holder.wait(timeout=60)
  assert second.returncode == 1, second.stderr[-3000:]
  lines = second.stderr.strip().splitlines()
  assert len(lines) == 1 and f"{run_dir} is in use by another run" in lines[0], lines
  assert f"pid {holder.pid}" in lines[0]
  assert snapshot(root) == before
  assert elapsed < 120  # TensorFlow's import, then the refusal: no data, no model, no training
  assert stat.S_IMODE(os.stat(run_dir / rundir.LOCK_FILE).st_mode) == 0o600
