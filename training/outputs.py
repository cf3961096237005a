"""What a run leaves for the researcher: metrics.csv, TensorBoard, summary.json, the final model.

* ``metrics.csv``: one row per round (rewritten on resume with every row logged so far).
* ``tensorboard/``: the same rows as scalars (``validation/<metric>``,
  ``round/<counter>``, ``privacy/epsilon``: the ε spent after each round), the test metrics
  and ε at the end, the config as hparams
  (``tensorboard.plugins.hparams``) and as text.
* ``summary.json``: ε and the privacy statement (``tff_mf.accounting.statement``), metrics, √L, package versions, the dataset fingerprint,
  UTC start and end times and the full config (never the noise seed).
* ``final_model.npz``: the trained weights, each array named by its model variable.

Training loss and accuracy are computed by the clients on their raw data, without
noise: they are not covered by the run's ε. They are written only with
``--report_train_metrics``, and then under ``nonprivate_`` names.
"""

from __future__ import annotations

import csv
import datetime
import importlib.metadata
import json
import math
import os
import platform
import sys
from typing import Container, Dict, List, Optional, Sequence

import numpy as np

from tff_mf import jsonio
from training.task import METRIC_KEYS

SUMMARY_FILE = "summary.json"
METRICS_FILE = "metrics.csv"
CONFIG_FILE = "config.json"
FINAL_MODEL_FILE = "final_model.npz"
TENSORBOARD_DIR = "tensorboard"
NONPRIVATE_TRAIN_KEYS = ("nonprivate_train_loss", "nonprivate_train_accuracy")
NONPRIVATE_NOTE = (
    "nonprivate_train_* metrics are averages of the clients' training loss and accuracy on "
    "their raw data, computed without DP noise: they are not covered by epsilon and must not "
    "be released as private results")
# Distribution names of the packages whose versions a summary records.
VERSIONED_PACKAGES = {"tff_mf": "tff-mf", "tensorflow": "tensorflow",
                      "tensorflow_federated": "tensorflow-federated",
                      "tensorflow_privacy": "tensorflow-privacy",
                      "dp_accounting": "dp-accounting", "numpy": "numpy"}


def utc_now() -> str:
  """The current time, ISO 8601 in UTC (``+00:00``), to the second."""
  return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()


def package_versions() -> Dict[str, Optional[str]]:
  """Versions of tff-mf, TensorFlow, TFF, TF Privacy, dp_accounting, numpy and Python."""
  out: Dict[str, Optional[str]] = {}
  for key, dist in VERSIONED_PACKAGES.items():
    try:
      out[key] = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
      out[key] = None
  if out["tff_mf"] is None:
    import tff_mf  # pylint: disable=g-import-not-at-top
    out["tff_mf"] = getattr(tff_mf, "__version__", None)
  out["python"] = platform.python_version()
  return out


def write_json(path: str, value, private: bool = False) -> None:
  """Writes strict JSON atomically (a temporary file, then rename); ``private``: 0600
  whatever the umask."""
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    if private:
      os.fchmod(f.fileno(), 0o600)
    f.write(jsonio.dumps(value, indent=2))
  os.replace(tmp, path)


def finite_or_none(value):
  return value if isinstance(value, float) and math.isfinite(value) else None


def metric_fields(report_train_metrics: bool, adaptive_clipping: bool = False,
                  private: bool = False) -> tuple:
  """The columns of metrics.csv (``next_clip_norm``: with adaptive clipping, the clip norm
  ζ_{i+1} that round i's private count update set for the next round; ``epsilon``: in a DP
  run, the ε spent after the round, ``tff_mf.mechanisms.PrivacyRecord.epsilon_by_round``)."""
  train = NONPRIVATE_TRAIN_KEYS if report_train_metrics else ()
  clip = ("next_clip_norm",) if adaptive_clipping else ()
  eps = ("epsilon",) if private else ()
  return ("round", *train, "round_seconds", "clients", "empty_clients_skipped",
          "zeroed_client_updates", *clip, *eps, *(f"validation_{k}" for k in METRIC_KEYS))


def _tensorboard_tag(key: str) -> str:
  if key.startswith("validation_"):
    return "validation/" + key[len("validation_"):]
  if key.startswith("nonprivate_"):
    return "nonprivate/" + key[len("nonprivate_"):]
  if key == "epsilon":
    return "privacy/epsilon"
  return "round/" + key


