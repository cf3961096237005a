"""C = I: independent noise in every round (DP-SGD / DP-FedAvg), B = A (numpy core).

The baseline every matrix mechanism is compared with (Denisov et al. 2022,
arXiv:2202.08312, Sec 1). Its stream has no state: row i of C⁻¹·Z is Z[i].
"""

from __future__ import annotations

from typing import Dict

import numpy as np

from tff_mf.factorization import families
from tff_mf import participation
from tff_mf.noise import streams
from tff_mf.factorization.families import FamilyResult

# Bumped whenever the output for the same inputs changes (part of the cache key).
VERSION = "1"

# A closed form: mechanisms rebuild it instead of loading it from the cache.
STRATEGIES = {"identity": families.Declaration(participations=participation.KINDS,
                                               peak_matrices=4, streams=True, cached=False)}


def factorize(a: np.ndarray, spec, context) -> FamilyResult:
  del spec, context
  return FamilyResult(b=a.copy(), c=np.eye(a.shape[0]))


def stream(extras: Dict[str, np.ndarray], a: np.ndarray) -> streams.LinearStream:
  del extras
  return streams.independent(a.shape[0])
