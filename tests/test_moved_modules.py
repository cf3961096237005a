"""Modules that moved into the library's folders keep their old import paths: the old
name is the same module object as the new one and warns once, naming the new path."""

import importlib
import sys
import warnings

import pytest

import tff_mf


def _import_fresh(old):
  """Imports ``old`` as if for the first time; (module, messages of the warnings raised)."""
  sys.modules.pop(old, None)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    module = importlib.import_module(old)
  return module, [str(w.message) for w in caught if w.category is DeprecationWarning]


@pytest.mark.parametrize("old", sorted(tff_mf.MOVED))
def test_an_old_path_is_the_module_at_its_new_path_and_warns_once(old):
  new = f"tff_mf.{tff_mf.MOVED[old]}"
  module, messages = _import_fresh(f"tff_mf.{old}")
  assert module is importlib.import_module(new)
  assert messages == [f"tff_mf.{old} moved to {new}; import {new} instead"]
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    assert importlib.import_module(f"tff_mf.{old}") is module  # cached: no second warning
  assert not caught


def test_a_submodule_of_a_moved_package_is_not_loaded_twice():
  module, messages = _import_fresh("tff_mf.families.banded")
  assert module is importlib.import_module("tff_mf.factorization.families.banded")
  assert module.__name__ == "tff_mf.factorization.families.banded"
  assert messages == ["tff_mf.families.banded moved to tff_mf.factorization.families.banded; "
                      "import tff_mf.factorization.families.banded instead"]


def test_old_names_resolve_as_attributes_and_unknown_ones_do_not():
  from tff_mf import streams  # pylint: disable=g-import-not-at-top
  assert streams is importlib.import_module("tff_mf.noise.streams")
  assert tff_mf.moved_to("tff_mf.accounting") is None
  assert tff_mf.moved_to("tff_mf.gaussian") == "tff_mf.accounting.gaussian"
  with pytest.raises(AttributeError):
    getattr(tff_mf, "no_such_module")
  with pytest.raises(ModuleNotFoundError):
    importlib.import_module("tff_mf.no_such_module")
