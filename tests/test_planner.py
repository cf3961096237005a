"""``tff-mf plan`` (``tff_mf.planner``, issue 50): its winner is an exhaustive search's, built
candidate by candidate, its expected error is the released noise's, and bad input is one line.

The deployment here is small (n = 16, P = 16, K = 8, three mechanisms) so that the planner and
the exhaustive search each build every candidate in seconds.
"""

from __future__ import annotations

import json
import math
import os
import sys

import numpy as np
import pytest

from tff_mf import checks
from tff_mf import cli
from tff_mf import mechanisms
from tff_mf import participation
from tff_mf import planner
from tff_mf import planner_bounds
from tff_mf import registry
from tff_mf import spec as spec_lib
from tff_mf.factorization import strategies
from tff_mf.factorization import workloads

N, POPULATION, K, EPS, DELTA = 16, 16, 8, 4.0, 1e-6
MECHANISMS = ("banded_toeplitz", "opt_prefix_sum", "gaussian")
SCHEMAS = ("single", "fixed_epoch", "min_sep", "balls_in_bins")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("plan-cache"))


def _deployment():
  return planner.Deployment(population=POPULATION, total_rounds=N, clients_per_round=K,
                            target_epsilon=EPS, delta=DELTA, schemas=SCHEMAS,
                            mechanisms=MECHANISMS, skip_mmcc=True)


@pytest.fixture(scope="module")
def result(cache_dir):
  """Every candidate calibrated (no pruning)."""
  return planner.plan(_deployment(), cache_dir=cache_dir, prune=False)


@pytest.fixture(scope="module")
def pruned_result(tmp_path_factory):
  """The default: pruning, from an empty cache of its own."""
  return planner.plan(_deployment(), cache_dir=str(tmp_path_factory.mktemp("pruned")))


def _exhaustive(cache_dir):
  """Every candidate of the deployment, derived here by hand and built one by one.

  P/K = 2 disjoint groups of K clients: single needs n·K = 128 clients (skipped); the epoch
  kinds need b = n/k ≤ 2 cohorts, so k = 8 epochs; min_sep takes b = 1 (p = K·b/P = 0.5) and
  b = 2 (p = 1). Bands go up to the separation (2). MMCC is skipped: a candidate whose
  amplified analysis would be MMCC is accounted without its sampling probability.
  """
  options = [(participation.fixed_epoch(8), None), (participation.min_sep(1), 0.5),
             (participation.min_sep(2), 1.0), (participation.balls_in_bins(8), None)]
  out = {}
  for name in MECHANISMS:
    for schema, p in options:
      bands = {participation.min_sep(1): [1]}.get(schema, [1, 2])
      grid = [{"bands": b} for b in bands] if name == "banded_toeplitz" else [{}]
      for params in grid:
        def spec(prob):
          return spec_lib.MechanismSpec.from_args(
              name, total_rounds=N, clients_per_round=K, clip_norm=1.0, target_epsilon=EPS,
              delta=DELTA, sampling_prob=prob, participation=schema.for_rounds(N), **params)
        resolved = mechanisms.resolve_spec(spec(p), cache_dir=cache_dir)
        amplified = mechanisms.amplification_applies(resolved.participation, N, p)
        if amplified and schema.poisson and mechanisms.amplified_analysis(
            resolved.encoder, resolved.participation) == "mmcc":
          p = None
        resolved, record = mechanisms.build(spec(p), cache_dir=cache_dir)
        b = resolved.factorization.b
        key = (name, schema.for_rounds(N).label, tuple(sorted(params.items())))
        out[key] = (record.noise_multiplier, record.epsilon,
                    record.noise_multiplier * np.linalg.norm(b) / math.sqrt(N))
  return out


def _key(c):
  return (c["mechanism"], participation.from_dict(c["schema"]).label,
          tuple(sorted(c["params"].items())))


def test_the_winner_is_the_exhaustive_searchs(result, tmp_path):
  """Same candidates, same z and ε (each ε ≤ target), and the planner's winner attains the
  least rmse of the search (candidates whose rmse ties within 1e-9 are equally good)."""
  found = _exhaustive(str(tmp_path / "independent-cache"))
  ranked = result["candidates"]
  assert {_key(c) for c in ranked} == set(found)
  for c in ranked:
    z, eps, rmse = found[_key(c)]
    assert c["epsilon"] <= EPS and eps <= EPS
    assert c["noise_multiplier"] == pytest.approx(z, rel=1e-9)
    assert c["rmse"] == pytest.approx(rmse, rel=1e-9)
  best = min(v[2] for v in found.values())
  assert result["recommended"]["rmse"] == pytest.approx(best, rel=1e-9)
  assert found[_key(result["recommended"])][2] <= best * (1 + 1e-9)
  assert [c["rmse"] for c in ranked] == sorted(c["rmse"] for c in ranked)
  assert any("schema single" == x["what"] for x in result["left_out"])


def test_pruning_never_changes_the_winner(result, pruned_result):
  """Pruned or not, the same winner at the same z and ε; the candidates calibrated in both
  agree; every pruned candidate is one the unpruned run calibrated above the cut its proof
  names (its ε at the cut's z above the target), so none was within the tolerance of the
  winner; and the grid prunes some (else the test would check nothing)."""
  full = {_key(c): c for c in result["candidates"]}
  assert _key(pruned_result["recommended"]) == _key(result["recommended"])
  for field in ("noise_multiplier", "epsilon", "rmse"):
    assert pruned_result["recommended"][field] == result["recommended"][field]
  for c in pruned_result["candidates"]:
    assert c["noise_multiplier"] == full[_key(c)]["noise_multiplier"]
  calibrated = {_key(c) for c in pruned_result["candidates"]}
  assert pruned_result["pruned"], "nothing pruned on the test grid"
  pruned = {}
  for x in pruned_result["pruned"]:
    match = [k for k, c in full.items() if planner.describe(
        c["mechanism"], _option(c), c["params"]) == x["what"]]
    assert len(match) == 1, x
    pruned[match[0]] = x
  assert set(pruned) | calibrated == set(full) and not set(pruned) & calibrated
  for key, x in pruned.items():
    _check_proof(x, full[key], result["recommended"]["rmse"], EPS)


