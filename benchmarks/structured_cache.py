"""Benchmark: structured banded + low-rank mechanism, cache-hit latency, demo runtime.

1. √L of the structured approximation (Denisov App H / McMahan Sec 4.2) against
   the optimum, the tree (Honaker online) and the papers' "Efficient" column,
   with fit times.
2. Per-round noise cost at round n: Denisov Algorithm 3 (O((h + r)·d)) against
   the dense row B[n, :]·Z (O(n·d)) in the same run.
3. `tff-mf factorize --json` wall time on a cache hit (interpreter start
   included) against a bare `python -c "import numpy, scipy.linalg"`.
4. `tff-mf demo` cold (empty cache) and warm.

Writes ``benchmarks/results/structured_cache.md`` and ``structured_cache.png``.
Usage: ``.venv/bin/python benchmarks/structured_cache.py [--full]`` (``--full``
adds n = 2048 and 4096 to part 1).
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from tff_mf import factorization as fz  # pylint: disable=wrong-import-position
from tff_mf.families import dense  # pylint: disable=wrong-import-position
from tff_mf import structured  # pylint: disable=wrong-import-position
from tff_mf import tree  # pylint: disable=wrong-import-position
from tff_mf import workloads  # pylint: disable=wrong-import-position

# McMahan et al. Table 1 (002_…) = Denisov et al. Table 2 (000_…): n -> (h, r, optimal, efficient).
PAPER = {256: (4, 4, 40.4, 40.4), 512: (5, 4, 62.0, 62.2), 1024: (5, 5, 94.6, 95.5),
         2048: (6, 5, 143.6, 145.8), 4096: (6, 6, 217.3, 224.0)}
MACHINE = "2-core x86_64 CPU, 24 GB, no GPU"


def part_structured(sizes):
  rows = []
  for n in sizes:
    h, r, paper_opt, paper_eff = PAPER[n]
    a = workloads.prefix_sum(n)
    start = time.perf_counter()
    opt = dense.solve(a)
    opt_seconds = time.perf_counter() - start
    start = time.perf_counter()
    res = structured.fit(a, h, r, b_opt=opt.b)
    fit_seconds = time.perf_counter() - start
    online = fz.sqrt_loss(tree.honaker_online_decoder(n), tree.tree_encoder(n))
    rows.append({"n": n, "h": h, "r": r, "honaker_online": online,
                 "optimal": fz.sqrt_loss(opt.b, opt.c), "structured": fz.sqrt_loss(res.b, res.c),
                 "paper_optimal": paper_opt, "paper_efficient": paper_eff,
                 "optimal_seconds": opt_seconds, "fit_seconds": fit_seconds,
                 "als_iterations": res.info["als_iterations"],
                 "approximation_error": res.info["approximation_error"], "result": res})
    print(f"n={n}: structured {rows[-1]['structured']:.2f} (paper {paper_eff}), optimal "
          f"{rows[-1]['optimal']:.2f}", flush=True)
  return rows


def part_noise_cost(row, d=20_000, repeats=20):
  """Time of round n's noise: Algorithm 3 step vs the dense row B[n, :]·Z."""
  res = row["result"]
  n = res.n
  rng = np.random.default_rng(0)
  z = rng.standard_normal((n, d))
  stream = res.noise_stream(d)
  for i in range(n - 1):
    stream.next(z[i])
  # Time the last round of the stream (restore state for each repeat).
  saved = (stream._recent.copy(), stream._beta.copy(), stream.round)  # pylint: disable=protected-access
  times = []
  for _ in range(repeats):
    stream._recent[:], stream._beta[:], stream.round = saved[0], saved[1], saved[2]  # pylint: disable=protected-access
    start = time.perf_counter()
    y = stream.next(z[n - 1])
    times.append(time.perf_counter() - start)
  dense_times = []
  for _ in range(repeats):
    start = time.perf_counter()
    y_dense = res.b[n - 1] @ z
    dense_times.append(time.perf_counter() - start)
  assert np.allclose(y, y_dense, atol=1e-8)
  return {"n": n, "d": d, "h": res.bands, "r": res.rank,
          "stream_ms": 1e3 * float(np.median(times)), "dense_ms": 1e3 * float(np.median(dense_times))}


def _cli(args, cache_dir):
  env = dict(os.environ, TFF_MF_CACHE=cache_dir)
  start = time.perf_counter()
  out = subprocess.run([sys.executable, "-m", "tff_mf.cli", *args], cwd=REPO, env=env,
                       capture_output=True, text=True, check=True)
  return time.perf_counter() - start, out.stdout


def part_hit_latency(cache_dir, repeats=5):
  rows = []
  base = []
  for _ in range(repeats):
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import numpy, scipy.linalg"], check=True)
    base.append(time.perf_counter() - start)
  baseline = float(np.median(base))
  for workload, n in (("prefix_sum", 512), ("momentum", 512), ("prefix_sum", 1024)):
    args = ["factorize", "--workload", workload, "--strategy", "optimal", "--n", str(n), "--json"]
    miss_seconds, out = _cli(args, cache_dir)
    assert json.loads(out)["cache_hit"] is False
    hits = []
    for _ in range(repeats):
      seconds, out = _cli(args, cache_dir)
      assert json.loads(out)["cache_hit"] is True
      hits.append(seconds)
    rows.append({"workload": workload, "n": n, "miss_seconds": miss_seconds,
                 "hit_seconds": float(np.median(hits)), "baseline_seconds": baseline})
    print(f"{workload} n={n}: miss {miss_seconds:.2f} s, hit {rows[-1]['hit_seconds']:.2f} s "
          f"(bare interpreter {baseline:.2f} s)", flush=True)
  return rows


