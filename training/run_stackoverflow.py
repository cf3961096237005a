"""Trains the StackOverflow next-word-prediction model with a DP mechanism.

Denisov, McMahan, Rush, Smith, Thakurta 2022 (arXiv:2202.08312), Sec 5 and App I:
DP-FedAvg whose per-round sums of clipped client updates go through a
matrix-factorization mechanism, with clients sampled under a participation schema
(single pass; k fixed epochs, Choquette-Choo et al. 2023, arXiv:2211.06530; b-min-sep
Poisson sampling, Choquette-Choo et al. 2023, arXiv:2306.08153). Rerunning the same
command resumes from its latest checkpoint.

  python training/run_stackoverflow.py --dataset=pydocs --mechanism=opt_momentum \\
      --target_epsilon=8 --total_rounds=200 --clients_per_round=10 \\
      --server_momentum=0.9 --root_output_dir=out/runs --experiment_name=momentum
  python training/run_stackoverflow.py ... --participation=fixed_epoch --epochs=2
  python training/run_stackoverflow.py ... --participation=min_sep --min_sep=20 \\
      --sampling_prob=0.05

Writes <root_output_dir>/<experiment_name>/{summary.json, metrics.csv, config.json,
tensorboard/, checkpoints/, final_model.npz}, private to the user (0700/0600).
Flags may be spelled ``--flag_name`` or ``--flag-name`` (``tff_mf.clitools``). Exit code
0 on success, 2 on a usage error (a bad flag, value or configuration: one line on stderr
with the closest valid spelling), 1 on a data or run-directory error (one line), 3 when
training diverged, 4 when the canary audit (``--canaries``) refuted the claimed ε (its lower
bound exceeds the claim; summary.json and the statement say so), 130 after Ctrl-C (the run stops at the end of the current round,
checkpointed; a second Ctrl-C stops at once).
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import logging  # pylint: disable=g-import-not-at-top,wrong-import-position

from tff_mf import clitools  # pylint: disable=wrong-import-position
from tff_mf import interrupt  # pylint: disable=wrong-import-position
from tff_mf import participation  # pylint: disable=wrong-import-position
from tff_mf import spec as spec_lib  # pylint: disable=wrong-import-position
import stackoverflow  # pylint: disable=wrong-import-position
from training import config as config_lib  # pylint: disable=wrong-import-position

_DEFAULTS = config_lib.TrainingConfig()
DIVERGED = 3  # exit status of a run whose model diverged (2 is a usage error)
REFUTED = 4  # exit status of a run whose canary audit refuted its claimed ε (training.canaries)
_NONE = "(default: none: "

clitools.define_absl_flag(
    spec_lib.MECHANISM_FLAG, __name__, default=_DEFAULTS.mechanism,
    note=" (README.md describes each; tree is TFF's tree_aggregation, none trains without DP): "
         f"{clitools.mechanism_help(trainable=True)}.")
flags.DEFINE_enum("dataset", _DEFAULTS.dataset, config_lib.DATASETS,
                  "stackoverflow (TFF's files in --data_dir), pydocs (docstrings of the installed "
                  "packages, no download), synthetic (a tiny generated corpus).")
flags.DEFINE_string("data_dir", None,
                    "Directory of the dataset files (stackoverflow) or of the built dataset "
                    f"cache (pydocs) {_NONE}$TFF_MF_STACKOVERFLOW_DIR or ~/.tff for stackoverflow, "
                    "$TFF_MF_CACHE/datasets/pydocs for pydocs).")
flags.DEFINE_boolean("pydocs_stdlib", _DEFAULTS.pydocs_stdlib,
                     "pydocs, pydocs_modules: include the standard library's docstrings, which "
                     "change with Python's patch version (--nopydocs_stdlib: the pinned "
                     "packages' alone, the same dataset from the same lock file under any "
                     "Python 3.11).")
clitools.define_absl_flag(spec_lib.workload_flag("total_rounds"), __name__,
                          default=_DEFAULTS.total_rounds, note=".")
clitools.define_absl_flag(spec_lib.CLIENTS_PER_ROUND_FLAG, __name__,
                          default=_DEFAULTS.clients_per_round, note=".")
# The schema flags of every tool (tff_mf.participation.flags), with what they mean in training.
_SCHEMA_NOTES = {
    "participation": (
        ". In training, fixed_epoch splits the clients into b = total_rounds/k cohorts of "
        "clients_per_round taken in order; min_sep joins each round of a client's class with "
        "probability --sampling_prob; balls_in_bins' ε is amplified by the secret bin and "
        "random_allocation's by random allocation, where smaller. ε is computed for the schema "
        "(summary.json names the analysis); a run whose sampled rounds break it reports no ε. "
        "Not given, it is the kind the schema flags imply, as in every tool: fixed_epoch with "
        "--epochs, min_sep with --min_sep, --sampling_prob or --max_participations, else "
        "single."),
    "epochs": " (required with those kinds, and only there)",
    "min_sep": " (required with --participation=min_sep, and only there)",
    "max_participations": (". A smaller cap is not Poisson sampling: ε is then "
                           "unamplified."),
}
for _flag in participation.flags():
  clitools.define_absl_flag(_flag, __name__, default=getattr(_DEFAULTS, _flag.name),
                            note=_SCHEMA_NOTES.get(_flag.name, ""))
clitools.define_absl_flag(spec_lib.privacy_flag("sampling_prob"), __name__,
                          note=" (required with --participation=min_sep)")
flags.DEFINE_float("client_lr", _DEFAULTS.client_lr, "Client SGD learning rate.")
flags.DEFINE_float("server_lr", _DEFAULTS.server_lr, "Server learning rate.")
clitools.define_absl_flag(spec_lib.workload_flag("server_momentum"), __name__,
                          default=_DEFAULTS.server_momentum, note=".")
clitools.define_absl_flag(spec_lib.workload_flag("lr_schedule"), __name__,
                          default=_DEFAULTS.lr_schedule, note=".")
clitools.define_absl_flag(spec_lib.workload_flag("schedule_rounds"), __name__,
                          note="; required with decay or cooldown")
for _name in ("noise_multiplier", "target_epsilon"):
  clitools.define_absl_flag(spec_lib.privacy_flag(_name), __name__)
clitools.define_absl_flag(spec_lib.privacy_flag("delta"), __name__, default=_DEFAULTS.delta)
clitools.define_absl_flag(spec_lib.privacy_flag("accountant"), __name__,
                          default=_DEFAULTS.accountant,
                          note=". It is what summary.json records as epsilon for an unamplified "
                               "run; amplified analyses use PLD (amplified banded) or MMCC and "
                               "summary.json names it (analysis); every reported ε is an upper "
                               "bound.")
clitools.define_absl_flag(spec_lib.privacy_flag("noise_distribution"), __name__,
                          default=_DEFAULTS.noise_distribution)
clitools.define_absl_flag(spec_lib.privacy_flag("granularity"), __name__)
# The clip norm and the adaptive estimator's parameters (tff_mf.spec.CLIPPING_FLAGS).
for _flag in spec_lib.CLIPPING_FLAGS:  # --clip_norm is text: a number or "adaptive"
  _default = getattr(_DEFAULTS, _flag.name)
  clitools.define_absl_flag(_flag, __name__, note=".",
                            default=str(_default) if _flag.type is str else _default)
flags.DEFINE_integer("noise_seed", None,
                     f"Pin the secret noise seed {_NONE}a fresh one from OS entropy; the seed is "
                     "kept only in the checkpoints, never in summary or config files).")
flags.DEFINE_string("cache_dir", None,
                    f"Factorization cache directory {_NONE}$TFF_MF_CACHE or ~/.cache/tff_mf).")
# The family parameters of every tool (tff_mf.spec.family_flags): bands, rank, buffers and
# each family's own.
for _flag in spec_lib.family_flags():
  clitools.define_absl_flag(_flag, __name__)
flags.DEFINE_string("root_output_dir", _DEFAULTS.root_output_dir,
                    "Root of the run directories; per user, never a shared place such as /tmp "
                    "(the run directory holds the secret noise seed).")
flags.DEFINE_string("experiment_name", _DEFAULTS.experiment_name,
                    "Run directory name under --root_output_dir (one path component).")
flags.DEFINE_integer("rounds_per_eval", _DEFAULTS.rounds_per_eval,
                     "Validation every k rounds (and after the last).")
flags.DEFINE_integer("rounds_per_checkpoint", _DEFAULTS.rounds_per_checkpoint,
                     "Checkpoint every k rounds (and after the last).")
flags.DEFINE_integer("vocab_size", _DEFAULTS.vocab_size, "Vocabulary words (10000 in the papers).")
flags.DEFINE_integer("num_oov_buckets", _DEFAULTS.num_oov_buckets, "Out-of-vocabulary buckets.")
flags.DEFINE_integer("embedding_size", _DEFAULTS.embedding_size,
                     "Embedding size (96 in the papers).")
flags.DEFINE_integer("lstm_size", _DEFAULTS.lstm_size, "LSTM units (670 in the papers).")
flags.DEFINE_integer("projection_size", _DEFAULTS.projection_size,
                     "Projection units (96 in the papers).")
flags.DEFINE_enum("lstm_kernel", _DEFAULTS.lstm_kernel, stackoverflow.LSTM_KERNELS,
                  "The LSTM's kernel: keras (Keras' cell; its cuDNN layer on a GPU) or block "
                  "(TensorFlow's fused BlockLSTMV2 op: the same variables and function, about "
                  "2x faster a step on small models on a CPU, slower at the papers' 670 "
                  "units).")
flags.DEFINE_integer("sequence_length", _DEFAULTS.sequence_length,
                     "Words per sentence (20 in the papers).")
flags.DEFINE_integer("max_elements_per_client", _DEFAULTS.max_elements_per_client,
                     "Sentences per client (256 in the papers).")
flags.DEFINE_integer("client_batch_size", _DEFAULTS.client_batch_size,
                     "Client batch size (16 in the papers).")
flags.DEFINE_integer("max_validation_elements", _DEFAULTS.max_validation_elements,
                     "Validation sentences (10000 in the papers).")
flags.DEFINE_integer("max_test_elements", None,
                     f"Cap on the test sentences {_NONE}the whole test split).")
flags.DEFINE_bool("progress", _DEFAULTS.progress,
                  "One progress bar per run on stderr (rounds, loss, ETA); --no_progress turns "
                  "it off.")
flags.DEFINE_bool("report_train_metrics", _DEFAULTS.report_train_metrics,
                  "Also write the clients' training loss and accuracy (nonprivate_train_* in "
                  "metrics.csv, TensorBoard and summary.json). Off by default: they are computed "
                  "on raw client data without noise, so they are not covered by ε; with the "
                  "flag off, everything a run writes is post-processing of the DP model or of "
                  "held-out data.")
flags.DEFINE_list("workers", [],
                  "host:port,... of remote TFF worker_binary executor services; empty: train in "
                  "this process (see training/distributed.py).")
flags.DEFINE_enum("engine", _DEFAULTS.engine, config_lib.ENGINES,
                  config_lib.ENGINE_HELP[0].upper() + config_lib.ENGINE_HELP[1:] + ".")
flags.DEFINE_integer("seed", _DEFAULTS.seed, "Seed of client sampling and model init.")
flags.DEFINE_integer("canaries", _DEFAULTS.canaries,
                     "Plant m canary clients and audit the run's claimed ε in one run (0: off; "
                     "training/canaries.py, docs/threat_model.md): each is a synthetic client "
                     "whose update is a random direction clipped to --clip_norm, included by a "
                     "fair coin, joining one participation pattern of the schema; after the "
                     "last round the run reports the one-run ε lower bound beside the claim "
                     "(exit status 4 when it exceeds the claim). At most --clients_per_round "
                     "per pattern; single, fixed_epoch or balls_in_bins participation, the "
                     "compiled engine and a fixed clip norm.")
flags.DEFINE_float("canary_alpha", _DEFAULTS.canary_alpha,
                   "--canaries: the audit's failure probability (each bound holds at "
                   "confidence 1 - alpha).")
flags.DEFINE_float("canary_plan_mu", None,
                   f"Planning μ {_NONE}the claim's μ = sens/z): with --canaries, the "
                   "Gaussian-DP μ of the score model the guess counts are planned on before "
                   "round 1.")
flags.DEFINE_integer("canary_seed", None,
                     f"Pin the canaries {_NONE}fresh from OS entropy): with --canaries, the seed "
                     "of their coins and directions; pinned, the audit is a demonstration: "
                     "whoever knows the seed knows which canaries were included.")

FLAGS = flags.FLAGS


def parse_flags_then_import_tensorflow(argv):
  """absl's flag parsing, then ``import tensorflow`` while absl's app is still initializing.

  Why TensorFlow must be imported before ``app.run`` calls ``main``: on import,
  TensorFlow registers ``absl.app.call_after_init(_set_total_phsyical_gpus)``
  (tensorflow/python/distribute/combinations.py). Once absl's app has finished
  initializing, ``call_after_init`` runs the callback at once, i.e. in the middle
  of ``import tensorflow``, before TensorFlow has switched to eager mode; the
  callback creates TensorFlow's eager context then, whose thread-local
  context-switch stack starts without its eager entry. Afterwards
  ``executing_eagerly_outside_functions()`` is False inside Keras's functional
  graph, so ``tf.keras.Input`` makes a graph placeholder instead of a
  KerasTensor and the LSTM is built eagerly on a symbolic length:
  "'SymbolicTensor' object cannot be interpreted as an integer". With the import
  here, absl defers the callback until after initialization, when TensorFlow is
  fully imported. (Tests used to miss this because their subprocesses inherited
  ``TF2_BEHAVIOR=1``, which TensorFlow sets in ``os.environ`` of the process that
  imports it, and which makes the early context eager too.) Parsing first keeps
  ``--help`` and flag errors fast. Flags are parsed with the vocabulary of every tool
  (``tff_mf.clitools``: both spellings, one-line errors with the closest spelling, exit
  status 2; ``--help`` exits 0).
  """
  remaining = clitools.parse_absl_flags(argv)
  if len(remaining) > 1:
    clitools.usage_error(os.path.basename(argv[0]), f"unexpected arguments: {remaining[1:]}")
  import tensorflow  # pylint: disable=g-import-not-at-top,unused-import
  return remaining


def config_from_flags() -> config_lib.TrainingConfig:
  values = {f.name: FLAGS[f.name].value for f in config_lib.dataclasses.fields(
      config_lib.TrainingConfig) if f.name in FLAGS}
  values["workers"] = tuple(values.get("workers") or ())
  values["family_params"] = tuple(sorted(  # a family's own parameters (no config field each)
      (f.name, FLAGS[f.name].value) for f in spec_lib.family_flags()
      if f.name not in values and FLAGS[f.name].value is not None))
  if not FLAGS["participation"].present:  # the schema flags imply it, as in every tool
    values["participation"] = clitools.implied_participation(
        None, values["epochs"], values["min_sep"], values["max_participations"],
        values["sampling_prob"], default=values["participation"])
  values["clip_norm"] = _clip_norm(values["clip_norm"])
  return config_lib.TrainingConfig(**values)


def _clip_norm(text: str):
  """--clip_norm: "adaptive" or a number (a bad value is a one-line error from the config)."""
  if text == "adaptive":
    return text
  try:
    return float(text)
  except ValueError:
    raise config_lib.TrainingError(
        f"--clip_norm must be a positive number or 'adaptive', got {text!r}") from None


def _one_line(error: BaseException) -> str:
  return " ".join(str(error).split()) or type(error).__name__


def main(argv):
  del argv  # parse_flags_then_import_tensorflow refused positional arguments
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # absl's INFO lines only with --verbosity
  try:
    config = config_from_flags()
    config.validate()
  except config_lib.TrainingError as e:  # a usage error: one line, exit status 2
    print(f"error: {_one_line(e)}", file=sys.stderr)
    return clitools.USAGE_ERROR
  from stackoverflow import word_counts  # pylint: disable=g-import-not-at-top
  from training import distributed  # pylint: disable=g-import-not-at-top
  from training import loop  # pylint: disable=g-import-not-at-top
  try:
    interrupt.check("interrupted; nothing was written")
    summary = loop.run_training(config)
  except interrupt.Interrupted as e:
    print(e, file=sys.stderr)  # the rounds run are checkpointed: the same command resumes
    return interrupt.EXIT_CODE
  except word_counts.DatasetUnavailableError as e:
    print(f"error: {e}", file=sys.stderr)  # several lines by design: what to fetch, and where
    return 1
  except (ValueError, distributed.WorkerError) as e:
    # TrainingError, CheckError, RegistryError and the library's ValueErrors: one line, no
    # traceback. Everything written so far (checkpoints, metrics.csv) stays; rerunning the
    # same command resumes from the last checkpoint. The arguments its remedy names are spelled
    # as the flags (e.g. the discrete Gaussian's --granularity, checked once TFF knows d).
    print(f"error: {_one_line(clitools.flag_message(e))}", file=sys.stderr)
    return 1
  status, message = exit_status(summary)
  if message:
    print(message, file=sys.stderr)
  return status


def exit_status(summary) -> tuple:
  """(exit status, line for stderr or None) of a finished run's summary: DIVERGED, REFUTED
  when the canary audit's bound exceeds the claimed ε, else 0."""
  from training import records  # pylint: disable=g-import-not-at-top
  summary = records.RunSummary.of_json(summary)
  if summary.diverged:
    return DIVERGED, None
  audit = summary.canary_audit or {}
  if audit.get("exceeds_claim"):
    return REFUTED, ("error: the canary audit's epsilon lower bound "
                     f"{audit['epsilon_lower_bound']:.4g} EXCEEDS the claimed "
                     f"epsilon {summary.epsilon:.4g} (canary_audit.json in the run directory)")
  return 0, None


if __name__ == "__main__":
  # Before TensorFlow's import: a first Ctrl-C stops at the next safe point (the end of the
  # current round, checkpointed), a second at once; never a traceback, never swallowed.
  interrupt.install(defer=True, prog="run_stackoverflow.py",
                    notice="Ctrl-C: stopping at the next safe point, the end of the current "
                           "round, checkpointed (Ctrl-C again stops at once)")
  app.run(main, flags_parser=parse_flags_then_import_tensorflow)