def _check_proof(x, unpruned, best_rmse, target):
  """A pruned candidate's proof holds against its calibration in the unpruned run: before
  factorizing, its rmse is at least the bound; else its ε at the cut's z is above the
  target and its z above that z; either way its rmse is above the cut, itself above the
  winner's by the tolerance."""
  if x.get("before_factorizing"):
    assert unpruned["rmse"] >= x["rmse_at_least"] > x["rmse_above"]
  else:
    assert x["epsilon_at_z"] > target and "epsilon" in x["why"]
    assert unpruned["noise_multiplier"] > x["z_above"]
  assert unpruned["rmse"] > x["rmse_above"] >= best_rmse * (
      1 + 2 * planner.TOLERANCE) * (1 - 1e-12)


def test_records_are_reused_and_a_corrupt_one_is_recomputed(tmp_path):
  """A second run reads every calibrated record back (same table); a corrupt or edited
  record is a miss, computed again, never trusted."""
  dep = planner.Deployment(population=32, total_rounds=8, clients_per_round=4,
                           target_epsilon=2.0, delta=DELTA, schemas=("single", "fixed_epoch"),
                           mechanisms=("gaussian", "banded"))
  first = planner.plan(dep, cache_dir=str(tmp_path))
  second = planner.plan(dep, cache_dir=str(tmp_path))
  assert all(c["calibration_cached"] for c in second["candidates"])
  assert not all(c["calibration_cached"] for c in first["candidates"])  # C = I is shared
  strip = lambda r: [{k: v for k, v in c.items() if k not in ("seconds", "calibration_cached",
                                                              "cache_hit")}
                     for c in r["candidates"]]
  assert strip(second) == strip(first) and second["pruned"] == first["pruned"]
  files = sorted((tmp_path / ".planner").glob("*.json"))
  kinds = {json.loads(path.read_text())["material"].get("kind") for path in files}
  # records, figures, a bound's multipliers and the last cut (the prefetch child's hint)
  assert kinds == {None, "figures", "thresholds", "cut"}
  for i, path in enumerate(files):  # truncated, or a value edited (below the truth)
    entry = json.loads(path.read_text())
    if i % 2:
      path.write_text(path.read_text()[:20])
    elif entry["material"].get("kind") == "thresholds":  # a bound's multipliers
      entry["value"] = {k: 2.0 * v for k, v in entry["value"].items()}
      path.write_text(json.dumps(entry))
    else:  # a record's z, a candidate's error norm (its figures), or the cut
      field = {"figures": "error_norm", "cut": "cut"}.get(entry["material"].get("kind"),
                                                          "noise_multiplier")
      entry["value"][field] *= 0.5
      path.write_text(json.dumps(entry))
  third = planner.plan(dep, cache_dir=str(tmp_path))
  assert not all(c["calibration_cached"] for c in third["candidates"])
  assert strip(third) == strip(first)


def test_an_edited_record_with_its_checksum_is_caught_at_the_winner(tmp_path):
  """A stored record edited together with its checksum (a consistent lie) is caught where
  it matters: the winner read back is resolved and its ε evaluated again at the stored z
  and just below it, and a mismatch makes the run trust no stored record."""
  dep = planner.Deployment(population=32, total_rounds=8, clients_per_round=4,
                           target_epsilon=2.0, delta=DELTA, schemas=("fixed_epoch",),
                           mechanisms=("gaussian", "opt_prefix_sum"))
  first = planner.plan(dep, cache_dir=str(tmp_path))
  loser = first["candidates"][-1]
  for path in (tmp_path / ".planner").glob("*.json"):  # make the loser look best
    entry = json.loads(path.read_text())
    if entry["value"].get("noise_multiplier") == loser["noise_multiplier"]:
      entry["value"]["noise_multiplier"] *= 1e-3
      entry["sha256"] = planner._entry_sha256(  # pylint: disable=protected-access
          entry["material"], entry["value"])
      path.write_text(json.dumps(entry))
  again = planner.plan(dep, cache_dir=str(tmp_path))
  assert again["recommended"]["mechanism"] == first["recommended"]["mechanism"]
  assert [c["noise_multiplier"] for c in again["candidates"]] == [
      c["noise_multiplier"] for c in first["candidates"]]


def _option(c):
  return planner.SchemaOption(participation.from_dict(c["schema"]), c["sampling_prob"],
                              c["clients_used"], c["participations"])


def test_account_agrees_with_the_winner(result, cache_dir, capsys):
  """`tff-mf account` with the winner's flags calibrates the same z and ε."""
  c = result["recommended"]
  schema = participation.from_dict(c["schema"])
  argv = ["account", "--mechanism", c["mechanism"], "--total_rounds", str(N),
          "--target_epsilon", str(EPS), "--delta", str(DELTA), "--participation", schema.kind,
          "--cache_dir", cache_dir, "--json", "--no_progress"]
  argv += [f"--{k}={getattr(schema, k)}" for k in schema.takes if k != "max_participations"]
  argv += [f"--{k}={v}" for k, v in c["params"].items()]
  if c["sampling_prob"] is not None and not c["mmcc_skipped"]:
    argv += ["--sampling_prob", repr(c["sampling_prob"])]
  assert cli.main(argv) == 0
  record = json.loads(capsys.readouterr().out)
  assert record["noise_multiplier"] == pytest.approx(c["noise_multiplier"], rel=1e-9)
  assert record["epsilon"] == pytest.approx(c["epsilon"], rel=1e-9)


