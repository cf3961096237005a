"""The factorization cache (tff_mf.factorization.cache): round trips, hits, atomicity, corruption."""

import dataclasses
import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

import userenv

from tff_mf.factorization import cache
from tff_mf import factorization as fz
from tff_mf import participation
from tff_mf.factorization import strategies
from tff_mf.factorization import workloads

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _spec(strategy="honaker_online", n=16, **workload_kwargs):
  kind = workload_kwargs.pop("kind", "prefix_sum")
  return strategies.FactorizationSpec(
      workload=workloads.WorkloadSpec(kind=kind, n=n, **workload_kwargs), strategy=strategy)


@pytest.fixture
def count_factorizations(monkeypatch):
  calls = []
  real = strategies.factorize

  def counting(spec, progress=False, context=None):
    calls.append(spec)
    return real(spec, progress=progress, context=context)

  monkeypatch.setattr(strategies, "factorize", counting)
  return calls


def _rewrite_sidecar(entry, **changes):
  with open(entry.json_path) as f:
    metadata = json.load(f)
  metadata.update(changes)
  with open(entry.json_path, "w") as f:
    json.dump(metadata, f)


def _replace_npz(entry, **arrays):
  """Writes ``arrays`` into the entry's npz and makes the sidecar sha256 agree."""
  np.savez(entry.npz_path, **arrays)
  _rewrite_sidecar(entry, npz_sha256=cache.file_sha256(entry.npz_path))


def test_round_trip_and_hit_without_recomputing(tmp_path, count_factorizations):
  spec = _spec("honaker_online", n=32)
  f1, e1 = cache.load_or_factorize(spec, cache_dir=str(tmp_path))
  assert not e1.cache_hit and len(count_factorizations) == 1
  f2, e2 = cache.load_or_factorize(spec, cache_dir=str(tmp_path))
  assert e2.cache_hit and len(count_factorizations) == 1  # no factorization on a hit
  assert e2.npz_path == e1.npz_path
  for x, y in ((f1.a, f2.a), (f1.b, f2.b), (f1.c, f2.c)):
    assert x.dtype == y.dtype == np.float64
    np.testing.assert_array_equal(x, y)
  assert f2.single_participation_sqrt_loss == pytest.approx(f1.single_participation_sqrt_loss)
  # The sidecar carries the figures the issue asks for.
  md = e2.metadata
  for key in ("params", "n", "single_participation_loss", "single_participation_sqrt_loss",
              "gamma_before_normalization", "relative_gap", "iterations", "seconds", "package_versions", "npz_sha256",
              "sensitivity", "rmse", "max_error", "participation"):
    assert key in md
  assert md["npz_sha256"] == cache.file_sha256(e2.npz_path)
  assert md["gamma_before_normalization"] == pytest.approx(np.sqrt(6))  # 6 tree levels
  assert md["package_versions"]["numpy"] == np.__version__
  # cache.load of the file gives the same matrices.
  f3 = cache.load(e2.npz_path, full_check=True)
  np.testing.assert_array_equal(f3.b, f1.b)


def test_entries_written_under_the_old_figure_names_are_still_served(tmp_path,
                                                                   count_factorizations):
  """Sidecars from before the rename (``sqrt_loss``, ``loss``) are read under the new names
  and pass every check; an edited old-named figure is still refused."""
  spec = _spec("optimal", n=16)
  f1, e1 = cache.load_or_factorize(spec, cache_dir=str(tmp_path))
  with open(e1.json_path) as f:
    metadata = json.load(f)
  metadata["sqrt_loss"] = metadata.pop("single_participation_sqrt_loss")
  metadata["loss"] = metadata.pop("single_participation_loss")
  with open(e1.json_path, "w") as f:
    json.dump(metadata, f)
  f2, e2 = cache.load_or_factorize(spec, cache_dir=str(tmp_path))
  assert e2.cache_hit and len(count_factorizations) == 1
  assert e2.metadata["single_participation_sqrt_loss"] == pytest.approx(
      f1.single_participation_sqrt_loss, rel=1e-12)
  np.testing.assert_array_equal(f2.c, f1.c)
  assert [r["ok"] for r in cache.verify(str(tmp_path))] == [True]
  _rewrite_sidecar(e1, sqrt_loss=0.5 * metadata["sqrt_loss"])
  with pytest.raises(cache.CacheError, match="single_participation_sqrt_loss = .* sidecar says"):
    cache.load(e1.npz_path, full_check=True)


