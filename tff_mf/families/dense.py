"""INTERIM (lead): family adapter for the optimal solver until the dense family module lands."""

from __future__ import annotations

VERSION = "2"


def factorize(a, spec, context):
  from tff_mf import optimal  # pylint: disable=g-import-not-at-top
  from tff_mf.families import FamilyResult  # pylint: disable=g-import-not-at-top
  result = optimal.solve(a, target_gap=spec.target_gap, max_iterations=spec.max_iterations,
                         allow_unconverged=spec.allow_unconverged,
                         progress=bool(context and context.progress))
  return FamilyResult(b=result.b, c=result.c, info=dict(result.info))
