"""tff-mf: optimal matrix-factorization mechanisms for DP federated learning.

The numpy/scipy core imports no TensorFlow; its folders name the parts:
``participation`` (schemas, sensitivities, samplers), ``noise`` (streams, the discrete
Gaussian), ``factorization`` (workloads, families and their solvers, the cache),
``accounting`` (analyses, calibration, the privacy statement) and ``audit``, beside
``registry``, ``spec`` and ``mechanisms``. The TensorFlow/TFF layer lives in ``tff_mf.tf``;
its public names are re-exported here lazily, so ``import tff_mf`` stays TensorFlow-free.

Modules that moved into a folder keep their old import path (``tff_mf.streams`` is
``tff_mf.noise.streams``): the old name yields the same module object and warns once
(``DeprecationWarning``) with the new one.
"""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

__version__ = "0.1.0"

# Public TF-layer names, resolved on first access (PEP 562).
_LAZY_TF_EXPORTS = {
    "MatrixFactorizationQuery": "tff_mf.tf.query",
}

# Old module path (under tff_mf) -> where it lives now. Submodules follow their package
# (tff_mf.families.banded is tff_mf.factorization.families.banded).
MOVED = {
    "strategies": "factorization.strategies",
    "workloads": "factorization.workloads",
    "families": "factorization.families",
    "dense_single": "factorization.dense_single",
    "dense_fixed_epoch": "factorization.dense_fixed_epoch",
    "dense_run": "factorization.dense_run",
    "toeplitz_ops": "factorization.toeplitz_ops",
    "lbfgs": "factorization.lbfgs",
    "cache": "factorization.cache",
    "separation": "participation.separation",
    "analyses": "accounting.analyses",
    "gaussian": "accounting.gaussian",
    "mmcc": "accounting.mmcc",
    "random_allocation": "accounting.random_allocation",
    "allocation_pld": "accounting.allocation_pld",
    "mixture_pair": "accounting.mixture_pair",
    "fixed_bin": "accounting.fixed_bin",
    "monte_carlo": "accounting.monte_carlo",
    "statement": "accounting.statement",
    "band_calibration": "accounting.band_calibration",
    "adaptive_clipping": "accounting.adaptive_clipping",
    "streams": "noise.streams",
    "discrete_gaussian": "noise.discrete_gaussian",
}


def moved_to(fullname: str):
  """The current dotted path of the old module path ``fullname``, or None if it did not move."""
  names = fullname.split(".")
  if len(names) < 2 or names[0] != __name__ or names[1] not in MOVED:
    return None
  return ".".join([__name__, MOVED[names[1]]] + names[2:])


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  """Imports an old module path as the module at its new path (one object, two names)."""

  def find_spec(self, fullname, path=None, target=None):  # pylint: disable=unused-argument
    if moved_to(fullname) is None:
      return None
    return importlib.util.spec_from_loader(fullname, self)

  def create_module(self, spec):
    new = moved_to(spec.name)
    warnings.warn(f"{spec.name} moved to {new}; import {new} instead", DeprecationWarning,
                  stacklevel=2)
    return importlib.import_module(new)

  def exec_module(self, module):  # the module at the new path is already executed
    pass


# First on the path: a submodule of a moved package (tff_mf.families.banded) must resolve to
# the module already loaded at its new path, not be found again under the old name.
if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
  sys.meta_path.insert(0, _MovedModules())


def __getattr__(name):
  if name in MOVED:  # tff_mf.streams without an import statement
    return importlib.import_module(f"{__name__}.{name}")
  module = _LAZY_TF_EXPORTS.get(name)
  if module is None:
    raise AttributeError(f"module 'tff_mf' has no attribute {name!r}")
  return getattr(importlib.import_module(module), name)
