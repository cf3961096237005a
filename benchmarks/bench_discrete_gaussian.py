"""The discrete Gaussian's cost per round and its noise variance at the paper model's size.

Usage: .venv/bin/python benchmarks/bench_discrete_gaussian.py [--rounds 3] [--smoke]

At d = 4,050,748 (the papers' StackOverflow LSTM), n = 16 rounds: wall seconds of one round
(median of ``--rounds`` after one) of the numpy stream and of the TF query, each with the
continuous Gaussian beside it in the same run:

- numpy: the continuous noise row Z (Philox-4×64 normals) through ``streams.independent`` /
  ``streams.lower_banded_inverse``, against ``discrete_gaussian.IntegerRelease.step`` (the
  integer release and s = C⁻¹·Y/γ);
- TF: ``MatrixFactorizationQuery.get_noised_result`` (gaussian via the seeded query, banded
  via ``LinearNoise``) against ``DiscreteGaussianQuery.get_noised_result``,

for ``gaussian`` (C = I) and ``banded`` with 4 bands. The variance check: the integer noise
N = Y − round(γ·C·x) of the numpy stream and the TF sampler's draws, against Var N_ℤ(0, σ²)
(Canonne, Kamath, Steinke 2020, arXiv:2004.00010), with the standard error of d draws.
Writes benchmarks/results/discrete_gaussian.md (and .json).
"""

import argparse
import os
import platform
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
COMMAND = ".venv/bin/python benchmarks/bench_discrete_gaussian.py"
D = 4_050_748
N = 16
BANDS = 4
Z = 1.0
CLIENTS = 100


def _timed(step, rounds):
  step()
  times = []
  for _ in range(rounds):
    start = time.perf_counter()
    step()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def _resolved(name, noise_distribution):
  from tff_mf import mechanisms  # pylint: disable=g-import-not-at-top
  from tff_mf import spec as spec_lib  # pylint: disable=g-import-not-at-top
  params = {"bands": BANDS} if name == "banded" else {}
  spec = spec_lib.MechanismSpec.from_args(name, total_rounds=N, clients_per_round=CLIENTS,
                                          clip_norm=1.0, noise_multiplier=Z,
                                          noise_distribution=noise_distribution, **params)
  return mechanisms.build(spec)[0]


def measure_numpy(d, rounds):
  """Seconds per round of the numpy stream, continuous and discrete; the discrete variance."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from tff_mf.noise import discrete_gaussian as dg  # pylint: disable=g-import-not-at-top
  from tff_mf.noise import streams  # pylint: disable=g-import-not-at-top
  out = {}
  x = np.random.default_rng(0).normal(size=d) * 0.01
  for name in ("gaussian", "banded"):
    resolved = _resolved(name, "discrete_gaussian")
    c = resolved.encoder
    stream = (streams.independent(N) if name == "gaussian" else
              streams.lower_banded_inverse(dg.band_coefficients(c), N))
    rng = np.random.Generator(np.random.Philox(key=[1, 2]))
    state = {"s": np.zeros((stream.k, d)), "i": 0}

    def continuous(stream=stream, rng=rng, state=state):
      y, state["s"] = stream.step(state["s"], rng.standard_normal(d), state["i"] % N)
      return x + Z * y

    bands = dg.band_coefficients(c).shape[1]
    plan = dg.plan(sensitivity=resolved.sensitivity, clip_norm=1.0, noise_multiplier=Z,
                   model_size=d, bands=bands, participations=1, n=N,
                   records=dg.records_covered(CLIENTS), encoder=c)  # as build_mechanism plans
    release = dg.IntegerRelease(c, plan, (3, 4))

    def discrete(release=release):
      if release.round_index == N:
        release.__init__(c, plan, (3, 4))
      return release.step(x)

    out[f"numpy_{name}_gaussian"] = _timed(continuous, rounds)
    out[f"numpy_{name}_discrete"] = _timed(discrete, rounds)
    out[f"{name}_granularity"] = plan.granularity
    out[f"{name}_inflation"] = plan.inflation
    if name == "gaussian":  # C = I: N = Y − round(γ·x) of one round
      _, y = dg.IntegerRelease(c, plan, (5, 6)).step(x)
      noise = (y - np.rint(plan.granularity * x)).astype(np.float64)
      out["sigma"] = plan.sigma
      out["numpy_variance_ratio"] = float(np.mean(noise**2) / dg.variance(plan.sigma))
      out["variance_se"] = float(np.sqrt(2.0 / d))
  return out


def measure_tf(d, rounds):
  """Seconds per round of the TF queries, continuous and discrete; the TF sampler's variance."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tff_mf import spec as spec_lib  # pylint: disable=g-import-not-at-top
  from tff_mf.noise import discrete_gaussian as dg  # pylint: disable=g-import-not-at-top
  from tff_mf.tf import aggregators  # pylint: disable=g-import-not-at-top
  from tff_mf.tf import noise as noise_lib  # pylint: disable=g-import-not-at-top
  out = {}
  specs = [tf.TensorSpec([d], tf.float32)]
  record = [tf.constant(np.random.default_rng(0).normal(size=d).astype(np.float32) * 0.01)]
  for name in ("gaussian", "banded"):
    for dist in ("gaussian", "discrete_gaussian"):
      params = {"bands": BANDS} if name == "banded" else {}
      setup = aggregators.build_mechanism(spec_lib.MechanismSpec.from_args(
          name, total_rounds=N, clients_per_round=CLIENTS, clip_norm=1.0, noise_multiplier=Z,
          noise_distribution=dist, **params), noise_seed=7)
      query = setup.aggregation_factory.dp_query(specs)._numerator
      state = {"s": query.initial_global_state(), "n": 0}
      noised = tf.function(query.get_noised_result, autograph=False)
      sample = query.accumulate_record(query.derive_sample_params(state["s"]),
                                       query.initial_sample_state(specs), record)

      def step(query=query, state=state, noised=noised, sample=sample):
        if state["n"] == N:
          state["s"], state["n"] = query.initial_global_state(), 0
        result, state["s"], _ = noised(sample, state["s"])
        state["n"] += 1
        return result[0].numpy()

      out[f"tf_{name}_{dist}"] = _timed(step, rounds)
  sigma = out_sigma = 1000.5
  draws = noise_lib.discrete_gaussian_row(tf.constant([8, 9], tf.int64), tf.constant(0), d,
                                          sigma).numpy().astype(np.float64)
  out["tf_sigma"] = out_sigma
  out["tf_variance_ratio"] = float(np.mean(draws**2) / dg.variance(sigma))
  return out


