"""tff-mf: optimal matrix-factorization mechanisms for DP federated learning.

The numpy/scipy core imports no TensorFlow; its folders name the parts:
``participation`` (schemas, sensitivities, samplers), ``noise`` (streams, the discrete
Gaussian), ``factorization`` (workloads, families and their solvers, the cache),
``accounting`` (analyses, calibration, the privacy statement) and ``audit``, beside
``registry``, ``spec`` and ``mechanisms``. The TensorFlow/TFF layer lives in ``tff_mf.tf``;
its public names are re-exported here lazily, so ``import tff_mf`` stays TensorFlow-free.

A name never changes meaning and a new thing gets a new name (dp_accounting's rule): a
module that moved is imported at its new path only (``tff_mf.noise.streams``).
"""

import importlib

__version__ = "0.1.0"

# Public TF-layer names, resolved on first access (PEP 562).
_LAZY_TF_EXPORTS = {
    "MatrixFactorizationQuery": "tff_mf.tf.query",
}


def __getattr__(name):
  module = _LAZY_TF_EXPORTS.get(name)
  if module is None:
    raise AttributeError(f"module 'tff_mf' has no attribute {name!r}")
  return getattr(importlib.import_module(module), name)
