"""The optimal dense family: C from the certified dual solvers (numpy core, no TensorFlow).

``tff_mf.factorization.dense_single.solve`` for single participation (Denisov et al. 2022,
arXiv:2202.08312) and ``tff_mf.factorization.dense_fixed_epoch.solve_fixed_epoch`` under
(k, b)-fixed-epoch participation (Choquette-Choo et al. 2023, arXiv:2211.06530); they
share their run loop (``tff_mf.factorization.dense_run``).
"""

from __future__ import annotations

import numpy as np

from tff_mf.factorization import dense_fixed_epoch
from tff_mf.factorization import families
from tff_mf.factorization import dense_single
from tff_mf import participation

# ----------------------------------------------------------------------------- family interface

# Bumped whenever the output for the same inputs changes (part of the cache key).
VERSION = "4"  # 4: the prefix sum takes the tridiagonal eigensolver

STRATEGIES = {"optimal": families.Declaration(
    parameters=("target_gap", "max_iterations", "allow_unconverged"),
    participations=("single", "fixed_epoch"), peak_matrices=12, optimum=True)}


def factorize(a: np.ndarray, spec, context):
  """The optimal C for A: ``solve`` (single participation) or ``solve_fixed_epoch``."""
  from tff_mf.factorization.families import FamilyResult  # pylint: disable=g-import-not-at-top
  progress = bool(context and context.progress)
  if a.shape[0] == 1:  # one round: C = [1] is optimal for every schema, with gap 0
    return FamilyResult(b=a.copy(), c=np.ones((1, 1)),
                        info={"relative_gap": 0.0, "iterations": 0, "converged": True})
  kwargs = dict(target_gap=spec.target_gap, max_iterations=spec.max_iterations,
                allow_unconverged=spec.allow_unconverged, progress=progress)
  if isinstance(spec.participation, participation.FixedEpoch):
    result = dense_fixed_epoch.solve_fixed_epoch(a, spec.participation.epochs, **kwargs)
  else:
    result = dense_single.solve(a, **kwargs)
  return FamilyResult(b=result.b, c=result.c, info=dict(result.info))
