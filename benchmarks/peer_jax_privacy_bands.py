"""Choosing the number of bands with amplification: tff-mf against jax_privacy, side by side.

For each configuration (n rounds, cyclic Poisson sampling of cycle B with probability p,
so E = p·n/B expected participations; target ε at δ), both sides try b = 1, 2, 4, …, B:
a b-banded Toeplitz C, cyclic Poisson sampling of cycle b at probability E·b/n, z
calibrated to the target ε with the amplified banded analysis (Choquette-Choo et al.
2023, arXiv:2306.08153, Thm 4), expected error z·rmse/E; each picks the b with the least.

- tff-mf: ``tff_mf.accounting.band_calibration.calibrate_bands`` (banded Toeplitz C from the
  factorization cache, ``accounting.calibrate`` with analysis "amplified_banded").
- jax_privacy (newest source, benchmark-only interpreter): for each b,
  ``BandMFConfig.default(num_bands=b, iterations=n, expected_participations=E)``, then
  ``.calibrate(epsilon=, delta=)`` and ``.rmse``. jax_privacy's package ``__init__``
  fails to import with the installable optax (``optax.ArrayTree`` is missing); the peer
  side sets ``optax.ArrayTree = typing.Any`` (a type alias used in annotations only)
  before importing ``jax_privacy.execution_plan``.

  .venv/bin/python benchmarks/peer_jax_privacy_bands.py [--peer-python /tmp/peer24/bin/python]
  peer_python benchmarks/peer_jax_privacy_bands.py --peer TASKS.json   (the peer side)

Writes ``benchmarks/results/peer_bands.md`` (or ``--out-dir``). ``--smoke``: our side
only, at n = 32. The two sides can also run apart and be assembled: ``--peer-rows FILE``
reads the JSON lines a ``--peer`` run printed, ``--ours-json FILE`` the ``ours`` of an
earlier run's ``peer_bands.json`` (its timings are those of that run).
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "benchmarks", "results")
DEFAULT_PEER_PYTHON = "/tmp/peer24/bin/python"
DELTA = 1e-6
SAMPLING_PROB = 0.5
EPSILONS = (1.0, 4.0, 8.0)
CONFIGS = ((512, 32, EPSILONS), (1024, 64, (4.0,)))  # (n, B, target ε's)
TOLERANCE = 1e-3


# ----------------------------------------------------------------------------- peer side


def peer_main(tasks_path):
  """Runs under jax_privacy's interpreter: one JSON line per (n, E, b, ε) task."""
  # pylint: disable=g-import-not-at-top
  import typing
  import optax
  if not hasattr(optax, "ArrayTree"):
    optax.ArrayTree = typing.Any  # an annotation-only alias the newest jax_privacy expects
  import jax
  jax.config.update("jax_enable_x64", True)
  from jax_privacy import execution_plan
  # pylint: enable=g-import-not-at-top
  with open(tasks_path) as f:
    tasks = json.load(f)
  print(json.dumps({"jax": jax.__version__, "module": execution_plan.__file__}), flush=True)
  strategies = {}
  for task in tasks:
    n, b, e = int(task["n"]), int(task["bands"]), float(task["expected_participations"])
    start = time.perf_counter()
    if (n, b) not in strategies:
      strategies[(n, b)] = execution_plan.BandMFConfig.default(
          num_bands=b, iterations=n, expected_participations=e).strategy
    config = execution_plan.BandMFConfig(iterations=n, expected_participations=e,
                                         strategy=strategies[(n, b)])
    calibrated = config.calibrate(epsilon=float(task["epsilon"]), delta=float(task["delta"]))
    print(json.dumps({**task, "noise_multiplier": float(calibrated.noise_multiplier),
                      "expected_error": float(calibrated.rmse),
                      "seconds": time.perf_counter() - start}), flush=True)


# ----------------------------------------------------------------------------- our side


