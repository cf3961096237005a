"""Toeplitz families on Toeplitz workloads held as first columns (issue 49): the same figures
as the dense path, the cache's column entries and their checks, O(n) memory at large n."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tff_mf import checks
from tff_mf import participation
from tff_mf import toeplitz_view
from tff_mf.accounting import analyses
from tff_mf.accounting import mmcc
from tff_mf.factorization import cache
from tff_mf.factorization import strategies
from tff_mf.factorization import toeplitz_factorization as tf_lib
from tff_mf.factorization import toeplitz_ops
from tff_mf.factorization import workloads
from tff_mf.factorization.families import blt

import userenv

N = 48
COEFFICIENTS = {
    "sqrt_prefix": workloads.sqrt_prefix_coefficients(N),
    "band8": np.r_[np.linspace(1.0, 0.3, 8), np.zeros(N - 8)],
    "signed": np.r_[1.0, -0.3, 0.2, np.zeros(N - 3)],
    "gap": np.r_[1.0, 0.0, 0.5, np.zeros(N - 3)],
    "rising": np.r_[1.0, 1.2, 0.4, 0.1, np.zeros(N - 4)],
}
SCHEMAS = [participation.SINGLE, participation.min_sep(8), participation.min_sep(24, 3),
           participation.min_sep(1), participation.min_sep(N), participation.fixed_epoch(4)]


def _spec(strategy, workload, schema, **params):
  return strategies.FactorizationSpec.with_parameters(
      params, workload=workload, strategy=strategy, participation=schema.for_rounds(workload.n))


def _dense_path(spec, monkeypatch):
  with monkeypatch.context() as m:
    m.setattr(strategies, "toeplitz_workload", lambda spec: None)
    return strategies.factorize(spec)


CASES = [("blt", {"buffers": 3, "error": "mean"}, participation.min_sep(32)),
         ("blt", {"buffers": 2, "error": "max"}, participation.SINGLE),
         ("banded_toeplitz", {"bands": 16, "error": "mean"}, participation.min_sep(32)),
         ("banded_toeplitz", {"bands": 8, "error": "max"}, participation.SINGLE)]
WORKLOADS = [workloads.WorkloadSpec("prefix_sum", 256),
             workloads.WorkloadSpec("momentum", 256, momentum=0.9)]


@pytest.mark.parametrize("strategy,params,schema", CASES)
@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.kind)
def test_first_columns_give_what_the_dense_path_gives(strategy, params, schema, workload,
                                                      monkeypatch):
  spec = _spec(strategy, workload, schema, **params)
  f = strategies.factorize(spec)
  g = _dense_path(spec, monkeypatch)
  assert isinstance(f, tf_lib.ToeplitzFactorization)
  assert not isinstance(g, tf_lib.ToeplitzFactorization)
  for name, dense in (("A_column", g.a), ("B_column", g.b), ("C_column", g.c)):
    np.testing.assert_array_equal(toeplitz_ops.lower_toeplitz(f.columns[name]), dense)
  for key in ("sensitivity", "rmse", "max_error", "objective", "gamma_before_normalization"):
    np.testing.assert_allclose(f.info[key], g.info[key], rtol=1e-12)
  for key in ("sensitivity_exact", "sensitivity_method", "outcome"):
    assert f.info[key] == g.info[key]
  np.testing.assert_allclose(f.single_participation_loss, g.single_participation_loss,
                             rtol=1e-12)
  np.testing.assert_allclose(f.per_round_variance(), g.per_round_variance(), rtol=1e-12)
  np.testing.assert_allclose(f.noise_matrix(), g.noise_matrix(), atol=1e-9)


SQUARE_ROOT_CASES = [("bsr", {"bands": 8}, participation.min_sep(32)),
                     ("bisr", {"bands": 16}, participation.SINGLE),
                     ("banded_inverse", {"bands": 4}, participation.min_sep(16)),
                     ("lambda_cgd", {}, participation.fixed_epoch(4))]


@pytest.mark.parametrize("strategy,params,schema", SQUARE_ROOT_CASES)
@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.kind)
def test_square_root_first_columns_are_the_dense_factorization(strategy, params, schema,
                                                               workload, monkeypatch):
  """BSR, BISR, BandInvMF and λCGD of a Toeplitz workload: first columns whose matrices are
  the dense path's (computed there by triangular solves and products, here by recurrences
  and convolutions: they agree to rounding, far below any figure's meaning), the same
  figures and parameters, and a stream that is C⁻¹ (the cache's check)."""
  spec = _spec(strategy, workload, schema, **params)
  f = strategies.factorize(spec)
  g = _dense_path(spec, monkeypatch)
  assert isinstance(f, tf_lib.ToeplitzFactorization)
  for name, dense in (("A_column", g.a), ("B_column", g.b), ("C_column", g.c)):
    np.testing.assert_allclose(toeplitz_ops.lower_toeplitz(f.columns[name]), dense,
                               rtol=1e-10, atol=1e-12 * np.max(np.abs(dense)))
  for key in ("sensitivity", "rmse", "max_error", "gamma_before_normalization"):
    np.testing.assert_allclose(f.info[key], g.info[key], rtol=1e-10)
  for key in ("sensitivity_exact", "sensitivity_method", "outcome", "form"):
    assert f.info[key] == g.info[key]
  module = strategies.family_module(strategy)
  module.check_extras(f)
  tf_lib.check_noise(f, *module.noise_column(f), strategies.stream(strategy, f.extras, f.n))
  np.testing.assert_allclose(strategies.stream(strategy, f.extras, f.n).run(np.eye(f.n)),
                             f.noise_matrix(), atol=1e-9)


def test_the_product_check_refuses_a_wrong_decoder():
  spec = _spec("blt", WORKLOADS[0], participation.min_sep(32), buffers=3, error="mean")
  f = strategies.factorize(spec)
  columns = dict(f.columns)
  assert tf_lib.check_product(columns, "ok") <= 1e-12
  columns["B_column"] = columns["B_column"].copy()
  columns["B_column"][100] += 1e-6
  with pytest.raises(checks.CheckError, match="B·C differs from A"):
    tf_lib.check_product(columns, "tampered")


def test_the_noise_check_refuses_parameters_that_stream_other_noise():
  spec = _spec("blt", WORKLOADS[0], participation.min_sep(32), buffers=3, error="mean")
  f = strategies.factorize(spec)
  module = strategies.family_module("blt")
  tf_lib.check_noise(f, *module.noise_column(f), strategies.stream("blt", f.extras, f.n))
  bad = dict(f.extras, blt_inverse_omega=f.extras["blt_inverse_omega"] * 1.001)
  f_bad = tf_lib.ToeplitzFactorization(*(f.columns[k] for k in tf_lib.COLUMNS), "blt",
                                       info=f.info, extras=bad)
  with pytest.raises(checks.CheckError, match="not the inverse of C"):
    tf_lib.check_noise(f_bad, *module.noise_column(f_bad),
                       strategies.stream("blt", bad, f.n))
  # Right C⁻¹ from the parameters, but a stream that realizes other noise.
  stream = strategies.stream("blt", bad, f.n)
  with pytest.raises(checks.CheckError, match="stream's noise differs"):
    tf_lib.check_noise(f, *module.noise_column(f), stream)


@pytest.mark.parametrize("strategy,params,schema", CASES[::2] + SQUARE_ROOT_CASES[:2])
def test_the_cache_stores_first_columns_and_checks_them(strategy, params, schema, tmp_path):
  spec = _spec(strategy, WORKLOADS[1], schema, **params)
  f, entry = cache.load_or_factorize(spec, cache_dir=str(tmp_path))
  assert not entry.cache_hit
  with np.load(entry.npz_path) as data:
    assert set(tf_lib.COLUMNS) <= set(data.files) and not {"A", "B", "C"} & set(data.files)
    assert all(data[k].shape == (256,) for k in tf_lib.COLUMNS)
  g, hit = cache.load_or_factorize(spec, cache_dir=str(tmp_path))
  assert hit.cache_hit and isinstance(g, tf_lib.ToeplitzFactorization)
  assert g.info["rmse"] == f.info["rmse"] and g.info["sensitivity"] == f.info["sensitivity"]
  assert [r["ok"] for r in cache.verify(str(tmp_path))] == [True]
  # A sidecar whose figure was edited is refused (figures are recomputed from the columns).
  meta = json.load(open(entry.json_path, encoding="utf-8"))
  meta["rmse"] *= 1.01
  with open(entry.json_path, "w", encoding="utf-8") as out:
    json.dump(meta, out)
  with pytest.raises(cache.CacheError, match="rmse"):
    cache.load_or_factorize(spec, cache_dir=str(tmp_path))


def test_a_tampered_column_entry_is_refused(tmp_path):
  spec = _spec("banded_toeplitz", WORKLOADS[0], participation.min_sep(32), bands=16,
               error="mean")
  f, entry = cache.load_or_factorize(spec, cache_dir=str(tmp_path))
  meta = json.load(open(entry.json_path, encoding="utf-8"))
  with np.load(entry.npz_path) as data:
    arrays = {k: data[k] for k in data.files}
  arrays["B_column"][10] += 1e-5
  os.remove(entry.npz_path)
  with open(entry.npz_path, "wb") as out:  # same name, new bytes, sidecar sha updated
    np.savez(out, **arrays)
  meta["npz_sha256"] = cache.file_sha256(entry.npz_path)
  with open(entry.json_path, "w", encoding="utf-8") as out:
    json.dump(meta, out)
  with pytest.raises(cache.CacheError, match="B·C differs from A"):
    cache.load_or_factorize(spec, cache_dir=str(tmp_path))
  del f


# The command's own peak resident set: VmHWM of /proc/self/status belongs to the process's
# address space, which execve replaces (getrusage's ru_maxrss survives execve on Linux and
# starts at the forking parent's resident set: a test process that imported TensorFlow).
_PEAK_CODE = ("import sys; from tff_mf import cli\n"
              "code = cli.main(sys.argv[1:])\n"
              "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0]\n"
              "print('PEAK_KB', int(hwm.split()[1]))\n"
              "sys.exit(code)")


@pytest.mark.parametrize("mechanism,flags", [("blt", []), ("banded_toeplitz", ["--bands", "64"])])
def test_factorize_at_n_16384_stays_small(mechanism, flags, tmp_path):
  """n = 16,384 under min-sep n/8: the dense path held about 19 GB; first columns stay far
  under 1 GB (peak resident set of the whole command)."""
  code = _PEAK_CODE
  out = subprocess.run(
      [sys.executable, "-c", code, "factorize", "--mechanism", mechanism, "--total_rounds",
       "16384", "--participation", "min_sep", "--min_sep", "2048", *flags, "--cache_dir",
       str(tmp_path), "--json", "--no_progress"],
      env=userenv.env(pythonpath=True), capture_output=True, text=True, timeout=600,
      check=True).stdout
  record = json.loads(out.splitlines()[0])
  assert record["sensitivity_exact"] and record["n"] == 16384
  peak_kb = int(out.split("PEAK_KB")[1])
  assert peak_kb < 1 << 20, f"peak resident {peak_kb / 1024:.0f} MiB"


def test_a_toeplitz_view_is_recognized_by_its_layout_only():
  column = np.random.default_rng(0).random(9)
  view = toeplitz_view.view(column)
  np.testing.assert_array_equal(view, toeplitz_ops.lower_toeplitz(column))
  assert view.flags.writeable is False and view.base is not None
  np.testing.assert_array_equal(toeplitz_view.column_of(view), column)
  np.testing.assert_array_equal(toeplitz_view.column_of(checks.matrix(view, "C")), column)
  for derived in (np.abs(view), view.copy(), view[:, ::2], view[1:, 1:],
                  toeplitz_ops.lower_toeplitz(column)):
    assert toeplitz_view.column_of(derived) is None
  assert checks.gamma(view) == pytest.approx(checks.gamma(toeplitz_ops.lower_toeplitz(column)),
                                             rel=1e-15)


@pytest.mark.parametrize("name", sorted(COEFFICIENTS))
@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: s.describe())
def test_the_sensitivity_of_a_view_is_that_of_the_dense_matrix(name, schema):
  """From the first column where that is exact (bit for bit); otherwise the dense analysis
  of the view, and the structured upper bound at least the dense lower one."""
  coef = COEFFICIENTS[name]
  schema = schema.for_rounds(N)
  dense = participation.sensitivity_report(toeplitz_ops.lower_toeplitz(coef), schema)
  view = participation.sensitivity_report(toeplitz_view.view(coef), schema)
  if participation.toeplitz_sensitivity_report(coef, schema) is not None:
    assert view == dense == participation.toeplitz_sensitivity_report(coef, schema)
    return
  assert schema.kind != "single"
  bound = participation.toeplitz_upper_bound_report(coef, schema)
  if bound is not None:
    assert bound["value"] >= dense["lower"] and not bound["exact"]
  # The dense analysis on the strided view (its sums in another order): to rounding.
  assert {k: view[k] for k in ("exact", "method")} == {k: dense[k] for k in ("exact", "method")}
  np.testing.assert_allclose([view["value"], view["lower"]], [dense["value"], dense["lower"]],
                             rtol=1e-13)