@pytest.mark.parametrize("rank", [0, 1, -1])
def test_the_expected_error_is_the_released_noises(result, cache_dir, rank):
  """Simulate the released noise z·N·Z (N = C⁻¹ by the mechanism's own stream or noise
  matrix), apply the workload A and compare the mean squared error per round with rmse².

  Tolerance: one draw of a column Z gives Q = ‖z·B·Z‖²/n with E[Q] = z²‖B‖²_F/n = rmse² and
  Var[Q] = 2z⁴‖BᵀB‖²_F/n² (a Gaussian quadratic form); the mean of T independent draws has
  standard deviation √(Var[Q]/T), and the test allows 5 of them (a two-sided normal tail of
  6e-7; T = 4000 makes the mean of the χ²-mixture close to normal).
  """
  c = result["candidates"][rank]
  option = planner.SchemaOption(participation.from_dict(c["schema"]), c["sampling_prob"],
                                c["clients_used"], c["participations"])
  spec = planner.spec_of(planner.Deployment(POPULATION, N, K, EPS, DELTA), c["mechanism"],
                         option, c["params"], amplified=not c["mmcc_skipped"])
  resolved, record = mechanisms.build(spec, cache_dir=cache_dir)
  f, z, draws = resolved.factorization, record.noise_multiplier, 4000
  assert z == pytest.approx(c["noise_multiplier"], rel=1e-12)
  noise = np.random.default_rng(20260).standard_normal((f.m, draws))
  released = resolved.stream.run(noise) if resolved.stream is not None else \
      f.noise_matrix() @ noise
  error = resolved.workload.build() @ (z * released)
  measured = np.mean(np.square(error))
  gram = f.b.T @ f.b
  sd = math.sqrt(2 * z ** 4 * np.sum(np.square(gram)) / N ** 2 / draws)
  assert abs(measured - c["rmse"] ** 2) <= 5 * sd, (measured, c["rmse"] ** 2, sd)


def test_schema_options_at_the_issues_size():
  """n = 2048, P = 1e5, K = 500: single needs 1,024,000 clients; the epoch kinds take k = 16
  (b = 128 cohorts of 500); min_sep tries b up to P/K = 200 at p = K·b/P, and every b gives a
  client E = K·n/P = 10.24 expected participations (up to rounding of ⌈n/b⌉)."""
  dep = planner.Deployment(population=100_000, total_rounds=2048, clients_per_round=500,
                           target_epsilon=8.0)
  options, skipped = planner.schema_options(dep)
  assert "1024000" in skipped["single"]
  epochs = {o.schema.kind: o for o in options if o.schema.kind != "min_sep"}
  assert {k: (o.schema.epochs, o.clients_used) for k, o in epochs.items()} == {
      "fixed_epoch": (16, 64_000), "balls_in_bins": (16, 64_000),
      "random_allocation": (16, 64_000)}
  seps = {o.schema.min_sep: o for o in options if o.schema.kind == "min_sep"}
  assert sorted(seps) == [1, 2, 4, 8, 16, 32, 64, 128, 200]
  for b, o in seps.items():
    assert o.sampling_prob == pytest.approx(500 * b / 100_000)
    assert o.participations == pytest.approx(o.sampling_prob * math.ceil(2048 / b))
  assert seps[1].participations == pytest.approx(10.24)


def test_cli_json_plot_and_state_cap(tmp_path, capsys):
  """--json is one object with the table's fields; --plot writes the PNG; --max_state_rows 0
  leaves out every mechanism that keeps noise state, saying why."""
  png = tmp_path / "plan.png"
  argv = ["plan", "--population", "32", "--total_rounds", "8", "--clients_per_round", "4",
          "--target_epsilon", "2", "--schemas", "fixed_epoch", "--mechanisms", "gaussian",
          "blt", "--max_state_rows", "0", "--cache_dir", str(tmp_path / "cache"), "--json",
          "--no_progress", "--plot", str(png)]
  assert cli.main(argv) == 0
  out = json.loads(capsys.readouterr().out)
  assert {c["mechanism"] for c in out["candidates"]} == {"gaussian"}
  assert all(c["state_rows"] == 0 and c["epsilon"] <= 2 for c in out["candidates"])
  assert any("exceeds the cap of 0" in x["why"] for x in out["left_out"])
  assert "--mechanism=gaussian" in out["training_flags"]
  assert "fixed_epoch(" in out["flower_arguments"] and out["demands"]
  assert os.path.getsize(png) > 1000 and out["plot"] == str(png)


@pytest.mark.parametrize("argv, words", [
    (["--population", "4", "--clients_per_round", "8"], "exceeds the population"),
    (["--population", "64", "--clients_per_round", "8", "--target_epsilon", "-1"],
     "target_epsilon"),
    (["--population", "64", "--clients_per_round", "8", "--mechanisms", "nonprivate"],
     "not a trainable private mechanism"),
    (["--population", "32", "--clients_per_round", "8", "--mechanisms", "blt",
      "--schemas", "single"], "no candidate can run"),
])
def test_bad_input_is_one_line(argv, words, capsys, tmp_path):
  base = ["plan", "--total_rounds", "8", "--target_epsilon", "2", "--no_progress",
          "--cache_dir", str(tmp_path)]
  assert cli.main(base + argv) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and words in err[0] and err[0].startswith("tff-mf plan: error:"), err


@pytest.mark.slow  # the planner at the main job's size (about 35 s)
def test_at_the_main_jobs_size_it_recommends_the_main_jobs_choice(tmp_path):
  """docs/plan.md's claim: under the main job's schema, rounds, clients, ε and workload (the
  population its 2 fixed epochs use), the planner recommends the MF mechanism the main job
  trains against the tree, and the tree's matrix form scores worse."""
  from training import main_job  # pylint: disable=g-import-not-at-top
  d = main_job.MAIN_JOB_DEFAULTS
  n, k = d["total_rounds"], d["clients_per_round"]
  dep = planner.Deployment(
      population=n // d["epochs"] * k, total_rounds=n, clients_per_round=k,
      target_epsilon=d["target_epsilon"], delta=d["delta"], schemas=(d["participation"],),
      momentum=d["server_momentum"], lr_schedule=d["lr_schedule"],
      schedule_rounds=round(main_job.COOLDOWN_FRACTION * n))
  result = planner.plan(dep, cache_dir=str(tmp_path))
  best = result["recommended"]
  assert best["mechanism"] == main_job.MAIN_JOB_MECHANISMS[1] == "opt_momentum"
  assert participation.from_dict(best["schema"]) == participation.fixed_epoch(d["epochs"])
  tree = next(c for c in result["candidates"] if c["mechanism"] == "honaker_online")
  assert tree["rmse"] > best["rmse"] and best["epsilon"] <= d["target_epsilon"]


