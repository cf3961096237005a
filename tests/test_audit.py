"""The empirical privacy audit (tff_mf.audit, tff_mf.tf.audit, `tff-mf audit`).

Statistical tolerances. Every flag the audit raises holds at confidence 1 − α over
its trials (simultaneous Clopper–Pearson bounds): a correct mechanism is flagged
with probability ≤ α (here α = 0.01, so a false alarm in one of these tests has
probability ≤ 1%). The μ estimate has standard error se ≈ √(2/T + μ²/(4T)) for T
trials per world (reported); the tightness checks require |μ̂/μ_claim − 1| ≤ 10%,
which at T = 2048 and μ ≈ 2.6 is more than 4 standard errors (false-alarm rate
below 1e-4 per check).
"""

import dataclasses
import json
import math
import subprocess
import sys

import numpy as np
import pytest

import statcheck
import userenv
from tff_mf import audit as audit_lib
from tff_mf import participation
from tff_mf.tf import audit
from tff_mf.tf import runtime

runtime.install_exit_hook()

N = 8
Z = 0.5
OPTIONS = audit.AuditOptions(trials=2048, trials_per_run=512, calibration_trials=1024,
                             delta=1e-5, alpha=0.01)


def _kwargs(**kw):
  out = dict(total_rounds=N, noise_multiplier=Z, clients_per_round=2, clip_norm=1.0)
  out.update(kw)
  return out


# ----------------------------------------------------------------------------- numpy core


def test_worst_canary_matches_the_sensitivity_where_it_is_exact():
  """The audit's own brute force (rank-1 ±1 canaries over its own pattern enumeration)
  attains the library's exact sensitivities, computed independently."""
  rng = np.random.default_rng(0)
  checked = 0
  for schema in (participation.SINGLE, participation.fixed_epoch(2), participation.min_sep(3, 2)):
    for c in (np.tril(rng.uniform(0.1, 1.0, (12, 12))), np.tril(np.ones((12, 12))),
              np.tril(np.triu(rng.uniform(0.1, 1.0, (12, 12)), -2))):
      report = participation.sensitivity_report(c, schema)
      pats = audit_lib.canary_patterns(schema.kind, 12, schema.epochs, schema.min_sep,
                                       schema.max_participations)
      found = audit_lib.worst_canary(np.linalg.inv(c), pats)
      assert found["sensitivity"] <= report["value"] * (1 + 1e-9)
      if report["exact"]:
        checked += 1
        assert found["sensitivity"] == pytest.approx(report["value"], rel=1e-9)
  assert checked >= 7


def test_gdp_conversion_matches_balle_wang():
  for mu in (0.5, 1.0, 2.6):
    eps = audit_lib.gdp_epsilon(mu, 1e-5)
    assert float(statcheck.gaussian_delta(1.0 / mu, eps)) == pytest.approx(1e-5, rel=1e-6)


def test_bounds_cover_at_their_confidence_and_detect_a_larger_mu():
  """On exact Gaussian scores: at μ = 2 the bounds stay below μ in ≥ 1 − α of 200 repetitions
  (binomial tail: > 8 misses has probability < 1e-4 at α = 0.01), and at μ = 2.5 they refute
  μ = 2 almost always."""
  rng = np.random.default_rng(1)
  grid = audit_lib.threshold_grid(2.0)
  misses, detected = 0, 0
  for _ in range(200):
    s0 = rng.standard_normal(2048)
    r = audit_lib.score_report(s0, rng.standard_normal(2048) + 2.0, grid, 0.01, 1e-5)
    misses += r["mu_lower_bound"] > 2.0 or r["epsilon_lower_bound"] > audit_lib.gdp_epsilon(2.0, 1e-5)
    r = audit_lib.score_report(s0, rng.standard_normal(2048) + 2.5, grid, 0.01, 1e-5)
    detected += r["mu_lower_bound"] > 2.0
  assert misses <= 8
  assert detected >= 190


# ----------------------------------------------------------------------------- the aggregator


@pytest.fixture(scope="module")
def fixed_epoch_pair():
  return audit.build_pair("opt_prefix_sum", OPTIONS.trials_per_run,
                          **_kwargs(participation=participation.fixed_epoch(2)))


def test_tight_and_no_false_alarm(fixed_epoch_pair):
  claimed, packed = fixed_epoch_pair
  r = audit.audit_setups(claimed, packed, OPTIONS, seed=0)
  assert r["canary"]["pattern"] in ([0, 4], [1, 5], [2, 6], [3, 7])
  assert r["release_mu"] == pytest.approx(r["claimed_mu"], rel=1e-6)
  assert abs(r["mu_ratio"] - 1) <= 0.10, r
  assert not r["violation"], r
  assert r["epsilon_lower_bound"] <= r["claimed_epsilon"]
  assert 0 < r["mu_lower_bound"] < r["claimed_mu"]
  for stat in r["statistics"].values():
    assert stat["packing_check"]["p_value"] > 1e-4


def _violation(r):
  return r["violation"] and r["mu_lower_bound"] > r["claimed_mu"]


@pytest.mark.parametrize("fault", ["under_reported_sensitivity", "noise_divided",
                                   "repeated_noise_row"])
def test_flags_a_planted_fault(fault, fixed_epoch_pair):
  """Sensitivity under-reported by 20% (claim 0.8·sens); noise divided by an extra factor 1.25;
  the noise row of the canary's first round added again in the next round. Each must be
  flagged: the μ lower bound (confidence 0.99) exceeds the claimed μ."""
  claimed, packed, schema = audit.plant_fault(fault, *fixed_epoch_pair)
  r = audit.audit_setups(claimed, packed, OPTIONS, schema=schema, seed=1)
  assert _violation(r), audit.json_ready(r)
  if fault == "repeated_noise_row":
    assert r["statistics"]["estimated_sigma"]["mu_lower_bound"] > r["claimed_mu"]


def test_flags_a_fixed_epoch_run_accounted_as_single_participation():
  claimed, packed, schema = audit.plant_fault(
      "schema_ignored", *audit.build_pair("opt_prefix_sum", OPTIONS.trials_per_run, **_kwargs()))
  r = audit.audit_setups(claimed, packed, OPTIONS, schema=schema, seed=4)
  assert r["claimed_sensitivity"] == pytest.approx(1.0)
  assert r["release_mu"] > 1.2 * r["claimed_mu"]
  assert _violation(r), audit.json_ready(r)
