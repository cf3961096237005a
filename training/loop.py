"""The training loop: DP FedAvg over sampled client rounds, checkpointed and resumable.

The loop of Denisov et al. 2022 (arXiv:2202.08312, Sec 5 and App I): FedAvg where
each round's clipped client updates go through a matrix-factorization mechanism
(``training.run_setup``), clients are sampled under the run's participation schema
(``training.sampling``: single pass, fixed epochs or b-min-sep Poisson sampling), ε
is that of the schema and its analysis (``training.privacy``), and the state is
checkpointed through ``tff.program.FileProgramStateManager``
(``training.checkpoints``) in a private, locked run directory (``training.rundir``).
The participations actually sampled are recorded; a run that broke its schema
reports no ε.

``run_training(TrainingConfig(...))`` is what ``training/run_stackoverflow.py``
calls; it returns the summary dict it also writes to ``<run dir>/summary.json``.
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import json
import math
import os
import re
import sys
import time
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np

from tff_mf import checks
from tff_mf import interrupt
from tff_mf import jsonio
from tff_mf import participation as participation_lib
from tff_mf import registry
from tff_mf.noise import keys as noise_keys
from training import canaries as canaries_lib
from training import checkpoints
from training import engine
from training import identity as identity_lib
from training import run_setup
from training import outputs
from training import privacy
from training import records
from training import rundir
from training import sampling
from training import task as task_lib
from training.config import TrainingConfig
from training.config import TrainingError
from training.config import is_seedless

Log = Callable[[str], None]
RoundCallback = Callable[[int], None]
# The library's own in-graph checks (tff_mf.tf.query) name themselves in their message.
_LIBRARY_ERROR = re.compile(re.escape(checks.IN_GRAPH_PREFIX) + r"([^\]\n]*)")


def _stderr(message: str) -> None:
  print(message, file=sys.stderr, flush=True)


@dataclasses.dataclass
class _Run:
  """Everything the rounds of one run share."""
  config: TrainingConfig
  run_dir: str
  checkpointer: checkpoints.Checkpointer
  progress: checkpoints.RunProgress
  created_utc: str
  start_utc: str
  log: Log
  round_callback: Optional[RoundCallback]
  identity: Optional[identity_lib.RunIdentity]  # None until the mechanism is built and bound
  releases: identity_lib.ReleaseLog
  seed_source: str
  session_start: float = dataclasses.field(default_factory=time.perf_counter)
  wall_before: float = 0.0

  def wall_seconds(self) -> float:
    return self.wall_before + time.perf_counter() - self.session_start

  def nonprivate_metrics(self) -> Tuple[str, ...]:
    """The non-private metrics released over the whole run: by any logged round, or by this
    invocation (``--report_train_metrics``)."""
    names = set(self.releases.nonprivate_metrics())
    if self.config.report_train_metrics:
      names.update(outputs.NONPRIVATE_TRAIN_KEYS)
    return tuple(k for k in outputs.NONPRIVATE_TRAIN_KEYS if k in names)

  def public_config(self) -> Dict[str, object]:
    """The flags as every output shows them: with the run's own seed source and whether any
    round released non-private metrics, not what this invocation's flags alone say."""
    return dict(self.config.public_dict(), noise_seed=self.seed_source,
                report_train_metrics=bool(self.nonprivate_metrics()))


def library_error_message(error: BaseException) -> Optional[str]:
  """The one-line message of a tff-mf in-graph check inside a TF/TFF/gRPC error, if any."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    match = _LIBRARY_ERROR.search(str(error))
    if match:
      return " ".join(match.group(1).split())
    error = error.__cause__ or error.__context__
  return None


def _find_metric(metrics, name: str):
  """The value of key ``name`` anywhere in TFF's nested measurements (None when absent)."""
  if isinstance(metrics, dict):
    if name in metrics:
      return metrics[name]
    for value in metrics.values():
      found = _find_metric(value, name)
      if found is not None:
        return found
  return None


def run_round(process, state, datasets, round_num: int, canaries=()):
  """``process.next(state, datasets)`` (with the round's canary updates, if any); a failed
  tff-mf check becomes a one-line TrainingError.

  TFF runs the round in its C++ executor, which wraps an in-graph assertion
  (e.g. running past the n rounds a matrix was built for) in a long gRPC/TF
  error; the query's own message is what the user needs.
  """
  try:
    if canaries:
      return process.next(state, datasets, canaries=canaries)
    return process.next(state, datasets)
  except Exception as e:  # pylint: disable=broad-except
    message = library_error_message(e)
    if message is None:
      raise
    raise TrainingError(f"round {round_num}: {message}") from None