def ours(n, min_sep, epsilon, cache_dir):
  from tff_mf.accounting import band_calibration  # pylint: disable=g-import-not-at-top
  start = time.perf_counter()
  result = band_calibration.calibrate_bands(n, epsilon, DELTA, min_sep=min_sep,
                                            sampling_prob=SAMPLING_PROB, cache_dir=cache_dir,
                                            tolerance=TOLERANCE)
  result["seconds"] = time.perf_counter() - start
  return result


def peer(peer_python, tasks, out_dir):
  path = os.path.join(out_dir, "peer_bands_tasks.json")
  with open(path, "w") as f:
    json.dump(tasks, f)
  proc = subprocess.run([peer_python, os.path.abspath(__file__), "--peer", path],
                        capture_output=True, text=True, check=False)
  rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
  if proc.returncode != 0:
    tail = proc.stderr.strip().splitlines()[-1:] or ["(no stderr)"]
    raise RuntimeError(f"the jax_privacy side failed (exit {proc.returncode}): {tail[0]}")
  return rows[0], rows[1:]


def table(configs, results, peer_rows):
  lines = ["| n | B | p | E | ε | tff-mf b | tff-mf z | tff-mf z·rmse/E | jax_privacy b | "
           "jax_privacy z | jax_privacy z·rmse/E |", "|---|---|---|---|---|---|---|---|---|---|---|"]
  for (n, min_sep, eps), r in zip(configs, results):
    best = r["best"]
    mine = [row for row in peer_rows if row["n"] == n and row["min_sep"] == min_sep and
            row["epsilon"] == eps]
    if mine:
      pb = min(mine, key=lambda row: (row["expected_error"], row["bands"]))
      peer_cells = f"{pb['bands']} | {pb['noise_multiplier']:.4f} | {pb['expected_error']:.4f}"
    else:
      peer_cells = "- | - | -"
    lines.append(f"| {n} | {min_sep} | {SAMPLING_PROB:g} | {r['expected_participations']:g} | "
                 f"{eps:g} | {best['bands']} | {best['noise_multiplier']:.4f} | "
                 f"{best['expected_error']:.4f} | {peer_cells} |")
  return lines


