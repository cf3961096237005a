"""Fixed-bin balls-in-bins and random allocation: tff-mf's bounds, and opake's beside them.

Our side (``tff_mf.accounting.fixed_bin``, ``tff_mf.accounting.random_allocation``):

- fixed-bin balls-in-bins with the registry's BLT built for ``balls_in_bins --epochs 8``,
  z = 4, at n = 512 (b = 64) and n = 2048 (b = 256): the amplified bound, the unamplified
  Gaussian and the proven lower bound (``tff_mf.accounting.fixed_bin.lower_bound``), with wall times;
- C = I, b = 64, k = E = 4, z = σ = 2, δ = 1e-8 (issue 39's configuration): fixed bin, and
  random allocation before and after this change (before: each order's larger direction
  converted, and the PLD for C = a·I only; after: each direction at its own order, and the
  comparison pair's PLD for near-diagonal C), with a BLT and a near-diagonal banded C.

Peer side (benchmark-only interpreter, never imported by the library): opake 0.16.1's
Monte-Carlo PLD of the fixed-bin pair (its native ``bnb_mc_pld``, given the same b x b
Gram matrix of the bins and z; failure probability 1e-6). opake's Python package does not
import under Python 3.11 (a dataclass with ``__weakref__`` in its slots), so the peer side
loads its compiled module by path.

  .venv/bin/python benchmarks/peer_opake_fixed_bin.py [--peer-python /tmp/opake-venv/bin/python]
  peer_python benchmarks/peer_opake_fixed_bin.py --peer TASKS.json   (the peer side)

Writes ``benchmarks/results/fixed_bin.md`` and ``fixed_bin.json`` (or ``--out-dir``).
``--smoke``: our side only, at n = 64. ``--peer-rows FILE`` reads the JSON lines of an
earlier ``--peer`` run instead of running it.
"""

import argparse
import glob
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "benchmarks", "results")
DEFAULT_PEER_PYTHON = "/tmp/opake-venv/bin/python"
EPOCHS, Z = 8, 4.0
DELTAS = (1e-5, 1e-6)
SIZES = (512, 2048)
# opake's Monte-Carlo resolution (unresolved mass in δ units) per δ (its ε is ∞ where the
# resolution exceeds δ): 1e-6 takes 3.2e7 samples, 1e-7 ten times more (too long here).
PEER_RESOLUTION = {1e-5: 1e-6, 1e-6: 1e-6}


# ----------------------------------------------------------------------------- peer side


