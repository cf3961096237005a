"""Monte-Carlo accounting with a proof: tff-mf against jax_privacy, side by side.

Both sides sample the privacy loss of the same dominating pair, fixed-bin balls-in-bins
(b bins, each user in every round of one secret bin) with a banded Toeplitz C ≥ 0,
jax_privacy's coverage (``experimental/monte_carlo``): N(0, z² I) vs the mean over bins j
of N(C 1_{S_j}, z² I), both directions, N draws each.

- tff-mf: ``tff_mf.accounting.monte_carlo.epsilon`` (Gram route: a draw costs O(b²) after one
  O(n·bands·b) Gram), ε at δ whose δ is bounded by Chernoff-Hoeffding at failure
  probability β, and its point estimate (sample means alone).
- jax_privacy (newest source, benchmark-only interpreter, ``--peer-python``):
  ``sample_generation.get_privacy_loss_sample`` with ``BallsInBinsSampling`` (a draw
  costs O(n·b)), its empirical δ by ``delta_calculation.delta_from_epsilon_and_samples``;
  from its draws: the point ε and the two-sided band [ε_lo, ε_hi] of ε where the
  Chernoff-Hoeffding interval of δ at failure β per side meets δ (the peer's confidence
  band), and its reportable ε (``get_base_delta``: the smallest ε whose δ̂ ≤ base δ).
  The two cyclic-Poisson pairs differ (jax_privacy mixes over the secret class, tff-mf
  takes the worst class), so only balls-in-bins is compared.

  .venv/bin/python benchmarks/bench_monte_carlo.py [--peer-python /tmp/peer-audit/bin/python]
  peer_python benchmarks/bench_monte_carlo.py --peer TASKS.json   (the peer side)

Writes ``benchmarks/results/monte_carlo.md`` (or ``--out-dir``); ``--smoke``: our side only,
tiny.
"""

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "benchmarks", "results")
DEFAULT_PEER_PYTHON = "/tmp/peer-audit/bin/python"
BETA = 1e-3
# (n, bins b, bands, z, δ, draws N per direction)
CONFIGS = ((256, 16, 4, 4.0, 1e-3, 200_000), (2048, 64, 16, 6.0, 1e-3, 200_000),
           (512, 64, 8, 3.0, 1e-4, 1_000_000))
SMOKE = ((32, 4, 2, 3.0, 1e-2, 5_000),)


def toeplitz_column(bands):
  """The first column's non-zeros of the banded Toeplitz C: 0.7^i, unit norm."""
  col = [0.7 ** i for i in range(bands)]
  norm = math.sqrt(sum(v * v for v in col))
  return [v / norm for v in col]


def _kl(a, m):
  """kl(a ‖ m) of Bernoulli means (the peer side's own copy: it imports no tff_mf)."""
  out = 0.0
  for x, y in ((a, m), (1.0 - a, 1.0 - m)):
    if x > 0:
      out += x * math.log(x / y)
  return out


def _bound(mean, count, beta, upper):
  """The Chernoff-Hoeffding bound on a [0, 1] mean at failure ``beta``, one side."""
  lo, hi = (mean, 1.0) if upper else (0.0, mean)
  budget = math.log(1.0 / beta) / count
  for _ in range(200):
    mid = 0.5 * (lo + hi)
    inside = _kl(mean, mid) <= budget
    if inside == upper:
      lo = mid
    else:
      hi = mid
  return hi if upper else lo


def _smallest_eps(passes, hi=60.0):
  lo = 0.0
  if passes(0.0):
    return 0.0
  for _ in range(60):
    mid = 0.5 * (lo + hi)
    if passes(mid):
      hi = mid
    else:
      lo = mid
  return hi


# ----------------------------------------------------------------------------- peer side


