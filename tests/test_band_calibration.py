"""Choosing the number of bands with amplification (``tff_mf.accounting.band_calibration``).

Against a grid computed here from the definitions: for each b, the b-banded Toeplitz C,
cyclic Poisson of cycle b at p·b/B, z calibrated with the amplified banded analysis
(Choquette-Choo et al. 2023, arXiv:2306.08153, Thm 4), error z·rmse/E.
"""

import math
import subprocess
import sys

import numpy as np
import pytest

import userenv
from tff_mf import accounting
from tff_mf.accounting import band_calibration
from tff_mf.factorization import cache
from tff_mf import checks
from tff_mf import participation
from tff_mf.factorization import strategies
from tff_mf.factorization import workloads

N, B, P, EPS, DELTA = 16, 2, 0.5, 4.0, 1e-6
TOL = 0.02  # z within 2% of the smallest valid one: few PLD evaluations (seconds each)


@pytest.fixture(scope="module")
def result(tmp_path_factory):
  cache_dir = str(tmp_path_factory.mktemp("bands_cache"))
  return band_calibration.calibrate_bands(N, EPS, DELTA, min_sep=B, sampling_prob=P,
                                          cache_dir=cache_dir, tolerance=TOL), cache_dir


def test_candidates_are_powers_of_two_up_to_the_separation_and_the_cap():
  assert band_calibration.candidate_bands(64, 32) == [1, 2, 4, 8, 16, 32]
  assert band_calibration.candidate_bands(64, 24) == [1, 2, 4, 8, 16, 24]
  assert band_calibration.candidate_bands(64, 32, max_bands=8) == [1, 2, 4, 8]
  assert band_calibration.candidate_bands(4, 32) == [1, 2, 4]


def test_best_is_the_least_expected_error_of_an_independent_grid(result):
  out, cache_dir = result
  e = P * N / B
  assert out["expected_participations"] == e
  assert [c["bands"] for c in out["candidates"]] == [1, 2]
  for c in out["candidates"]:
    b = c["bands"]
    assert c["sampling_prob"] == pytest.approx(P * b / B)
    schema = participation.min_sep(b, math.ceil(N / b))
    spec = strategies.FactorizationSpec(workload=workloads.WorkloadSpec("prefix_sum", N),
                                        strategy="banded_toeplitz", participation=schema,
                                        bands=b)
    f, entry = cache.load_or_factorize(spec, cache_dir=cache_dir)
    assert entry.cache_hit and entry.npz_path == c["cache_npz"]  # factorized once, cached
    assert accounting.band_count(f.c) <= b
    # z meets the target under the amplified banded analysis, and z·(1 − tolerance) does not.
    record = accounting.epsilon_for(f.c, schema, c["noise_multiplier"], DELTA, "amplified_banded",
                                    c["sampling_prob"])
    assert record["epsilon"] <= EPS and record["epsilon"] == pytest.approx(c["epsilon"])
    below = accounting.epsilon_for(f.c, schema, c["noise_multiplier"] * (1 - TOL), DELTA,
                                   "amplified_banded", c["sampling_prob"])
    assert below["epsilon"] > EPS
    rmse = float(np.linalg.norm(f.b) / np.sqrt(N))  # γ(C) = 1
    assert c["rmse"] == pytest.approx(rmse, rel=1e-12)
    assert c["expected_error"] == pytest.approx(c["noise_multiplier"] * rmse / e, rel=1e-12)
  assert out["best"] == min(out["candidates"], key=lambda c: c["expected_error"])


def test_refusals():
  for kwargs, match in ((dict(min_sep=32), "exceeds"), (dict(min_sep=4, strategy="blt"),
                                                        "strategy"),
                        (dict(min_sep=4, sampling_prob=1.5), "sampling_prob")):
    args = dict(sampling_prob=P)
    args.update(kwargs)
    with pytest.raises(checks.CheckError, match=match):
      band_calibration.calibrate_bands(N, EPS, DELTA, **args)


def test_command_prints_every_candidate_and_refuses_in_one_line(result, tmp_path):
  _, cache_dir = result
  command = [sys.executable, "-m", "tff_mf.cli", "calibrate-bands", "--total_rounds", str(N),
             "--min_sep",
             str(B), "--sampling_prob", str(P), "--target_epsilon", str(EPS), "--delta",
             str(DELTA), "--cache_dir", cache_dir, "--max_bands", "1", "--tolerance", "0.05"]
  done = subprocess.run(command, env=userenv.env(home=tmp_path), capture_output=True,
                        text=True, timeout=600, cwd=userenv.REPO)
  assert done.returncode == 0, done.stderr[-2000:]
  rows = [line for line in done.stdout.splitlines() if line.strip()[:1].isdigit()]
  assert len(rows) == 1 and "<- best" in rows[0]
  bad = subprocess.run(command[:7] + ["64"] + command[8:], env=userenv.env(home=tmp_path),
                       capture_output=True, text=True, timeout=600, cwd=userenv.REPO)
  assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
  assert "exceeds" in bad.stderr
