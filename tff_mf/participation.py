"""Participation schemas as data, and the sensitivity of an encoder under each (numpy core).

INTERIM (lead's branch): the interface other modules use; the sensitivity math
arrives with the participation work.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional

import numpy as np

from tff_mf import checks

KINDS = ("single", "fixed_epoch", "min_sep")


@dataclasses.dataclass(frozen=True)
class Participation:
  kind: str = "single"
  epochs: Optional[int] = None
  min_sep: Optional[int] = None
  max_participations: Optional[int] = None

  def check(self, n: int) -> None:
    if self.kind == "fixed_epoch" and n % self.epochs:
      raise checks.CheckError(f"fixed_epoch: {self.epochs} epochs do not divide n = {n} rounds")

  def check_bands(self, bands: int, strategy: str) -> None:
    del bands, strategy

  @property
  def label(self) -> str:
    if self.kind == "single":
      return "single"
    if self.kind == "fixed_epoch":
      return f"fixed_epoch-k{self.epochs}"
    return f"min_sep-b{self.min_sep}-k{self.max_participations}"

  def as_dict(self) -> Dict[str, Any]:
    out = {"kind": self.kind, "label": self.label}
    for name in ("epochs", "min_sep", "max_participations"):
      if getattr(self, name) is not None:
        out[name] = getattr(self, name)
    return out


SINGLE = Participation()


def from_dict(d: Dict[str, Any]) -> Participation:
  return Participation(kind=d["kind"], epochs=d.get("epochs"), min_sep=d.get("min_sep"),
                       max_participations=d.get("max_participations"))


def sensitivity_report(c: np.ndarray, schema: Participation) -> Dict[str, Any]:
  if schema.kind != "single":
    raise NotImplementedError(schema.kind)
  return {"value": checks.gamma(c), "exact": True, "method": "max column norm"}


def from_args(kind, n, epochs=None, min_sep=None, max_participations=None) -> Participation:
  if kind == "single":
    return SINGLE
  if kind == "fixed_epoch":
    p = Participation("fixed_epoch", epochs=epochs)
  else:
    p = Participation("min_sep", min_sep=min_sep, max_participations=max_participations or -(-n // min_sep))
  p.check(n)
  return p