def _check_resumable(config: TrainingConfig, run_dir: str, what: str,
                     recorded: Optional[identity_lib.RunIdentity], noise_seed: int) -> str:
  """Refuses a run directory (holding ``what``) of other flags, seed or no identity.

  Returns the run's creation time.
  """
  config_path = os.path.join(run_dir, outputs.CONFIG_FILE)
  if not os.path.exists(config_path) or recorded is None:
    missing = outputs.CONFIG_FILE if recorded is not None else identity_lib.IDENTITY_FILE
    raise TrainingError(f"{run_dir} holds {what} but no {missing} (its seeds and mechanism "
                        "cannot be proven); use a new --experiment_name")
  with open(config_path, encoding="utf-8") as f:
    saved = json.load(f)
  recorded_config = saved.get("config", {})
  if (recorded_config.get("participation") in participation_lib.LEGACY_KINDS and
      participation_lib.FIXED_BIN_MARKER not in recorded_config and
      config.participation_kind.marks_fixed_bin):
    raise TrainingError(
        f"{run_dir} holds {what} of a balls_in_bins run written before the fixed-bin rename: "
        "its clients were sampled by random allocation (a new round each epoch), which is "
        "now --participation=random_allocation; resume it with that flag, or use a new "
        "--experiment_name")
  if saved.get("fingerprint") not in config.accepted_fingerprints():
    changed = config.changed_fields(recorded_config)
    raise TrainingError(
        f"{run_dir} holds {what} of a run with other flags "
        f"({', '.join(changed) or 'fingerprint'} differ); rerun the same command to resume, "
        "or use a new --experiment_name")
  if recorded.noise_seed != noise_seed:
    raise TrainingError(f"the checkpoint of {run_dir} holds another noise seed than its "
                        f"{identity_lib.IDENTITY_FILE}; the run directory is corrupt")
  if config.noise_seed is not None and int(config.noise_seed) != recorded.noise_seed:
    raise TrainingError(f"--noise_seed differs from the seed recorded in {run_dir}; a "
                        "resumed or repeated run must reuse its noise seed")
  return saved.get("created_utc") or ""


def _last_logged_round(run_dir: str, releases: identity_lib.ReleaseLog) -> int:
  """The last round this run directory ever logged (releases.jsonl, or metrics.csv of a run
  directory written before releases were recorded). A round in metrics.csv that
  releases.jsonl does not record is refused: its replay could not be checked."""
  last = releases.last_round
  path = os.path.join(run_dir, outputs.METRICS_FILE)
  if os.path.exists(path):
    with open(path, newline="", encoding="utf-8") as f:
      rounds = [int(row["round"]) for row in csv.DictReader(f) if row.get("round")]
    unrecorded = sorted(set(rounds) - set(releases.logged))
    if unrecorded and os.path.lexists(releases.path):
      raise TrainingError(
          f"{path} logs round {unrecorded[0]} but {releases.path} has no record of it, so "
          "its replay cannot be checked; restore that file or use a new --experiment_name")
    last = max([last] + rounds)
  return last


def _new_progress(config: TrainingConfig) -> Tuple[checkpoints.RunProgress, str]:
  """A fresh run's seeds (pinned or from OS entropy) and where the noise seed came from.

  An unpinned run's noise key is two secret words from OS entropy (``tff_mf.noise.keys``),
  and its sampling secret a third, drawn apart from them; a pinned seed keeps the public tag
  and derives the sampling secret (pinning it pins the whole run)."""
  key = -1
  if config.noise_seed is not None:
    seed, source = int(config.noise_seed), "pinned"
  elif is_seedless(config.canonical_mechanism):
    seed, source = None, "no_noise"
  else:
    (seed, key), source = noise_keys.noise_key(None), "os_entropy"
  return checkpoints.RunProgress(
      noise_seed=-1 if seed is None else seed, noise_seed_key=key,
      sampling_secret=privacy.sampling_secret(config, seed if source == "pinned" else None)
  ), source


