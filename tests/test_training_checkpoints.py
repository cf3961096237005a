"""Incremental checkpoints (``training.checkpoints``): a large state leaf that a round passes on
unchanged is written once and referred to; every kept checkpoint loads bit for bit, after a
kill at any point, and a lost or changed referred file is a one-line error."""

import collections
import os
import zipfile

import numpy as np
import pytest

from training import checkpoints
from training.config import TrainingError

ROW = checkpoints.INCREMENTAL_BYTES // 4  # float32 entries of a row just large enough


def _rows(seed, k=4):
  rng = np.random.default_rng(seed)
  return [rng.standard_normal(ROW).astype(np.float32) for _ in range(k)]


def _state(rows, step):
  return collections.OrderedDict(rows=tuple(rows), step=np.int64(step),
                                 small=np.arange(5, dtype=np.float32) * step)


def _members(directory, version):
  with zipfile.ZipFile(os.path.join(directory, f"checkpoint_{version}")) as zf:
    return {info.filename[:-4]: info.file_size for info in zf.infolist()}


def _large_members(directory, version):
  return sorted(k for k, size in _members(directory, version).items()
                if size >= checkpoints.INCREMENTAL_BYTES)


def _assert_loads(ckpt, version, state):
  loaded = ckpt.load_state(version, state)
  for got, want in zip(loaded["rows"], state["rows"]):
    assert got.dtype == want.dtype and np.array_equal(got.view(np.uint32), want.view(np.uint32))
  assert loaded["step"] == state["step"]
  np.testing.assert_array_equal(loaded["small"], state["small"])


def _shift(rows, seed):
  """A banded stream's round: a new row in front, the others passed on, the last dropped."""
  return _rows(seed, 1) + list(rows[:-1])


def test_a_row_passed_on_is_written_once_and_loaded_from_the_file_that_holds_it(tmp_path):
  directory = str(tmp_path / "checkpoints")
  ckpt = checkpoints.Checkpointer(directory, keep=2)
  rows, states = _rows(0), {}
  for version in range(1, 7):
    states[version] = _state(rows, version)
    ckpt.save(states[version], checkpoints.RunProgress(round=version), background=True)
    ckpt.wait()
    # The first file holds every row, each later one the new row alone.
    assert len(_large_members(directory, version)) == (4 if version == 1 else 1)
    rows = _shift(rows, version)
  ckpt.close()
  # Kept: rounds 5 and 6, whose rows were made in rounds 2-5 and 3-6: files 2-4 stay for
  # their rows (no longer checkpoints), round 1's goes.
  assert sorted(os.listdir(directory)) == ["checkpoint_5", "checkpoint_6", "rows_2", "rows_3",
                                           "rows_4"]
  fresh = checkpoints.Checkpointer(directory, keep=2)
  for version in (5, 6):
    _assert_loads(fresh, version, states[version])
  assert fresh.latest().round == 6


def test_only_equal_bits_are_referred_to(tmp_path):
  """A row changed in place after its save, or differing only in the sign of a zero, is
  written again: the writer compares with its own copy, bit for bit."""
  directory = str(tmp_path / "checkpoints")
  ckpt = checkpoints.Checkpointer(directory)
  rows = _rows(1) + [np.zeros(ROW, np.float32)]
  first = _state(rows, 1)
  ckpt.save(first, checkpoints.RunProgress(round=1), background=True)
  saved = [r.copy() for r in rows]
  rows[0] *= 2.0  # the caller's array, changed in place after the save
  rows[4] = -rows[4]  # -0.0: float-equal to 0.0, other bits
  second = _state(rows, 2)
  ckpt.save(second, checkpoints.RunProgress(round=2), background=True)
  ckpt.close()
  assert _large_members(directory, 2) == ["program_state/0", "program_state/4"]
  fresh = checkpoints.Checkpointer(directory)
  _assert_loads(fresh, 2, second)
  _assert_loads(fresh, 1, _state(saved, 1))
  assert np.signbit(fresh.load_state(2, second)["rows"][4]).all()