@pytest.mark.slow  # amplified banded calibrations at every band (about 25 s)
def test_the_shared_banded_bound_is_a_lower_bound(tmp_path):
  """Under min_sep sampling (p < 1) the amplified banded ε of one candidate bounds, from
  below, every candidate's reported ε of the group at a z with z/γ no larger: the shared
  bound never exceeds the ε training reports there (each computed in full)."""
  dep = planner.Deployment(population=64, total_rounds=16, clients_per_round=8,
                           target_epsilon=EPS, delta=DELTA, schemas=("min_sep",),
                           mechanisms=("banded_toeplitz", "banded"))
  records = planner.Records(str(tmp_path))
  preps = [p for p in (planner.prepare(dep, name, option, params, cache_dir=str(tmp_path))
                       for name, option, params in planner.enumerate_candidates(dep)[0])
           if isinstance(p, planner.Prepared) and p.figures["analysis"] == "amplified_banded"
           and p.option.schema.min_sep == 4]
  assert len(preps) >= 3
  first = preps[0]
  z0 = 0.5 * first.z_upper
  assert planner.epsilon_at(first, z0, records) > EPS  # registers f(z0/γ) for the group
  checked = 0
  for prep in preps[1:]:
    for scale in (1.0, 0.7, 0.4):
      z = scale * z0 * prep.figures["gamma"] / first.figures["gamma"]
      bound = planner.shared_banded_bound(dep, prep, z, records)
      assert bound is not None
      exact = planner.epsilon_at(prep, z, planner.Records(str(tmp_path), read=False))
      assert bound <= exact * (1 + 1e-12), (prep.describe(), z, bound, exact)
      checked += 1
  assert checked >= 6


@pytest.mark.parametrize("n", [1, 7, 64])
def test_the_prefix_sums_nuclear_norm_is_its_singular_values_sum(n):
  from tff_mf.factorization import workloads  # pylint: disable=g-import-not-at-top
  spec = workloads.WorkloadSpec("prefix_sum", n)
  exact = float(np.sum(np.linalg.svd(spec.build(), compute_uv=False)))
  bound = planner_bounds.nuclear_norm(spec)  # less what B·C may differ from A by
  assert bound <= exact and bound == pytest.approx(
      exact - n ** 1.5 * planner_bounds.PRODUCT_ATOL, rel=1e-12)


def test_the_error_bound_is_below_every_calibrated_rmse(result, tmp_path):
  """The bound before factorizing (``planner.error_lower_bounds``) is below the calibrated
  rmse of every candidate of its schema option, and not vacuous where it applies."""
  dep = _deployment()
  todo = planner.enumerate_candidates(dep)[0]
  bounds = planner.error_lower_bounds(dep, todo, planner.Records(str(tmp_path)))
  found = {planner.describe(c["mechanism"], _option(c), c["params"]): c["rmse"]
           for c in result["candidates"]}
  checked = 0
  for i, (name, option, params) in enumerate(todo):
    rmse = found.get(planner.describe(name, option, params))
    if rmse is not None:
      assert bounds[i]["rmse"] <= rmse, (name, option.schema.label, bounds[i], rmse)
      checked += bounds[i]["rmse"] > 0
  assert checked >= 3


@pytest.mark.slow  # two planner runs with every amplified calibration (about 2 minutes)
def test_pruning_before_factorizing_keeps_the_winner(tmp_path):
  """With a population large enough for strongly amplified min_sep sampling (p = b/64),
  a single-participation candidate cannot beat the best amplified one: the dense family's
  candidates there are pruned before their factorization, with the same winner as the
  unpruned planner's, and every proof holds against the unpruned calibration."""
  dep = planner.Deployment(population=256, total_rounds=8, clients_per_round=4,
                           target_epsilon=EPS, delta=DELTA,
                           schemas=("single", "fixed_epoch", "min_sep"),
                           mechanisms=("banded_toeplitz", "gaussian", "opt_prefix_sum"),
                           skip_mmcc=True)
  pruned = planner.plan(dep, cache_dir=str(tmp_path / "pruned"))
  full = planner.plan(dep, cache_dir=str(tmp_path / "full"), prune=False)
  assert _key(pruned["recommended"]) == _key(full["recommended"])
  assert pruned["recommended"]["rmse"] == full["recommended"]["rmse"]
  by_what = {planner.describe(c["mechanism"], _option(c), c["params"]): c
             for c in full["candidates"]}
  before = [x for x in pruned["pruned"] if x.get("before_factorizing")]
  assert before, "nothing pruned before factorizing"
  for x in pruned["pruned"]:
    _check_proof(x, by_what[x["what"]], full["recommended"]["rmse"], EPS)


def test_a_stored_bound_is_evaluated_again(tmp_path):
  """A threshold edited upward with its checksum (a bound that would prune more) fails its
  evaluation when read back and is computed again."""
  dep = _deployment()
  todo = planner.enumerate_candidates(dep)[0]
  first = planner.error_lower_bounds(dep, todo, planner.Records(str(tmp_path)))
  for path in (tmp_path / ".planner").glob("*.json"):
    entry = json.loads(path.read_text())
    if entry["material"].get("kind") == "thresholds" and "gaussian" in entry["value"]:
      entry["value"] = {k: 10.0 * v for k, v in entry["value"].items()}
      entry["sha256"] = planner._entry_sha256(  # pylint: disable=protected-access
          entry["material"], entry["value"])
      path.write_text(json.dumps(entry))
  again = planner.error_lower_bounds(dep, todo, planner.Records(str(tmp_path)))
  assert again == first