def part_demo(cache_dir, output_dir):
  out = {}
  for label in ("cold", "warm"):
    seconds, _ = _cli(["demo", "--output-dir", output_dir, "--cache-dir", cache_dir], cache_dir)
    out[label] = seconds
    print(f"demo {label}: {seconds:.1f} s", flush=True)
  return out


def write_png(rows, path):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(7, 4.5))
  ns = [row["n"] for row in rows]
  for key, label, marker in (("honaker_online", "Honaker online (tree)", "o"),
                             ("structured", "structured h+r=log₂n (ours)", "s"),
                             ("paper_efficient", "Efficient (McMahan Table 1)", "x"),
                             ("optimal", "optimal (ours)", "^")):
    ax.plot(ns, [row[key] for row in rows], marker=marker, label=label)
  ax.set_xscale("log", base=2)
  ax.set_xlabel("n")
  ax.set_ylabel("√L")
  ax.set_title("Prefix sums: structured banded + low-rank vs optimal and tree")
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--full", action="store_true", help="add n = 2048, 4096 to part 1")
  parser.add_argument("--skip-cli", action="store_true", help="skip parts 3 and 4")
  args = parser.parse_args()
  sizes = [256, 512, 1024] + ([2048, 4096] if args.full else [])
  rows = part_structured(sizes)
  costs = [part_noise_cost(row) for row in rows]
  load = os.getloadavg()[0]
  results_dir = os.path.join(REPO, "benchmarks", "results")
  os.makedirs(results_dir, exist_ok=True)
  png = os.path.join(results_dir, "structured_cache.png")
  write_png(rows, png)
  lines = ["## Structured mechanism, cache hits and the demo", "",
           f"Command: `.venv/bin/python benchmarks/structured_cache.py{' --full' if args.full else ''}`"
           f" — machine: {MACHINE} ({platform.machine()}, Python {platform.python_version()}); "
           f"1-minute load average at the end of part 1: {load:.1f} (other jobs inflate wall times).",
           "",
           "### √L of the banded + low-rank approximation (Denisov App H, McMahan Table 1)", "",
           "| n | (h, r) | Honaker online | optimal | structured | paper Efficient | structured / optimal "
           "| ‖B̂−B*‖/‖B*‖ | optimal s | ALS fit s |",
           "|---|---|---|---|---|---|---|---|---|---|"]
  for row in rows:
    lines.append(
        f"| {row['n']} | ({row['h']}, {row['r']}) | {row['honaker_online']:.1f} | {row['optimal']:.2f} "
        f"| {row['structured']:.2f} | {row['paper_efficient']} | "
        f"{row['structured'] / row['optimal']:.4f} | {row['approximation_error']:.3f} | "
        f"{row['optimal_seconds']:.1f} | {row['fit_seconds']:.1f} |")
  lines += ["", "### Noise for the last round n (d columns): Algorithm 3 vs dense B[n, :]·Z", "",
            "| n | d | (h, r) | Algorithm 3 ms | dense row ms | speed-up |", "|---|---|---|---|---|---|"]
  for c in costs:
    lines.append(f"| {c['n']} | {c['d']} | ({c['h']}, {c['r']}) | {c['stream_ms']:.2f} | "
                 f"{c['dense_ms']:.2f} | {c['dense_ms'] / c['stream_ms']:.1f}× |")
  if not args.skip_cli:
    with tempfile.TemporaryDirectory() as tmp:
      hits = part_hit_latency(os.path.join(tmp, "cache"))
      demo = part_demo(os.path.join(tmp, "demo_cache"), os.path.join(tmp, "demo_out"))
    lines += ["", "### `tff-mf factorize --strategy optimal --json`: cache miss vs hit (wall, interpreter "
              "start included)", "",
              "| workload | n | miss s | hit s (median of 5) | bare `python -c 'import numpy, scipy.linalg'` s |",
              "|---|---|---|---|---|"]
    for h in hits:
      lines.append(f"| {h['workload']} | {h['n']} | {h['miss_seconds']:.2f} | {h['hit_seconds']:.2f} | "
                   f"{h['baseline_seconds']:.2f} |")
    lines += ["", f"### `tff-mf demo` (n = 512): cold cache {demo['cold']:.1f} s, warm cache "
              f"{demo['warm']:.1f} s"]
  lines += ["", f"![structured vs optimal](structured_cache.png)", ""]
  with open(os.path.join(results_dir, "structured_cache.md"), "w", encoding="utf-8") as f:
    f.write("\n".join(lines))
  print("\n".join(lines))


if __name__ == "__main__":
  main()
