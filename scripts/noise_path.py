"""Counts the repository's files a reader crosses from the --noise_multiplier flag to the noise
added in round i (issue 47, item 7: 21 files before it).

It runs the training binary in this process for 2 rounds on the synthetic dataset, with hooks
that keep the Python call stack wherever the noise multiplier z or the round's noise passes:
where the flags become the config, where the mechanism is built and its privacy computed,
where the DPQuery receives its stddev, and where a round's noise row is drawn. The files are
the union of the repository's files on those stacks, each with the functions seen there.

  .venv/bin/python scripts/noise_path.py [--mechanism blt] [--json]
"""

import argparse
import collections
import contextlib
import functools
import json
import os
import sys
import tempfile
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def _frames(stack):
  return [(os.path.relpath(f.filename, REPO), f.name) for f in stack
          if os.path.abspath(f.filename).startswith(REPO + os.sep)
          and os.sep + ".venv" not in f.filename and not f.filename.endswith("noise_path.py")]


def _hook(owner, name, seen):
  """Wraps ``owner.name`` (a function, method or classmethod) to keep the repository's frames
  of each call's stack, and the function itself (a tf.function's frames are AutoGraph's)."""
  raw = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
  is_classmethod = isinstance(raw, classmethod)
  original = raw.__func__ if is_classmethod else raw
  code = original.__code__
  # (a dataclass's generated __init__ has no file: its class's module stands for it)
  path = code.co_filename if os.path.isabs(code.co_filename) else \
      sys.modules[original.__module__].__file__ if original.__module__ in sys.modules else ""
  own = (os.path.relpath(path, REPO), original.__qualname__)

  @functools.wraps(original)
  def wrapped(*args, **kwargs):
    seen[f"{own[0]}:{own[1]}"].append(_frames(traceback.extract_stack()[:-1]) + [own])
    return original(*args, **kwargs)

  setattr(owner, name, classmethod(wrapped) if is_classmethod else wrapped)


def trace(mechanism: str, out_dir: str):
  """{file: sorted functions} on the z path of a 2-round run of ``mechanism``: where z is
  read from the flags, becomes the spec's privacy, the plan's record, the query's stddev and
  the stddev of round i's noise row."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  import tensorflow  # pylint: disable=g-import-not-at-top,unused-import
  from training import run_stackoverflow  # pylint: disable=g-import-not-at-top
  from tff_mf import mechanisms, plan, spec  # pylint: disable=g-import-not-at-top
  from tff_mf.tf import aggregators, noise, query  # pylint: disable=g-import-not-at-top
  seen = collections.defaultdict(list)
  hooks = [(run_stackoverflow, "config_from_flags"), (spec.MechanismSpec, "from_args"),
           (spec.Privacy, "__init__"), (plan, "build"), (mechanisms, "build"),
           (mechanisms, "privacy_record"), (aggregators, "build_mechanism"),
           (query.MatrixFactorizationQuery, "__init__"),
           (query.MatrixFactorizationQuery, "get_noised_result"),
           (noise.StreamingNoise, "noise_row"), (noise.LinearNoise, "_noise_row")]
  for owner, name in hooks:
    _hook(owner, name, seen)
  argv = ["run_stackoverflow.py", f"--mechanism={mechanism}", "--dataset=synthetic",
          "--total_rounds=2", "--clients_per_round=2", "--noise_multiplier=1.0",
          "--rounds_per_eval=2", "--max_validation_elements=8", "--max_test_elements=8",
          "--vocab_size=100", "--embedding_size=8", "--lstm_size=8", "--projection_size=8",
          f"--root_output_dir={out_dir}", "--experiment_name=noise_path", "--noprogress",
          f"--cache_dir={os.path.join(out_dir, 'cache')}"]
  from absl import app  # pylint: disable=g-import-not-at-top
  try:
    with contextlib.redirect_stdout(sys.stderr):  # the run's own report: stdout is ours
      app.run(run_stackoverflow.main, argv=argv,
              flags_parser=run_stackoverflow.parse_flags_then_import_tensorflow)
  except SystemExit as e:
    if e.code not in (0, None):
      raise
  missing = [f"{getattr(owner, '__name__', owner)}.{name}" for owner, name in hooks
             if not any(key.split(":")[1].split(".")[-1] == name for key in seen)]
  files = collections.defaultdict(set)
  for stacks in seen.values():
    for stack in stacks:
      for path, function in stack:
        files[path].add(function)
  for path, functions in files.items():  # a frame's name beside its hooked qualified name
    files[path] = {f for f in functions if not any(g.endswith("." + f) for g in functions)}
  return {path: sorted(functions) for path, functions in sorted(files.items())}, missing


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--mechanism", default="blt", help="a streaming mechanism (default: blt)")
  parser.add_argument("--json", action="store_true", help="print {file: functions} as JSON")
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as out_dir:
    files, missing = trace(args.mechanism, out_dir)
  if missing:
    print(f"noise_path: never called: {', '.join(missing)}", file=sys.stderr)
  if args.json:
    print(json.dumps(files, indent=1))
    return
  for path, functions in files.items():
    print(f"{path}: {', '.join(functions)}")
  print(f"{len(files)} files, {sum(map(len, files.values()))} functions")


if __name__ == "__main__":
  main()