def test_a_kill_inside_a_write_leaves_the_checkpoints_before_it_whole(tmp_path, monkeypatch):
  """The write of round 3 dies (a cut temporary file); round 2, which refers to round 1's
  file, still loads; the rerun (a new process: nothing held) writes round 3 whole."""
  directory = str(tmp_path / "checkpoints")
  ckpt = checkpoints.Checkpointer(directory, keep=1)
  rows, states = _rows(2), {}
  for version in (1, 2):
    states[version] = _state(rows, version)
    ckpt.save(states[version], checkpoints.RunProgress(round=version))
    rows = _shift(rows, 10 + version)
  real = checkpoints._write_npz  # pylint: disable=protected-access

  class Killed(Exception):
    pass

  def dies(path, arrays):
    with open(path + ".tmp", "wb") as f:
      f.write(b"cut")
    raise Killed()

  monkeypatch.setattr(checkpoints, "_write_npz", dies)
  with pytest.raises(Killed):
    ckpt.save(_state(rows, 3), checkpoints.RunProgress(round=3))
  monkeypatch.setattr(checkpoints, "_write_npz", real)
  rerun = checkpoints.Checkpointer(directory, keep=1)
  assert rerun.latest().round == 2
  _assert_loads(rerun, 2, states[2])
  states[3] = _state(rows, 3)
  rerun.save(states[3], checkpoints.RunProgress(round=3))
  assert len(_large_members(directory, 3)) == 4
  assert sorted(os.listdir(directory)) == ["checkpoint_3"]  # round 3 refers to no file
  _assert_loads(rerun, 3, states[3])


def test_a_lost_or_replaced_referred_file_is_a_one_line_error(tmp_path):
  directory = str(tmp_path / "checkpoints")
  ckpt = checkpoints.Checkpointer(directory, keep=3)
  rows = _rows(3)
  first, second = _state(rows, 1), _state(_shift(rows, 30), 2)
  ckpt.save(first, checkpoints.RunProgress(round=1))
  ckpt.save(second, checkpoints.RunProgress(round=2))
  # Round 1's file replaced by a whole, valid checkpoint of other rows: refused by its CRC.
  other = checkpoints.Checkpointer(str(tmp_path / "other"), keep=3)
  other.save(_state(_rows(4), 1), checkpoints.RunProgress(round=1))
  os.replace(str(tmp_path / "other" / "checkpoint_1"), os.path.join(directory, "checkpoint_1"))
  with pytest.raises(TrainingError, match="checkpoint_1, which holds another one") as e:
    ckpt.load_state(2, second)
  assert "\n" not in str(e.value)
  os.unlink(os.path.join(directory, "checkpoint_1"))
  with pytest.raises(TrainingError, match="refers to checkpoint_1, which is missing") as e:
    ckpt.load_state(2, second)
  assert "\n" not in str(e.value)
  assert sorted(os.listdir(directory)) == ["checkpoint_2"]  # nothing else removed


def _released(run_dir):
  import json  # pylint: disable=g-import-not-at-top
  from training import identity  # pylint: disable=g-import-not-at-top
  with open(os.path.join(run_dir, identity.RELEASES_FILE)) as f:
    return {r["round"]: r["sha256"] for r in map(json.loads, f)}


def test_a_banded_run_killed_and_resumed_on_incremental_checkpoints_is_the_same_run(
    tiny_config, tmp_path, monkeypatch):
  """Every state leaf counts as large here, so each checkpoint of a banded run refers to the
  rows earlier files hold; killed after round 3, the rerun resumes from round 2's checkpoint
  and ends with every release of an uninterrupted run, bit for bit."""
  from training import loop  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(checkpoints, "INCREMENTAL_BYTES", 1)
  configs = tiny_config.using(total_rounds=5, clients_per_round=2, vocab_size=100,
                              embedding_size=8, lstm_size=8, projection_size=8,
                              max_validation_elements=8, max_test_elements=8,
                              noise_multiplier=1.0, rounds_per_checkpoint=1, rounds_per_eval=10,
                              cache_subdir="cache", mechanism="banded", noise_seed=5)
  config = configs(tmp_path, experiment_name="run")

  def kill_after_round_3(round_num):
    if round_num == 3:
      raise KeyboardInterrupt
  with pytest.raises(KeyboardInterrupt):
    loop.run_training(config, round_callback=kill_after_round_3)
  directory = os.path.join(config.run_dir, checkpoints.CHECKPOINT_DIR)
  assert checkpoints.Checkpointer(directory).latest().round == 2
  refs = _members(directory, 2)
  assert "program_state/__ref_leaves__" in refs  # round 2 refers to round 1's rows
  assert loop.run_training(config)["finished"]
  reference = configs(tmp_path, experiment_name="reference")
  assert loop.run_training(reference)["finished"]
  assert _released(config.run_dir) == _released(reference.run_dir)