def _start_or_resume(config: TrainingConfig, run_dir: str, log: Log,
                     round_callback: Optional[RoundCallback]) -> _Run:
  """Opens the checkpoints; resumes from the latest or records a new run's config."""
  start_utc = outputs.utc_now()
  checkpointer = checkpoints.Checkpointer(os.path.join(run_dir, checkpoints.CHECKPOINT_DIR))
  progress = checkpointer.latest()
  recorded = identity_lib.load(run_dir)
  releases = identity_lib.ReleaseLog(run_dir)
  logged = _last_logged_round(run_dir, releases)
  if progress is not None:
    created_utc = _check_resumable(config, run_dir, f"a checkpoint (round {progress.round})",
                                   recorded, progress.noise_seed)
    if recorded.sampling_secret != progress.sampling_secret:
      raise TrainingError(f"the checkpoint of {run_dir} holds another sampling secret than "
                          f"its {identity_lib.IDENTITY_FILE}; the run directory is corrupt")
    if _key_word(recorded) != progress.noise_seed_key:
      raise TrainingError(f"the checkpoint of {run_dir} holds another noise key than its "
                          f"{identity_lib.IDENTITY_FILE}; the run directory is corrupt")
    if progress.identity_digest != identity_lib.digest_int(recorded):
      raise TrainingError(
          f"{os.path.join(run_dir, identity_lib.IDENTITY_FILE)} is not the identity the "
          f"checkpoint of round {progress.round} was written under (its encoder, schema, seed "
          "source or flags fingerprint was edited, replaced or restored since, or an older "
          "tff-mf wrote the checkpoint); restore it or use a new --experiment_name")
    releases.check_identity(recorded)
    log(f"resuming {run_dir} from round {progress.round}")
  elif logged:
    # A rerun before the first checkpoint: the same seeds replay the rounds already logged.
    created_utc = _check_resumable(config, run_dir, f"rounds 1-{logged} already released",
                                   recorded, recorded.noise_seed if recorded else -1)
    releases.check_identity(recorded)
    progress = checkpoints.RunProgress(noise_seed=recorded.noise_seed,
                                       noise_seed_key=_key_word(recorded),
                                       sampling_secret=recorded.sampling_secret)
    log(f"restarting {run_dir} from round 0 with its recorded seeds (rounds 1-{logged} "
        "were logged and must replay identically)")
  else:
    # No round was released and nothing binds an identity file: a new run (new seeds, or the
    # pinned one, and the identity rewritten, so its seed source is this start's).
    recorded = None
    progress, source = _new_progress(config)
    created_utc = start_utc
    outputs.write_json(os.path.join(run_dir, outputs.CONFIG_FILE),
                       {"config": config.public_dict(), "fingerprint": config.fingerprint(),
                        "created_utc": created_utc})
  return _Run(config=config, run_dir=run_dir, checkpointer=checkpointer, progress=progress,
              created_utc=created_utc, start_utc=start_utc, log=log,
              round_callback=round_callback, identity=recorded, releases=releases,
              seed_source=recorded.seed_source if recorded is not None else source,
              wall_before=progress.wall_seconds)


def _key_word(identity: identity_lib.RunIdentity) -> int:
  """The identity's second key word as the checkpoint's meta holds it (-1: the public tag)."""
  return -1 if identity.noise_seed_key is None else identity.noise_seed_key


def _bind_identity(run: _Run, setup) -> None:
  """Records the run's seeds, encoder and schema before round 1, or checks them on a restart."""
  config = run.config
  c = setup.encoder if setup.info.get("private") else None
  b = setup.factorization.b if setup.factorization is not None else None
  encoder = identity_lib.encoder_sha256(c, b)
  schema = identity_lib.schema_sha256(config.schema().as_dict())
  if run.identity is not None:
    # A run recorded before the fixed-bin rename holds its random_allocation schema's old dict.
    accepted = [identity_lib.schema_sha256(d) for d in config.schema().legacy_dicts()]
    if run.identity.schema_sha256 in accepted:
      schema = run.identity.schema_sha256
    identity_lib.check_same_mechanism(run.identity, encoder, schema, run.run_dir)
  else:
    run.identity = identity_lib.RunIdentity(
        noise_seed=run.progress.noise_seed, sampling_secret=run.progress.sampling_secret,
        seed_source=run.seed_source, config_fingerprint=config.fingerprint(),
        encoder_sha256=encoder, schema_sha256=schema,
        noise_seed_key=None if run.progress.noise_seed_key < 0 else run.progress.noise_seed_key)
    identity_lib.save(run.run_dir, run.identity)
  run.progress.identity_digest = identity_lib.digest_int(run.identity)  # bound by checkpoints