def test_keys_are_stable_and_distinguish_parameters(tmp_path):
  base = cache.key_params(_spec("optimal", n=64))
  assert cache.key_hash(base) == cache.key_hash(cache.key_params(_spec("optimal", n=64)))
  others = [_spec("optimal", n=65), _spec("honaker_full", n=64),
            _spec("optimal", n=64, kind="momentum", momentum=0.9),
            strategies.FactorizationSpec(workload=workloads.WorkloadSpec(n=64), target_gap=1e-8)]
  hashes = {cache.key_hash(cache.key_params(s)) for s in others}
  assert cache.key_hash(base) not in hashes and len(hashes) == len(others)


def test_matrix_file_is_keyed_by_content_not_path(tmp_path):
  a = np.tril(np.random.default_rng(0).uniform(0.5, 1.5, (8, 8)))
  p1, p2, p3 = (str(tmp_path / name) for name in ("a.npy", "copy.npy", "other.npy"))
  np.save(p1, a)
  np.save(p2, a)
  np.save(p3, 2 * a)
  keys = [cache.key_params(strategies.FactorizationSpec(
      workload=workloads.WorkloadSpec(kind="file", n=8, matrix_file=p), strategy="identity"))
          for p in (p1, p2, p3)]
  assert keys[0] == keys[1] != keys[2]
  assert "matrix_sha256" in keys[0]["workload"] and p1 not in json.dumps(keys[0])


def test_env_var_sets_default_dir(tmp_path, monkeypatch):
  monkeypatch.setenv("TFF_MF_CACHE", str(tmp_path / "from_env"))
  assert cache.default_cache_dir() == str(tmp_path / "from_env")
  _, entry = cache.load_or_factorize(_spec("identity", n=8))
  assert entry.npz_path.startswith(str(tmp_path / "from_env") + os.sep)
  monkeypatch.delenv("TFF_MF_CACHE")
  assert cache.default_cache_dir() == os.path.join(os.path.expanduser("~"), ".cache", "tff_mf")


def _corrupt_flip(entry):
  data = bytearray(open(entry.npz_path, "rb").read())
  middle = len(data) // 2
  data[middle:middle + 64] = bytes(b ^ 0xFF for b in data[middle:middle + 64])
  open(entry.npz_path, "wb").write(bytes(data))


