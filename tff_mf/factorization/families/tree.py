"""Binary-tree strategy C_T and the Honaker decoders (numpy core, no TensorFlow).

McMahan, Rush, Thakurta, arXiv:2202.08312 v1, Sec 2.1 and Prop 2.1; Denisov et al.
2022, arXiv:2202.08312, App C. C_T has one row per tree node: the node covering leaves
[s, e] is the sum x_s + … + x_e. Rows are in *release order*: a node is
released in the round of its last leaf e, and among nodes released in the same
round the lower (smaller) ones come first. So the matrix is "lower triangular"
in the sense that row r only involves rounds up to its release round, which is
what adaptive privacy (Denisov Thm 2.1) and MMCC (Choquette-Choo et al. 2024)
require.

For n not a power of two we use the complete nodes of the tree over the next
power of two: every node whose interval ends at or before n. Early rounds are
then covered by ⌊log₂ n⌋ + 1 nodes and later rounds by fewer, so
γ(C_T)² = ⌊log₂ n⌋ + 1 (for n a power of two: log₂ n + 1 levels, every round
covered by one node per level). ``strategies.factorize`` normalizes by the
measured γ, so the privacy calibration never relies on this formula.

Decoders:
- ``honaker_online`` (streaming, Honaker's estimator from below): the estimate
  of S·x at round t uses only nodes released by round t. Round t's prefix is the
  disjoint union of the maximal dyadic nodes inside [1, t]; each is estimated
  from its own subtree by inverse-variance weighting (Honaker 2015, Sec 3.2),
  which is the constrained pseudo-inverse of McMahan Prop 2.1.
- ``honaker_full``: B = S·C_T^† (McMahan Prop 2.1), not a streaming decoder but
  a valid Gaussian mechanism (Denisov Thm 2.1).
"""

from __future__ import annotations

import dataclasses
from typing import List, Tuple

import numpy as np
import scipy.linalg

from tff_mf import checks
from tff_mf.factorization import families

# Bumped whenever the output for the same inputs changes (part of the cache key).
VERSION = "1"

# Closed forms: mechanisms rebuild them instead of loading them from the cache. C_T has one
# row per node (up to 2n).
STRATEGIES = {
    "honaker_online": families.Declaration(peak_matrices=8, encoder_rows=2, cached=False),
    "honaker_full": families.Declaration(peak_matrices=10, encoder_rows=2, cached=False),
}


@dataclasses.dataclass(frozen=True)
class TreeNode:
  start: int  # first leaf (0-based round index)
  end: int  # last leaf (0-based, inclusive); the node is released in round `end`
  height: int  # 0 for leaves


def tree_levels(n: int) -> int:
  """Number of tree levels covering n leaves (height of the root + 1)."""
  if n < 1:
    raise checks.CheckError(f"n must be positive, got {n}")
  return int(np.ceil(np.log2(n))) + 1 if n > 1 else 1


def tree_nodes(n: int) -> List[TreeNode]:
  """Complete nodes of the binary tree over n leaves, in release order."""
  levels = tree_levels(n)
  nodes = []
  for h in range(levels):
    width = 1 << h
    for s in range(0, n, width):
      e = s + width - 1
      if e < n:
        nodes.append(TreeNode(s, e, h))
  nodes.sort(key=lambda nd: (nd.end, nd.height))
  return nodes


def tree_encoder(n: int) -> np.ndarray:
  """C_T (m x n, m = number of complete nodes, 2n-1 for n a power of two), unnormalized."""
  nodes = tree_nodes(n)
  c = np.zeros((len(nodes), n), dtype=np.float64)
  for r, nd in enumerate(nodes):
    c[r, nd.start:nd.end + 1] = 1.0
  return c


def _from_below_estimators(nodes: List[TreeNode]) -> Tuple[List[dict], np.ndarray]:
  """Coefficients (node row -> weight) of each node's estimator from below, and its variance.

  With unit noise per node: leaves have variance 1. A node of height h combines
  its own value (variance 1) with the sum of its children's estimates
  (variance 2·v_{h-1}) by inverse-variance weighting.
  """
  index = {(nd.start, nd.end): r for r, nd in enumerate(nodes)}
  coeffs: List[dict] = [dict() for _ in nodes]
  var = np.zeros(len(nodes))
  for r in sorted(range(len(nodes)), key=lambda r: nodes[r].height):
    nd = nodes[r]
    if nd.height == 0:
      coeffs[r] = {r: 1.0}
      var[r] = 1.0
      continue
    half = 1 << (nd.height - 1)
    left = index[(nd.start, nd.start + half - 1)]
    right = index[(nd.start + half, nd.end)]
    v_children = var[left] + var[right]
    w_self = v_children / (1.0 + v_children)
    w_child = 1.0 / (1.0 + v_children)
    coef = {r: w_self}
    for child in (left, right):
      for k, w in coeffs[child].items():
        coef[k] = coef.get(k, 0.0) + w_child * w
    coeffs[r] = coef
    var[r] = v_children / (1.0 + v_children)
  return coeffs, var


def dyadic_decomposition(t: int, n: int) -> List[Tuple[int, int]]:
  """Maximal tree nodes (start, end) whose disjoint union is rounds [0, t] (0-based)."""
  out = []
  start = 0
  remaining = t + 1
  levels = tree_levels(n)
  for h in reversed(range(levels)):
    width = 1 << h
    if remaining >= width:
      out.append((start, start + width - 1))
      start += width
      remaining -= width
  return out


def honaker_online_decoder(n: int) -> np.ndarray:
  """B_hs (n x m): the streaming estimator from below for prefix sums, S = B_hs·C_T."""
  nodes = tree_nodes(n)
  index = {(nd.start, nd.end): r for r, nd in enumerate(nodes)}
  coeffs, _ = _from_below_estimators(nodes)
  b = np.zeros((n, len(nodes)), dtype=np.float64)
  for t in range(n):
    for key in dyadic_decomposition(t, n):
      for k, w in coeffs[index[key]].items():
        b[t, k] += w
  return b


def honaker_full_decoder(n: int, workload: np.ndarray = None) -> np.ndarray:
  """B_hf = S·C_T^† (McMahan Prop 2.1), via the normal equations (C_T has full column rank)."""
  c = tree_encoder(n)
  s = np.tril(np.ones((n, n))) if workload is None else workload
  gram = c.T @ c
  chol = scipy.linalg.cho_factor(gram, lower=True)
  # B = S (CᵀC)⁻¹ Cᵀ
  return scipy.linalg.cho_solve(chol, s.T).T @ c.T


def factorize(a: np.ndarray, spec, context):
  """C_T with the Honaker online (streaming) or full decoder, post-processed into A."""
  from tff_mf import factorization as fz  # pylint: disable=g-import-not-at-top
  from tff_mf.factorization.families import FamilyResult  # pylint: disable=g-import-not-at-top
  del context
  n = a.shape[0]
  b_tree = honaker_online_decoder(n) if spec.strategy == "honaker_online" \
      else honaker_full_decoder(n)
  return FamilyResult(b=fz.post_process_prefix_decoder(a, b_tree), c=tree_encoder(n))
