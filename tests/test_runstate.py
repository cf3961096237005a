"""The core's run-state rules (``tff_mf.runstate``), which the training binary and the Flower
wrappers both use: private files, one writer, a binding compared field by field, and a
release log that refuses an older state."""

import os

import numpy as np
import pytest

from tff_mf import checks
from tff_mf import runstate

REMEDY = "start a new run"


def test_a_state_file_others_could_read_or_write_is_refused(tmp_path):
  path = str(tmp_path / "state")
  runstate.write_private(path, lambda f: f.write(b"secret"))
  assert os.stat(path).st_mode & 0o777 == 0o600
  runstate.check_private(path, REMEDY)
  runstate.check_secret(path, "its seed", REMEDY)
  os.chmod(path, 0o640)
  runstate.check_private(path, REMEDY)
  with pytest.raises(checks.CheckError, match=r"readable by group or others \(mode 0o640\).*"
                     "start a new run"):
    runstate.check_secret(path, "its seed", REMEDY)
  os.chmod(path, 0o660)
  with pytest.raises(checks.CheckError, match="group- or other-writable"):
    runstate.check_private(path, REMEDY)


def test_a_write_never_follows_a_planted_link(tmp_path):
  target = tmp_path / "elsewhere"
  target.write_bytes(b"keep")
  os.symlink(target, tmp_path / "state.tmp")
  runstate.write_private(str(tmp_path / "state"), lambda f: f.write(b"new"))
  assert target.read_bytes() == b"keep"
  assert (tmp_path / "state").read_bytes() == b"new"


def test_one_holder_of_a_lock(tmp_path):
  path = str(tmp_path / "state.lock")
  with runstate.StateLock(path, "the state", REMEDY):
    with pytest.raises(checks.CheckError, match=rf"the state is in use by another run \(lock "
                       rf"{path} is held by pid {os.getpid()}\)"):
      runstate.StateLock(path, "the state", REMEDY)
  runstate.StateLock(path, "the state", REMEDY).release()


def test_a_binding_is_compared_field_by_field():
  recorded = {"mechanism": "gaussian", "encoder_sha256": "a" * 64}
  runstate.check_binding(recorded, dict(recorded), "the state", REMEDY)
  with pytest.raises(checks.CheckError, match=r"its encoder_sha256 is aaaaaaaaaaaaaaaa…, this "
                     r"run's bbbbbbbbbbbbbbbb…") as e:
    runstate.check_binding(recorded, {**recorded, "encoder_sha256": "b" * 64}, "the state",
                           REMEDY)
  assert "\n" not in str(e.value)
  assert runstate.binding_digest(recorded) == runstate.binding_digest(dict(reversed(
      list(recorded.items()))))


def test_the_release_log_refuses_an_older_state_and_a_different_replay(tmp_path):
  path = str(tmp_path / "releases.jsonl")
  log = runstate.ReleaseLog(path, REMEDY)
  for r in (1, 2, 3):
    log.record(r, runstate.model_digest([np.full(3, float(r))]), "binding")
  log = runstate.ReleaseLog(path, REMEDY)
  assert log.last_round == 3 and log.bound_elsewhere("binding") is None
  assert log.bound_elsewhere("other") == 1
  assert not log.check_state_round(3, "the state")
  assert log.check_state_round(4, "the state")  # a kill between the state and its log line
  with pytest.raises(checks.CheckError, match="at round 2 .* shows round 3 released: it is an "
                     "older copy"):
    log.check_state_round(2, "the state")
  with pytest.raises(checks.CheckError, match="the log was cut"):
    log.check_state_round(5, "the state")
  assert log.replays(2, runstate.model_digest([np.full(3, 2.0)]))
  with pytest.raises(checks.CheckError, match="round 2 was already released"):
    log.replays(2, runstate.model_digest([np.full(3, 2.5)]))
  with open(path, "ab") as f:
    f.write(b'{"round": 4, "sha')  # a kill inside record(): the cut line names no release
  assert runstate.ReleaseLog(path, REMEDY).last_round == 3
  with open(path, "ab") as f:
    f.write(b"not a record\n{\"round\": 9, \"sha256\": \"x\"}\n")
  with pytest.raises(checks.CheckError, match="line 4 is not a release record"):
    runstate.ReleaseLog(path, REMEDY)
