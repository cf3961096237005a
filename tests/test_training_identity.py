"""A resumed or repeated run is one mechanism (training.identity).

* The encoder C and the schema are fixed at the run's start: a cache entry replaced
  by another valid C between a kill and a resume (in the run's cache or another
  --cache_dir) is refused, naming both fingerprints.
* Replays release nothing new: gaussian, TFF's tree and an MF mechanism, killed
  before the first checkpoint and between checkpoints, replay the logged rounds bit
  for bit (seeds from the run directory), and TensorBoard keeps one version of each.
* Provenance: a pinned seed, resumed without the flag, is still labelled pinned.
* A fixed-epoch run with too few non-empty clients is refused before round 1.

A "kill" here is an exception raised by the round callback right after a round is
logged: what is on disk is what a SIGKILL at that point leaves.
"""

import csv
import glob
import hashlib
import json
import os

import numpy as np
import pytest

from tff_mf.factorization import cache
from tff_mf import factorization as fz
from tff_mf import participation
from tff_mf.factorization import strategies
from tff_mf.factorization import workloads
from training import identity
from training import loop
from training import outputs
from training.config import TrainingError


class Killed(Exception):
  pass


@pytest.fixture(name="configs", scope="module")
def _configs(tiny_config):
  return tiny_config.using(total_rounds=4, clients_per_round=2, vocab_size=100, embedding_size=8,
                           lstm_size=8, projection_size=8, max_validation_elements=8,
                           max_test_elements=8, experiment_name="run", noise_multiplier=1.0,
                           rounds_per_checkpoint=2, rounds_per_eval=1, cache_subdir="cache")


def run_until(config, kill_after=None):
  def callback(round_num):
    if round_num == kill_after:
      raise Killed()
  if kill_after is None:
    return loop.run_training(config)
  with pytest.raises(Killed):
    loop.run_training(config, round_callback=callback)
  return None


def legacy_save(checkpointer, state, progress, sampling=None, background=False):
  """``Checkpointer.save`` as an earlier tff-mf wrote checkpoints: three
  ``tff.program.FileProgramStateManager`` SavedModels (program state, sampling, meta last)."""
  import asyncio  # pylint: disable=g-import-not-at-top
  import dataclasses  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from training import checkpoints  # pylint: disable=g-import-not-at-top
  from training import rundir  # pylint: disable=g-import-not-at-top
  del background
  meta = checkpoints._meta_structure()  # pylint: disable=protected-access
  meta.update({k: type(meta[k])(v) for k, v in dataclasses.asdict(progress).items()})
  with rundir.private_umask():
    for part, value in zip(checkpoints.LEGACY_PARTS, (state, sampling, meta)):
      manager = tff.program.FileProgramStateManager(checkpointer.directory, prefix=part)
      asyncio.run(manager.save(value, int(progress.round)))
  rundir.restrict_tree(checkpointer.directory)


def metric_rows(run_dir):
  """{round: row without its timing} of metrics.csv."""
  with open(os.path.join(run_dir, outputs.METRICS_FILE), newline="") as f:
    return {int(r["round"]): {k: v for k, v in r.items() if k != "round_seconds"}
            for r in csv.DictReader(f)}


