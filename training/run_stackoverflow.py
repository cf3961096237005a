"""Trains the StackOverflow next-word-prediction model with a DP mechanism.

Denisov et al. Sec 5 / App I (`001_…`, `000_…`): single-pass DP-FedAvg whose
per-round sums of clipped client updates go through a matrix-factorization
mechanism. Rerunning the same command resumes from its latest checkpoint.

  python training/run_stackoverflow.py --dataset=pydocs --mechanism=opt_momentum \\
      --target_epsilon=8 --total_rounds=200 --clients_per_round=10 \\
      --server_momentum=0.9 --root_output_dir=out/runs --experiment_name=momentum

Writes <root_output_dir>/<experiment_name>/{summary.json, metrics.csv,
tensorboard/, checkpoints/, final_model.npz}. Exit code 0 on success, 1 on a
configuration or data error (message on stderr), 2 when training diverged.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position

from training import train_lib  # pylint: disable=g-import-not-at-top,wrong-import-position

_DEFAULTS = train_lib.TrainingConfig()

flags.DEFINE_enum("mechanism", _DEFAULTS.mechanism, train_lib.MECHANISM_FLAGS,
                  "DP mechanism: tree (Honaker online, DP-FTRL), honaker_full, opt_prefix_sum, "
                  "opt_momentum (momentum and lr schedule inside the matrix), structured "
                  "(banded + low-rank), gaussian (independent noise each round), none (no DP).")
flags.DEFINE_enum("dataset", _DEFAULTS.dataset, train_lib.DATASETS,
                  "stackoverflow (TFF's files in --data_dir), pydocs (docstrings of the installed "
                  "packages, no download), synthetic (TFF's tiny synthetic StackOverflow).")
flags.DEFINE_string("data_dir", None, "Directory of the dataset files / cache.")
flags.DEFINE_integer("total_rounds", _DEFAULTS.total_rounds, "Rounds n (the matrix size).")
flags.DEFINE_integer("clients_per_round", _DEFAULTS.clients_per_round, "Clients per round.")
flags.DEFINE_float("client_lr", _DEFAULTS.client_lr, "Client SGD learning rate.")
flags.DEFINE_float("server_lr", _DEFAULTS.server_lr, "Server learning rate.")
flags.DEFINE_float("server_momentum", _DEFAULTS.server_momentum, "Server momentum β.")
flags.DEFINE_enum("lr_schedule", _DEFAULTS.lr_schedule, train_lib.LR_SCHEDULES,
                  "Server learning-rate schedule over the last --schedule_rounds rounds.")
flags.DEFINE_integer("schedule_rounds", None, "Rounds of the decay/cooldown at the end.")
flags.DEFINE_float("noise_multiplier", None, "Noise multiplier z (σ = z·clip_norm).")
flags.DEFINE_float("target_epsilon", None, "Calibrate z to this ε (instead of --noise_multiplier).")
flags.DEFINE_float("delta", _DEFAULTS.delta, "δ of the (ε, δ) guarantee.")
flags.DEFINE_enum("accountant", _DEFAULTS.accountant, ("pld", "rdp"), "Privacy accountant.")
flags.DEFINE_float("clip_norm", _DEFAULTS.clip_norm, "Per-client L2 clip norm ζ.")
flags.DEFINE_integer("noise_seed", None, "Pin the noise seed (default: OS entropy; the seed is "
                     "kept only in the checkpoint, never in summary/config files).")
flags.DEFINE_string("matrix_cache", None, "Factorization cache directory (default TFF_MF_CACHE "
                    "or ~/.cache/tff_mf).")
flags.DEFINE_integer("bands", None, "structured: bands h of B̂.")
flags.DEFINE_integer("rank", None, "structured: rank r of B̂'s low-rank part.")
flags.DEFINE_string("root_output_dir", _DEFAULTS.root_output_dir, "Root of the run directories.")
flags.DEFINE_string("experiment_name", _DEFAULTS.experiment_name, "Run directory name.")
flags.DEFINE_integer("rounds_per_eval", _DEFAULTS.rounds_per_eval, "Validation every k rounds.")
flags.DEFINE_integer("rounds_per_checkpoint", _DEFAULTS.rounds_per_checkpoint,
                     "Checkpoint every k rounds.")
flags.DEFINE_integer("vocab_size", _DEFAULTS.vocab_size, "Vocabulary words (10000 in the papers).")
flags.DEFINE_integer("num_oov_buckets", _DEFAULTS.num_oov_buckets, "OOV buckets.")
flags.DEFINE_integer("embedding_size", _DEFAULTS.embedding_size, "Embedding size (96).")
flags.DEFINE_integer("lstm_size", _DEFAULTS.lstm_size, "LSTM units (670).")
flags.DEFINE_integer("projection_size", _DEFAULTS.projection_size, "Projection units (96).")
flags.DEFINE_integer("sequence_length", _DEFAULTS.sequence_length, "Words per sentence (20).")
flags.DEFINE_integer("max_elements_per_client", _DEFAULTS.max_elements_per_client,
                     "Sentences per client (256).")
flags.DEFINE_integer("client_batch_size", _DEFAULTS.client_batch_size, "Client batch size (16).")
flags.DEFINE_integer("max_validation_elements", _DEFAULTS.max_validation_elements,
                     "Validation sentences (10000).")
flags.DEFINE_integer("max_test_elements", None, "Cap on test sentences (default: all).")
flags.DEFINE_bool("progress", True, "Per-round progress lines on stderr.")
flags.DEFINE_list("workers", [], "host:port,... of remote TFF worker_binary executor services "
                  "(see training/distributed.py).")
flags.DEFINE_integer("seed", _DEFAULTS.seed, "Seed of client sampling and model init.")

FLAGS = flags.FLAGS


def config_from_flags() -> train_lib.TrainingConfig:
  names = [f.name for f in train_lib.dataclasses.fields(train_lib.TrainingConfig)]
  values = {name: FLAGS[name].value for name in names if name in FLAGS}
  values["workers"] = tuple(values.get("workers") or ())
  return train_lib.TrainingConfig(**values)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  try:
    summary = train_lib.run_training(config_from_flags())
  except train_lib.TrainingError as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  except Exception as e:  # pylint: disable=broad-except
    from stackoverflow import data as so_data  # pylint: disable=g-import-not-at-top
    from training import distributed  # pylint: disable=g-import-not-at-top
    if isinstance(e, (so_data.DatasetUnavailableError, distributed.WorkerError)):
      # One clear line; rerunning the same command resumes from the last checkpoint.
      print(f"error: {e}", file=sys.stderr)
      return 1
    raise
  return 2 if summary["diverged"] else 0


if __name__ == "__main__":
  app.run(main)
