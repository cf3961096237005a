"""Fixed-bin balls-in-bins (``balls_in_bins``) beside random allocation (``random_allocation``).

The field's balls-in-bins (Chua et al. 2024, arXiv:2410.06266, arXiv:2412.16802;
jax_privacy's ``BallsInBinsSampling``) keeps a user's bin j for the whole run: it joins
every round i with i mod b = j. Random allocation draws a new round in every epoch. The
two are different mechanisms; a record written before ``balls_in_bins`` took the fixed-bin
meaning (no ``fixed_bin`` marker) names random allocation and is read as such.
"""

import hashlib
import itertools
import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest
from scipy import special
from scipy import stats

import userenv

from tff_mf import accounting
from tff_mf.accounting import allocation_pld
from tff_mf.factorization import cache
from tff_mf import checks
from tff_mf.accounting import fixed_bin as fb
from tff_mf import mechanisms
from tff_mf import participation as pa
from tff_mf.factorization import strategies
from tff_mf.factorization import workloads
from training import config as config_lib
from training import identity as identity_lib
from training import loop
from training import outputs
from training import sampling
from training.config import TrainingError

DELTA = 1e-8


def _legacy(k):
  """What versions before the rename stored for the per-epoch scheme."""
  return {"kind": "balls_in_bins", "label": f"balls_in_bins-k{k}", "epochs": k}


# ----------------------------------------------------------------------------- schema


def test_fixed_bin_schema_is_the_cyclic_patterns_and_stores_its_marker():
  s = pa.from_args("balls_in_bins", 12, epochs=3)
  assert s == pa.balls_in_bins(3) and s.kind == "balls_in_bins"
  assert sorted(s.patterns(12)) == [(j, j + 4, j + 8) for j in range(4)]
  assert s.separation(12) == 4 and s.max_participations_in(12) == 3
  d = s.as_dict()
  assert d[pa.FIXED_BIN_MARKER] is True and pa.from_dict(d) == s
  assert s.label != _legacy(3)["label"] and "fixed" in s.describe()
  assert "fixed" in s.sampler
  # Random allocation: every choice of one round per epoch.
  r = pa.random_allocation(3)
  assert len(r.patterns(12)) == 4 ** 3 and r.separation(12) == 1
  assert pa.from_dict(r.as_dict()) == r


def test_an_old_balls_in_bins_record_is_read_as_random_allocation():
  assert pa.from_dict(_legacy(4)) == pa.random_allocation(4)
  assert pa.random_allocation(4).legacy_dicts() == [_legacy(4)]
  assert pa.balls_in_bins(4).legacy_dicts() == []
  for bad in (dict(_legacy(4), fixed_bin=False), {"kind": "fixed_epoch", "epochs": 4,
                                                  "fixed_bin": True}):
    with pytest.raises(checks.CheckError) as e:
      pa.from_dict(bad)
    assert "fixed_bin" in str(e.value) and "\n" not in str(e.value)


# ----------------------------------------------------------------------------- sensitivity


def _brute_cyclic(c, k):
  """max over bins j of the SDP value, for C ≥ 0: Σ_{s,t∈P_j} X_st (all-equal contributions)."""
  n = c.shape[1]
  b = n // k
  x = c.T @ c
  return max(np.sqrt(x[np.ix_(p, p)].sum()) for p in (list(range(j, n, b)) for j in range(b)))