def test_records_written_before_their_types_read_the_same(result, capsys):
  """The planner's stored records and ``tff-mf plan``'s rows are read by their typed fields
  (``planner.Calibration``, ``planner.Candidate``); ones written before the types existed
  read, and write back, key for key the same."""
  from tff_mf.commands import plan as plan_command  # pylint: disable=g-import-not-at-top
  calibrated = {"noise_multiplier": 1.25, "epsilon": 3.5, "bound": "amplified"}
  evaluated = {"noise_multiplier": 0.5, "epsilon": 9.0, "bound": "unamplified",
               "amplified_banded_epsilon": None}
  for old in (calibrated, evaluated):
    record = planner.Calibration.of_json(old)
    assert json.dumps(record.json()) == json.dumps(old)
    assert (record.noise_multiplier, record.epsilon, record.bound) == (
        old["noise_multiplier"], old["epsilon"], old["bound"])
  valid = planner._record_valid  # pylint: disable=protected-access
  assert valid({"privacy": {"target_epsilon": 4.0}}, calibrated)
  assert not valid({"privacy": {"target_epsilon": 3.0}}, calibrated)  # above its target
  assert not valid({"privacy": {}}, dict(calibrated, bound=None))
  assert not valid({"privacy": {}}, dict(calibrated, noise_multiplier=math.inf))
  printed = json.loads(json.dumps(result))  # as `tff-mf plan --json` prints it
  typed = [planner.Candidate.of_json(row) for row in printed["candidates"]]
  assert [json.dumps(c.json()) for c in typed] == [
      json.dumps(row) for row in printed["candidates"]]
  with pytest.raises(Exception):
    typed[0].epsilon = 0.0  # frozen
  plan_command.print_table(result)
  live = capsys.readouterr().out
  plan_command.print_table(printed)
  assert capsys.readouterr().out == live and "->" in live


def _toeplitz(coef, n):
  return sum(v * np.eye(n, k=-d) for d, v in enumerate(coef[:n]))


@pytest.mark.parametrize("kind", ["balls_in_bins", "random_allocation"])
def test_the_mixture_component_bound_is_below_every_analysis(kind):
  """``planner_bounds.component_lower_epsilon`` (one component of the mixture over the secret
  pattern) is a lower bound on the true ε, so below the ε every valid analysis reports, for
  C = I, a banded and a BLT-like Toeplitz C, dense or in Toeplitz view; and the shifts are
  the largest over the patterns, by brute force."""
  from tff_mf import accounting
  from tff_mf import toeplitz_view
  n, k = 32, 4
  schema = participation.from_args(kind, n, epochs=k)
  b = n // k
  for coef in (np.ones(1), np.array([1.0, 0.6, 0.3]), 0.8 ** np.arange(n)):
    c = _toeplitz(coef, n)
    shifts = planner_bounds.component_shifts(c, schema, n)
    assert shifts == pytest.approx(planner_bounds.component_shifts(
        toeplitz_view.view(c[:, 0]), schema, n), rel=1e-12)
    col = np.sum(c * c, axis=0)
    if kind == "balls_in_bins":
      assert shifts["bin"] == pytest.approx(max(math.sqrt(col[r::b].sum()) for r in range(b)))
    else:
      best = np.sort(col.reshape(k, b).max(axis=1))[::-1]
      for m in range(1, k + 1):
        assert shifts[f"epochs_{m}"] == pytest.approx(math.sqrt(best[:m].sum()))
    for z in (0.5, 1.0, 3.0):
      low = planner_bounds.component_lower_epsilon(shifts, z, schema, n, DELTA)
      reported = accounting.epsilon_for(c, schema, z, DELTA)["epsilon"]
      assert 0.0 <= low <= reported, (coef[:3], z, low, reported)
      if z == 0.5:
        assert low > 0.0  # not vacuous at small noise


def test_the_component_epsilon_is_below_the_subsampled_gaussians():
  """A mixture w·N(μ, 1) + (1 − w)·N(0, 1) against N(0, 1) is the Poisson-subsampled
  Gaussian at rate w: ``component_epsilon`` stays below its pessimistic PLD (an upper bound
  on its true ε), and at w = 1 it is the Gaussian's exact ε from below."""
  from dp_accounting.pld import privacy_loss_distribution as pld_lib
  from tff_mf.accounting import gaussian
  for sigma in (0.5, 1.0, 2.0):
    for w in (1.0, 0.3, 0.01):
      low = planner_bounds.component_epsilon(sigma, DELTA, math.log(w))
      upper = pld_lib.from_gaussian_mechanism(sigma, sampling_prob=w).get_epsilon_for_delta(
          DELTA)
      assert low <= upper
    exact = gaussian.gaussian_epsilon_exact(sigma, DELTA)
    low = planner_bounds.component_epsilon(sigma, DELTA, 0.0)
    assert exact * (1 - 1e-5) <= low <= exact


def test_a_dense_entry_shared_by_schemas_is_loaded_once_per_run(tmp_path, monkeypatch):
  """banded's C serves every schema (schema_free) and opt_prefix_sum's is single
  participation's: the planner computes each dense cache entry once and loads it once, not
  once per schema option; the plan is the one a run without the memo gives."""
  from tff_mf.factorization import cache  # pylint: disable=g-import-not-at-top
  dep = planner.Deployment(population=64, total_rounds=8, clients_per_round=4,
                           target_epsilon=4.0, delta=DELTA,
                           schemas=("fixed_epoch", "min_sep"),
                           mechanisms=("banded", "opt_prefix_sum"), skip_mmcc=True)
  calls, computed = [], []
  load, factorize = cache.load_or_factorize, strategies.factorize

  def counted_load(spec, **kw):
    calls.append(cache.entry_paths(spec, kw["cache_dir"])[0])
    return load(spec, **kw)

  def counted_factorize(spec, **kw):
    computed.append((spec.strategy, json.dumps(spec.key_params(), sort_keys=True, default=str)))
    return factorize(spec, **kw)

  monkeypatch.setattr(cache, "load_or_factorize", counted_load)
  monkeypatch.setattr(strategies, "factorize", counted_factorize)
  out = planner.plan(dep, cache_dir=str(tmp_path / "b"), prefetch=False)
  assert calls and len(calls) == len(set(calls))
  # Each dense factorization was computed once.
  dense = [c for c in computed if c[0] in ("banded", "opt_prefix_sum")]
  assert dense and len(set(dense)) == len(dense)
  calls.clear()
  options = {participation.from_dict(c["schema"]).label for c in out["candidates"]}
  assert len(options) > 1  # several schema options shared the entries
  monkeypatch.setattr(planner, "LOADED_MAX_BYTES", 0)  # keeps only the last one
  again = planner.plan(dep, cache_dir=str(tmp_path / "c"), prefetch=False)
  reloads = [x for x in calls if x.startswith(str(tmp_path / "c"))]
  assert len(reloads) > len(set(reloads))  # without the memo, entries are loaded again
  strip = lambda r: [{k: v for k, v in c.items() if k not in ("seconds", "calibration_cached",
                                                              "cache_hit")}
                     for c in r["candidates"]]
  assert strip(again) == strip(out)