def tensorboard_steps(run_dir, tag="validation/loss"):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  steps = []
  for path in glob.glob(os.path.join(run_dir, outputs.TENSORBOARD_DIR, "*tfevents*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      steps += [event.step for v in event.summary.value if v.tag == tag]
  return sorted(steps)


@pytest.mark.parametrize("mechanism,first_seed", [
    pytest.param("gaussian", None, marks=pytest.mark.slow), ("opt_prefix_sum", None),
    pytest.param("tree", 5, marks=pytest.mark.slow)])
def test_killed_runs_replay_their_logged_rounds_bit_for_bit(configs, tmp_path, mechanism,
                                                            first_seed):
  config = configs(tmp_path, mechanism=mechanism, noise_seed=first_seed)
  resumed = configs(tmp_path, mechanism=mechanism)  # a pinned seed is not repeated on resume
  run_dir = config.run_dir
  run_until(config, kill_after=1)  # before the first checkpoint (round 2)
  first = metric_rows(run_dir)
  run_until(resumed, kill_after=3)  # between the checkpoints of rounds 2 and 4
  second = metric_rows(run_dir)
  summary = run_until(resumed)
  final = metric_rows(run_dir)
  assert sorted(first) == [1] and sorted(second) == [1, 2, 3] and sorted(final) == [1, 2, 3, 4]
  assert final[1] == first[1] == second[1]
  for r in (2, 3):
    assert final[r] == second[r], r
  assert tensorboard_steps(run_dir) == [1, 2, 3, 4]  # one version of each round
  with open(os.path.join(run_dir, identity.RELEASES_FILE)) as f:
    assert [json.loads(line)["round"] for line in f] == [1, 2, 3, 4]
  path = os.path.join(run_dir, identity.IDENTITY_FILE)
  assert oct(os.stat(path).st_mode & 0o777) == "0o600"
  with open(path) as f:
    recorded = json.load(f)
  source = "pinned" if first_seed is not None else "os_entropy"
  assert recorded["seed_source"] == source
  # An unpinned key's second word is a secret; a pinned seed keeps the public tag (no field).
  assert ("noise_seed_key" in recorded) == (first_seed is None)
  assert summary["config"]["noise_seed"] == source
  assert summary["privacy"]["noise_seed_source"] == source
  assert ("warning" in summary["privacy"]) == (first_seed is not None)


def _plant_other_encoder(tmp_path, cache_dir):
  """Another valid C for the same A (C = I, B = S) under the run's cache key in
  ``cache_dir``: it passes every load check. Returns (entry, saved original, original C)."""
  [entry] = glob.glob(str(tmp_path / "cache" / "optimal-*"))
  with open(os.path.join(entry, cache.METADATA_FILE)) as f:
    params = json.load(f)["params"]
  original = cache.load(glob.glob(os.path.join(entry, "*.npz"))[0])
  a = original.a
  other = fz.Factorization(a=a, b=a.copy(), c=np.eye(4), strategy="optimal", info={},
                           extras={})
  other.info.update(strategies.error_figures(other, participation.SINGLE))
  spec = strategies.FactorizationSpec(workload=workloads.WorkloadSpec(
      "prefix_sum", 4))
  target = os.path.join(cache_dir, os.path.basename(entry))
  saved_dir = str(tmp_path / "saved_entry")
  if os.path.exists(target):
    os.rename(target, saved_dir)
  cache._write_entry(target, params, spec, other)  # pylint: disable=protected-access
  assert np.array_equal(cache.load(glob.glob(os.path.join(target, "*.npz"))[0]).c, np.eye(4))
  return entry, saved_dir, original.c


def test_a_replaced_encoder_is_refused_on_resume(configs, tmp_path):
  config = configs(tmp_path, mechanism="opt_prefix_sum", rounds_per_eval=10)
  run_until(config, kill_after=3)
  elsewhere = tmp_path / "other_cache"
  _plant_other_encoder(tmp_path, str(elsewhere))
  entry, saved_dir, original_c = _plant_other_encoder(tmp_path, str(tmp_path / "cache"))
  before = metric_rows(config.run_dir)
  old = identity.encoder_sha256(original_c)
  new = identity.encoder_sha256(np.eye(4))
  for cache_dir in (str(tmp_path / "cache"), str(elsewhere)):
    with pytest.raises(TrainingError) as e:
      run_until(configs(tmp_path, mechanism="opt_prefix_sum", rounds_per_eval=10,
                        cache_dir=cache_dir))
    message = str(e.value)
    assert "\n" not in message and old in message and new in message, message
    assert metric_rows(config.run_dir) == before  # nothing lost, nothing added
  # The original entry back: the run resumes and finishes.
  os.rename(entry, str(tmp_path / "bad_entry"))
  os.rename(saved_dir, entry)
  assert run_until(config)["finished"]


def _edit_identity(run_dir, **fields):
  path = os.path.join(run_dir, identity.IDENTITY_FILE)
  with open(path) as f:
    recorded = json.load(f)
  recorded.update(fields)
  with open(path, "w") as f:
    json.dump(recorded, f)
  return path


def test_every_identity_field_is_bound_to_the_checkpoint_and_the_releases(configs, tmp_path):
  """identity.json edited after a release: refused in one line, nothing lost; an encoder
  hash edited to match another valid C in the cache would have mixed two mechanisms."""
  config = configs(tmp_path, mechanism="opt_prefix_sum", rounds_per_eval=10)
  run_dir = config.run_dir
  path = os.path.join(run_dir, identity.IDENTITY_FILE)
  run_until(config, kill_after=1)  # no checkpoint yet: only releases.jsonl binds it
  with open(path, "rb") as f:
    original = f.read()
  edits = [dict(seed_source="pinned"), dict(config_fingerprint="0" * 64),
           dict(noise_seed_key=12345)]

  def refused(expected_line_part):
    before = metric_rows(run_dir)
    with open(os.path.join(run_dir, identity.RELEASES_FILE), "rb") as f:
      releases = f.read()
    with pytest.raises(TrainingError) as e:
      run_until(config)
    message = str(e.value)
    assert "\n" not in message and expected_line_part in message, message
    assert metric_rows(run_dir) == before
    with open(os.path.join(run_dir, identity.RELEASES_FILE), "rb") as f:
      assert f.read() == releases

  for fields in edits:
    _edit_identity(run_dir, **fields)
    refused(identity.IDENTITY_FILE)
    with open(path, "wb") as f:
      f.write(original)
  run_until(config, kill_after=3)  # checkpoint of round 2, rounds 1-3 released
  # The attack: the encoder hash set to that of another valid C planted in the cache.
  entry, saved_dir, _ = _plant_other_encoder(tmp_path, str(tmp_path / "cache"))
  edits.append(dict(encoder_sha256=identity.encoder_sha256(np.eye(4))))
  for fields in edits + [dict(schema_sha256="0" * 64)]:
    _edit_identity(run_dir, **fields)
    refused(identity.IDENTITY_FILE)
    with open(path, "wb") as f:
      f.write(original)
  os.rename(entry, str(tmp_path / "bad_entry"))
  os.rename(saved_dir, entry)
  # A group/other-readable identity file is refused (its seeds may have been read), and left.
  os.chmod(path, 0o644)
  refused("readable by group or others")
  assert oct(os.stat(path).st_mode & 0o777) == "0o644"
  os.chmod(path, 0o600)
  summary = run_until(config)
  assert summary["finished"] and summary["privacy"]["noise_seed_source"] == "os_entropy"


def test_fixed_epoch_with_too_few_nonempty_clients_is_refused_before_round_1(configs, tmp_path,
                                                                             tiny_stackoverflow):
  data_dir = tiny_stackoverflow(num_train_clients=10, num_empty_train_clients=10)
  config = configs(tmp_path, mechanism="opt_prefix_sum", dataset="stackoverflow",
                   data_dir=data_dir, total_rounds=4, clients_per_round=6,
                   participation="fixed_epoch", epochs=2)
  with pytest.raises(TrainingError, match="before round 1: too few non-empty clients"):
    run_until(config)
  assert not metric_rows(config.run_dir)
  assert not os.path.exists(os.path.join(config.run_dir, identity.RELEASES_FILE))


def _tensorboard_config(run_dir):
  """[(hparams dict, config text)] of every start of the run, in order."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensorboard.plugins.hparams import plugin_data_pb2  # pylint: disable=g-import-not-at-top
  hparams, texts = [], []
  for path in sorted(glob.glob(os.path.join(run_dir, outputs.TENSORBOARD_DIR, "*tfevents*"))):
    for event in tf.compat.v1.train.summary_iterator(path):
      for v in event.summary.value:
        if v.tag == "_hparams_/session_start_info":
          data = plugin_data_pb2.HParamsPluginData.FromString(v.metadata.plugin_data.content)
          hparams.append({k: (x.string_value or x.bool_value)
                          for k, x in data.session_start_info.hparams.items()})
        elif v.tag.startswith("config"):
          texts.append(tf.make_ndarray(v.tensor).item().decode())
  return hparams, texts


def test_a_resumed_run_reports_its_own_seed_source_and_every_nonprivate_release(configs,
                                                                                tmp_path):
  """Started pinned and with --report_train_metrics, resumed with neither flag: every output
  (summary.json, TensorBoard's hparams and config text, metrics.csv, the statement) still
  says pinned and names the non-private metrics the first rounds released."""
  first = configs(tmp_path, mechanism="opt_prefix_sum", noise_seed=7, report_train_metrics=True,
                  rounds_per_eval=10)
  run_until(first, kill_after=3)  # checkpoint of round 2; round 3 replays on resume
  summary = run_until(configs(tmp_path, mechanism="opt_prefix_sum", rounds_per_eval=10))
  assert summary["finished"]
  assert summary["config"]["noise_seed"] == "pinned"
  assert summary["config"]["report_train_metrics"] is True
  assert outputs.NONPRIVATE_NOTE in summary["notes"]
  not_covered = " ".join(summary["privacy_statement"]["not_covered"])
  assert all(k in not_covered for k in outputs.NONPRIVATE_TRAIN_KEYS), not_covered
  assert "nonprivate_train_loss" in summary["privacy_statement"]["text"]
  hparams, texts = _tensorboard_config(first.run_dir)
  assert len(hparams) == len(texts) == 2  # one per start
  assert all(h["noise_seed"] == "pinned" and h["report_train_metrics"] for h in hparams)
  assert all("| noise_seed | pinned |" in t for t in texts), texts
  rows = metric_rows(first.run_dir)
  assert sorted(rows) == [1, 2, 3, 4]
  assert all(rows[r]["nonprivate_train_loss"] for r in (1, 2, 3))  # as first logged
  assert rows[4]["nonprivate_train_loss"] == ""  # computed only with the flag


def test_release_log_refuses_a_malformed_line_and_repairs_a_cut_last_line(tmp_path):
  run_dir = str(tmp_path)
  ident = identity.RunIdentity(noise_seed=1, sampling_secret=2, seed_source="os_entropy",
                               config_fingerprint="f")
  log = identity.ReleaseLog(run_dir)
  for r in (1, 2, 3):
    log.record(r, identity.model_digest([np.full(3, float(r))]), ident)
  with open(log.path, "rb") as f:
    whole = f.read()
  lines = whole.split(b"\n")
  # A line cut (or edited) in the middle: refused, naming the file and the line.
  with open(log.path, "wb") as f:
    f.write(b"\n".join([lines[0], lines[1][:20], lines[2], b""]))
  with pytest.raises(TrainingError, match=rf"{identity.RELEASES_FILE} line 2 ") as e:
    identity.ReleaseLog(run_dir)
  assert "\n" not in str(e.value)
  # A last line cut by a kill inside record(): removed, and the next record starts clean.
  with open(log.path, "wb") as f:
    f.write(b"\n".join([lines[0], lines[1], lines[2][:20]]))
  log = identity.ReleaseLog(run_dir)
  assert sorted(log.logged) == [1, 2]
  log.record(3, identity.model_digest([np.full(3, 3.0)]), ident)
  with open(log.path, "rb") as f:
    assert f.read() == whole
  # A complete last line without its newline: kept, and its newline restored.
  with open(log.path, "wb") as f:
    f.write(whole[:-1])
  assert sorted(identity.ReleaseLog(run_dir).logged) == [1, 2, 3]
  with open(log.path, "rb") as f:
    assert f.read() == whole


def test_a_refused_replay_keeps_metrics_and_releases_consistent(configs, tmp_path):
  config = configs(tmp_path, mechanism="opt_prefix_sum", rounds_per_eval=10)
  run_dir = config.run_dir
  run_until(config, kill_after=3)  # checkpoint of round 2; round 3 logged after it
  path = os.path.join(run_dir, identity.RELEASES_FILE)
  with open(path) as f:
    records = [json.loads(line) for line in f]
  before = metric_rows(run_dir)
  assert sorted(before) == [r["round"] for r in records] == [1, 2, 3]
  records[2]["sha256"] = "0" * 64  # the rerun of round 3 cannot reproduce this release
  with open(path, "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)
  with pytest.raises(TrainingError, match="round 3 was already released"):
    run_until(config)
  assert metric_rows(run_dir) == before  # every released round still in metrics.csv
  with open(path) as f:
    assert [json.loads(line) for line in f] == records
  # A round in metrics.csv without its release record is refused before anything runs.
  with open(path, "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in records[:2])
  with pytest.raises(TrainingError, match=rf"logs round 3 but .*{identity.RELEASES_FILE}"):
    run_until(config)
  assert metric_rows(run_dir) == before


def test_a_checkpoint_without_the_identity_digest_is_refused_in_one_line(tmp_path):
  """An older tff-mf's meta (no identity digest) cannot bind identity.json: refused."""
  import asyncio  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from training import checkpoints  # pylint: disable=g-import-not-at-top
  directory = str(tmp_path / "checkpoints")
  os.mkdir(directory, 0o700)
  old = checkpoints._meta_structure()  # pylint: disable=protected-access
  del old["identity_digest"]
  old["round"] = np.int64(2)
  asyncio.run(tff.program.FileProgramStateManager(directory, prefix="meta_").save(old, 2))
  with pytest.raises(TrainingError, match="meta_2 .* without the digest that binds") as e:
    checkpoints.Checkpointer(directory).latest()
  assert "\n" not in str(e.value)


def test_an_unpinned_run_draws_two_secret_key_words_and_a_pinned_one_keeps_the_tag(configs,
                                                                                  tmp_path):
  """Issue 46 item 7: a new unpinned run's noise key is two words from OS entropy, the second
  no public tag and fresh at every start; a pinned seed is (seed, tag) as before."""
  from tff_mf.noise import keys  # pylint: disable=g-import-not-at-top
  new = loop._new_progress  # pylint: disable=protected-access
  drawn = [new(configs(tmp_path, mechanism="opt_prefix_sum"))[0] for _ in range(3)]
  assert len({p.noise_key for p in drawn}) == 3 and len({p.noise_seed_key for p in drawn}) == 3
  for progress in drawn:
    seed, key = progress.noise_key
    assert seed == progress.noise_seed and 0 <= key < 2**63 and key != keys.SEED_TAG
  progress, source = new(configs(tmp_path, mechanism="opt_prefix_sum", noise_seed=7))
  assert source == "pinned" and progress.noise_key == 7 and progress.noise_seed_key == -1
  assert keys.noise_key(progress.noise_key) == (7, keys.SEED_TAG)


def test_an_identity_without_the_key_keeps_its_digest_and_refuses_a_bad_key(tmp_path):
  """An identity written before the second key word (or a pinned one) has the file and the
  digest an earlier tff-mf wrote, so its releases.jsonl records still match."""
  old_fields = dict(noise_seed=5, sampling_secret=-1, seed_source="os_entropy",
                    config_fingerprint="f", encoder_sha256="e", schema_sha256="s")
  ident = identity.RunIdentity(**old_fields)
  old_digest = hashlib.sha256(json.dumps(old_fields, sort_keys=True).encode()).hexdigest()
  assert identity.digest(ident) == old_digest
  identity.save(str(tmp_path), ident)
  with open(tmp_path / identity.IDENTITY_FILE) as f:
    assert json.load(f) == old_fields
  assert identity.load(str(tmp_path)) == ident
  keyed = identity.RunIdentity(**old_fields, noise_seed_key=9)
  assert identity.digest(keyed) != old_digest
  identity.save(str(tmp_path), keyed)
  assert identity.load(str(tmp_path)) == keyed
  _edit_identity(str(tmp_path), noise_seed_key=-3)
  with pytest.raises(TrainingError, match="noise_seed_key must be in") as e:
    identity.load(str(tmp_path))
  assert "\n" not in str(e.value)


@pytest.mark.slow  # a run written in the former layout, resumed (about 14 s)
def test_a_run_from_before_the_key_word_resumes_with_its_identical_noise(configs, tmp_path,
                                                                          monkeypatch):
  """A run started by an earlier tff-mf (key (seed, tag), identity.json and the checkpoints'
  meta without the second word; its checkpoints SavedModels) resumes on the tag: round 3,
  released before the checkpoint of round 2 was resumed, replays bit for bit
  (releases.jsonl refuses any other model), and the run finishes with its old identity."""
  import asyncio  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from training import checkpoints  # pylint: disable=g-import-not-at-top
  from training import rundir  # pylint: disable=g-import-not-at-top
  config = configs(tmp_path, mechanism="opt_prefix_sum", rounds_per_eval=10)
  run_dir = config.run_dir
  real = loop._new_progress  # pylint: disable=protected-access

  def old_progress(cfg):
    progress, source = real(cfg)
    progress.noise_seed_key = -1  # what an earlier tff-mf drew: the public tag
    return progress, source

  monkeypatch.setattr(loop, "_new_progress", old_progress)
  monkeypatch.setattr(checkpoints.Checkpointer, "save", legacy_save)  # its SavedModels
  run_until(config, kill_after=3)  # checkpoint of round 2, rounds 1-3 released
  monkeypatch.undo()
  with open(os.path.join(run_dir, identity.IDENTITY_FILE)) as f:
    old = json.load(f)
  assert "noise_seed_key" not in old and old["seed_source"] == "os_entropy"
  # The meta as an earlier tff-mf wrote it: without the noise_seed_key field.
  directory = os.path.join(run_dir, checkpoints.CHECKPOINT_DIR)
  manager = tff.program.FileProgramStateManager(directory, prefix="meta_")
  structure = checkpoints._meta_structure  # pylint: disable=protected-access
  with rundir.private_umask():
    for version in asyncio.run(manager.get_versions()):
      meta = asyncio.run(manager.load(version, structure()))
      legacy = structure(legacy=True)
      legacy.update({k: type(legacy[k])(meta[k]) for k in legacy})
      asyncio.run(manager._remove(version))  # pylint: disable=protected-access
      asyncio.run(manager.save(legacy, version))
  latest = checkpoints.Checkpointer(directory).latest()
  assert latest.noise_seed_key == -1 and latest.noise_key == old["noise_seed"]
  summary = run_until(config)
  assert summary["finished"] and summary["privacy"]["noise_seed_source"] == "os_entropy"
  assert sorted(metric_rows(run_dir)) == [1, 2, 3, 4]
  with open(os.path.join(run_dir, identity.IDENTITY_FILE)) as f:
    assert json.load(f) == old
  with open(os.path.join(run_dir, identity.RELEASES_FILE)) as f:
    digests = {json.loads(line)["identity"] for line in f}
  assert digests == {hashlib.sha256(json.dumps(old, sort_keys=True).encode()).hexdigest()}


def _released(run_dir):
  """{round: sha256} of releases.jsonl."""
  with open(os.path.join(run_dir, identity.RELEASES_FILE)) as f:
    return {r["round"]: r["sha256"] for r in map(json.loads, f)}


def test_a_kill_before_the_background_checkpoint_is_written_replays_to_the_same_model(
    configs, tmp_path, monkeypatch):
  """The checkpoint of round 2 is written in the background while round 3 runs; the process
  dies inside that write (a cut temporary file on disk) and after round 3 is released.
  The rerun has no checkpoint: it restarts from round 0 with the recorded seeds, refuses a
  replay that differs from a logged release, and otherwise replays rounds 1-3 bit for bit
  and ends with the model of an uninterrupted run."""
  from training import checkpoints  # pylint: disable=g-import-not-at-top
  config = configs(tmp_path, mechanism="opt_prefix_sum", noise_seed=11, rounds_per_eval=10)
  run_dir = config.run_dir
  directory = os.path.join(run_dir, checkpoints.CHECKPOINT_DIR)
  real_write = checkpoints._write_npz  # pylint: disable=protected-access

  def dies_inside_the_write(path, arrays):
    if os.path.basename(path) != "checkpoint_2":
      return real_write(path, arrays)
    with open(path + ".tmp", "wb") as f:
      f.write(b"cut")  # the write, cut by the kill
    raise Killed()

  monkeypatch.setattr(checkpoints, "_write_npz", dies_inside_the_write)
  run_until(config, kill_after=3)
  monkeypatch.undo()
  assert checkpoints.Checkpointer(directory).latest() is None
  assert sorted(os.listdir(directory)) == ["checkpoint_2.tmp"]
  logged = _released(run_dir)
  assert sorted(logged) == [1, 2, 3]
  before = metric_rows(run_dir)
  path = os.path.join(run_dir, identity.RELEASES_FILE)
  with open(path) as f:
    records = [json.loads(line) for line in f]
  tampered = [dict(r, sha256="0" * 64) if r["round"] == 2 else r for r in records]
  with open(path, "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in tampered)
  with pytest.raises(TrainingError, match="round 2 was already released"):
    run_until(config)
  assert metric_rows(run_dir) == before
  with open(path, "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)
  assert run_until(config)["finished"]
  reference = configs(tmp_path, mechanism="opt_prefix_sum", noise_seed=11, rounds_per_eval=10,
                      experiment_name="reference")
  assert run_until(reference)["finished"]
  assert _released(run_dir) == _released(reference.run_dir)  # every round's model, bit for bit
  with np.load(os.path.join(run_dir, outputs.FINAL_MODEL_FILE)) as a, \
       np.load(os.path.join(reference.run_dir, outputs.FINAL_MODEL_FILE)) as b:
    assert all(np.array_equal(a[k], b[k]) for k in a.files)
  files = sorted(os.listdir(directory))
  assert files == ["checkpoint_2", "checkpoint_4"]  # the cut temporary file replaced
  assert all(os.stat(os.path.join(directory, f)).st_mode & 0o777 == 0o600 for f in files)


def test_a_background_checkpoint_is_the_state_at_its_round_and_its_failure_is_raised(tmp_path):
  """save(background=True) copies the arrays it is given (the next round may change them)
  and returns; a failed write is raised by the next wait, and the checkpoint before it stays
  the latest."""
  import collections  # pylint: disable=g-import-not-at-top
  from training import checkpoints  # pylint: disable=g-import-not-at-top
  ckpt = checkpoints.Checkpointer(str(tmp_path / "checkpoints"))
  state = collections.OrderedDict(model=np.arange(6, dtype=np.float32), event=b"Gaussian",
                                  step=np.int64(3))
  sampling = collections.OrderedDict(sampler_order=np.arange(4))
  ckpt.save(state, checkpoints.RunProgress(round=1, noise_seed=7), sampling, background=True)
  state["model"][:] = -1.0  # the next round, in place
  sampling["sampler_order"][:] = 0
  ckpt.wait()
  template = collections.OrderedDict(model=np.zeros(6, np.float32), event=b"Gaussian",
                                     step=np.int64(0))
  loaded = ckpt.load_state(1, template)
  np.testing.assert_array_equal(loaded["model"], np.arange(6, dtype=np.float32))
  assert loaded["event"] == b"Gaussian" and type(loaded["event"]) is bytes
  assert loaded["step"] == 3 and loaded["step"].dtype == np.int64
  np.testing.assert_array_equal(ckpt.load_sampling(1, sampling)["sampler_order"], np.arange(4))
  assert ckpt.latest().noise_seed == 7

  class DiskFull(OSError):
    pass

  def full(path, arrays):
    raise DiskFull(28, "No space left on device")

  real = checkpoints._write_npz  # pylint: disable=protected-access
  checkpoints._write_npz = full  # pylint: disable=protected-access
  try:
    ckpt.save(state, checkpoints.RunProgress(round=2, noise_seed=7), sampling, background=True)
    with pytest.raises(DiskFull):
      ckpt.close()
  finally:
    checkpoints._write_npz = real  # pylint: disable=protected-access
  assert ckpt.latest().round == 1