def candidates_table(configs, results, peer_rows):
  lines = ["| n | B | ε | b | tff-mf z | jax_privacy z | tff-mf rmse·z/E | jax_privacy rmse·z/E |",
           "|---|---|---|---|---|---|---|---|"]
  for (n, min_sep, eps), r in zip(configs, results):
    for c in r["candidates"]:
      match = [row for row in peer_rows if row["n"] == n and row["min_sep"] == min_sep and
               row["epsilon"] == eps and row["bands"] == c["bands"]]
      pz = f"{match[0]['noise_multiplier']:.4f}" if match else "-"
      pe = f"{match[0]['expected_error']:.4f}" if match else "-"
      lines.append(f"| {n} | {min_sep} | {eps:g} | {c['bands']} | {c['noise_multiplier']:.4f} | "
                   f"{pz} | {c['expected_error']:.4f} | {pe} |")
  return lines


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--peer", default=None, metavar="TASKS.json",
                      help="run the jax_privacy side on TASKS.json (in the peer interpreter)")
  parser.add_argument("--peer-python", default=DEFAULT_PEER_PYTHON,
                      help="interpreter with jax_privacy installed, or 'none' (default: "
                           f"{DEFAULT_PEER_PYTHON})")
  parser.add_argument("--out-dir", default=RESULTS)
  parser.add_argument("--cache-dir", default=None,
                      help="factorization cache (default: <out-dir>/cache_bands)")
  parser.add_argument("--smoke", action="store_true", help="our side only, n = 32, B = 8")
  parser.add_argument("--peer-rows", default=None,
                      help="JSON lines of an earlier --peer run (instead of running the peer)")
  parser.add_argument("--ours-json", default=None,
                      help="peer_bands.json of an earlier run: reuse its tff-mf results")
  args = parser.parse_args(argv)
  if args.peer:
    peer_main(args.peer)
    return 0
  os.makedirs(args.out_dir, exist_ok=True)
  cache_dir = args.cache_dir or os.path.join(args.out_dir, "cache_bands")
  grid = ((32, 8, (4.0,)),) if args.smoke else CONFIGS
  configs = [(n, b, eps) for n, b, epsilons in grid for eps in epsilons]
  results = []
  if args.ours_json:
    with open(args.ours_json) as f:
      results = json.load(f)["ours"]
  for n, min_sep, eps in configs[len(results):]:
    results.append(ours(n, min_sep, eps, cache_dir))
    with open(os.path.join(args.out_dir, "peer_bands.json"), "w", encoding="utf-8") as f:
      json.dump({"ours": results}, f, indent=1)  # kept when a later configuration is stopped
    print(f"[tff-mf] n={n} B={min_sep} eps={eps:g}: b={results[-1]['best']['bands']} "
          f"({results[-1]['seconds']:.1f} s)", file=sys.stderr, flush=True)
  peer_info, peer_rows, peer_note = {}, [], ""
  peer_python = None if args.smoke or args.peer_python == "none" else args.peer_python
  if args.peer_rows:
    with open(args.peer_rows) as f:
      rows = [json.loads(line) for line in f if line.startswith("{")]
    peer_info, peer_rows = rows[0], rows[1:]
    peer_note = (f"jax_privacy side: {sum(r['seconds'] for r in peer_rows):.0f} s wall in all "
                 f"(jax {peer_info.get('jax')}, 500 optimizer steps per strategy, "
                 "dp_accounting's PLD accountant, its default calibration tolerance).")
  elif peer_python and os.path.exists(peer_python):
    tasks = [{"n": n, "min_sep": min_sep, "epsilon": eps, "delta": DELTA,
              "bands": c["bands"], "expected_participations": r["expected_participations"]}
             for (n, min_sep, eps), r in zip(configs, results) for c in r["candidates"]]
    start = time.perf_counter()
    peer_info, peer_rows = peer(peer_python, tasks, args.out_dir)
    peer_note = (f"jax_privacy side: {time.perf_counter() - start:.0f} s wall in all (jax "
                 f"{peer_info.get('jax')}, 500 optimizer steps per strategy, "
                 "dp_accounting's PLD accountant, its default calibration tolerance).")
  else:
    peer_note = "jax_privacy side not run (no peer interpreter given or found)."
  ours_seconds = sum(r["seconds"] for r in results)
  lines = [
      "## Number of bands with amplification: tff-mf against jax_privacy",
      "",
      "Command: `.venv/bin/python benchmarks/peer_jax_privacy_bands.py "
      "--peer-python /tmp/peer24/bin/python`",
      f"(Python {platform.python_version()}, 2-core x86_64 shared with other jobs). Peer: "
      "jax_privacy 2.3.0.dev0 (newest source), `BandMFConfig.default(num_bands=b, ...)`, "
      "`.calibrate(epsilon, delta)` and `.rmse` for every b, the least `rmse` chosen. "
      "jax_privacy's `__init__` does not import with the installable optax; the peer side "
      "sets the annotation-only alias `optax.ArrayTree = typing.Any` first.",
      "",
      f"Cyclic Poisson sampling given at cycle B with p = {SAMPLING_PROB:g} (E = p·n/B "
      "expected participations); each candidate b = 1, 2, …, B samples with cycle b at "
      f"p·b/B; δ = {DELTA:g}; banded Toeplitz C; z calibrated with the amplified banded "
      "analysis (arXiv:2306.08153, Thm 4); expected error z·rmse/E (jax_privacy's "
      f"`BandMFConfig.rmse`). tff-mf: z to relative tolerance {TOLERANCE:g}, "
      f"{ours_seconds:.0f} s wall in all (factorizations included, cold cache). {peer_note}",
      "",
      *table(configs, results, peer_rows),
      "",
      "Every candidate:",
      "",
      *candidates_table(configs, results, peer_rows),
      "",
  ]
  path = os.path.join(args.out_dir, "peer_bands.md")
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(lines))
  with open(os.path.join(args.out_dir, "peer_bands.json"), "w", encoding="utf-8") as f:
    json.dump({"ours": results, "peer": peer_rows, "peer_info": peer_info}, f, indent=1)
  print("\n".join(lines))
  return 0


if __name__ == "__main__":
  sys.exit(main())