def test_loaded_keeps_the_most_recently_used_within_its_bytes():
  f = lambda n: mechanisms.resolve(registry.mechanism("opt_prefix_sum"),
                                   workloads.WorkloadSpec("prefix_sum", n),
                                   participation.SINGLE).factorization
  small, large = f(8), f(16)
  loaded = planner.Loaded(max_bytes=large.resident_bytes() + small.resident_bytes())
  loaded["a"], loaded["b"] = (small, "a.npz"), (large, "b.npz")
  assert loaded["a"][0] is small  # now the most recently used
  loaded["c"] = (small, "c.npz")
  assert set(loaded) == {"a", "c"}  # "b", the least recently used, went
  loaded["d"] = (f(32), "d.npz")  # alone above the budget: kept alone
  assert list(loaded) == ["d"]


def _table(result):
  return [{k: v for k, v in c.items() if k not in ("seconds", "calibration_cached", "cache_hit")}
          for c in result["candidates"]]


@pytest.mark.parametrize("child", ["factorizes", "exits"])
def test_dense_factorizations_computed_beside_give_the_same_plan(tmp_path, monkeypatch, child):
  """The dense families' entries come from a child process computing them during the cheap
  stage (BLAS on one thread there: iterative solvers may differ in the last bits, so the
  figures agree to 1e-9); the planner loads them with every check and computes none itself.
  A child that does nothing (or dies) leaves the planner to compute them: the same plan."""
  from tff_mf import planner_prefetch  # pylint: disable=g-import-not-at-top
  dep = planner.Deployment(population=64, total_rounds=16, clients_per_round=4,
                           target_epsilon=4.0, delta=DELTA,
                           schemas=("fixed_epoch", "min_sep"),
                           mechanisms=("banded", "opt_prefix_sum", "banded_toeplitz"),
                           skip_mmcc=True)
  alone = planner.plan(dep, cache_dir=str(tmp_path / "alone"), prefetch=False)
  if child == "exits":
    monkeypatch.setattr(planner_prefetch.Prefetch, "command",
                        staticmethod(lambda: [sys.executable, "-c", "pass"]))
  computed = []
  factorize = strategies.factorize
  monkeypatch.setattr(strategies, "factorize",
                      lambda spec, **kw: computed.append(spec.strategy) or factorize(spec, **kw))
  beside = planner.plan(dep, cache_dir=str(tmp_path / "beside"))
  dense = [s for s in computed if s in ("banded", "opt_prefix_sum")]
  assert (not dense) if child == "factorizes" else dense
  a, b = _table(alone), _table(beside)
  assert [_key(c) for c in a] == [_key(c) for c in b]
  for x, y in zip(a, b):
    np.testing.assert_allclose([x["rmse"], x["noise_multiplier"], x["epsilon"]],
                               [y["rmse"], y["noise_multiplier"], y["epsilon"]], rtol=1e-9)
  assert not [f for _, _, files in os.walk(tmp_path / "beside") for f in files
              if f.startswith(".tmp")]


def test_only_missing_entries_are_computed_beside(tmp_path):
  """Each entry once, in the order asked, and none that the cache already holds."""
  from tff_mf import planner_prefetch  # pylint: disable=g-import-not-at-top
  from tff_mf.factorization import cache  # pylint: disable=g-import-not-at-top
  w = workloads.WorkloadSpec("prefix_sum", 8)
  specs = [strategies.FactorizationSpec.with_parameters(
      {"bands": b}, workload=w, strategy="banded", participation=participation.SINGLE)
           for b in (2, 4, 2)]
  cache.load_or_factorize(specs[1], cache_dir=str(tmp_path))
  todo = planner_prefetch.missing(specs, str(tmp_path))
  assert list(todo.values()) == [specs[0]]
  beside = planner_prefetch.Prefetch(todo, str(tmp_path))
  (directory,) = todo
  assert beside.wait(directory) == "done" and not beside.pending(directory)
  beside.close()
  assert os.path.exists(os.path.join(directory, cache.METADATA_FILE))


def test_the_child_skips_the_entries_the_planner_will_prune(tmp_path):
  """An entry whose least rmse bound is above the planner's cut (given at the start, or sent
  later with ``lower_cut``) is reported skipped and not computed; one with a bound below the
  cut, or with none, is computed."""
  from tff_mf import planner_prefetch  # pylint: disable=g-import-not-at-top
  from tff_mf.factorization import cache  # pylint: disable=g-import-not-at-top

  def specs_of(n, bands):
    w = workloads.WorkloadSpec("prefix_sum", n)
    return planner_prefetch.missing([strategies.FactorizationSpec.with_parameters(
        {"bands": b}, workload=w, strategy="banded", participation=participation.SINGLE)
                                     for b in bands], str(tmp_path))

  def reports(beside):
    out = [beside.wait(d) for d in beside.order]
    beside.close()
    return out

  todo = specs_of(8, (2, 4, 8))
  d2, d4, d8 = todo
  beside = planner_prefetch.Prefetch(todo, str(tmp_path), bounds={d2: 5.0, d8: 1.0}, cut=2.0)
  assert reports(beside) == ["skipped", "done", "done"]
  assert not os.path.exists(d2) and os.path.exists(os.path.join(d8, cache.METADATA_FILE))
  # A cut sent while the child computes its first (slow) entry: the next entry is skipped.
  todo = specs_of(512, (64, 2, 4))
  first, later, last = todo
  beside = planner_prefetch.Prefetch(todo, str(tmp_path), bounds={later: 3.0, last: 1.5})
  beside.lower_cut(2.5)
  beside.lower_cut(2.6)  # not lower: ignored
  assert beside.cut == 2.5
  assert reports(beside) == ["done", "skipped", "done"]
  assert not os.path.exists(later)