def peer_main(tasks_path):
  """Runs under opake's interpreter: one JSON line per task (its native module by path)."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  found = glob.glob(os.path.join(os.path.dirname(os.path.dirname(sys.executable)), "lib",
                                 "python*", "site-packages", "opake", "api", "accounting",
                                 "core", "opake_accounting*.so"))
  spec = importlib.util.spec_from_file_location("opake_accounting", found[0])
  native = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(native)
  with open(tasks_path) as f:
    tasks = json.load(f)
  for task in tasks:
    config = native.DiscretizationConfig(mc_resolution=task["resolution"])
    start = time.perf_counter()
    pld = native.bnb_mc_pld(task["gram"], task["bins"], task["z"], config)
    eps = pld.epsilon_at(task["delta"])
    print(json.dumps({"n": task["n"], "delta": task["delta"], "epsilon": eps,
                      "seconds": time.perf_counter() - start,
                      "samples": config.resolved_num_mc_samples,
                      "failure_probability": pld.mc_failure_probability}), flush=True)


# ----------------------------------------------------------------------------- our side


def _blt(n, k, cache_dir):
  """The registry's BLT built for ``balls_in_bins --epochs k``, as ``tff-mf account`` builds
  (and caches) it."""
  from tff_mf.factorization import cache  # pylint: disable=g-import-not-at-top
  command = [sys.executable, "-m", "tff_mf.cli", "account", "--mechanism", "blt",
             "--total_rounds", str(n), "--participation", "balls_in_bins", "--epochs", str(k),
             "--noise_multiplier", "1", "--delta", "1e-6", "--json"]
  if cache_dir:
    command += ["--cache_dir", cache_dir]
  out = subprocess.run(command, capture_output=True, text=True, check=True, cwd=REPO)
  return cache.load(json.loads(out.stdout)["cache_npz"]).c


def fixed_bin_rows(sizes, cache_dir):
  """Per (n, δ): ours, the unamplified bound, the lower bound, times; and the Gram."""
  from tff_mf import accounting  # pylint: disable=g-import-not-at-top
  from tff_mf.accounting import fixed_bin  # pylint: disable=g-import-not-at-top
  from tff_mf import participation  # pylint: disable=g-import-not-at-top
  rows, grams = [], {}
  for n in sizes:
    c = _blt(n, EPOCHS, cache_dir)
    m = fixed_bin.bin_means(c, EPOCHS)
    grams[n] = (m.T @ m).ravel().tolist()
    for delta in DELTAS:
      start = time.perf_counter()
      record = accounting.epsilon_for(c, participation.balls_in_bins(EPOCHS), Z, delta,
                                      "amplified_fixed_bin")
      seconds = time.perf_counter() - start
      start = time.perf_counter()
      lower = fixed_bin.lower_bound(c, EPOCHS, Z, delta)
      rows.append({"n": n, "bins": n // EPOCHS, "delta": delta, "epsilon": record["epsilon"],
                   "bound": record["bound"], "method": record["fixed_bin"]["method"],
                   "direction": record["fixed_bin"]["direction"],
                   "unamplified": record["unamplified_epsilon"], "lower": lower,
                   "seconds": seconds, "lower_seconds": time.perf_counter() - start,
                   "sensitivity": record["sensitivity"]})
  return rows, grams


def allocation_rows(n, k, z, delta, cache_dir):
  """Random allocation before / after, and fixed bin, for C = I, BLT and a 2-band C."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from tff_mf.accounting import fixed_bin  # pylint: disable=g-import-not-at-top
  from tff_mf import participation  # pylint: disable=g-import-not-at-top
  from tff_mf.accounting import random_allocation as ra  # pylint: disable=g-import-not-at-top
  blt = _blt(n, k, cache_dir)
  banded = np.eye(n) + 0.05 * np.eye(n, k=-1)
  rows = []
  for name, c in (("I", np.eye(n)), ("BLT (built for balls_in_bins)", blt),
                  ("I + 0.05 (subdiagonal)", banded / np.max(np.linalg.norm(banded, axis=0)))):
    sens = participation.sensitivity(c, participation.random_allocation(k))
    start = time.perf_counter()
    after = ra.epsilon(c, k, z, delta, sensitivity=sens)
    seconds = time.perf_counter() - start
    joint = ra.best_order(lambda a, c=c, sens=sens: ra.rdp(c, k, z, sensitivity=sens,
                                                           orders=a), delta)["epsilon"]
    before = joint
    if name == "I":  # the PLD of C = a·I was computed before too
      before = min(joint, after["pld"]["epsilon"])
    fixed = fixed_bin.epsilon(c, k, z, delta, sensitivity=participation.sensitivity(
        c, participation.balls_in_bins(k)))
    rows.append({"c": name, "before": before, "renyi_before": joint, "after": after["epsilon"],
                 "renyi_after": after["renyi_epsilon"], "method": after["method"],
                 "seconds": seconds, "fixed_bin": fixed["epsilon"],
                 "fixed_bin_method": fixed["method"]})
  return rows


def _peer(grams, args):
  if args.peer_rows:
    with open(args.peer_rows) as f:
      return [json.loads(line) for line in f if line.strip()]
  if not args.peer_python or not os.path.exists(args.peer_python):
    return []
  tasks = [{"n": n, "bins": n // EPOCHS, "z": Z, "delta": delta, "gram": grams[n],
            "resolution": PEER_RESOLUTION[delta]} for n in sorted(grams) if n <= 512
           for delta in DELTAS]
  with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
    json.dump(tasks, f)
  result = subprocess.run([args.peer_python, os.path.abspath(__file__), "--peer", f.name],
                          capture_output=True, text=True, check=False)
  os.unlink(f.name)
  return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def _load():
  return os.getloadavg()[0]