def test_per_variable_stream_rows_of_an_earlier_tff_mf_load_in_this_layout(tmp_path):
  """An earlier tff-mf kept each ``LinearNoise`` state row as one entry per variable; its
  checkpoint loads into this layout (one flat vector per dtype, the variables in order): the
  same values, so the resumed run continues the identical stream. Another structure is still
  refused in one line."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tff_mf import mechanisms  # pylint: disable=g-import-not-at-top
  from tff_mf import spec as spec_lib  # pylint: disable=g-import-not-at-top
  from tff_mf.tf import noise  # pylint: disable=g-import-not-at-top
  resolved, _ = mechanisms.build(spec_lib.MechanismSpec.from_args(
      "blt", total_rounds=6, clients_per_round=2, clip_norm=1.0, noise_multiplier=1.0))
  stream = noise.LinearNoise(resolved.stream, resolved.factorization.c)
  specs = [tf.TensorSpec([3], tf.float32), tf.TensorSpec([2, 2], tf.float64),
           tf.TensorSpec([5], tf.float32)]
  rng = np.random.default_rng(5)
  old_rows = tuple((rng.standard_normal(3).astype(np.float32), rng.standard_normal((2, 2)),
                    rng.standard_normal(5).astype(np.float32)) for _ in range(stream.state_rows()))
  ckpt = checkpoints.Checkpointer(str(tmp_path / "checkpoints"))
  ckpt.save(collections.OrderedDict(round_index=np.int32(4), stream_state=old_rows),
            checkpoints.RunProgress(round=1))
  template = collections.OrderedDict(
      round_index=np.int32(0),
      stream_state=tf.nest.map_structure(lambda t: t.numpy(), stream.initial_state(specs)))
  loaded = ckpt.load_state(1, template)
  assert loaded["round_index"] == 4
  for old, new in zip(old_rows, loaded["stream_state"]):
    assert [x.dtype for x in new] == [np.float32, np.float64]
    np.testing.assert_array_equal(new[0], np.concatenate([old[0], old[2]]))
    np.testing.assert_array_equal(new[1], old[1].ravel())
  other = collections.OrderedDict(round_index=np.int32(0), stream_state=template["stream_state"][:-1])
  with pytest.raises(TrainingError, match="does not have this run's state structure") as e:
    ckpt.load_state(1, other)
  assert "\n" not in str(e.value)


def test_a_round_saved_again_refers_to_no_file_it_replaces(tmp_path):
  """Saving round 2 twice (or round 1 after round 2) never refers to the file being
  replaced, or to a later one: each save loads."""
  directory = str(tmp_path / "checkpoints")
  ckpt = checkpoints.Checkpointer(directory, keep=5)
  rows = _rows(6)
  for version in (1, 2, 2, 1):
    state = _state(rows, version)
    ckpt.save(state, checkpoints.RunProgress(round=version))
    _assert_loads(checkpoints.Checkpointer(directory, keep=5), version, state)


def test_a_file_kept_for_its_rows_is_no_checkpoint_to_resume_from(tmp_path):
  """keep=1 over rounds 1-4 of a four-row shift: round 4 refers to rows of rounds 1-3, whose
  files stay as rows_<round> (whose own references are not kept: they are read only for the
  members they hold); the latest checkpoint is round 4 and loads."""
  directory = str(tmp_path / "checkpoints")
  ckpt = checkpoints.Checkpointer(directory, keep=1)
  rows, states = _rows(7), {}
  for version in range(1, 5):
    states[version] = _state(rows, version)
    ckpt.save(states[version], checkpoints.RunProgress(round=version))
    rows = _shift(rows, 70 + version)
  assert sorted(os.listdir(directory)) == ["checkpoint_4", "rows_1", "rows_2", "rows_3"]
  fresh = checkpoints.Checkpointer(directory, keep=1)
  assert fresh.latest().round == 4
  _assert_loads(fresh, 4, states[4])
  states[5] = _state(rows, 5)
  fresh.save(states[5], checkpoints.RunProgress(round=5))  # a new process: every row written
  assert sorted(os.listdir(directory)) == ["checkpoint_5"]
  _assert_loads(fresh, 5, states[5])