def test_a_warm_run_gives_the_child_the_last_runs_cut(tmp_path, monkeypatch):
  """The final pruning cut is stored with the records; the next run of the same deployment
  starts its prefetch child with it (so the child does not compute the entries the last run
  skipped), and the plan is the same."""
  from tff_mf import planner_prefetch  # pylint: disable=g-import-not-at-top
  cuts = []
  start = planner_prefetch.Prefetch.__init__

  def init(self, specs, cache_dir, bounds=None, cut=None):
    cuts.append(cut)
    start(self, specs, cache_dir, bounds=bounds, cut=cut)

  monkeypatch.setattr(planner_prefetch.Prefetch, "__init__", init)
  dep = planner.Deployment(population=64, total_rounds=16, clients_per_round=4,
                           target_epsilon=4.0, delta=DELTA, schemas=("fixed_epoch", "min_sep"),
                           mechanisms=("banded", "banded_toeplitz"), skip_mmcc=True)
  cold = planner.plan(dep, cache_dir=str(tmp_path))
  warm = planner.plan(dep, cache_dir=str(tmp_path))
  assert _table(cold) == _table(warm)
  assert cuts == [None, (1.0 + 2.0 * planner.TOLERANCE) * cold["recommended"]["rmse"]]
  planner.plan(dep, cache_dir=str(tmp_path), prune=False)
  assert cuts[-1] is None


def test_a_stopped_child_leaves_no_temporary_files(tmp_path):
  """``close`` while the child writes: it exits through Python, and the cache's atomic
  writes remove what they had begun (an entry is there whole or not at all)."""
  import time  # pylint: disable=g-import-not-at-top
  from tff_mf import planner_prefetch  # pylint: disable=g-import-not-at-top
  from tff_mf.factorization import cache  # pylint: disable=g-import-not-at-top
  w = workloads.WorkloadSpec("prefix_sum", 768)
  specs = [strategies.FactorizationSpec.with_parameters(
      {"bands": b}, workload=w, strategy="banded", participation=participation.SINGLE)
           for b in (4, 64, 128)]
  beside = planner_prefetch.Prefetch(planner_prefetch.missing(specs, str(tmp_path)),
                                     str(tmp_path))
  time.sleep(4.0)  # the first entry written, the next ones under way
  assert beside.proc is not None and beside.proc.poll() is None
  beside.close()
  assert beside.proc is None
  for directory, _, files in os.walk(tmp_path):
    assert not [f for f in files if f.startswith(".tmp")], directory
    if files:
      assert cache.METADATA_FILE in files, directory