@pytest.mark.parametrize("name", sorted(COEFFICIENTS))
def test_the_gram_of_a_first_column_is_the_dense_product(name):
  """CᵀC from the first column in O(n²): the dense product's entries to rounding (sums in
  another order), exactly symmetric, and exactly zero at lags no band of C reaches."""
  from tff_mf.participation import bounds  # pylint: disable=g-import-not-at-top
  coef = COEFFICIENTS[name]
  c = toeplitz_ops.lower_toeplitz(coef)
  x = bounds.toeplitz_gram(coef)
  dense = c.T @ c
  np.testing.assert_allclose(x, dense, rtol=0, atol=N * 2e-16 * np.max(np.abs(dense)))
  np.testing.assert_array_equal(x, x.T)
  reach = int(np.max(np.nonzero(coef)[0])) + 1
  lags = np.abs(np.subtract.outer(np.arange(N), np.arange(N)))
  assert not np.any(x[lags >= reach])
  assert bounds.toeplitz_gram(coef[:1]).tolist() == [[coef[0] ** 2]]
  # A Gram of a view finds its column; one given the column beside C checks it, never
  # multiplies C.
  assert np.array_equal(bounds.Gram(toeplitz_view.view(coef)).matrix, x)
  assert np.array_equal(bounds.Gram(c, column=coef).matrix, x)
  # A column that is not C's is refused: the sensitivity would be another matrix's.
  with pytest.raises(checks.CheckError, match="not C's"):
    _ = bounds.Gram(np.zeros((N, N)), column=coef).matrix
  other = c.copy()
  other[N - 1, 0] += 1e-3
  with pytest.raises(checks.CheckError, match="not C's"):
    _ = bounds.Gram(other, column=coef).matrix


