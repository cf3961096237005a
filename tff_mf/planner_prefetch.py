"""The planner's dense factorizations computed beside its first stage (numpy core).

``tff_mf.planner.plan`` calibrates the cheap families first: Python and PLD work that keeps
one core busy. The dense families' factorizations (the banded family's L-BFGS at n = 2048
takes minutes) do not depend on that work, so a child process computes them meanwhile, with
BLAS on one thread (two thread pools on two cores spin against each other), into the same
factorization cache, in the order the dense stage needs them. The dense stage waits for an
entry the child has not finished, then loads it like any cache entry: every check of
``tff_mf.factorization.cache`` runs in the planner's process, so the child is trusted with
nothing. If the child fails or is gone, the planner computes what it needs itself.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
from typing import Dict, List, Optional, Sequence

# BLAS threads of the child (the planner's own process keeps its own setting).
CHILD_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def missing(specs: Sequence, cache_dir: Optional[str]) -> Dict[str, object]:
  """{cache entry directory: spec} of the specs (``FactorizationSpec``s, in order) whose entry
  has no sidecar yet, each once."""
  from tff_mf.factorization import cache  # pylint: disable=g-import-not-at-top
  out: Dict[str, object] = {}
  for spec in specs:
    directory = cache.entry_paths(spec, cache_dir)[0]
    if directory not in out and not os.path.exists(os.path.join(directory,
                                                                cache.METADATA_FILE)):
      out[directory] = spec
  return out


class Prefetch:
  """A child computing the cache entries of ``specs`` ({directory: spec}, in order).

  ``wait(directory)`` returns once the child reported that entry (done or failed), or has
  exited; ``close()`` stops it. Without entries or a second core it starts nothing."""

  def __init__(self, specs: Dict[str, object], cache_dir: Optional[str]):
    self.order: List[str] = list(specs)
    self.reported: Dict[str, str] = {}
    self.proc: Optional[subprocess.Popen] = None
    if not self.order or (os.cpu_count() or 1) < 2:
      return
    import tff_mf  # pylint: disable=g-import-not-at-top
    root = os.path.dirname(os.path.dirname(os.path.abspath(tff_mf.__file__)))
    env = dict(os.environ, **CHILD_ENV)
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in [env.get("PYTHONPATH")] if p])
    try:
      self.proc = subprocess.Popen(self.command(), stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
      self.proc.stdin.write(pickle.dumps((cache_dir, [specs[d] for d in self.order])))
      self.proc.stdin.close()
    except OSError:  # no child: the planner computes everything itself
      self.close()

  @staticmethod
  def command() -> List[str]:
    """The child's command line (it reads the pickled (cache_dir, specs) on stdin)."""
    return [sys.executable, "-m", "tff_mf.planner_prefetch"]

  def pending(self, directory: str) -> bool:
    """Whether the child will still report ``directory``."""
    return (self.proc is not None and directory in self.order
            and directory not in self.reported)

  def wait(self, directory: str) -> Optional[str]:
    """Blocks until the child reported ``directory`` ("done" or "failed: ..."), or exited
    (None then, as for an entry it was not asked for)."""
    while self.pending(directory):
      line = self.proc.stdout.readline()
      if not line:  # the child exited
        self.close()
        break
      index, _, status = line.decode("utf-8", "replace").strip().partition(" ")
      if index.isdigit() and int(index) < len(self.order):
        self.reported[self.order[int(index)]] = status
    return self.reported.get(directory)

  def close(self) -> None:
    """Stops the child (an entry it was writing is written atomically or not at all)."""
    if self.proc is not None:
      proc, self.proc = self.proc, None
      if proc.poll() is None:
        proc.terminate()
      try:
        proc.wait(timeout=30)
      except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
      proc.stdout.close()


def main() -> None:
  """The child: factorize each spec read from stdin into the cache; print "i done" or
  "i failed: reason" after each."""
  from tff_mf.factorization import cache  # pylint: disable=g-import-not-at-top
  # ``close`` terminates: exit through Python, so that an entry being written removes its
  # temporary files (the cache writes each entry atomically).
  signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(1))
  cache_dir, specs = pickle.loads(sys.stdin.buffer.read())
  for i, spec in enumerate(specs):
    try:
      cache.load_or_factorize(spec, cache_dir=cache_dir)
      status = "done"
    except Exception as e:  # pylint: disable=broad-except
      status = "failed: " + " ".join(str(e).split())
    print(i, status, flush=True)


if __name__ == "__main__":
  main()
