"""What was asked and what was done: the solver outcome record of every factorization
(requested, returned, converged, why), its warning line, ``--strict``, and cache entries
written before the record existed."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import userenv
from tff_mf.factorization import cache
from tff_mf.factorization import lbfgs
from tff_mf import participation
from tff_mf.factorization import strategies
from tff_mf.factorization import workloads

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Under 32-min-sep participation at n = 512 the best 4-buffer BLT switches buffers off (two,
# with every OpenBLAS kernel tried: its cancelled pairs sit on the log-gap bound); the tests
# read how many from the output rather than assume one optimizer path.
BLT_FEWER = ("--mechanism", "blt", "--buffers", 4, "--total_rounds", 512, "--participation",
             "min_sep", "--min-sep", 32)


def factorize(*args, cache_dir):
  env = userenv.env()
  argv = [sys.executable, "-m", "tff_mf.cli", "factorize", *map(str, args),
          "--cache-dir", str(cache_dir)]
  return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_blt_fewer_buffers_says_so_with_both_rmses(tmp_path):
  text = factorize(*BLT_FEWER, cache_dir=tmp_path)
  assert text.returncode == 0, text.stderr
  warnings = [line for line in text.stdout.splitlines() if "warning" in line]
  assert len(warnings) == 1, text.stdout
  returned = re.search(r"buffers ([1-3]) returned for 4 requested", warnings[0])
  assert returned, warnings[0]
  k = int(returned.group(1))
  assert f"  buffers        {k}" in text.stdout.splitlines()  # what was done, not what was asked
  record = json.loads(factorize(*BLT_FEWER, "--json", cache_dir=tmp_path).stdout)
  outcome = record["outcome"]
  assert record["cache_hit"] is True
  assert outcome["requested"] == {"buffers": 4} and outcome["returned"] == {"buffers": k}
  assert isinstance(outcome["converged"], bool) and outcome["why"] == warnings[0].split(
      "warning: ", 1)[1]
  with open(record["metadata_path"], encoding="utf-8") as f:
    info = json.load(f)["info"]
  assert info["outcome"] == outcome
  # Both rmses: at the requested count (the optimizer's 4-buffer BLT before its cancelled
  # decay pairs are dropped) and at the returned one; dropping a pair changes the
  # coefficients by at most 1e-12 relative (blt._prune), so the two agree to ~1e-9.
  assert f"{info['rmse_at_buffers_requested']:.10g} with 4 buffers" in outcome["why"]
  assert f"{record['rmse']:.10g} with {k}" in outcome["why"]
  assert info["rmse_at_buffers_requested"] == pytest.approx(record["rmse"], rel=1e-8)


def test_strict_refuses_in_one_line_and_keeps_the_entry(tmp_path):
  strict = factorize(*BLT_FEWER, "--strict", cache_dir=tmp_path)
  assert strict.returncode == 2
  assert strict.stdout == "" and "Traceback" not in strict.stderr
  lines = [line for line in strict.stderr.splitlines() if line.startswith("tff-mf")]
  assert len(lines) == 1 and "refused by strict" in lines[0], strict.stderr
  assert re.search(r"buffers [1-3] returned for 4 requested", lines[0]), lines[0]
  hit = factorize(*BLT_FEWER, "--json", cache_dir=tmp_path)
  assert hit.returncode == 0 and json.loads(hit.stdout)["cache_hit"] is True
  # Nothing to refuse: strict passes a converged result with the requested parameters.
  ok = factorize("--mechanism", "blt", "--buffers", 2, "--total_rounds", 64, "--strict", "--json",
                 cache_dir=tmp_path)
  assert ok.returncode == 0, ok.stderr
  outcome = json.loads(ok.stdout)["outcome"]
  assert outcome == {"requested": {"buffers": 2}, "returned": {"buffers": 2},
                     "converged": True, "why": ""}


def _strip_outcome(json_path, *keys):
  with open(json_path, encoding="utf-8") as f:
    metadata = json.load(f)
  for key in ("outcome",) + keys:
    del metadata["info"][key]
  with open(json_path, "w", encoding="utf-8") as f:
    json.dump(metadata, f)


def test_entries_cached_before_the_record(tmp_path, capsys):
  w = workloads.WorkloadSpec(kind="prefix_sum", n=64)
  plain = strategies.FactorizationSpec(workload=w, strategy="banded_toeplitz", bands=4)
  _, entry = cache.load_or_factorize(plain, cache_dir=tmp_path)
  _strip_outcome(entry.json_path)
  f, hit = cache.load_or_factorize(plain, cache_dir=tmp_path, strict=True)
  assert hit.cache_hit and capsys.readouterr().err == ""  # served: it passes every check
  assert f.info["outcome"] == {"requested": {"bands": 4}, "returned": {"bands": 4},
                               "converged": True, "why": ""}
  # A BLT entry that returned fewer buffers cannot say why without both rmses: recomputed.
  fewer = strategies.FactorizationSpec(
      workload=workloads.WorkloadSpec(kind="prefix_sum", n=512), strategy="blt", buffers=4,
      participation=participation.from_args("min_sep", 512, min_sep=32))
  _, entry = cache.load_or_factorize(fewer, cache_dir=tmp_path)
  _strip_outcome(entry.json_path, "returned_why", "rmse_at_buffers_requested")
  f, again = cache.load_or_factorize(fewer, cache_dir=tmp_path)
  err = capsys.readouterr().err.strip().splitlines()
  assert not again.cache_hit and len(err) == 1 and "recomputing" in err[0]
  assert f.info["outcome"]["returned"]["buffers"] < 4 and f.info["outcome"]["why"]
  with pytest.raises(strategies.SolverOutcomeError, match="refused by strict"):
    cache.load_or_factorize(fewer, cache_dir=tmp_path, strict=True)


def test_unconverged_lbfgs_says_why():
  spec = strategies.FactorizationSpec(workload=workloads.WorkloadSpec(kind="prefix_sum", n=8),
                                      strategy="banded_toeplitz", bands=2)
  info = {"bands": 2, "converged": False, "message": "ABNORMAL_TERMINATION_IN_LNSRCH",
          "gradient_norm": 3e-4}
  outcome = strategies.solver_outcome(spec, info)
  assert strategies.deviates(outcome) and not outcome["converged"]
  assert outcome["why"] == "not converged: " + lbfgs.why_unconverged(
      "ABNORMAL_TERMINATION_IN_LNSRCH", 3e-4)
  assert "ABNORMAL_TERMINATION_IN_LNSRCH" in outcome["why"] and "0.0003" in outcome["why"]
  converged = strategies.solver_outcome(spec, dict(info, converged=True))
  assert not strategies.deviates(converged) and converged["why"] == ""


def test_unconverged_optimal_warns_and_strict_refuses(tmp_path):
  args = ("--mechanism", "optimal", "--total_rounds", 64, "--max-iterations", 2,
          "--allow-unconverged")
  record = json.loads(factorize(*args, "--json", cache_dir=tmp_path).stdout)
  outcome = record["outcome"]
  assert outcome["converged"] is False and outcome["requested"] == outcome["returned"] == {}
  assert outcome["why"] == (f"not converged: relative duality gap {record['relative_gap']:.3g} "
                            "above the target (iteration limit reached)")
  assert record["relative_gap"] > 1e-6
  strict = factorize(*args, "--strict", cache_dir=tmp_path)
  assert strict.returncode == 2 and "refused by strict" in strict.stderr
