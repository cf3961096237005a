"""The number of bands b (and z) that minimizes the error at a target ε, with amplification.

Amplified banded MF (Choquette-Choo, Ganesh, McMahan, Rush, Steinke, Thakurta 2023,
"(Amplified) Banded Matrix Factorization", arXiv:2306.08153, Sec 5 and Thm 4): a C with
at most b bands, trained with cyclic Poisson sampling of cycle b (users split into b
groups, group t mod b eligible in round t, each eligible user joining with probability
p_b), is dominated by ⌈n/b⌉-fold composition of the Poisson-subsampled Gaussian at
z / γ(C). More bands lower the factorization's error but weaken amplification: at a
fixed expected number of participations E per user, p_b = E·b/n grows with b, and
fewer rounds are composed at a larger rate. ``calibrate_bands`` tries every candidate
b, as jax_privacy's ``BandMFConfig`` is meant to be used (``BandMFConfig.default``
for each b, ``calibrate`` for z, ``rmse`` to compare):

- C: the b-banded factorization of the workload (``banded_toeplitz`` by default, the
  family jax_privacy optimizes; or ``banded``), from ``tff_mf.factorization.cache.load_or_factorize``
  (computed once, then read from the cache), γ(C) = 1;
- z(b): the smallest z whose ε at δ is at most the target under the amplified banded
  analysis at p_b (``tff_mf.accounting.calibrate``, analysis ``"amplified_banded"``; it reports
  the smaller of the amplified and the unamplified bound, both valid);
- expected error: z(b)·rmse(b)/E with rmse(b) = ‖B‖_F/√n at γ(C) = 1, the figure of
  jax_privacy's ``BandMFConfig.rmse`` (noise multiplier over expected participations
  times the root mean per-query error; McKenna 2024, arXiv:2405.15913).

The sampling is given as the run would use it at the largest separation B: cyclic
Poisson with cycle B and probability p, so E = p·n/B and p_b = p·b/B (the same
expected number of users per round, p/B of them, for every b). Candidates are the
powers of 2 up to min(B, max_bands, n), and B itself.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional

from tff_mf import checks
from tff_mf import registry

# The banded strategies b is chosen for (their C has at most b bands), the default first.
STRATEGIES = (registry.BANDED_TOEPLITZ.name, registry.BANDED.name)
DEFAULT_STRATEGY = STRATEGIES[0]


@dataclasses.dataclass(frozen=True)
class BandCandidate:
  """One number of bands: its sampling, calibrated z, ε, rmse and expected error."""
  bands: int
  sampling_prob: float  # p_b: probability of joining an eligible round (cycle b)
  noise_multiplier: float
  epsilon: float
  bound: str  # which valid bound gave ε: amplified or unamplified
  rmse: float  # ‖B‖_F/√n at γ(C) = 1
  expected_error: float  # z·rmse / E
  cache_npz: Optional[str] = None

  def as_dict(self) -> Dict[str, Any]:
    return dataclasses.asdict(self)


def candidate_bands(n: int, min_sep: int, max_bands: Optional[int] = None) -> List[int]:
  """Powers of 2 up to min(min_sep, max_bands, n), and that limit itself."""
  n = checks.positive_int(n, "n")
  limit = min(checks.positive_int(min_sep, "min_sep"), n)
  if max_bands is not None:
    limit = min(limit, checks.positive_int(max_bands, "max_bands"))
  out = [1 << i for i in range(limit.bit_length()) if 1 << i <= limit]
  return out if out[-1] == limit else out + [limit]


def calibrate_bands(n: int, target_epsilon: float, delta: float, *, min_sep: int,
                    sampling_prob: float, max_bands: Optional[int] = None,
                    strategy: str = DEFAULT_STRATEGY, workload=None,
                    cache_dir: Optional[str] = None, tolerance: float = 1e-3,
                    progress: bool = False) -> Dict[str, Any]:
  """The b (and z) with the least expected error at ε ≤ ``target_epsilon`` (see the module).

  Args:
    n: rounds.
    target_epsilon, delta: the guarantee every candidate's z is calibrated to.
    min_sep: B, the cycle of the cyclic Poisson sampling the rate is given for (the
      largest b tried).
    sampling_prob: p, the probability of joining an eligible round at cycle B.
    max_bands: a further cap on b (default: none).
    strategy: ``banded_toeplitz`` (default) or ``banded``.
    workload: a ``tff_mf.factorization.workloads.WorkloadSpec`` with n rounds (default: prefix sum).
    cache_dir: the factorization cache (``tff_mf.factorization.cache``; default: its default).
    tolerance: relative tolerance of each z (the returned z always meets the target).

  Returns a JSON-ready dict: ``best`` (a ``BandCandidate`` dict), ``candidates`` (all of
  them, in increasing b), ``expected_participations`` E, and the inputs.
  """
  from tff_mf import accounting  # pylint: disable=g-import-not-at-top
  from tff_mf.accounting import analyses  # pylint: disable=g-import-not-at-top
  from tff_mf.factorization import cache  # pylint: disable=g-import-not-at-top
  from tff_mf import factorization as fz  # pylint: disable=g-import-not-at-top
  from tff_mf import participation  # pylint: disable=g-import-not-at-top
  from tff_mf.factorization import strategies  # pylint: disable=g-import-not-at-top
  from tff_mf.factorization import workloads  # pylint: disable=g-import-not-at-top
  n = checks.positive_int(n, "n")
  target = checks.positive_float(target_epsilon, "target_epsilon")
  delta = checks.delta(delta, "delta")
  p = checks.probability(sampling_prob, "sampling_prob")
  if strategy not in STRATEGIES:
    raise checks.CheckError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
  if checks.positive_int(min_sep, "min_sep") > n:
    raise checks.CheckError(f"min_sep={min_sep} exceeds the number of rounds n={n}")
  bands = candidate_bands(n, min_sep, max_bands)
  if workload is None:
    workload = workloads.WorkloadSpec("prefix_sum", n)
  if workload.n != n:
    raise checks.CheckError(f"the workload has {workload.n} rounds, expected n={n}")
  expected = p * n / min_sep
  out: List[BandCandidate] = []
  for b in bands:
    p_b = p * b / min_sep
    schema = participation.from_args("min_sep", n, min_sep=b)
    spec = strategies.FactorizationSpec(workload=workload, strategy=strategy,
                                        participation=schema, bands=b)
    f, entry = cache.load_or_factorize(spec, cache_dir=cache_dir, progress=progress)
    record = accounting.calibrate(f.c, schema, target, delta, analyses.AmplifiedBanded.name, p_b,
                                  tolerance=tolerance)
    z = float(record.noise_multiplier)
    rmse = fz.rmse(f.b, checks.gamma(f.c))
    out.append(BandCandidate(bands=b, sampling_prob=p_b, noise_multiplier=z,
                             epsilon=float(record.epsilon), bound=record.bound, rmse=rmse,
                             expected_error=z * rmse / expected, cache_npz=entry.npz_path))
  best = min(out, key=lambda c: (c.expected_error, c.bands))
  return {"best": best.as_dict(), "candidates": [c.as_dict() for c in out],
          "expected_participations": expected, "n": n, "target_epsilon": target,
          "delta": delta, "min_sep": int(min_sep), "sampling_prob": p, "strategy": strategy,
          "analysis": analyses.AmplifiedBanded.name, "theorem": analyses.AmplifiedBanded.theorem,
          "error": "z * rmse / expected_participations (jax_privacy BandMFConfig.rmse)"}