@pytest.mark.parametrize("schema", [participation.random_allocation(4),
                                    participation.balls_in_bins(4),
                                    participation.fixed_epoch(4), participation.min_sep(5, 4)],
                         ids=lambda s: s.describe())
def test_a_toeplitz_factorization_reports_the_dense_sensitivity(schema):
  """Its analyses run on the Gram of its first column: the dense C's reports (to
  rounding), with the same exactness and method."""
  spec = _spec("blt", WORKLOADS[0], participation.SINGLE, buffers=2, error="mean")
  f = strategies.factorize(spec)
  assert isinstance(f, tf_lib.ToeplitzFactorization)
  schema = schema.for_rounds(f.n)
  dense = participation.sensitivity_report(np.array(f.c), schema)
  got = f.sensitivity_report(schema)
  assert {k: got[k] for k in ("exact", "method")} == {k: dense[k] for k in ("exact", "method")}
  np.testing.assert_allclose([got["value"], got["lower"]], [dense["value"], dense["lower"]],
                             rtol=1e-13)


@pytest.mark.parametrize("name", sorted(COEFFICIENTS))
@pytest.mark.parametrize("min_sep", [1, 7, 32, N])
def test_residue_class_sensitivity_of_a_view_is_the_dense_one(name, min_sep):
  coef = COEFFICIENTS[name]
  dense = analyses.poisson_sensitivity(toeplitz_ops.lower_toeplitz(coef), min_sep)
  view = analyses.poisson_sensitivity(toeplitz_view.view(coef), min_sep)
  assert view[1] == dense[1]
  np.testing.assert_allclose(view[0], dense[0], rtol=1e-13)


