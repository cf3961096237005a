"""jax_privacy's ``auditing.CanaryScoreAuditor`` on tff-mf's canary scores (peer side).

Runs under a separate, benchmark-only interpreter with jax_privacy installed from its
newest source (``auditing`` is not in the 2.0.0 release on the package index); it imports
numpy, scipy, dp_accounting and ``jax_privacy.auditing`` only, never tff_mf.

  peer_python benchmarks/peer_jax_privacy_audit.py TASKS.json

TASKS.json: {"significance": α, "delta": δ, "files": [path.npz, ...]}, each npz holding
``held_in`` (scores with the canary) and ``out`` (without). Prints one JSON line per file:
{"file", "frontier_thresholds" (how many thresholds its Bonferroni correction counts),
"clopper_pearson_bonferroni", "clopper_pearson_multisplit", "gdp"} (ε lower bounds at δ,
two-sided, at significance α), or {"file", "error"}. A file whose arrays are 2-D holds
repetitions (rows) of exact Gaussian scores with ``true_epsilon`` at ``delta``: then
{"file", "repetitions", "mean_epsilon", "exceed_true_epsilon", "epsilons"}. With
"one_run": true in TASKS.json, each file holds one run's canary scores (``held_in``: the
included canaries', ``out``: the others') and the line is {"file", "one_run",
"one_run_fdp", "seconds", "frontier_thresholds"}: ``epsilon_one_run`` and ``epsilon_one_run_fdp`` (one-sided,
Bonferroni over thresholds, the peer's defaults) at significance α and δ. "counts":
[[m, guesses, correct], ...] in TASKS.json adds one line per triple, {"counts",
"one_run", "one_run_fdp"}: the module's bounds for those counts themselves (its
``_epsilon_one_run`` and ``_epsilon_one_run_fdp``), to compare the formulas alone.
"""

import json
import sys

if __name__ == "__main__" and (len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help")):
  print(__doc__)
  sys.exit(0 if sys.argv[1:2] in (["-h"], ["--help"]) else 2)

# pylint: disable=g-import-not-at-top,wrong-import-position
import importlib.util
import os
import time

import numpy as np


def _load_auditing():
  """``jax_privacy.auditing`` without the package's ``__init__`` (which imports optax and
  jax features the offline-installable versions lack); the module needs only numpy, scipy
  and dp_accounting."""
  spec = importlib.util.find_spec("jax_privacy")
  path = os.path.join(list(spec.submodule_search_locations)[0], "auditing.py")
  module_spec = importlib.util.spec_from_file_location("jax_privacy_auditing", path)
  module = importlib.util.module_from_spec(module_spec)
  sys.modules[module_spec.name] = module  # dataclasses look their module up
  module_spec.loader.exec_module(module)
  return module, path


auditing, AUDITING_PATH = _load_auditing()
# pylint: enable=g-import-not-at-top,wrong-import-position


def run_one_run(path, significance, delta):
  data = np.load(path)
  auditor = auditing.CanaryScoreAuditor(data["held_in"], data["out"])
  start = time.perf_counter()
  out = {"one_run": float(auditor.epsilon_one_run(significance, delta)),
         "one_run_fdp": float(auditor.epsilon_one_run_fdp(significance, delta))}
  return dict(out, seconds=time.perf_counter() - start,
              frontier_thresholds=int(len(auditor._thresholds)))  # pylint: disable=protected-access


def run_file(path, significance, delta):
  data = np.load(path)
  if data["out"].ndim == 2:  # repetitions: coverage of the Clopper-Pearson bound
    eps = [auditing.CanaryScoreAuditor(s1, s0).epsilon_clopper_pearson(
        significance, float(data["delta"]), one_sided=False)
           for s0, s1 in zip(data["out"], data["held_in"])]
    return {"repetitions": len(eps), "mean_epsilon": float(np.mean(eps)),
            "exceed_true_epsilon": int(np.sum(np.array(eps) > float(data["true_epsilon"]))),
            "epsilons": [float(e) for e in eps]}
  auditor = auditing.CanaryScoreAuditor(data["held_in"], data["out"])
  return {"frontier_thresholds": int(len(auditor._thresholds)),  # pylint: disable=protected-access
      "clopper_pearson_bonferroni": float(auditor.epsilon_clopper_pearson(
          significance, delta, one_sided=False)),
      "clopper_pearson_multisplit": float(auditor.epsilon_clopper_pearson(
          significance, delta, one_sided=False,
          threshold_strategy=auditing.MultiSplit(num_samples=20, seed=0))),
      "gdp": float(auditor.epsilon_from_gdp(significance, delta)),
  }


def main(argv):
  with open(argv[1]) as f:
    tasks = json.load(f)
  from importlib import metadata  # pylint: disable=g-import-not-at-top
  print(json.dumps({"auditing": AUDITING_PATH, "version": metadata.version("jax_privacy")}),
        flush=True)
  for m, guesses, correct in tasks.get("counts", []):
    args = (0, m, guesses, correct, tasks["significance"], tasks["delta"])
    print(json.dumps({"counts": [m, guesses, correct],
                      "one_run": float(auditing._epsilon_one_run(*args)),  # pylint: disable=protected-access
                      "one_run_fdp": float(auditing._epsilon_one_run_fdp(*args))}),  # pylint: disable=protected-access
          flush=True)
  for path in tasks["files"]:
    try:
      run = run_one_run if tasks.get("one_run") else run_file
      entry = dict(file=path, **run(path, tasks["significance"], tasks["delta"]))
    except Exception as e:  # pylint: disable=broad-except
      entry = {"file": path, "error": f"{type(e).__name__}: {e}".splitlines()[0]}
    print(json.dumps(entry), flush=True)


if __name__ == "__main__":
  main(sys.argv)