def _corrupt_truncate(entry):
  data = open(entry.npz_path, "rb").read()
  open(entry.npz_path, "wb").write(data[:len(data) // 3])


def _corrupt_sidecar_sha(entry):
  _rewrite_sidecar(entry, npz_sha256="0" * 64)


def _corrupt_flip_with_matching_sha(entry):
  _corrupt_flip(entry)
  _rewrite_sidecar(entry, npz_sha256=cache.file_sha256(entry.npz_path))


def _corrupt_shapes(entry):
  with np.load(entry.npz_path) as d:
    a, b, c = d["A"], d["B"], d["C"]
  _replace_npz(entry, A=a, B=b[:, :-1], C=c)


def _corrupt_dtype(entry):
  with np.load(entry.npz_path) as d:
    a, b, c = d["A"], d["B"], d["C"]
  _replace_npz(entry, A=a, B=b.astype(np.float32), C=c)


def _corrupt_non_triangular_c(entry):
  """A valid-looking factorization (B·C = A, γ(C) = 1) whose C is not lower triangular."""
  with np.load(entry.npz_path) as d:
    a = d["A"]
  n = a.shape[0]
  c = np.eye(n) + 0.3 * np.random.default_rng(0).standard_normal((n, n))
  c /= np.max(np.linalg.norm(c, axis=0))  # γ(C) = 1
  b = a @ np.linalg.inv(c)
  assert np.max(np.abs(b @ c - a)) < 1e-10
  _replace_npz(entry, A=a, B=b, C=c)


def _corrupt_product(entry):
  with np.load(entry.npz_path) as d:
    a, b, c = d["A"], d["B"], d["C"]
  b = b.copy()
  b[-1, 0] += 1e-3
  _replace_npz(entry, A=a, B=b, C=c)


def _corrupt_other_workload(entry):
  """A valid factorization of a different A (2·S) under this entry's key."""
  with np.load(entry.npz_path) as d:
    a, b, c = d["A"], d["B"], d["C"]
  _replace_npz(entry, A=2 * a, B=2 * b, C=c)


def _corrupt_sidecar_json(entry):
  open(entry.json_path, "w").write("{not json")


def _corrupt_scaled_encoder(entry):
  """B·C = A still holds, but C·2 has sensitivity 2: the noise would be half of what ε needs."""
  with np.load(entry.npz_path) as d:
    a, b, c = d["A"], d["B"], d["C"]
  _replace_npz(entry, A=a, B=b / 2, C=2 * c)


def _corrupt_non_triangular_b(entry):
  with np.load(entry.npz_path) as d:
    a, b, c = d["A"], d["B"], d["C"]
  b = b.copy()
  b[0, -1] = 0.5
  _replace_npz(entry, A=a, B=b, C=c)


def _corrupt_sidecar_n(entry):
  with open(entry.json_path) as f:
    n = json.load(f)["n"]
  _rewrite_sidecar(entry, n=n + 1)


def _corrupt_sidecar_sqrt_loss(entry):
  with open(entry.json_path) as f:
    value = json.load(f)["single_participation_sqrt_loss"]
  _rewrite_sidecar(entry, single_participation_sqrt_loss=0.5 * value)


def _corrupt_sidecar_path(entry):
  """The sidecar names a file outside its own entry folder."""
  _rewrite_sidecar(entry, npz_file="../" + os.path.basename(entry.npz_path))


def _corrupt_against_public_probe(entry):
  """B + E with E·C·R = 0 for the old fixed public probe R, every sidecar figure updated.

  The old quick check (B·(C·R) = A·R with R from seed 0x7FF) passed such an entry;
  the product is now checked on every entry.
  """
  with np.load(entry.npz_path) as d:
    a, b, c = d["A"], d["B"], d["C"]
  n = a.shape[0]
  y = c @ np.random.default_rng(0x7FF).standard_normal((n, 4))
  q, _ = np.linalg.qr(y)
  v = np.random.default_rng(1).standard_normal(n)
  v -= q @ (q.T @ v)  # v ⊥ every column of C·R
  e = np.tril(np.outer(np.ones(n), v))
  bad = np.tril(b + 1e3 * e)
  _replace_npz(entry, A=a, B=bad, C=c)
  _rewrite_sidecar(entry, single_participation_sqrt_loss=fz.single_participation_sqrt_loss(bad, c),
                   single_participation_loss=fz.single_participation_loss(bad, c),
                   rmse=fz.rmse(bad, 1.0), max_error=fz.max_error(bad, 1.0))


CORRUPTIONS = {
    "flipped bytes": (_corrupt_flip, "sha256"),
    "truncated": (_corrupt_truncate, "sha256"),
    "sidecar sha mismatch": (_corrupt_sidecar_sha, "sha256"),
    "flipped bytes, matching sha": (_corrupt_flip_with_matching_sha, "cannot be read as .npz"),
    "wrong shapes": (_corrupt_shapes, "shapes"),
    "float32": (_corrupt_dtype, "float64"),
    "non-triangular C": (_corrupt_non_triangular_c, "C is not lower triangular"),
    "B·C != A": (_corrupt_product, "differs from A"),
    "other workload": (_corrupt_other_workload, "not the requested workload"),
    "C·2, B/2": (_corrupt_scaled_encoder, "not normalized"),
    "non-triangular B": (_corrupt_non_triangular_b, "B is not lower triangular"),
    "sidecar n": (_corrupt_sidecar_n, "sidecar says n"),
    "edited sqrt(L)": (_corrupt_sidecar_sqrt_loss, "single_participation_sqrt_loss = .* sidecar says"),
    "file outside its entry": (_corrupt_sidecar_path, "not a file of its own entry folder"),
    "crafted against a public probe": (_corrupt_against_public_probe, "differs from A"),
}


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_corrupt_entry_is_a_clear_error_and_never_used(tmp_path, count_factorizations, name):
  corrupt, message = CORRUPTIONS[name]
  spec = _spec("optimal", n=16)
  good, entry = cache.load_or_factorize(spec, cache_dir=str(tmp_path))
  corrupt(entry)
  for attempt in range(2):  # the bad file is never used, however often it is asked for
    with pytest.raises(cache.CacheError, match=message) as info:
      cache.load_or_factorize(spec, cache_dir=str(tmp_path))
    assert entry.directory in str(info.value)  # names the file
    # ... and says how to recompute it, on the command line and from Python.
    assert "--force" in str(info.value) and "force=True" in str(info.value)
    assert len(str(info.value).splitlines()) == 1
  with pytest.raises(cache.CacheError) as info:
    cache.load(entry.npz_path)
  assert entry.npz_path in str(info.value) or entry.json_path in str(info.value)
  assert len(count_factorizations) == 1
  bad = [r for r in cache.verify(str(tmp_path)) if not r["ok"]]
  assert len(bad) == 1 and entry.directory in bad[0]["error"]
  # --force recomputes and replaces the bad entry with a good one.
  fixed, fixed_entry = cache.load_or_factorize(spec, cache_dir=str(tmp_path), force=True)
  assert not fixed_entry.cache_hit and len(count_factorizations) == 2
  np.testing.assert_allclose(fixed.b, good.b)
  again, hit = cache.load_or_factorize(spec, cache_dir=str(tmp_path))
  assert hit.cache_hit
  assert all(r["ok"] for r in cache.verify(str(tmp_path)))
  # Exactly one npz is left in the entry (the replaced one was removed).
  assert [p for p in os.listdir(entry.directory) if p.endswith(".npz")] == [
      os.path.basename(hit.npz_path)]


def test_unreadable_sidecar_is_a_clear_error(tmp_path):
  spec = _spec("identity", n=8)
  _, entry = cache.load_or_factorize(spec, cache_dir=str(tmp_path))
  _corrupt_sidecar_json(entry)
  with pytest.raises(cache.CacheError, match="not valid JSON") as info:
    cache.load_or_factorize(spec, cache_dir=str(tmp_path))
  assert entry.json_path in str(info.value)
  _, fixed = cache.load_or_factorize(spec, cache_dir=str(tmp_path), force=True)
  assert not fixed.cache_hit


def test_sidecar_for_other_parameters_is_rejected(tmp_path):
  spec = _spec("identity", n=8)
  _, entry = cache.load_or_factorize(spec, cache_dir=str(tmp_path))
  _rewrite_sidecar(entry, params={"strategy": "identity", "workload": {"n": 9}})
  with pytest.raises(cache.CacheError, match="other parameters"):
    cache.load_or_factorize(spec, cache_dir=str(tmp_path))


def test_failed_computation_never_clobbers_a_good_entry(tmp_path, monkeypatch):
  spec = _spec("honaker_full", n=16)
  good, entry = cache.load_or_factorize(spec, cache_dir=str(tmp_path))

  def broken(spec, progress=False, context=None):
    raise ValueError("solver failed")

  monkeypatch.setattr(strategies, "factorize", broken)
  with pytest.raises(ValueError, match="solver failed"):
    cache.load_or_factorize(spec, cache_dir=str(tmp_path), force=True)
  f, hit = cache.load_or_factorize(spec, cache_dir=str(tmp_path))
  assert hit.cache_hit and hit.npz_path == entry.npz_path
  np.testing.assert_array_equal(f.b, good.b)
  # No temporary files are left behind.
  assert not [p for p in os.listdir(entry.directory) if p.startswith(".tmp")]


def test_bad_factorization_is_not_written(tmp_path, monkeypatch):
  spec = _spec("identity", n=8)
  real = strategies.factorize

  def wrong_workload(spec, progress=False, context=None):
    f = real(spec, progress=progress, context=context)
    return fz.Factorization(a=2 * f.a, b=2 * f.b, c=f.c, strategy=f.strategy, info=f.info)

  monkeypatch.setattr(strategies, "factorize", wrong_workload)
  with pytest.raises(cache.CacheError, match="requested workload"):
    cache.load_or_factorize(spec, cache_dir=str(tmp_path))
  assert cache.list_entries(str(tmp_path)) == []


def test_structured_entry_reuses_cached_optimum_and_stores_algorithm3_pieces(tmp_path):
  opt_spec = _spec("optimal", n=32)
  opt, _ = cache.load_or_factorize(opt_spec, cache_dir=str(tmp_path))
  spec = strategies.FactorizationSpec(workload=opt_spec.workload, strategy="structured",
                                      bands=2, rank=2)
  f, entry = cache.load_or_factorize(spec, cache_dir=str(tmp_path))
  assert f.single_participation_sqrt_loss >= opt.single_participation_sqrt_loss * (1 - 1e-9)
  assert entry.metadata["info"]["optimal_sqrt_loss"] == pytest.approx(opt.single_participation_sqrt_loss)
  loaded = cache.load(entry.npz_path)
  stream = strategies.stream("structured", loaded.extras, loaded.a)
  z = np.random.default_rng(0).standard_normal((32, 3))
  np.testing.assert_allclose(stream.run(z), np.linalg.solve(f.c, z), atol=1e-9)
  assert len(cache.list_entries(str(tmp_path))) == 2


def test_structured_pieces_that_do_not_rebuild_b_are_refused(tmp_path):
  spec = strategies.FactorizationSpec(workload=workloads.WorkloadSpec(n=32),
                                      strategy="structured", bands=2, rank=2)
  _, entry = cache.load_or_factorize(spec, cache_dir=str(tmp_path))
  with np.load(entry.npz_path) as d:
    arrays = {k: d[k] for k in d.files}
  arrays["structured_u"] = arrays["structured_u"] * 1.01
  _replace_npz(entry, **arrays)
  with pytest.raises(cache.CacheError, match="do not rebuild"):
    cache.load_or_factorize(spec, cache_dir=str(tmp_path))


@pytest.mark.parametrize("strategy,family,params", [("honaker_online", "tree", {}),
                                                    ("banded_inverse", "square_root",
                                                     {"bands": 2})])
def test_solver_version_change_is_a_miss(tmp_path, monkeypatch, count_factorizations, strategy,
                                         family, params):
  spec = dataclasses.replace(_spec(strategy, n=8), **params)
  _, first = cache.load_or_factorize(spec, cache_dir=str(tmp_path))
  assert first.metadata["params"]["solver"] == (
      f"{family}-{strategies.family_module(strategy).VERSION}")
  monkeypatch.setattr(strategies.family_module(strategy), "VERSION", "999")
  _, second = cache.load_or_factorize(spec, cache_dir=str(tmp_path))
  assert not second.cache_hit and second.directory != first.directory
  assert len(count_factorizations) == 2
  assert second.metadata["params"]["solver"] == f"{family}-999"


# Rewrites one entry in a loop, each time with different bytes (so under a new file name,
# and the previous file is deleted), as a recomputation with another solver version would.
_REWRITER = """
import sys, time
import numpy as np
from tff_mf.factorization import cache, strategies, workloads
spec = strategies.FactorizationSpec(workloads.WorkloadSpec(n=300), strategy="identity")
f, entry = cache.load_or_factorize(spec, cache_dir=sys.argv[1])
end, k = time.time() + float(sys.argv[2]), 0
while time.time() < end:
  k += 1
  f.extras["rewrite"] = np.array([float(k)])
  cache._write_entry(entry.directory, entry.metadata["params"], spec, f)
"""


def test_readers_never_see_a_half_replaced_entry(tmp_path):
  spec = _spec("identity", n=300)  # cheap to recompute: a writer rewrites it continually
  cache.load_or_factorize(spec, cache_dir=str(tmp_path))
  env = userenv.env()
  writer = subprocess.Popen([sys.executable, "-c", _REWRITER, str(tmp_path), "8"], env=env)
  errors, loads = [], 0
  try:
    time.sleep(1.0)
    while writer.poll() is None:
      try:
        cache.load_or_factorize(spec, cache_dir=str(tmp_path))
      except cache.CacheError as e:  # the failure this test looks for
        errors.append(str(e))
      loads += 1
  finally:
    writer.wait(timeout=60)
  assert writer.returncode == 0
  assert loads > 50 and errors == []


def test_list_entries(tmp_path):
  for strategy in ("identity", "honaker_online"):
    cache.load_or_factorize(_spec(strategy, n=8), cache_dir=str(tmp_path))
  rows = cache.list_entries(str(tmp_path))
  assert sorted(r["strategy"] for r in rows) == ["honaker_online", "identity"]
  assert all(r["n"] == 8 and r["single_participation_sqrt_loss"] > 0 and r["bytes"] > 0 for r in rows)
  with pytest.raises(cache.CacheError, match="does not exist"):
    cache.list_entries(str(tmp_path / "missing"))


def test_verify_refuses_a_missing_directory_and_skips_datasets(tmp_path):
  with pytest.raises(cache.CacheError, match="does not exist"):
    cache.verify(str(tmp_path / "mistyped"))
  cache.load_or_factorize(_spec("identity", n=8), cache_dir=str(tmp_path))
  os.makedirs(tmp_path / "datasets" / "pydocs")
  results = cache.verify(str(tmp_path))
  assert len(results) == 1 and results[0]["ok"]


def test_unconverged_result_is_keyed_separately(tmp_path):
  converged = _spec("optimal", n=16)
  loose = strategies.FactorizationSpec(workload=converged.workload, strategy="optimal",
                                       allow_unconverged=True, max_iterations=1)
  assert cache.key_params(converged) != cache.key_params(loose)


def _fixed_epoch_spec(n=16, epochs=4):
  from tff_mf import participation  # pylint: disable=g-import-not-at-top
  return strategies.FactorizationSpec(
      workload=workloads.WorkloadSpec(kind="prefix_sum", n=n), strategy="optimal",
      participation=participation.Participation("fixed_epoch", epochs=epochs))


def _relabel_single(entry):
  """The schema in the sidecar says single, and every figure is rewritten to match it."""
  from tff_mf import participation  # pylint: disable=g-import-not-at-top
  f = cache.load(entry.npz_path)
  figures = strategies.error_figures(f, participation.SINGLE)
  with open(entry.json_path) as fh:
    metadata = json.load(fh)
  for key in ("participation", "sensitivity", "rmse", "max_error"):
    metadata[key] = figures[key]
    metadata["info"][key] = figures[key]
  with open(entry.json_path, "w") as fh:
    json.dump(metadata, fh)


def _edit_key_schema(entry):
  with open(entry.json_path) as fh:
    metadata = json.load(fh)
  metadata["params"]["participation"]["epochs"] = 2
  with open(entry.json_path, "w") as fh:
    json.dump(metadata, fh)


def _edit_info_sensitivity(entry):
  with open(entry.json_path) as fh:
    metadata = json.load(fh)
  metadata["info"]["sensitivity"] *= 0.5
  with open(entry.json_path, "w") as fh:
    json.dump(metadata, fh)


@pytest.mark.parametrize("edit,message", [
    (_relabel_single, "participation is .* but its key names"),
    (_edit_key_schema, "key recomputed from its sidecar"),
    (_edit_info_sensitivity, "sidecar says info.sensitivity"),
])
def test_verify_and_load_refuse_an_edited_schema_or_figure(tmp_path, edit, message):
  spec = _fixed_epoch_spec()
  _, entry = cache.load_or_factorize(spec, cache_dir=str(tmp_path))
  edit(entry)
  [result] = cache.verify(str(tmp_path))
  assert not result["ok"] and re.search(message, result["error"]), result
  with pytest.raises(cache.CacheError, match=message):
    cache.load(entry.npz_path)
  if edit is not _edit_key_schema:  # (an edited key is "other parameters" for a keyed load)
    with pytest.raises(cache.CacheError, match=message):
      cache.load_or_factorize(spec, cache_dir=str(tmp_path))


def test_verify_refuses_entries_swapped_between_keys(tmp_path):
  _, e1 = cache.load_or_factorize(_spec("identity", n=8), cache_dir=str(tmp_path))
  _, e2 = cache.load_or_factorize(_spec("honaker_online", n=8), cache_dir=str(tmp_path))
  os.rename(e1.directory, str(tmp_path / "swap"))
  os.rename(e2.directory, e1.directory)
  os.rename(str(tmp_path / "swap"), e2.directory)
  results = cache.verify(str(tmp_path))
  assert len(results) == 2 and not any(r["ok"] for r in results)
  assert all("key recomputed from its sidecar" in r["error"] for r in results)
  with pytest.raises(cache.CacheError, match="key recomputed"):
    cache.load(os.path.join(e1.directory, os.path.basename(e2.npz_path)))


def test_account_matrix_prints_the_schema_of_the_entry_and_refuses_a_relabelled_one(
    tmp_path, capsys):
  from tff_mf import cli  # pylint: disable=g-import-not-at-top
  _, entry = cache.load_or_factorize(_fixed_epoch_spec(), cache_dir=str(tmp_path))
  argv = ["account", "--matrix", entry.npz_path, "--noise_multiplier", "2", "--delta", "1e-6",
          "--json"]
  assert cli.main(argv) == 0
  record = json.loads(capsys.readouterr().out)
  assert record["schema"]["kind"] == "fixed_epoch" and record["schema"]["epochs"] == 4
  assert record["schema_source"].startswith("the cache entry's key")
  eps = record["epsilon"]
  _relabel_single(entry)
  rc = cli.main(argv)
  captured = capsys.readouterr()
  assert rc != 0 and "participation is" in captured.err and captured.err.count("\n") == 1
  assert eps == pytest.approx(4.114, abs=1e-3)


def test_one_json_policy_for_every_writer():
  """tff_mf.jsonio: numpy as Python values, ±inf as "inf"/"-inf", NaN refused; read back."""
  from tff_mf import jsonio  # pylint: disable=g-import-not-at-top
  value = {"a": np.float64("inf"), "b": [np.int64(2), -np.inf, np.bool_(True)],
           "c": np.arange(2.0)}
  text = jsonio.dumps(value)
  assert json.loads(text) == {"a": "inf", "b": [2, "-inf", True], "c": [0.0, 1.0]}
  assert jsonio.number("inf") == np.inf and jsonio.number("-inf") == -np.inf
  assert jsonio.number("x") == "x"
  with pytest.raises(ValueError, match="NaN"):
    jsonio.dumps({"x": float("nan")})


def _edit_sensitivity_everywhere(entry, value=1.0):
  with open(entry.json_path) as fh:
    metadata = json.load(fh)
  metadata["sensitivity"] = metadata["info"]["sensitivity"] = value
  with open(entry.json_path, "w") as fh:
    json.dump(metadata, fh)


def test_list_shows_only_figures_recomputed_from_the_matrices(tmp_path, capsys):
  """An edited sidecar figure (sensitivity 1.0 where C's is larger) is never listed as a figure:
  each entry is checked as a load checks it, and a failing one is listed as BAD (exit 1)."""
  from tff_mf import cli  # pylint: disable=g-import-not-at-top
  from tff_mf import participation  # pylint: disable=g-import-not-at-top
  spec = _fixed_epoch_spec()
  f, entry = cache.load_or_factorize(spec, cache_dir=str(tmp_path))
  truth = strategies.error_figures(f, participation.fixed_epoch(4))["sensitivity"]
  assert truth > 1.1
  [row] = cache.list_entries(str(tmp_path))
  assert row["verified"] and row["sensitivity"] == pytest.approx(truth, rel=1e-9)
  assert cli.main(["cache", "list", "--cache_dir", str(tmp_path)]) == 0
  assert f"{truth:.5g}" in capsys.readouterr().out
  _edit_sensitivity_everywhere(entry)
  [row] = cache.list_entries(str(tmp_path))
  assert not row["verified"] and "sensitivity" not in row
  assert "sidecar says sensitivity = 1.0" in row["error"]
  assert cli.main(["cache", "list", "--cache_dir", str(tmp_path)]) == 1
  out = capsys.readouterr().out
  assert "1 BAD" in out and "BAD " in out and "--force" in out
  table = [line for line in out.splitlines() if line.startswith("BAD ")]
  assert len(table) == 1 and entry.directory in table[0]
  assert cli.main(["cache", "list", "--json", "--cache_dir", str(tmp_path)]) == 1
  listed = json.loads(capsys.readouterr().out)
  assert listed["bad"] == 1 and "sensitivity" not in listed["entries"][0]


def test_list_shows_no_solver_claim_it_cannot_recheck(tmp_path):
  """The duality gap cannot be recomputed from C (it needs the dual point): an edited one
  (1e-30) passes every check, so a verified row does not list it as a figure."""
  spec = _fixed_epoch_spec()
  _, entry = cache.load_or_factorize(spec, cache_dir=str(tmp_path))
  with open(entry.json_path) as fh:
    metadata = json.load(fh)
  metadata["relative_gap"] = metadata["info"]["relative_gap"] = 1e-30
  with open(entry.json_path, "w") as fh:
    json.dump(metadata, fh)
  [row] = cache.list_entries(str(tmp_path))
  assert row["verified"] and "relative_gap" not in row


# ----------------------------------------------------------------------------- one key per schema


def _min_sep_spec(schema):
  return strategies.FactorizationSpec(workload=workloads.WorkloadSpec(kind="prefix_sum", n=16),
                                      strategy="identity", participation=schema)


def _factorize_cli(tmp_path, *flags):
  env = userenv.env()
  env.pop("TFF_MF_CACHE", None)
  out = subprocess.run([sys.executable, "-m", "tff_mf.cli", "factorize", "--workload",
                        "prefix_sum", "--mechanism", "identity", "--total_rounds", "16", "--participation",
                        "min_sep", "--min_sep", "4", *flags, "--json", "--cache_dir",
                        str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0, out.stderr
  return json.loads(out.stdout)


def test_one_min_sep_schema_has_one_cache_key_from_python_and_the_cli(tmp_path,
                                                                       count_factorizations):
  """min_sep(4) from Python and --min_sep 4 from the CLI (which fills in the ⌈n/b⌉ = 4 that
  fit) are one schema: one entry, computed once (it was stored as ``-kall`` and ``-k4``)."""
  _, entry = cache.load_or_factorize(_min_sep_spec(participation.min_sep(4)),
                                     cache_dir=str(tmp_path))
  assert not entry.cache_hit
  for flags in ((), ("--max_participations", "4")):
    record = _factorize_cli(tmp_path, *flags)
    assert record["cache_hit"] and os.path.dirname(record["metadata_path"]) == entry.directory
  _, again = cache.load_or_factorize(_min_sep_spec(participation.min_sep(4, 4)),
                                     cache_dir=str(tmp_path))
  assert again.cache_hit and again.directory == entry.directory
  assert len(os.listdir(tmp_path)) == 1 and len(count_factorizations) == 1
  # A cap below the ⌈n/b⌉ that fit is another schema, with its own entry.
  _, capped = cache.load_or_factorize(_min_sep_spec(participation.min_sep(4, 2)),
                                      cache_dir=str(tmp_path))
  assert not capped.cache_hit and capped.directory != entry.directory


def test_a_min_sep_entry_python_cached_without_its_cap_still_loads(tmp_path,
                                                                    count_factorizations):
  """An entry an earlier version wrote from Python (key ``min_sep-b4-kall``) is read, from
  Python and from the CLI, not computed and stored a second time."""
  _, entry = cache.load_or_factorize(_min_sep_spec(participation.min_sep(4)),
                                     cache_dir=str(tmp_path))
  new, old = participation.min_sep(4, 4).as_dict(), participation.min_sep(4).as_dict()
  with open(entry.json_path) as f:
    metadata = json.load(f)
  metadata["params"]["participation"] = old
  metadata["participation"] = metadata["info"]["participation"] = old
  assert new != old and "kall" in old["label"]
  metadata["key"] = cache.key_hash(metadata["params"])
  old_dir = os.path.join(str(tmp_path), cache.entry_name(metadata["params"]))
  assert old_dir.endswith(f"-min_sep-b4-kall-{metadata['key']}")
  os.rename(entry.directory, old_dir)
  with open(os.path.join(old_dir, cache.METADATA_FILE), "w") as f:
    json.dump(metadata, f)
  _, hit = cache.load_or_factorize(_min_sep_spec(participation.min_sep(4)),
                                   cache_dir=str(tmp_path))
  assert hit.cache_hit and hit.directory == old_dir
  record = _factorize_cli(tmp_path)
  assert record["cache_hit"] and os.path.dirname(record["metadata_path"]) == old_dir
  assert os.listdir(tmp_path) == [os.path.basename(old_dir)]
  assert len(count_factorizations) == 1
  assert [r["ok"] for r in cache.verify(str(tmp_path))] == [True]