def render(rows, peer, alloc, alloc_config, smoke):
  peer_by = {(p["n"], p["delta"]): p for p in peer}
  lines = [
      "## Fixed-bin balls-in-bins and random allocation (issue 39, items 2 and 3)", "",
      "Script: `benchmarks/peer_opake_fixed_bin.py` (module docstring: both sides). "
      f"Machine: the shared 2-core x86_64 CPU ({platform.python_version()}); 1-minute load "
      f"average at the end: {_load():.1f}. Every ε of ours is a proven upper bound "
      "(`tff_mf.accounting.fixed_bin`, derivation in docs/mechanisms.md); \"lower\" is a proven lower "
      "bound (`tff_mf.accounting.fixed_bin.lower_bound`). opake's column is its Monte-Carlo PLD "
      "(`bnb_mc_pld`, opake 0.16.1, failure probability 1e-6) of the same pair: the same "
      "b x b Gram matrix of the bins and z, run here in its own interpreter.", "",
      f"Fixed bin, BLT built for `balls_in_bins --epochs {EPOCHS}`, z = {Z:g}:", "",
      "| n | b | δ | ours | method | unamplified | lower | ours s | lower s | opake (MC) | "
      "opake s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    p = peer_by.get((r["n"], r["delta"]))
    peer_cells = (f"{p['epsilon']:.3f} | {p['seconds']:.0f}" if p else
                  "not run (n = 2048: 25 min+ in issue 39) | –" if r["n"] > 512 else
                  "not run | –")
    lines.append(f"| {r['n']} | {r['bins']} | {r['delta']:g} | {r['epsilon']:.3f} | "
                 f"{r['method']}, {r['direction']} | {r['unamplified']:.3f} | "
                 f"{r['lower']:.3f} | {r['seconds']:.1f} | {r['lower_seconds']:.1f} | "
                 f"{peer_cells} |")
  lines += [
      "", "How to read it. Ours is deterministic; opake's is an estimate that holds with "
      "probability 1 − 1e-6 and carries its Monte-Carlo resolution as extra δ (1e-6 here: "
      "at δ = 1e-6 that is δ itself, hence its larger ε there; a resolution of 1e-7 takes "
      "3.4e8 samples, too long for this machine). At δ = 1e-5, where it resolves, opake's "
      "estimate lies between our lower and upper bounds, and ours is within "
      + ", ".join(f"{100 * (r['epsilon'] / peer_by[(r['n'], r['delta'])]['epsilon'] - 1):.0f}%"
                  for r in rows if (r["n"], r["delta"]) in peer_by and r["delta"] == 1e-5)
      + " of it. Issue 39 quotes opake's 3.477 at n = 512 (its BLT; δ not stated): our bound "
      "at δ = 1e-6 is below it. At n = 2048 ours takes about a second, where opake did not "
      "finish in 25 minutes (issue 39). Our binding direction is add (Jensen's bound), and "
      "the remove direction (Hoeffding's decoupling) is a few percent below it."]
  n, k, z, delta = alloc_config
  lines += [
      "", f"Random allocation (and fixed bin) at n = {n}, b = {n // k}, k = E = {k}, z = σ = "
      f"{z:g}, δ = {delta:g}. Before: each order's larger direction converted, the PLD for "
      "C = a·I only. After: each direction converted at its own order, and for "
      "near-diagonal C the PLD of the comparison pair (Kahane's inequality).", "",
      "| C | random allocation before | after | method | Rényi alone before → after | "
      "after s | fixed bin |", "|---|---|---|---|---|---|---|"]
  for r in alloc:
    lines.append(f"| {r['c']} | {r['before']:.4f} | {r['after']:.4f} | {r['method']} | "
                 f"{r['renyi_before']:.4f} → {r['renyi_after']:.4f} | {r['seconds']:.1f} | "
                 f"{r['fixed_bin']:.4f} ({r['fixed_bin_method']}) |")
  if smoke:
    lines += ["", "(smoke run: small sizes, not the figures of record)"]
  return "\n".join(lines) + "\n"


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--peer", metavar="TASKS.json", help="run the peer side (opake's "
                      "interpreter) on these tasks")
  parser.add_argument("--peer-python", default=DEFAULT_PEER_PYTHON)
  parser.add_argument("--peer-rows", help="JSON lines of an earlier --peer run")
  parser.add_argument("--out-dir", default=RESULTS)
  parser.add_argument("--cache-dir", default=None)
  parser.add_argument("--smoke", action="store_true")
  args = parser.parse_args(argv)
  if args.peer:
    peer_main(args.peer)
    return 0
  sys.path.insert(0, REPO)
  from benchmarks import bench_harness  # pylint: disable=g-import-not-at-top
  sizes = (64,) if args.smoke else SIZES
  cache_dir = args.cache_dir or (os.path.join(args.out_dir, "cache") if args.smoke else None)
  rows, grams = fixed_bin_rows(sizes, cache_dir)
  peer = [] if args.smoke else _peer(grams, args)
  alloc_config = (16, 4, 2.0, 1e-8) if args.smoke else (256, 4, 2.0, 1e-8)
  alloc = allocation_rows(*alloc_config, cache_dir)
  text = render(rows, peer, alloc, alloc_config, args.smoke)
  bench_harness.write_section(args.out_dir, "fixed_bin", text,
                              {"fixed_bin": rows, "peer": peer, "random_allocation": alloc})
  return 0


if __name__ == "__main__":
  sys.exit(main())