MMCC_CASES = {
    "band8": np.r_[workloads.sqrt_prefix_coefficients(8), np.zeros(56)],
    "blt": blt.coefficients([0.9, 0.5], [0.05, 0.1], 64),
}


@pytest.mark.parametrize("name", sorted(MMCC_CASES))
@pytest.mark.parametrize("min_sep", [8, 16])
def test_mmcc_of_a_view_composes_class_zero_as_the_dense_path_finds(name, min_sep):
  """The dense path computes every residue class and keeps those ``dominates`` does not
  drop; the view computes class 0 alone by the domination argument: the same result."""
  column = MMCC_CASES[name]
  dense = mmcc.mmcc(toeplitz_ops.lower_toeplitz(column), 0.5 / min_sep, 2.0, 1e-6,
                    min_sep=min_sep, workers=1).as_dict()
  view = mmcc.mmcc(toeplitz_view.view(column), 0.5 / min_sep, 2.0, 1e-6, min_sep=min_sep,
                   workers=1).as_dict()
  dense.pop("seconds")
  view.pop("seconds")
  assert view == dense


def test_mmcc_refuses_a_signed_view_as_it_refuses_the_matrix():
  column = np.r_[1.0, -0.5, 0.25, np.zeros(13)]
  for c in (toeplitz_ops.lower_toeplitz(column), toeplitz_view.view(column)):
    with pytest.raises(mmcc.MMCCError, match=r"negative entries \(C\[1, 0\] = -0.5\)"):
      mmcc.check_encoder(c)


