"""tff-mf: optimal matrix-factorization mechanisms for DP federated learning.

The numpy/scipy core (``workloads``, ``factorization``, ``tree``, ``optimal``,
``structured``, ``strategies``, ``cache``, ``accounting``, ``mmcc``) imports no
TensorFlow. The TensorFlow/TFF layer lives in ``tff_mf.tf``; its public names
are re-exported here lazily, so ``import tff_mf`` stays TensorFlow-free.
"""

__version__ = "0.1.0"

# Public TF-layer names, resolved on first access (PEP 562).
_LAZY_TF_EXPORTS = {
    "MatrixFactorizationQuery": "tff_mf.tf.query",
}


def __getattr__(name):
  module = _LAZY_TF_EXPORTS.get(name)
  if module is None:
    raise AttributeError(f"module 'tff_mf' has no attribute {name!r}")
  import importlib  # pylint: disable=g-import-not-at-top
  return getattr(importlib.import_module(module), name)