@pytest.mark.parametrize("n,k,seed", [(12, 3, 0), (16, 4, 1), (16, 2, 2), (18, 3, 3)])
def test_fixed_bin_sensitivity_is_exact_for_nonnegative_c(n, k, seed):
  c = np.tril(np.random.default_rng(seed).random((n, n)))
  report = pa.sensitivity_report(c, pa.balls_in_bins(k))
  assert report["exact"]
  assert report["value"] == pytest.approx(_brute_cyclic(c, k), rel=1e-10)
  # b-cyclic patterns are b-separated: never above the min-sep-b value.
  assert report["value"] <= pa.sensitivity(c, pa.min_sep(n // k, k)) * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_fixed_bin_sensitivity_brackets_signed_c(seed):
  """Signed C: the value is an upper bound on every explicit ±1 contribution on a cyclic
  pattern, and the min-sep-b bound is used where smaller."""
  n, k = 12, 3
  b = n // k
  c = np.tril(np.random.default_rng(seed).standard_normal((n, n)))
  report = pa.sensitivity_report(c, pa.balls_in_bins(k))
  x = c.T @ c
  explicit = max(np.sqrt(s @ x[np.ix_(p, p)] @ s)
                 for p in (list(range(j, n, b)) for j in range(b))
                 for s in map(np.array, itertools.product((1.0, -1.0), repeat=k)))
  assert explicit <= report["value"] * (1 + 1e-12)
  assert report["lower"] <= report["value"]
  assert report["value"] <= pa.sensitivity(c, pa.min_sep(b, k)) * (1 + 1e-9)
  assert report["value"] <= pa.sensitivity(c, pa.fixed_epoch(k)) * (1 + 1e-9)


def test_fixed_bin_sensitivity_of_blt_equals_the_exact_min_sep_value():
  """BLT-like C (non-negative, non-increasing Toeplitz): the earliest pattern {0, b, …} is
  the worst b-separated one, a fixed-bin pattern: both analyses give the same exact value."""
  n, k = 48, 4
  coeffs = 0.6 ** np.arange(n) + 0.2 * 0.95 ** np.arange(n)
  c = np.array([[coeffs[i - j] if i >= j else 0.0 for j in range(n)] for i in range(n)])
  fixed = pa.sensitivity_report(c, pa.balls_in_bins(k))
  assert fixed["exact"]
  assert fixed["value"] == pytest.approx(pa.sensitivity(c, pa.min_sep(n // k, k)), rel=1e-10)


# ----------------------------------------------------------------------------- accounting


def test_fixed_bin_epsilon_is_amplified_and_the_plain_record_names_the_analysis():
  c = np.eye(16)
  record = accounting.epsilon_for(c, pa.balls_in_bins(4), 2.0, DELTA)
  assert record["sensitivity"] == pytest.approx(2.0, rel=1e-9)
  assert record["epsilon"] == pytest.approx(
      accounting.epsilon(2.0, DELTA, sensitivity=record["sensitivity"]), rel=1e-12)
  assert "'amplified_fixed_bin'" in record["amplification"]
  assert "fixed-bin" in record["theorem"]
  # The random-allocation bound is never used for the fixed-bin scheme, nor the reverse.
  with pytest.raises(checks.CheckError) as e:
    accounting.epsilon_for(c, pa.balls_in_bins(4), 2.0, DELTA, "amplified_allocation")
  assert "not balls_in_bins(epochs=4, fixed bin)" in str(e.value)
  with pytest.raises(checks.CheckError) as e:
    accounting.epsilon_for(c, pa.random_allocation(4), 2.0, DELTA, "amplified_fixed_bin")
  assert "not random_allocation" in str(e.value) and "\n" not in str(e.value)
  # C = I: the bins' means are orthogonal, so the pair is one epoch of random allocation
  # of b = 4 bins at z / sqrt(k) (the comparison pair is the pair itself; G is rounded up
  # by participation.ROUNDING_MARGIN).
  amplified = accounting.epsilon_for(c, pa.balls_in_bins(4), 2.0, DELTA, "amplified_fixed_bin")
  same = allocation_pld.epsilon(4, 1, 1.0, DELTA)["epsilon"]
  assert amplified["fixed_bin"]["method"] == "pld" and amplified["bound"] == "amplified"
  assert amplified["epsilon"] == pytest.approx(same, rel=1e-9)
  assert amplified["epsilon"] < record["epsilon"] == amplified["unamplified_epsilon"]
  run = mechanisms.run_privacy(c, pa.balls_in_bins(4), 2.0, None, DELTA, "exact")
  assert run.bound == "amplified_fixed_bin" and run.epsilon == amplified["epsilon"]
  text = str(run)
  assert "secret bin of fixed-bin balls-in-bins" in text and "Kahane" in text


def test_an_account_call_with_an_old_record_gets_the_random_allocation_bound():
  c = np.eye(64)
  old = accounting.epsilon_for(c, _legacy(4), 2.0, DELTA, "amplified_allocation")
  new = accounting.epsilon_for(c, pa.random_allocation(4), 2.0, DELTA, "amplified_allocation")
  assert old["schema"]["kind"] == "random_allocation"
  assert old["epsilon"] == new["epsilon"] < new["unamplified_epsilon"]


def _account(*args):
  return subprocess.run([sys.executable, "-m", "tff_mf.cli", "account", *args],
                        capture_output=True, text=True, env=userenv.env(), check=False)


def test_cli_balls_in_bins_is_fixed_bin_and_random_allocation_is_amplified(tmp_path):
  base = ["--mechanism", "gaussian", "--total_rounds", "16", "--epochs", "4", "--noise_multiplier",
          "2", "--delta", "1e-8", "--cache_dir", str(tmp_path), "--json"]
  fixed = _account("--participation", "balls_in_bins", *base)
  assert fixed.returncode == 0, fixed.stderr
  record = json.loads(fixed.stdout)
  assert record["schema"]["kind"] == "balls_in_bins" and record["schema"]["fixed_bin"]
  assert record["analysis"] == "none" and "'amplified_fixed_bin'" in record["amplification"]
  assert "fixed bin" in json.dumps(record["privacy_statement"])
  allocation = _account("--participation", "random_allocation", "--amplification",
                        "amplified_allocation", *base)
  assert allocation.returncode == 0, allocation.stderr
  assert json.loads(allocation.stdout)["epsilon"] < record["epsilon"]
  amplified = _account("--participation", "balls_in_bins", "--amplification", "amplified_fixed_bin",
                       "--lower_bound", *base)
  assert amplified.returncode == 0, amplified.stderr
  bound = json.loads(amplified.stdout)
  assert bound["analysis"] == "amplified_fixed_bin" and bound["schema"]["fixed_bin"]
  assert bound["lower_bound_epsilon"] <= bound["epsilon"] < record["epsilon"]
  assert "secret bin" in json.dumps(bound["privacy_statement"])
  for schema, analysis, what in (("balls_in_bins", "amplified_allocation", "fixed-bin"),
                                 ("random_allocation", "amplified_fixed_bin", "new round")):
    refused = _account("--participation", schema, "--amplification", analysis, *base)
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode != 0 and len(lines) == 1 and what in lines[0], refused.stderr
  helped = _account("--help")
  assert "fixed-bin" in " ".join(helped.stdout.split()) and "random_allocation" in helped.stdout


# ----------------------------------------------------------------------------- the bound


def _random_c(n, seed):
  """A random non-negative lower-triangular C (columns of unit norm at most)."""
  c = np.tril(np.random.default_rng(seed).uniform(0.0, 1.0, (n, n)))
  return c / np.max(np.linalg.norm(c, axis=0))


def _exact_remove_moments(g, orders):
  """E exp(Σ_{i<l} G[j_i, j_l]) over every α-tuple of bins (exact enumeration)."""
  b = g.shape[0]
  out = []
  for alpha in orders:
    vals = [sum(g[t[i], t[l]] for i in range(alpha) for l in range(i + 1, alpha))
            for t in itertools.product(range(b), repeat=alpha)]
    out.append(float(np.log(np.mean(np.exp(vals)))) / (alpha - 1))
  return np.array(out)


def _quadrature_add(g, orders, points):
  """D_α(P‖Q) = log E_P[W^{1−α}] / (α − 1), W = mean_j exp(Y_j − G_jj/2), Y ~ N(0, G), by
  tensor Gauss–Hermite quadrature (an independent, deterministic evaluation)."""
  b = g.shape[0]
  x, w = special.roots_hermitenorm(points)
  w = w / np.sqrt(2 * np.pi)
  xi = np.stack(np.meshgrid(*[x] * b, indexing="ij"), -1).reshape(-1, b)
  weight = np.prod(np.stack(np.meshgrid(*[w] * b, indexing="ij"), -1).reshape(-1, b), axis=1)
  y = xi @ np.linalg.cholesky(g).T
  log_w = special.logsumexp(y - np.diag(g) / 2, axis=1) - np.log(b)
  return np.array([float(special.logsumexp((1 - a) * log_w, b=weight)) / (a - 1)
                   for a in orders])


def _bounds_and_gram(n, k, seed, z, orders):
  """The Rényi bounds and the Gram matrix G of the bins for a random C ≥ 0."""
  c = _random_c(n, seed)
  return fb.rdp(c, k, z, orders=orders), fb.bin_gram(c, k, z)


@pytest.mark.parametrize("n,k,seed", [(6, 2, 0), (9, 3, 1), (8, 2, 2)])
def test_remove_bounds_hold_against_exact_enumeration_and_are_exact_where_proven(n, k, seed):
  z, orders = 0.7, [2, 3, 4, 5, 6]
  bounds, g = _bounds_and_gram(n, k, seed, z, orders)
  exact = _exact_remove_moments(g, orders)
  for name in ("remove_pairs", "remove_triples", "remove_collisions"):
    assert np.all(bounds[name] >= exact * (1 - 1e-12)), name
  # One block holds every ball: the pair bound at α = 2 and the triple bound at α = 3 are the
  # exact moments (Hoeffding's decoupling loses nothing there).
  assert bounds["remove_pairs"][0] == pytest.approx(exact[0], rel=1e-10)
  assert bounds["remove_triples"][1] == pytest.approx(exact[1], rel=1e-10)
  # C = I: the collision bound is exact.
  eye = fb.rdp(np.eye(n), k, z, orders=orders)
  assert eye["remove_collisions"] == pytest.approx(
      _exact_remove_moments(fb.bin_gram(np.eye(n), k, z), orders), rel=1e-10)


@pytest.mark.parametrize("n,k,seed", [(4, 2, 3), (6, 2, 4), (6, 3, 5)])
def test_add_bound_holds_against_quadrature(n, k, seed):
  orders = [2, 3, 4, 6, 8]
  bounds, g = _bounds_and_gram(n, k, seed, 1.5, orders)
  points = 40 if g.shape[0] == 2 else 30
  exact = _quadrature_add(g, orders, points)
  # Quadrature of a smooth integrand: two numbers of points agree far inside this margin.
  again = _quadrature_add(g, orders, points + 10)
  error = np.max(np.abs(exact - again))
  assert error < 1e-6
  assert np.all(bounds["add"] >= exact - 10 * error - 1e-12)
  assert np.all(bounds["rdp"] <= bounds["unamplified"])


def test_the_comparison_covariance_dominates_the_remove_moments():
  """Kahane's inequality on the integer moments: A·11ᵀ + B·I ≥ G entrywise gives larger
  moments (exact enumeration of both)."""
  c = _random_c(9, 6)
  g = fb.bin_gram(c, 3, 0.6)
  parts = fb.comparison(g)
  bigger = parts["common"] + parts["hidden"] * np.eye(3)
  assert np.all(bigger >= g - 1e-15)
  orders = [2, 3, 4, 5]
  assert np.all(_exact_remove_moments(bigger, orders) >= _exact_remove_moments(g, orders))


def test_fixed_bin_bound_sits_between_the_lower_bound_and_the_unamplified_one():
  n, k, z = 64, 4, 2.0
  coef = 1.0 / np.sqrt(1.0 + np.arange(n))  # a slowly decaying Toeplitz C, as BLT
  c = sum(v * np.eye(n, k=-d) for d, v in enumerate(coef))
  record = accounting.epsilon_for(c, pa.balls_in_bins(k), z, 1e-6, "amplified_fixed_bin")
  lower = fb.lower_bound(c, k, z, 1e-6)
  assert 0 < lower <= record["epsilon"] <= record["unamplified_epsilon"]
  assert record["bound"] == "amplified" and record["fixed_bin"]["method"] == "renyi"
  # b = 1: nothing is hidden, the bound is the Gaussian's.
  one = fb.epsilon(np.eye(4), 4, z, 1e-6)
  gauss = accounting.epsilon(z, 1e-6, sensitivity=2.0)
  assert one["method"] == "pld"
  assert gauss <= one["epsilon"] <= gauss + 2 * one["pld"]["max_loss_overstatement"]


# ----------------------------------------------------------------------------- sampler


IDS = [f"u{i:05d}" for i in range(3000)]


def _rounds(sampler, n):
  joined = {}
  for t in range(1, n + 1):
    for c in sampler.next_round(t, lambda cid: cid)[0]:
      joined.setdefault(c, []).append(t)
  return joined


def test_fixed_bin_sampler_keeps_each_clients_bin_and_its_bin_is_uniform():
  n, k = 20, 4
  b = n // k
  sampler = sampling.BallsInBinsSampler(IDS, seed=3, total_rounds=n, epochs=k, secret=77)
  joined = _rounds(sampler, n)
  assert set(joined) == set(IDS)
  for rounds in joined.values():
    assert rounds == list(range(rounds[0], n + 1, b)) and rounds[0] <= b
  assert stats.chisquare(np.bincount([r[0] - 1 for r in joined.values()],
                                     minlength=b)).pvalue > 1e-6
  log = sampling.ParticipationLog(IDS, period=b)
  again = sampling.BallsInBinsSampler(IDS, seed=3, total_rounds=n, epochs=k, secret=77)
  for t in range(1, n + 1):
    log.observe(t, again.next_round(t, lambda cid: cid)[0])
  assert log.violations(pa.balls_in_bins(k), n) == []
  # The bin comes from the secret: another secret, other bins; random allocation differs.
  other = sampling.BallsInBinsSampler(IDS, seed=3, total_rounds=n, epochs=k, secret=78)
  assert set(other.members(1)) != set(sampler.members(1))
  allocation = _rounds(sampling.RandomAllocationSampler(IDS, seed=3, total_rounds=n, epochs=k,
                                                        secret=77), n)
  assert any(r != list(range(r[0], n + 1, b)) for r in allocation.values())


def test_training_flags_build_the_fixed_bin_sampler():
  values = dict(mechanism="none", dataset="synthetic", total_rounds=12, clients_per_round=5)
  cfg = config_lib.TrainingConfig(participation="balls_in_bins", epochs=3, **values)
  cfg.validate()
  assert cfg.schema() == pa.balls_in_bins(3)
  assert isinstance(sampling.build_sampler(cfg, IDS, 5), sampling.BallsInBinsSampler)
  assert sampling.schema_period(cfg) == 4 and sampling.schema_epoch_length(cfg) is None
  allocation = config_lib.TrainingConfig(participation="random_allocation", epochs=3, **values)
  assert isinstance(sampling.build_sampler(allocation, IDS, 5),
                    sampling.RandomAllocationSampler)


# ----------------------------------------------------------------------------- old records


def _to_legacy(value, new, old):
  """``value`` with every dict equal to ``new`` replaced by ``old`` (recursively)."""
  if value == new:
    return old
  if isinstance(value, dict):
    return {k: _to_legacy(v, new, old) for k, v in value.items()}
  if isinstance(value, list):
    return [_to_legacy(v, new, old) for v in value]
  return value


def _write_legacy_entry(tmp_path, k):
  """A random_allocation entry rewritten into what the version before the rename wrote."""
  spec = strategies.FactorizationSpec(workload=workloads.WorkloadSpec(kind="prefix_sum", n=8),
                                      strategy="identity",
                                      participation=pa.random_allocation(k))
  _, entry = cache.load_or_factorize(spec, cache_dir=str(tmp_path))
  with open(entry.json_path) as f:
    metadata = _to_legacy(json.load(f), pa.random_allocation(k).as_dict(), _legacy(k))
  metadata["key"] = cache.key_hash(metadata["params"])
  old_dir = os.path.join(str(tmp_path), cache.entry_name(metadata["params"]))
  assert "balls_in_bins-k2" in old_dir
  os.rename(entry.directory, old_dir)
  with open(os.path.join(old_dir, cache.METADATA_FILE), "w") as f:
    json.dump(metadata, f)
  return spec, old_dir


def test_an_old_cache_entry_is_served_as_random_allocation_never_as_fixed_bin(
    tmp_path, monkeypatch):
  spec, old_dir = _write_legacy_entry(tmp_path, 2)
  calls = []
  real = strategies.factorize
  monkeypatch.setattr(strategies, "factorize",
                      lambda s, **kw: calls.append(s) or real(s, **kw))
  f, entry = cache.load_or_factorize(spec, cache_dir=str(tmp_path))
  assert entry.cache_hit and entry.directory == old_dir and not calls
  [row] = cache.list_entries(str(tmp_path))
  assert row["verified"] and row["participation"] == "random_allocation-k2"
  assert [r["ok"] for r in cache.verify(str(tmp_path))] == [True]
  # The fixed-bin schema of the same K never reads it.
  fixed = strategies.FactorizationSpec(workload=spec.workload, strategy="identity",
                                       participation=pa.balls_in_bins(2))
  _, fixed_entry = cache.load_or_factorize(fixed, cache_dir=str(tmp_path))
  assert not fixed_entry.cache_hit and fixed_entry.directory != old_dir and len(calls) == 1
  # tff-mf account --matrix on the old entry accounts random allocation.
  result = _account("--matrix", os.path.join(old_dir, os.path.basename(entry.npz_path)),
                    "--noise_multiplier", "2", "--delta", "1e-6", "--json")
  assert result.returncode == 0, result.stderr
  assert json.loads(result.stdout)["schema"]["kind"] == "random_allocation"
  assert f.c.shape == (8, 8)


def _old_fingerprint(cfg):
  """The fingerprint the version before the rename computed for these flags."""
  values = {k: v for k, v in cfg.public_dict().items()
            if k not in config_lib.RESUME_FREE_FIELDS}
  values["participation"] = "balls_in_bins"
  return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()


def test_an_old_run_directory_resumes_as_random_allocation_only(tmp_path):
  values = dict(mechanism="gaussian", dataset="synthetic", total_rounds=8, clients_per_round=2,
                noise_multiplier=1.0, epochs=2, root_output_dir=str(tmp_path),
                experiment_name="old")
  allocation = config_lib.TrainingConfig(participation="random_allocation", **values)
  old_config = dict(allocation.public_dict(), participation="balls_in_bins")
  run_dir = str(tmp_path / "old")
  os.makedirs(run_dir)
  outputs.write_json(os.path.join(run_dir, outputs.CONFIG_FILE),
                     {"config": old_config, "fingerprint": _old_fingerprint(allocation),
                      "created_utc": "2026-11-01T00:00:00Z"})
  recorded = identity_lib.RunIdentity(
      noise_seed=5, sampling_secret=9, seed_source="os_entropy",
      config_fingerprint=_old_fingerprint(allocation),
      schema_sha256=identity_lib.schema_sha256(_legacy(2)))
  assert loop._check_resumable(allocation, run_dir, "a checkpoint", recorded, 5) == \
      "2026-11-01T00:00:00Z"  # pylint: disable=protected-access
  fixed = config_lib.TrainingConfig(participation="balls_in_bins", **values)
  with pytest.raises(TrainingError) as e:
    check = loop._check_resumable  # pylint: disable=protected-access
    check(fixed, run_dir, "a checkpoint", recorded, 5)
  assert "random_allocation" in str(e.value) and "\n" not in str(e.value)
  # The identity's schema fingerprint: the old dict is random allocation's, not fixed-bin's.
  setup = types.SimpleNamespace(info={}, encoder=None, factorization=None)
  bind = loop._bind_identity  # pylint: disable=protected-access
  progress = types.SimpleNamespace(identity_digest=None)
  bind(types.SimpleNamespace(config=allocation, identity=recorded, run_dir=run_dir,
                             progress=progress), setup)
  assert progress.identity_digest == identity_lib.digest_int(recorded)
  with pytest.raises(TrainingError, match="participation schema sha256"):
    bind(types.SimpleNamespace(config=fixed, identity=recorded, run_dir=run_dir,
                               progress=progress), setup)
  assert fixed.fingerprint() not in allocation.accepted_fingerprints()
  assert _old_fingerprint(allocation) not in fixed.accepted_fingerprints()