def test_account_with_mmcc_at_n_16384_stays_small(tmp_path):
  """The amplified account of banded Toeplitz at n = 16,384 (the dense path: 225 s and 15 GB
  for BLT): no n x n matrix."""
  code = _PEAK_CODE
  out = subprocess.run(
      [sys.executable, "-c", code, "account", "--mechanism", "banded_toeplitz", "--bands", "64",
       "--total_rounds", "16384", "--min_sep", "2048", "--amplification", "mmcc",
       "--sampling_prob", "0.25", "--noise_multiplier", "2", "--delta", "1e-6", "--json",
       "--no_progress", "--cache_dir", str(tmp_path)],
      env=userenv.env(pythonpath=True), capture_output=True, text=True, timeout=600,
      check=True).stdout
  record = json.loads(out.splitlines()[0])
  assert record["bound"] == "amplified" and record["epsilon"] < record["unamplified_epsilon"]
  peak_kb = int(out.split("PEAK_KB")[1])
  assert peak_kb < 1 << 20, f"peak resident {peak_kb / 1024:.0f} MiB"


def test_square_root_parameters_that_do_not_rebuild_c_are_refused():
  spec = _spec("bisr", WORKLOADS[0], participation.SINGLE, bands=8)
  f = strategies.factorize(spec)
  module = strategies.family_module("bisr")
  taps = f.extras["inverse_taps"].copy()
  taps[3] *= 1.001
  bad = tf_lib.ToeplitzFactorization(*(f.columns[k] for k in tf_lib.COLUMNS), "bisr",
                                     info=f.info, extras=dict(f.extras, inverse_taps=taps))
  with pytest.raises(checks.CheckError, match="taps do not rebuild C"):
    module.check_extras(bad)
  with pytest.raises(checks.CheckError, match="not the inverse of C"):
    tf_lib.check_noise(bad, *module.noise_column(bad), strategies.stream("bisr", bad.extras, f.n))
  dense = strategies.factorize(_spec("bisr", workloads.WorkloadSpec(
      "momentum", 32, momentum=0.9, lr_schedule="cooldown", schedule_rounds=8),
      participation.SINGLE, bands=4))
  with pytest.raises(checks.CheckError, match="held as first columns"):
    module.check_extras(type(dense)(a=dense.a, b=dense.b, c=dense.c, strategy="bisr",
                                    extras=dict(dense.extras, inverse_taps=np.ones(4))))