def _client_loader(task: task_lib.Task, process):
  """The client's preprocessed batches in the form ``process`` takes (arrays for the compiled
  engine, a tf.data.Dataset for TFF's process), or None when it has no examples (skipped)."""
  if isinstance(process, engine.CompiledProcess):
    return task.client_datasets.batches
  return task.client_datasets.load


def _model_weights(process, state):
  """``process.get_model_weights(state)`` without a TFF call: the sync context already
  returned the state as numpy, and a call sends it to TFF's runtime and back (a second per
  round for the paper's 4M-parameter model)."""
  weights = getattr(state, "global_model_weights", None)
  return weights if weights is not None else process.get_model_weights(state)


def _initial_state(run: _Run, process, task: task_lib.Task):
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  state = process.initialize()
  trainable, non_trainable = task_lib.initial_model_weights(task.keras_model_fn, run.config.seed)
  state = process.set_model_weights(
      state, tff.learning.models.ModelWeights(trainable=trainable, non_trainable=non_trainable))
  if run.progress.round > 0:
    state = run.checkpointer.load_state(run.progress.round, state)
  return state


@dataclasses.dataclass
class _Trainer:
  """The built pieces of a run's rounds."""
  run: _Run
  task: task_lib.Task
  process: object
  sampler: object  # a training.sampling sampler
  log: sampling.ParticipationLog
  ledger: Optional[privacy.EventLedger]
  evaluate: task_lib.Evaluator
  writer: outputs.MetricsWriter
  epsilons: Optional[list] = None  # ε spent after each round (PrivacyRecord.epsilon_by_round)
  canaries: Optional[canaries_lib.Canaries] = None  # --canaries: the planted canary clients
  released: Optional[canaries_lib.ReleasedModels] = None  # the models the audit scores

  def sampling_state(self):
    """The sampler's and the participation log's arrays, as one checkpointable structure."""
    out = collections.OrderedDict()
    for prefix, part in (("sampler_", self.sampler), ("log_", self.log)):
      out.update((prefix + k, v) for k, v in part.state().items())
    return out

  def restore_sampling(self, round_num: int) -> None:
    loaded = self.run.checkpointer.load_sampling(round_num, self.sampling_state())
    for prefix, part in (("sampler_", self.sampler), ("log_", self.log)):
      part.restore({k[len(prefix):]: v for k, v in loaded.items() if k.startswith(prefix)})

  def prefetch(self, round_num: int) -> None:
    """Loads the clients the round draws in one batch (``task.ClientDatasets.prefetch``)
    where the sampler's next clients are known before it draws them: the next of its
    permutation for a single pass or a new fixed-epoch cohort. Clients it then finds empty
    are replaced one by one, as before; other samplers load one by one."""
    sampler = self.sampler
    if isinstance(sampler, sampling.FixedEpochSampler):
      if sampler.cohorts[(round_num - 1) % sampler.cohort_count, 0] >= 0:
        return  # a cohort formed before: its loaded clients are kept
    elif not isinstance(sampler, sampling.SinglePassSampler):
      return
    prefetch = getattr(self.task.client_datasets, "prefetch", None)
    if prefetch is not None:
      upcoming = sampler.order[sampler.cursor:sampler.cursor + sampler.clients_per_round]
      prefetch([sampler.client_ids[int(i)] for i in upcoming])

  def round(self, state, round_num: int, load_client) -> Tuple[object, Dict[str, object], bool]:
    """One round: (new state, its metrics row, whether the model diverged).

    A round may have no clients (Poisson sampling): it still runs, so its noise is added.
    """
    from tff_mf.tf import clipping as tf_clipping  # pylint: disable=g-import-not-at-top
    config, progress = self.run.config, self.run.progress
    start = time.perf_counter()
    self.prefetch(round_num)
    client_ids, datasets, skipped = self.sampler.next_round(round_num, load_client)
    planted = () if self.canaries is None else self.canaries.updates(
        round_num, [np.shape(w) for w in _model_weights(self.process, state).trainable])
    output = run_round(self.process, state, datasets, round_num, planted)
    self.log.observe(round_num, client_ids)
    if self.ledger is not None:
      self.ledger.write(round_num, privacy.round_event(output.state.aggregator))
    zeroed = int(output.metrics["aggregator"][tf_clipping.ZEROED_METRIC])
    clip = _find_metric(output.metrics["aggregator"], "clip_norm")
    progress.empty_clients_skipped += skipped
    progress.zeroed_client_updates += zeroed
    progress.cursor = self.sampler.cursor
    progress.round = round_num
    row: Dict[str, object] = {"round": round_num, "round_seconds": time.perf_counter() - start,
                              "clients": len(client_ids), "empty_clients_skipped": skipped,
                              "zeroed_client_updates": zeroed}
    if self.epsilons is not None and not self.log.violations(config.schema(),
                                                             config.total_rounds):
      row["epsilon"] = self.epsilons[round_num - 1]  # none once the schema is broken
    if clip is not None:  # adaptive clipping: ζ after this round's update (TFF reports the new state)
      row["next_clip_norm"] = float(clip)
    if config.report_train_metrics:
      train = output.metrics["client_work"]["train"]
      row["nonprivate_train_loss"] = float(train["loss"])
      row["nonprivate_train_accuracy"] = float(train.get("accuracy", float("nan")))
    weights = _model_weights(self.process, output.state)
    diverged = not tf_clipping.all_finite(weights.trainable)
    if not diverged and (round_num % config.rounds_per_eval == 0
                         or round_num == config.total_rounds):
      row.update({f"validation_{k}": v for k, v in self.evaluate(weights, self.task.validation)
                  .items()})
    return output.state, row, diverged

  def rounds(self, state) -> Tuple[object, bool]:
    """Runs the remaining rounds (checkpointing); returns (state, diverged)."""
    run, config = self.run, self.run.config
    load_client = _client_loader(self.task, self.process)
    bar = outputs.Progress(config.experiment_name, config.total_rounds, run.progress.round,
                           config.progress)
    diverged = False
    if run.progress.round == 0:  # fixed cohorts: too few non-empty clients refused before round 1
      self.sampler.prepare(load_client)
    try:
      for round_num in range(run.progress.round + 1, config.total_rounds + 1):
        state, row, diverged = self.round(state, round_num, load_client)
        digest = identity_lib.model_digest(_model_weights(self.process, state).trainable)
        if self.released is not None:
          self.released.record(round_num, _model_weights(self.process, state).trainable)
        replayed = run.releases.replays(round_num, digest)  # raises on a different release
        if replayed:  # released again only as first logged: no non-private metric it lacked
          logged = run.releases.logged[round_num].get("nonprivate", ())
          row = {k: v for k, v in row.items()
                 if k not in outputs.NONPRIVATE_TRAIN_KEYS or k in logged}
        run.releases.record(round_num, digest, run.identity,
                            [k for k in outputs.NONPRIVATE_TRAIN_KEYS if k in row])
        self.writer.write(row, replayed=replayed)
        bar.update(row)
        if run.round_callback is not None:
          run.round_callback(round_num)
        if diverged:
          bar.write(f"round {round_num}: model weights are no longer finite; stopping (diverged)")
          break
        # A first Ctrl-C (tff_mf.interrupt) stops here, with this round checkpointed. The
        # checkpoint is written while the next round runs (training.checkpoints): it is
        # requested after this round's release is logged, so a kill before it is written
        # leaves an older checkpoint, whose rerun replays the rounds logged since.
        if (round_num % config.rounds_per_checkpoint == 0 or round_num == config.total_rounds
            or interrupt.requested()):
          run.progress.wall_seconds = run.wall_seconds()
          run.checkpointer.save(state, run.progress, self.sampling_state(), background=True)
        interrupt.check(interrupted_message(round_num))
    finally:
      bar.close()
      run.checkpointer.close()
    return state, diverged


