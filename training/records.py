"""A run's ``summary.json``, typed (``RunSummary``); the JSON form only at the edge.

The training loop writes one per run; ``training.summarize``, ``training.report``,
``training.sweep`` and the binary's exit status read it by its typed fields (``tff_mf.jsonio.
Record``: every key it holds is kept, in the order written, so a summary written before this
type existed reads, and writes back, the same).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional

from tff_mf import jsonio


@dataclasses.dataclass(frozen=True, eq=False)
class RunSummary(jsonio.Record):
  """A run's summary.json (``training.loop``); None where the summary has no such key.

  Attributes:
    config: the run's public flags.
    mechanism: the canonical mechanism name.
    noise_multiplier, epsilon, delta: z, the ε reported (None: not reported, see
      ``epsilon_reason``; or a non-private run) and δ.
    accountant, analysis: the privacy record's accountant and analysis.
    private: whether the run added DP noise.
    privacy: the privacy record (``tff_mf.accounting.Bound``'s JSON form, with the run's own
      fields).
    privacy_statement: the run's statement (``tff_mf.accounting.statement``).
    total_rounds, rounds_completed, finished, diverged: how far the run got.
    wall_seconds: the run's time.
    validation_metrics, test_metrics: the final metrics ({name: value or None}).
    single_participation_sqrt_loss: √L of the factorization under single participation.
    canary_audit: the one-run canary audit (``training.canaries``), when run.
  """
  config: Optional[Dict[str, Any]] = None
  mechanism: Optional[str] = None
  noise_multiplier: Optional[float] = None
  epsilon: Optional[float] = None
  delta: Optional[float] = None
  accountant: Optional[str] = None
  analysis: Optional[str] = None
  private: Optional[bool] = None
  privacy: Optional[Dict[str, Any]] = None
  privacy_statement: Optional[Dict[str, Any]] = None
  total_rounds: Optional[int] = None
  rounds_completed: Optional[int] = None
  finished: Optional[bool] = None
  diverged: Optional[bool] = None
  wall_seconds: Optional[float] = None
  validation_metrics: Optional[Dict[str, Any]] = None
  test_metrics: Optional[Dict[str, Any]] = None
  single_participation_sqrt_loss: Optional[float] = None
  canary_audit: Optional[Dict[str, Any]] = None