class MetricsWriter:
  """metrics.csv (one row per round, kept up to the resumed round) and TensorBoard."""

  def __init__(self, run_dir: str, resume_round: int, report_train_metrics: bool,
               adaptive_clipping: bool = False, private: bool = False,
               logged_rounds: Container[int] = ()):
    """``logged_rounds``: rounds after ``resume_round`` whose release is recorded
    (``training.identity``): their rows are kept too, as they were first logged."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    self.fields = metric_fields(report_train_metrics, adaptive_clipping, private)
    self.path = os.path.join(run_dir, METRICS_FILE)
    kept = []
    if os.path.exists(self.path):
      with open(self.path, newline="", encoding="utf-8") as f:
        kept = [row for row in csv.DictReader(f)
                if int(row["round"]) <= resume_round or int(row["round"]) in logged_rounds]
    self._logged = {int(row["round"]) for row in kept}
    self._file = open(  # pylint: disable=consider-using-with
        self.path, "w", newline="", encoding="utf-8")
    self._writer = csv.DictWriter(self._file, fieldnames=self.fields)
    self._writer.writeheader()
    self.rows: List[Dict[str, object]] = []
    for row in kept:
      self._append({k: row.get(k, "") for k in self.fields})
    self._tb = tf.summary.create_file_writer(os.path.join(run_dir, TENSORBOARD_DIR))

  def _append(self, row: Dict[str, object]) -> None:
    self._writer.writerow(row)
    self._file.flush()
    self.rows.append(row)

  def scalars(self, values: Dict[str, object], step: int, prefix: str = "") -> None:
    """Finite numbers of ``values`` as TensorBoard scalars ``prefix + tag``: the events
    ``tf.summary.scalar`` writes, built here and written in one op (one eager op a scalar
    cost 0.2 ms of CPU, more than the rest of a round's bookkeeping)."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    from tensorboard.compat.proto import summary_pb2  # pylint: disable=g-import-not-at-top
    from tensorboard.plugins.scalar import summary_v2  # pylint: disable=g-import-not-at-top
    summary = summary_pb2.Summary()
    for key, value in values.items():
      if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(
          value):
        tag = prefix + key if prefix else _tensorboard_tag(key)
        summary.value.extend(summary_v2.scalar_pb(tag, value).value)
    if summary.value:
      with self._tb.as_default():
        tf.summary.experimental.write_raw_pb(summary.SerializeToString(), step=step)
    self._tb.flush()

  def write(self, row: Dict[str, object], replayed: bool = False) -> None:
    """One round's row into metrics.csv and TensorBoard (fields not in the header dropped).

    ``replayed``: a round replayed identically after a restart. metrics.csv keeps the row
    first logged for it (a later refusal then loses nothing) and TensorBoard, whose events
    cannot be rewritten, its one version: only a row metrics.csv lacks is written, there.
    """
    row = {k: row.get(k, "") for k in self.fields}
    if int(row["round"]) in self._logged:
      return
    self._append(row)
    if not replayed:
      self.scalars({k: v for k, v in row.items() if k != "round"}, int(row["round"]))

  def hparams(self, config: Dict[str, object], run_name: str) -> None:
    """The config as TensorBoard hparams (and as a text table)."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    from tensorboard.plugins.hparams import api as hp  # pylint: disable=g-import-not-at-top
    values = {k: (v if isinstance(v, (bool, int, float, str)) else jsonio.dumps(v, sort_keys=False))
              for k, v in config.items()}
    with self._tb.as_default():
      hp.hparams(values, trial_id=run_name)
      lines = ["| flag | value |", "| --- | --- |"]
      lines += [f"| {k} | {values[k]} |" for k in sorted(values)]
      tf.summary.text("config", "\n".join(lines), step=0)
    self._tb.flush()

  def close(self) -> None:
    self._file.close()
    self._tb.close()


def save_final_model(run_dir: str, names: Sequence[str], arrays: Sequence[np.ndarray]) -> str:
  """final_model.npz with one array per trainable variable, keyed by its name."""
  if len(names) != len(arrays):
    raise ValueError(f"{len(names)} variable names for {len(arrays)} arrays")
  path = os.path.join(run_dir, FINAL_MODEL_FILE)
  np.savez(path, **{name: np.asarray(a) for name, a in zip(names, arrays)})
  return path


class Progress:
  """One tqdm bar per run on stderr: rounds, the latest loss, ETA (disabled: no output)."""

  def __init__(self, name: str, total: int, start: int, enabled: bool):
    import tqdm  # pylint: disable=g-import-not-at-top
    self._bar = tqdm.tqdm(total=total, initial=start, desc=name, unit="round", file=sys.stderr,
                          disable=not enabled, dynamic_ncols=True, mininterval=0.5)

  def update(self, row: Dict[str, object]) -> None:
    shown = {}
    for key, label in (("nonprivate_train_loss", "train_loss(nonprivate)"),
                       ("validation_loss", "val_loss"),
                       ("validation_accuracy_no_oov_no_eos", "val_acc")):
      value = row.get(key)
      if isinstance(value, float) and math.isfinite(value):
        shown[label] = f"{value:.4f}"
    skipped, zeroed = row.get("empty_clients_skipped"), row.get("zeroed_client_updates")
    if skipped or zeroed:
      shown["empty/zeroed"] = f"{skipped}/{zeroed}"
    if shown:
      self._bar.set_postfix(shown, refresh=False)
    self._bar.update(1)

  def write(self, message: str) -> None:
    self._bar.write(message, file=sys.stderr)

  def close(self) -> None:
    self._bar.close()
