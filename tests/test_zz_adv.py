import os, json, pytest
from test_training_identity import tiny, run_until, metric_rows
from training import identity
from training.config import TrainingError

def test_deleted_identity(tmp_path):
  config = tiny(tmp_path, mechanism="opt_prefix_sum", rounds_per_eval=10)
  run_dir = config.run_dir
  run_until(config, kill_after=3)
  path = os.path.join(run_dir, identity.IDENTITY_FILE)
  os.rename(path, path + ".bak")
  with pytest.raises(TrainingError) as e:
    run_until(config)
  print("DELETED:", e.value)
  assert not os.path.exists(path) or True
  os.rename(path + ".bak", path)
  # identity at 0640 (group-readable only)
  os.chmod(path, 0o640)
  with pytest.raises(TrainingError) as e:
    run_until(config)
  print("0640:", e.value)
  os.chmod(path, 0o600)
  # a releases.jsonl line cut in the middle, rounds after it
  rel = os.path.join(run_dir, identity.RELEASES_FILE)
  lines = open(rel).read().split("\n")
  open(rel, "w").write("\n".join([lines[0], lines[1][:15], lines[2], ""]))
  before = metric_rows(run_dir)
  with pytest.raises(TrainingError) as e:
    run_until(config)
  print("CUT:", e.value)
  assert metric_rows(run_dir) == before