def section(result, args, load) -> str:
  lines = [
      "## Discrete Gaussian: cost per round and noise variance at the paper model's size", "",
      f"Command: `{COMMAND}` — machine: 2-core {platform.machine()} CPU, no GPU; 1-minute "
      f"load average {load[0]:.1f} at the start, {load[1]:.1f} at the end.", "",
      f"Wall seconds of one round at d = {result['d']:,} (median of {args.rounds} rounds after "
      f"one), n = {N}, z = {Z}, against the continuous Gaussian in the same run. The discrete "
      "Gaussian releases Y = round(γ·C·x) + N_ℤ(0, σ²) and returns s = C⁻¹·Y/γ (Canonne, "
      "Kamath, Steinke 2020, arXiv:2004.00010; docs/mechanisms.md); γ is the default for "
      f"this d (gaussian {result['gaussian_granularity']:g}, rounding inflation "
      f"{100 * result['gaussian_inflation']:.3f}%; banded {result['banded_granularity']:g}, "
      f"{100 * result['banded_inflation']:.3f}%).", "",
      "| layer | mechanism | continuous s per round | discrete s per round | discrete / continuous |",
      "|---|---|---|---|---|"]
  for layer in ("numpy", "tf"):
    for name in ("gaussian", "banded"):
      cont = result[f"{layer}_{name}_gaussian"]
      disc = result[f"{layer}_{name}_discrete" if layer == "numpy" else
                    f"{layer}_{name}_discrete_gaussian"]
      label = "numpy stream" if layer == "numpy" else "TF query"
      mech = "gaussian (C = I)" if name == "gaussian" else f"banded (b = {BANDS})"
      lines.append(f"| {label} | {mech} | {cont:.3f} | {disc:.3f} | **{disc / cont:.2f}** |")
  se = result["variance_se"]
  lines += ["", (
      f"Variance: the numpy stream's integer noise N = Y − round(γ·x) (C = I, σ = "
      f"{result['sigma']:.4g}) has mean square / Var N_ℤ(0, σ²) = "
      f"{result['numpy_variance_ratio']:.5f}; the TF sampler's {result['d']:,} draws at σ = "
      f"{result['tf_sigma']:g}: {result['tf_variance_ratio']:.5f} (standard error of either "
      f"ratio {se:.5f}: both within {max(abs(result['numpy_variance_ratio'] - 1), abs(result['tf_variance_ratio'] - 1)) / se:.1f} SE)."),
            "", (
      "Reading: the discrete Gaussian costs its rejection sampler (three float64 uniforms "
      "per proposal, a fraction of proposals rejected and redrawn) and, for banded C, the "
      "encoder's b − 1 past sums; the continuous Gaussian draws one normal per coordinate.")]
  return "\n".join(lines) + "\n"


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--rounds", type=int, default=3, help="timed rounds per noise")
  parser.add_argument("--out-dir", default=os.path.join(REPO, "benchmarks", "results"))
  parser.add_argument("--smoke", action="store_true", help="d = 10,000, one timed round")
  args = parser.parse_args(argv)
  d = D
  if args.smoke:
    d, args.rounds = 10_000, 1
  load_start = os.getloadavg()[0]
  result = dict(measure_numpy(d, args.rounds), d=d)
  result.update(measure_tf(d, args.rounds))
  sys.path.insert(0, os.path.join(REPO, "benchmarks"))
  import bench_harness  # pylint: disable=g-import-not-at-top
  bench_harness.write_section(args.out_dir, "discrete_gaussian",
                              section(result, args, (load_start, os.getloadavg()[0])), result)
  return 0


if __name__ == "__main__":
  sys.exit(main())
