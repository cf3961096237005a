"""The edge attacks of issue 46, stated once for every framework (numpy only).

Each attack is one client's local data for a linear model ŷ = w·x + b trained by one SGD
step on the squared error from w = 0, b = 0; its update is what that client sends (TFF's
client work computes it in TensorFlow, the Flower client below in numpy). A framework
runs one round with the attacker and one without it, both on the same honest clients and
the same pinned noise, and ``check_round`` asserts what the clipping rule promises
(``tff_mf.clipping``): the release is finite and moves by at most the clip norm's share
server_lr·ζ/K (add/remove one client, Denisov et al. 2022, arXiv:2202.08312, Alg. 1).
Before the fix, a NaN turned Flower's clipping off (the release moved by about 500) and a
finite update of norm above 2.6e19 made TensorFlow's clipping NaN and rejected the round
(the model stayed exactly where it was: the attacker's presence showed with certainty).
"""

import numpy as np

D_IN = 3
CLIENT_LR = 0.5
HONEST = [(np.array([0.5, -1.0, 2.0]), 1.0), (np.array([1.0, 0.0, -0.5]), -2.0)]
# name -> (x, y) of the attacker's one example.
ATTACKS = {
    "nan_feature": (np.array([np.nan, 1000.0, 0.0]), 1.0),
    "inf_target": (np.array([1.0, 1.0, 1.0]), np.inf),
    "norm_overflows_float32": (np.array([1e10, 1e10, 1e10]), 1e10),
    "large_finite": (np.array([1e3, -1e3, 1e3]), 1e3),
}


def local_update(x: np.ndarray, y: float, w: np.ndarray, b: float) -> np.ndarray:
  """The delta (old − new, TFF's sign) of one SGD step on (ŷ − y)² from (w, b), flat [w, b]."""
  with np.errstate(all="ignore"):
    residual = float(np.dot(w, x) + b - y)
    grad = np.concatenate([2.0 * residual * x, [2.0 * residual]])
    return CLIENT_LR * grad


def check_round(before, with_attacker, without_attacker, clip_norm, server_lr, k):
  """The promise of the clipping rule for one round, the attacker added or removed."""
  before, a, b = (np.asarray(v, np.float64).ravel() for v in (before, with_attacker,
                                                              without_attacker))
  assert np.all(np.isfinite(a)), f"the release is not finite: {a}"
  assert np.all(np.isfinite(b))
  assert not np.array_equal(b, before), "the round without the attacker released nothing"
  assert not np.array_equal(a, before), ("the round with the attacker was rejected: its "
                                         "presence shows with certainty")
  moved = float(np.linalg.norm(a - b))
  bound = server_lr * clip_norm / k
  # The clipped update has norm ≤ ζ up to float32 rounding of the d + 1 products it took.
  assert moved <= bound * (1 + 1e-5), f"the attacker moved the release by {moved} > {bound}"
  return moved