def peer_main(tasks_path):
  """Runs under jax_privacy's interpreter: one JSON line per task."""
  # pylint: disable=g-import-not-at-top
  import typing
  import optax
  if not hasattr(optax, "ArrayTree"):
    optax.ArrayTree = typing.Any  # an annotation-only alias the newest jax_privacy expects
  import numpy as np
  from jax_privacy import batch_selection
  from jax_privacy.experimental.monte_carlo import delta_calculation
  from jax_privacy.experimental.monte_carlo import sample_generation
  # pylint: enable=g-import-not-at-top
  with open(tasks_path) as f:
    tasks = json.load(f)
  for task in tasks:
    n, b, z, delta, count = task["n"], task["bins"], task["z"], task["delta"], task["samples"]
    col = np.array(task["column"])
    strategy = batch_selection.BallsInBinsSampling(iterations=n, cycle_length=b)
    start = time.perf_counter()
    sets = []
    for positive in (True, False):
      parts, left, seed = [], count, 0
      while left:  # blocks of at most 8 MB of draws (the sample is n x draws)
        size = min(left, max(1, 1_000_000 // n))
        loss, _ = sample_generation.get_privacy_loss_sample(
            strategy, z, col, seed=task["seed"] * 1000 + seed * 2 + positive,
            positive_sample=positive, num_samples=size)
        parts.append(loss)
        left -= size
        seed += 1
      sets.append(np.concatenate(parts))
    sampled = time.perf_counter() - start

    def mean(eps):
      return max(delta_calculation.delta_from_epsilon_and_samples(eps, s) for s in sets)

    point = _smallest_eps(lambda e: mean(e) <= delta)
    seconds = time.perf_counter() - start  # its draws and one ε search (as ours)
    eps_hi = _smallest_eps(lambda e: max(_bound(delta_calculation.delta_from_epsilon_and_samples(
        e, s), count, BETA / 2, True) for s in sets) <= delta)
    eps_lo = _smallest_eps(lambda e: max(_bound(delta_calculation.delta_from_epsilon_and_samples(
        e, s), count, BETA / 2, False) for s in sets) <= delta)
    try:
      base = delta_calculation.get_base_delta(count, delta)
      reportable = _smallest_eps(lambda e: mean(e) <= base)
    except ValueError as e:
      base, reportable = None, f"none: {e}"
    print(json.dumps({"id": task["id"], "point": point, "band": [eps_lo, eps_hi],
                      "base_delta": base, "reportable": reportable,
                      "sample_seconds": sampled, "seconds": seconds}), flush=True)


# ----------------------------------------------------------------------------- our side


def ours(config, seed):
  """Our ε bound, point estimate and seconds for one configuration."""
  # pylint: disable=g-import-not-at-top
  import numpy as np
  from tff_mf.accounting import monte_carlo
  from tff_mf import participation
  # pylint: enable=g-import-not-at-top
  n, b, bands, z, delta, count = config
  col = toeplitz_column(bands)
  c = sum(np.diag(np.full(n - i, v), -i) for i, v in enumerate(col))
  schema = participation.Participation("balls_in_bins", epochs=n // b)
  start = time.perf_counter()
  found = monte_carlo.epsilon(c, schema, z, delta, samples=count, failure_probability=BETA,
                              seed=seed)
  return {"epsilon": found["epsilon"], "point": found["point_estimate"],
          "seconds": time.perf_counter() - start}


def _tasks(configs, seed):
  return [{"id": i, "n": n, "bins": b, "z": z, "delta": d, "samples": count,
           "column": toeplitz_column(bands), "seed": seed}
          for i, (n, b, bands, z, d, count) in enumerate(configs)]


def run_peer(peer_python, tasks):
  import tempfile  # pylint: disable=g-import-not-at-top
  with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
    json.dump(tasks, f)
    path = f.name
  env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
  env.update(JAX_PLATFORMS="cpu", OMP_NUM_THREADS="1")
  out = subprocess.run([peer_python, os.path.abspath(__file__), "--peer", path],
                       capture_output=True, text=True, env=env, check=False)
  os.unlink(path)
  rows = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
  if out.returncode != 0 or len(rows) != len(tasks):
    raise SystemExit(f"bench_monte_carlo: the peer failed: {out.stderr.strip()[-800:]}")
  return {r["id"]: r for r in rows}


def _version(peer_python):
  out = subprocess.run([peer_python, "-m", "pip", "show", "jax_privacy"], capture_output=True,
                       text=True, check=False).stdout
  return next((l.split(":", 1)[1].strip() for l in out.splitlines()
               if l.startswith("Version")), "?")


def report(configs, mine, peer, version):
  lines = ["## Monte-Carlo accounting with a proof: tff-mf beside jax_privacy", "",
           "Fixed-bin balls-in-bins, banded Toeplitz C (first column 0.7^i, unit norm), the same "
           "dominating pair on both sides, N draws per direction each. Ours: epsilon whose delta "
           f"is bounded by Chernoff-Hoeffding at failure probability beta = {BETA:g} "
           "(tff_mf.accounting.monte_carlo). Peer: jax_privacy "
           f"{version} experimental/monte_carlo, its point epsilon and its band [lo, hi] "
           f"(the two-sided Chernoff-Hoeffding interval of delta, beta/2 per side, from its "
           "draws), and its reportable epsilon (get_base_delta: delta-hat below the base delta). "
           f"{platform.processor() or platform.machine()}, 2 cores, shared.", "",
           "| n | bins | bands | z | delta | N | ours: epsilon (holds w.p. >= 1 - beta) | ours: point | "
           "peer: point | peer band | our point in band | peer reportable | ours <= reportable | "
           "ours s | peer s | speed-up |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for i, (n, b, bands, z, d, count) in enumerate(configs):
    m = mine[i]
    row = [n, b, bands, f"{z:g}", f"{d:g}", count, f"{m['epsilon']:.4f}", f"{m['point']:.4f}"]
    if i in peer:
      p = peer[i]
      lo, hi = p["band"]
      inside = "yes" if lo <= m["point"] <= hi else "no"
      rep = p["reportable"]
      below = ("yes" if m["epsilon"] <= rep else "no") if isinstance(rep, float) else "-"
      row += [f"{p['point']:.4f}", f"[{lo:.4f}, {hi:.4f}]", inside,
              f"{rep:.4f}" if isinstance(rep, float) else rep, below, f"{m['seconds']:.2f}",
              f"{p['seconds']:.2f}", f"{p['seconds'] / m['seconds']:.1f}x"]
    else:
      row += ["-"] * 5 + [f"{m['seconds']:.2f}", "-", "-"]
    lines.append("| " + " | ".join(str(x) for x in row) + " |")
  lines += ["", "Seconds: the draws of both directions and one epsilon search on each side "
            "(ours: the bound's and the point's). Our point estimate and the peer's estimate "
            "the same epsilon: ours lies in the peer's band. Our bound (the upper end of a "
            "band like the peer's, from our own draws) is compared with the peer's reportable "
            "epsilon; ours states its failure probability beside epsilon, the peer folds it "
            "into delta (arXiv:2602.09338, App A).", ""]
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--peer", default=None, metavar="TASKS.json",
                      help="run the peer side (in jax_privacy's interpreter)")
  parser.add_argument("--peer-python", default=DEFAULT_PEER_PYTHON)
  parser.add_argument("--out-dir", default=RESULTS)
  parser.add_argument("--seed", type=int, default=0, help="pinned draws on both sides")
  parser.add_argument("--smoke", action="store_true", help="our side only, tiny")
  args = parser.parse_args(argv)
  if args.peer:
    peer_main(args.peer)
    return 0
  sys.path.insert(0, REPO)
  configs = SMOKE if args.smoke else CONFIGS
  mine = {i: ours(config, args.seed) for i, config in enumerate(configs)}
  peer, version = {}, "-"
  if not args.smoke:
    peer = run_peer(args.peer_python, _tasks(configs, args.seed))
    version = _version(args.peer_python)
  sys.path.insert(0, os.path.join(REPO, "benchmarks"))
  import bench_harness  # pylint: disable=g-import-not-at-top
  bench_harness.write_section(args.out_dir, "monte_carlo", report(configs, mine, peer, version),
                              {"configs": configs, "ours": mine, "peer": peer,
                               "beta": BETA, "peer_version": version})
  return 0


if __name__ == "__main__":
  sys.exit(main())
