"""Runs jax_privacy's strategy optimizers for ``bench_multi_participation.py`` (peer side).

Runs under a separate, benchmark-only interpreter that has ``jax-privacy`` installed
(e.g. ``python3.11 -m venv /tmp/peer && /tmp/peer/bin/pip install jax-privacy==2.0.0``);
it imports only jax, jax_privacy and numpy, never tff_mf. jax_privacy is no dependency
of tff-mf.

  peer_python benchmarks/peer_jax_privacy.py TASKS.json OUT_DIR

TASKS.json is a list of tasks {"id", "kind", "n", ...}; kinds:
  banded_toeplitz (bands) -> toeplitz.optimize_banded_toeplitz(n, bands): coefficients
  blt (min_sep, max_participations, error) -> buffered_toeplitz.optimize: θ, ω
  dense (epochs[, max_optimizer_steps]) -> dense.optimize(n, epochs=k): C
  banded (bands) -> banded.optimize(n, bands=b).materialize(): C
  bisr (bands) -> toeplitz.banded_inverse_square_root_noising_coefs(b): taps of C⁻¹
  banded_inverse (min_sep, bands, max_participations) ->
    toeplitz.optimize_banded_inverse_toeplitz(n, min_sep, b, max_participations=k): taps of C⁻¹
  bsr (bands) -> toeplitz.optimal_max_error_strategy_coefs(b): coefficients of the banded C
The last three need jax_privacy's newest source (2.3 development); its package ``__init__``
expects ``optax.ArrayTree``, which the installable optax lacks, so the annotation-only alias
``optax.ArrayTree = typing.Any`` is set first when missing.
Tasks run in order; after each one its arrays go to OUT_DIR/<id>.npz and one JSON line
{"id", "seconds" and "cpu_seconds" (one call, including jax compilation for a new shape)
or "error"} is
printed, so a run stopped at a time limit keeps what it finished.
"""

import json
import sys
import time

if __name__ == "__main__" and (len(sys.argv) != 3 or sys.argv[1] in ("-h", "--help")):
  # Usage without jax: `--help` works in any interpreter (the smoke test runs it in tff-mf's).
  print(__doc__)
  sys.exit(0 if sys.argv[1:2] in (["-h"], ["--help"]) else 2)

# pylint: disable=g-import-not-at-top,wrong-import-position
import typing

import optax

if not hasattr(optax, "ArrayTree"):
  optax.ArrayTree = typing.Any  # an annotation-only alias the newest jax_privacy expects

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np
from jax_privacy.matrix_factorization import banded
from jax_privacy.matrix_factorization import buffered_toeplitz
from jax_privacy.matrix_factorization import dense
from jax_privacy.matrix_factorization import toeplitz
# pylint: enable=g-import-not-at-top,wrong-import-position


def run_task(task):
  kind, n = task["kind"], int(task["n"])
  if kind == "banded_toeplitz":
    return {"coefficients": toeplitz.optimize_banded_toeplitz(n, int(task["bands"]))}
  if kind == "blt":
    b = buffered_toeplitz.optimize(n=n, min_sep=int(task["min_sep"]),
                                   max_participations=int(task["max_participations"]),
                                   error=task.get("error", "mean"))
    return {"theta": b.buf_decay, "omega": b.output_scale}
  if kind == "dense":
    kwargs = {}
    if task.get("max_optimizer_steps"):
      kwargs["max_optimizer_steps"] = int(task["max_optimizer_steps"])
    return {"c": dense.optimize(n, epochs=int(task["epochs"]), **kwargs)}
  if kind == "banded":
    return {"c": banded.optimize(n, bands=int(task["bands"])).materialize()}
  if kind == "bisr":
    return {"taps": toeplitz.banded_inverse_square_root_noising_coefs(int(task["bands"]))}
  if kind == "banded_inverse":
    return {"taps": toeplitz.optimize_banded_inverse_toeplitz(
        n, int(task["min_sep"]), int(task["bands"]),
        max_participations=int(task["max_participations"]))}
  if kind == "bsr":
    return {"coefficients": toeplitz.optimal_max_error_strategy_coefs(int(task["bands"]))}
  raise ValueError(f"unknown task kind {kind!r}")


def main(argv):
  with open(argv[1]) as f:
    tasks = json.load(f)
  print(json.dumps({"jax": jax.__version__}), flush=True)
  for task in tasks:
    start, cpu = time.perf_counter(), time.process_time()
    try:
      out = run_task(task)
      np.savez(f"{argv[2]}/{task['id']}.npz",
               **{name: np.asarray(value, dtype=np.float64) for name, value in out.items()})
      entry = {"id": task["id"], "seconds": time.perf_counter() - start,
               "cpu_seconds": time.process_time() - cpu}
    except Exception as e:  # pylint: disable=broad-except
      entry = {"id": task["id"], "error": f"{type(e).__name__}: {e}".splitlines()[0]}
    print(json.dumps(entry), flush=True)


if __name__ == "__main__":
  main(sys.argv)