def test_the_true_epsilon_bound_is_below_every_analysis():
  """``planner_bounds.true_lower_epsilon`` (a residue class's largest columns as composed
  Poisson-subsampled Gaussians, from ``order_norms``) is a lower bound on the true ε under
  cyclic Poisson sampling, so below what MMCC, the amplified banded analysis and the
  unamplified Gaussian report, for C = I, a banded, a BLT-like Toeplitz and a non-Toeplitz C;
  near DP-SGD's ε for C = I; and ``order_norms`` are the classes' ordered column norms by
  brute force, dense or in Toeplitz view."""
  from dp_accounting.pld import privacy_loss_distribution as pld_lib
  from tff_mf import accounting
  from tff_mf import toeplitz_view
  n, b, p = 16, 4, 0.5
  schema = participation.min_sep(b)
  tree = np.tril(np.ones((n, n))) + np.diag(np.arange(n) % 3 / 4.0)  # not Toeplitz, C ≥ 0
  for c in (np.eye(n), _toeplitz(np.array([1.0, 0.5, 0.25]), n),
            _toeplitz(0.7 ** np.arange(n), n), tree / np.sqrt(np.max(np.sum(tree ** 2, 0)))):
    norms = planner_bounds.order_norms(c, b)
    col = np.sqrt(np.sum(c * c, axis=0))
    assert [m for m, _ in norms] == [1, 2, 4]
    for m, s in norms:
      assert s == pytest.approx(max(np.sort(col[r::b])[::-1][m - 1] for r in range(b)))
    if np.allclose(c, np.tril(c)) and np.allclose(c[1:, 1:], c[:-1, :-1]):
      assert planner_bounds.order_norms(toeplitz_view.view(c[:, 0]), b) == pytest.approx(norms)
    for z in (0.6, 1.0, 2.0):
      low = planner_bounds.true_lower_epsilon(norms, z, p, DELTA)
      assert low > 0.0
      banded = np.allclose(c, np.tril(np.triu(c, -(b - 1))))
      # MMCC takes seconds per point here (30 s for the tree at z = 0.6): checked at z = 2
      # for the dense C's, everywhere but z = 0.6 for the banded ones.
      mmcc = ("mmcc",) if z == 2.0 or (banded and z > 0.6) else ()
      for amplification in mmcc + ("none",) + (("amplified_banded",) if banded else ()):
        reported = accounting.epsilon_for(
            c, schema, z, DELTA, amplification=amplification,
            sampling_prob=None if amplification == "none" else p)["epsilon"]
        assert low <= reported, (amplification, z, low, reported)
      if np.array_equal(c, np.eye(n)):  # DP-SGD over a class's 4 rounds: near its ε
        # 1e-14: near the mass composition truncates (1e-15 a time), which is not a loss
        for delta in (DELTA, 1e-14):
          low = planner_bounds.true_lower_epsilon(norms, z, p, delta)
          upper = pld_lib.from_gaussian_mechanism(z, sampling_prob=p).self_compose(
              n // b, tail_mass_truncation=0.0).get_epsilon_for_delta(delta)
          assert 0.97 * upper <= low <= upper, (delta, low, upper)


def _raise(error):
  raise error


def _blt_under_min_sep(tmp_path, min_sep):
  """(deployment, the prepared BLT candidate with one buffer under min_sep b, its records):
  n = 8, P = 256, K = 4, so p = b/64, and MMCC accounts it."""
  dep = planner.Deployment(population=256, total_rounds=8, clients_per_round=4,
                           target_epsilon=EPS, delta=DELTA, schemas=("min_sep",),
                           mechanisms=("blt",))
  records = planner.Records(str(tmp_path))
  name, option, params = next(t for t in planner.enumerate_candidates(dep)[0]
                              if t[1].schema.min_sep == min_sep and t[2] == {"buffers": 1})
  prep = planner.prepare(dep, name, option, params, cache_dir=str(tmp_path), records=records)
  assert prep.figures["analysis"] == "mmcc"
  return dep, prep, records


@pytest.mark.slow  # an MMCC calibration (about 30 s)
def test_the_true_epsilon_bound_prunes_without_mmcc(tmp_path, monkeypatch):
  """A candidate that MMCC accounts (BLT under min_sep b = 1, p = 1/64) is pruned against a
  best rmse below its own by the bound on the true ε alone (no MMCC evaluation: one would
  fail here), and the proof holds against its MMCC calibration."""
  dep, prep, records = _blt_under_min_sep(tmp_path, 1)
  option = prep.option
  assert prep.figures["order_norms"]
  calibrated = planner.calibrate(prep, records)
  assert calibrated.bound == "mmcc"

  def no_mmcc(*args, **kwargs):
    raise AssertionError("the pruning evaluated MMCC")
  monkeypatch.setattr(planner, "epsilon_at", no_mmcc)
  best = calibrated.rmse / 1.1
  why = planner.prune_check(dep, prep, best, records)
  assert why is not None and "at least" in why["why"], why
  _check_proof(why, calibrated.json(), best, EPS)
  # At its calibrated z the bound is below MMCC's ε there (within the target).
  assert planner_bounds.true_lower_epsilon(
      prep.figures["order_norms"], calibrated.noise_multiplier, option.sampling_prob,
      DELTA) <= calibrated.epsilon <= EPS


def test_the_mmcc_bound_is_below_the_reported_epsilon(tmp_path):
  """``planner.mmcc_bound`` (MMCC's own ε from below, with the unamplified Gaussians) never
  exceeds the ε training reports at the same z (MMCC evaluated in full), for BLT under
  min_sep b = 2 at noise multipliers where it proves the target exceeded."""
  dep, prep, _ = _blt_under_min_sep(tmp_path, 2)
  proven = 0
  for scale in (0.15, 0.25):
    z = scale * prep.z_upper
    bound = planner.mmcc_bound(dep, prep, z)
    if bound is not None:
      reported = planner.epsilon_at(prep, z, planner.Records(str(tmp_path), read=False))
      assert EPS < bound <= reported, (z, bound, reported)
      proven += 1
  assert proven >= 1


def test_the_prune_bounds_are_read_back_by_a_warm_run(tmp_path, monkeypatch):
  """The lower bounds a prune test computes (seconds each at n = 2048) are stored with the
  records and read back by a later run with the same value, not computed again; a run
  without records computes them."""
  from tff_mf.accounting import mmcc  # pylint: disable=g-import-not-at-top
  dep, prep, records = _blt_under_min_sep(tmp_path, 2)
  z = 0.15 * prep.z_upper
  first = planner.mmcc_bound(dep, prep, z, records), planner.true_bound(dep, prep, z, records)
  assert first[0] is not None
  calls = []
  lower, true_lower = mmcc.lower_bound_epsilon, planner_bounds.true_lower_epsilon
  monkeypatch.setattr(mmcc, "lower_bound_epsilon",
                      lambda *a, **k: calls.append("mmcc") or lower(*a, **k))
  monkeypatch.setattr(planner_bounds, "true_lower_epsilon",
                      lambda *a, **k: calls.append("true") or true_lower(*a, **k))
  warm = planner.Records(str(tmp_path))
  assert (planner.mmcc_bound(dep, prep, z, warm), planner.true_bound(dep, prep, z, warm)) == first
  assert not calls
  assert (planner.mmcc_bound(dep, prep, z), planner.true_bound(dep, prep, z)) == first
  assert calls == ["mmcc", "true"]
  # A refusal (MMCC does not take this C) is stored as one and read back: no proof, not
  # computed again; a failure its material does not decide (memory) is not stored.
  for error, stored in ((checks.CheckError("MMCC takes no negative entries"), True),
                        (MemoryError(), False)):
    root = tmp_path / type(error).__name__  # records of their own
    calls.clear()
    monkeypatch.setattr(mmcc, "lower_bound_epsilon",
                        lambda *a, error=error, **k: calls.append("mmcc") or _raise(error))
    for _ in range(2):
      assert planner.mmcc_bound(dep, prep, z, planner.Records(str(root))) is None
    assert calls == ["mmcc"] if stored else ["mmcc", "mmcc"]
  # A cache that fails while the C is read (not a refusal of this C) is not stored either.
  monkeypatch.setattr(mmcc, "lower_bound_epsilon", lower)
  root, resolve = str(tmp_path / "flaky"), prep.resolve
  prep.resolved = None
  monkeypatch.setattr(prep, "resolve", lambda: _raise(
      checks.CheckError("cache entry kept changing while it was read; try again")))
  assert planner.mmcc_bound(dep, prep, z, planner.Records(root)) is None
  monkeypatch.setattr(prep, "resolve", resolve)
  assert planner.mmcc_bound(dep, prep, z, planner.Records(root)) == first[0]