def _participation_summary(trainer: _Trainer) -> Dict[str, object]:
  """The schema, the participations observed in the rounds run, and how they break it."""
  config = trainer.run.config
  schema = config.schema()
  violations = trainer.log.violations(schema, config.total_rounds)
  out: Dict[str, object] = {
      "schema": schema.as_dict(), "describe": schema.describe(),
      "separation_required": schema.separation(config.total_rounds),
      "max_participations_allowed": schema.max_participations_in(config.total_rounds),
      "observed": trainer.log.observed(), "follows_schema": not violations,
      "violations": violations, "sampler": schema.sampler}
  if schema.secret_sampling and not schema.poisson:  # a bin, or a round per epoch
    out.update(expected_clients_per_round=len(trainer.sampler) /
               (config.total_rounds // config.epochs),
               sampling_secret=("derived from the pinned noise seed"
                                if trainer.run.seed_source == "pinned" else "os_entropy"))
  if schema.poisson:
    smallest, largest = trainer.sampler.class_sizes()
    out.update(sampling_prob=config.sampling_prob, residue_class_sizes=[smallest, largest],
               expected_clients_per_round=config.sampling_prob * len(trainer.sampler) /
               config.min_sep,
               sampling_secret=("derived from the pinned noise seed"
                                if trainer.run.seed_source == "pinned" else "os_entropy"))
  return out


def _privacy_summary(trainer: _Trainer, noise_multiplier, record, participation
                     ) -> Tuple[Optional[float], Optional[str], Optional[Dict[str, Any]]]:
  """(ε to report or None, why None, the privacy block of summary.json)."""
  config = trainer.run.config
  if record is None:
    return None, "non-private run", None
  block = jsonio.jsonable(record.json())
  block["noise_multiplier"] = noise_multiplier
  if trainer.ledger is not None:
    block["dp_event_cross_check"] = privacy.dp_event_epsilon(
        trainer.ledger.events(), config.delta, trainer.run.progress.round)
  eps, reason = record.epsilon, None
  if not participation["follows_schema"]:
    eps, reason = None, ("the sampled rounds broke the participation schema (" +
                         "; ".join(participation["violations"]) + "); no epsilon is reported")
    block = privacy.without_epsilons(block)
  elif not math.isfinite(eps):
    eps, reason = None, "the noise is too small for a finite epsilon"
  block["epsilon"], block["epsilon_reason"] = eps, reason
  return eps, reason, block


def _summary(trainer: _Trainer, state, diverged: bool, noise_multiplier, record,
             single_participation_sqrt_loss, mechanism_info) -> records.RunSummary:
  """Final evaluation, final model, TensorBoard's last scalars, and the run's summary."""
  run, config, task = trainer.run, trainer.run.config, trainer.task
  progress = run.progress
  weights = _model_weights(trainer.process, state)
  if diverged:
    validation = test = {k: None for k in task_lib.METRIC_KEYS}
  else:
    validation = trainer.evaluate(weights, task.validation)
    test = trainer.evaluate(weights, task.test)
    outputs.save_final_model(run.run_dir, task_lib.trainable_variable_names(task.keras_model_fn),
                             weights.trainable)
  participation = _participation_summary(trainer)
  eps, reason, privacy_block = _privacy_summary(trainer, noise_multiplier, record, participation)
  public = run.public_config()
  nonprivate = run.nonprivate_metrics()
  notes = [outputs.NONPRIVATE_NOTE] if nonprivate else []
  if privacy_block is not None:
    privacy_block["noise_seed_source"] = run.seed_source
    if run.seed_source == "pinned":
      privacy_block["warning"] = identity_lib.PINNED_WARNING
      notes.append(identity_lib.PINNED_WARNING)
  trainer.writer.scalars(test, progress.round, prefix="test/")
  if eps is not None:
    trainer.writer.scalars({"epsilon": eps}, progress.round, prefix="privacy/")
  mechanism = config.canonical_mechanism
  train_rows = [r for r in trainer.writer.rows if r.get("nonprivate_train_loss") not in ("", None)]
  return records.RunSummary.of_json({
      "config": public, "mechanism": mechanism,
      "mechanism_label": registry.label(mechanism), "noise_multiplier": noise_multiplier,
      "epsilon": eps, "epsilon_reason": reason,
      "delta": config.delta if record is not None else None,
      "accountant": record["accountant"] if record is not None else None,
      "analysis": record["analysis"] if record is not None else None,
      "private": record is not None, "privacy": privacy_block, "participation": participation,
      "privacy_statement": privacy.run_statement(config, record, eps, reason, participation,
                                                 run.seed_source, nonprivate, mechanism_info),
      "total_rounds": config.total_rounds, "rounds_completed": progress.round,
      "finished": progress.round == config.total_rounds and not diverged,
      "diverged": diverged, "wall_seconds": run.wall_seconds(),
      "validation_metrics": {k: outputs.finite_or_none(v) for k, v in validation.items()},
      "test_metrics": {k: outputs.finite_or_none(v) for k, v in test.items()},
      "single_participation_sqrt_loss": single_participation_sqrt_loss,
      "nonprivate_train_metrics": ({k: float(train_rows[-1][k])
                                    for k in outputs.NONPRIVATE_TRAIN_KEYS}
                                   if nonprivate and train_rows else None),
      "notes": notes,
      "empty_clients_skipped": progress.empty_clients_skipped,
      "zeroed_client_updates": progress.zeroed_client_updates,
      "num_train_clients": len(task.train_client_ids), "clients_used": trainer.sampler.cursor,
      # The aggregator's own description; its ε fields are the privacy block's (one record),
      # which alone is cleared when the sampling broke the schema.
      "mechanism_info": {k: v for k, v in mechanism_info.items()
                         if isinstance(v, (str, int, float, bool)) and "seed" not in k
                         and "epsilon" not in k},
      "versions": outputs.package_versions(), "dataset": task.dataset,
      "created_utc": run.created_utc, "start_utc": run.start_utc, "end_utc": outputs.utc_now(),
  })


def _build_trainer(run: _Run, task: task_lib.Task, setup,
                   sampler) -> Tuple[_Trainer, object]:
  """The trainer around ``sampler`` (restored at the checkpoint's round later), its process
  and writers; the start state."""
  config = run.config
  log = sampling.build_log(config, task.train_client_ids)
  process = engine.build_process(config.engine, task.model_fn, setup, config.client_lr,
                                 report_train_metrics=config.report_train_metrics)
  state = _initial_state(run, process, task)
  private = setup.info.get("private", False)
  trainer = _Trainer(run=run, task=task, process=process, sampler=sampler, log=log,
                     ledger=privacy.EventLedger(run.run_dir, run.progress.round) if private
                     else None,
                     evaluate=task_lib.Evaluator(task.keras_model_fn, len(task.vocab),
                                                 config.num_oov_buckets),
                     writer=outputs.MetricsWriter(run.run_dir, run.progress.round,
                                                  bool(run.nonprivate_metrics()),
                                                  config.adaptive_clipping, private,
                                                  logged_rounds=run.releases.logged))
  if run.progress.round > 0:
    trainer.restore_sampling(run.progress.round)
  return trainer, state


def _claimed_mu(setup) -> Optional[float]:
  """The run's Gaussian μ = sens/z (its unamplified Gaussian mechanism), None without noise."""
  z_over_sens = setup.privacy.effective_noise_multiplier if setup.privacy is not None else None
  return 1.0 / z_over_sens if z_over_sens else None


def _plant_canaries(trainer: _Trainer, state, setup, new_run: bool) -> None:
  """--canaries: a new run draws them and plans the guesses before round 1 (both written to
  the run directory first); a resumed run reads them back. θ_0 is recorded for the audit."""
  run = trainer.run
  trainable = _model_weights(trainer.process, state).trainable
  size = sum(int(np.size(w)) for w in trainable)
  canaries_lib.check_models_size(run.config.total_rounds, size)
  if new_run:
    planted = canaries_lib.Canaries.draw(run.config, run.config.canary_seed)
    canaries_lib.save_plan(run.run_dir, canaries_lib.plan(run.config, _claimed_mu(setup)))
    canaries_lib.save(run.run_dir, planted)
  else:
    planted = canaries_lib.load(run.run_dir)
  trainer.canaries = planted
  trainer.released = canaries_lib.ReleasedModels(run.run_dir, run.config.total_rounds, size)
  if run.progress.round == 0:
    trainer.released.record(0, trainable)


def _workload(config: TrainingConfig, setup) -> np.ndarray:
  """A, the workload the server optimizer applies (the factorization's, else M(η)·M(β))."""
  from tff_mf.factorization import workloads  # pylint: disable=g-import-not-at-top
  if setup.factorization is not None:
    return np.asarray(setup.factorization.a, np.float64)
  etas = workloads.learning_rates(config.total_rounds, config.lr_schedule, config.schedule_rounds)
  return workloads.momentum_matrix(config.total_rounds, config.server_momentum, etas)


def _canary_audit(trainer: _Trainer, state, setup,
                  summary: records.RunSummary) -> records.RunSummary:
  """The summary with the one-run audit of a finished canary run (``training.canaries``) in
  it and in its privacy statement; a run that did not finish is not audited, and says so."""
  if not summary.finished:
    return summary.replace(canary_audit={"audited": False,
                                         "reason": "the run did not finish (diverged)"})
  noise = setup.factorization.noise_matrix() if setup.factorization is not None else None
  shapes = [np.shape(w) for w in _model_weights(trainer.process, state).trainable]
  report = canaries_lib.audit(trainer.run.run_dir, _workload(trainer.run.config, setup), noise,
                              summary.epsilon, _claimed_mu(setup), shapes,
                              trainer.run.releases.logged)
  statement = summary.privacy_statement
  statement = dict(statement, text=f"{statement['text']}\n{report['text']}",
                   canary_audit=report["text"])
  return summary.replace(privacy_statement=statement, canary_audit=dict(report, audited=True))


def interrupted_message(round_num: int) -> str:
  """The line a run stopped by Ctrl-C prints (``tff_mf.interrupt``)."""
  return f"interrupted at round {round_num}; run the same command to resume"


def _train(run: _Run, task: Optional[task_lib.Task]) -> records.RunSummary:
  """Builds the task, mechanism and process; runs the rounds; writes the outputs.

  A Ctrl-C during start-up stops at the next step (nothing of the rounds is lost: the run
  restarts from its checkpoint, or from round 0 with its recorded seeds).
  """
  config = run.config
  where = interrupted_message(run.progress.round)
  interrupt.check(where)
  if task is None:
    task = task_lib.build_task(config)
    interrupt.check(where)
  # Built once, before the mechanism: a dataset with too few clients stops here, in one line.
  sampler = sampling.build_sampler(config, task.train_client_ids, run.progress.sampling_secret)
  setup, noise_multiplier, record = run_setup.resolve_privacy(config, run.progress.noise_key)
  interrupt.check(where)
  new_run = run.identity is None
  _bind_identity(run, setup)
  trainer, state = _build_trainer(run, task, setup, sampler)
  if record is not None:
    trainer.epsilons = setup.privacy.epsilon_by_round()
  if config.canaries:
    _plant_canaries(trainer, state, setup, new_run)
  interrupt.check(where)
  try:
    trainer.writer.hparams(run.public_config(), config.experiment_name)
    state, diverged = trainer.rounds(state)
    summary = _summary(trainer, state, diverged, noise_multiplier, record,
                       setup.single_participation_sqrt_loss, setup.info)
    if config.canaries:
      summary = _canary_audit(trainer, state, setup, summary)
  finally:
    trainer.writer.close()
  path = os.path.join(run.run_dir, outputs.SUMMARY_FILE)
  outputs.write_json(path, summary)
  statement = summary.privacy_statement
  eps_text = (statement["epsilon_text"] or "none") if summary.private else "none (no DP)"
  run.log(f"{summary.mechanism}: {summary.rounds_completed}/{config.total_rounds} rounds, "
          f"eps={eps_text}, "
          f"test loss {summary.test_metrics['loss']}, "
          f"{summary.wall_seconds:.1f}s -> {path}")
  print(statement["text"], flush=True)
  return summary


def run_training(config: TrainingConfig, task: Optional[task_lib.Task] = None,
                 log: Optional[Log] = None,
                 round_callback: Optional[RoundCallback] = None) -> records.RunSummary:
  """Trains (resuming from the latest checkpoint if any); returns the run's summary (what
  summary.json holds, typed: ``training.records.RunSummary``).

  Args:
    config: the run's flags.
    task: a prebuilt task (data and model) to reuse across runs; built from config if None.
    log: where one-line messages go (default: stderr).
    round_callback: called with the round number after each round's row is written.

  Raises:
    TrainingError: bad flags, a run directory that is not private or is in use,
      a checkpoint of another run, too few clients, or a failed tff-mf check.
  """
  config.validate()
  config = config.with_used_engine()
  log = log or _stderr
  engine.configure_threads(config)
  from tff_mf.tf import runtime  # pylint: disable=g-import-not-at-top
  runtime.install_exit_hook()
  run_dir = rundir.open_run_dir(config.run_dir)
  with rundir.RunLock(run_dir), rundir.private_umask():
    if config.workers:
      from training import distributed  # pylint: disable=g-import-not-at-top
      distributed.configure_execution_context(list(config.workers))
    run = _start_or_resume(config, run_dir, log, round_callback)
    return _train(run, task)
