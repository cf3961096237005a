"""The StackOverflow hyperparameter grids of Denisov et al., as data, in one place.

Every grid is a named, documented tuple of :class:`RunConfig`; each RunConfig
maps to the flags of ``training/run_stackoverflow.py`` (:meth:`RunConfig.flags`).
Source: Denisov, McMahan, Rush, Smith, Thakurta 2022, "Improved Differential
Privacy for SGD via Optimal Private Linear Operators on Adaptive Streams",
arXiv:2202.08312 (Sec 5, Fig 2 and 3, App I Tables 3 and 4).

* ``table3_search`` — App I Table 3: the initial search for Fig 2 over client
  LR × server LR × server momentum × noise multiplier, for the four mechanisms
  of Table 1 / Fig 2 (the DP-FTRL tree of the paper is ``honaker_online``, the
  tree with the online Honaker estimator as a matrix mechanism), one seed.
* ``table4_repeats`` — App I Table 4: the selected (server LR, client LR,
  momentum) per mechanism and ε, repeated over 10 seeds (App I: error bars
  from 10 seeds; at least 7 converged per setting).
* ``fig3_schedules`` — Sec 5 / Fig 3 and App I: ε = 18.9
  (z = 0.341); constant LR with the Table 4 ε = 18.9 settings; LR decay
  (×0.15 over the last 512 rounds) and LR cooldown (linear 1.0 → 0.05 over the
  last 512 rounds) with server LR 0.5, client LR 1.0, momentum 0.95 (App I);
  cooldown again with 167 clients per round (Fig 3's last bar group: the most a
  single pass over StackOverflow's 342k training clients allows in 2048
  rounds). Mechanisms: the prefix-sum mechanism with momentum and the schedule
  as post-processing (``opt_prefix_sum``) against the mechanism that factorizes
  the momentum-with-schedule matrix M itself (``opt_momentum``), the
  comparison of App I Fig 6. 10 seeds.
* ``paper_config`` — the papers' StackOverflow configuration as it runs here, on the
  compiled engine (``--engine=auto`` on one machine): the 4.05M-parameter LSTM, 100
  clients per round, 2048 rounds, at most 256 sentences per client; Fig 2's headline
  pair at ε = 18.9 (z = 0.341), ``opt_momentum`` against the DP-FTRL tree
  (``honaker_online``), each with its Table 4 setting, seed 0. The same runs as
  ``table4_repeats``' seed 0 (same directories). ``benchmarks/bench_paper_config.py``
  measures its time per round and projects the total.
* ``nonprivate_reference`` — not a table of the paper: the non-private model
  (Fig 3's top horizontal line), searched over Table 3's learning rates and
  momenta, one seed.

All runs: 2048 rounds, 100 clients per round unless stated, δ = 1e-6, one
participation per client (single pass), StackOverflow settings shared with
Kairouz et al. 2021, arXiv:2103.00039 (App I "Stackoverflow settings": vocabulary
10000, sequence length 20, at most 256 examples per client, batch 16, the
4.05M-parameter LSTM).

ε of a noise multiplier z is that of one Gaussian mechanism with sensitivity 1
(Denisov Thm 4.1; all factorizations are normalized to γ(C) = 1, App I);
:func:`epsilon_for` computes it with ``tff_mf.accounting``. With RDP at
δ = 1e-6 the five noise multipliers give the paper's 18.9, 8.2, 3.7, 1.7, 0.8.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Dict, List, Optional, Tuple

TOTAL_ROUNDS = 2048
DELTA = 1e-6
CLIENTS_PER_ROUND = 100
MAX_CLIENTS_PER_ROUND = 167  # Fig 3: single pass of 2048 rounds over the training clients
SCHEDULE_ROUNDS = 512  # Sec 5: decay / cooldown over the last 512 rounds
NUM_REPEAT_SEEDS = 10  # App I: error bars over 10 seeds
SEARCH_SEED = 0

# Table 3 (App I): the initial search grid.
TABLE3_CLIENT_LRS = (0.5, 1.0)
TABLE3_SERVER_LRS = (0.25, 0.5, 1.0, 2.0)
TABLE3_SERVER_MOMENTA = (0.0, 0.9, 0.95)
TABLE3_NOISE_MULTIPLIERS = (0.341, 0.682, 1.364, 2.728, 5.456)
# The paper's ε label (δ = 1e-6) of each noise multiplier (Fig 2, Table 4).
PAPER_EPSILON = {0.341: 18.9, 0.682: 8.2, 1.364: 3.7, 2.728: 1.7, 5.456: 0.8}

# The paper's DP-FTRL tree (the baseline of Fig 2 and of the papers' configuration): the
# Honaker online matrix mechanism, as a run_stackoverflow.py --mechanism value.
DP_FTRL_TREE = "honaker_online"


def label(mechanism: str) -> str:
  """Display label of a mechanism (tff_mf.registry's; the name itself if unknown)."""
  from tff_mf import registry  # pylint: disable=g-import-not-at-top
  try:
    return registry.label(mechanism)
  except registry.RegistryError:
    return mechanism

# Table 4 (App I): mechanism -> {ε label: (server LR, client LR, server momentum)}.
TABLE4 = {
    "honaker_full": {18.9: (0.5, 1.0, 0.95), 8.2: (0.25, 1.0, 0.95), 3.7: (0.25, 1.0, 0.9),
                     1.7: (0.25, 0.5, 0.9), 0.8: (0.25, 0.5, 0.0)},
    DP_FTRL_TREE: {18.9: (0.25, 1.0, 0.95), 8.2: (0.25, 1.0, 0.9), 3.7: (0.25, 0.5, 0.9),
                   1.7: (0.25, 1.0, 0.0), 0.8: (0.25, 0.5, 0.0)},
    "opt_prefix_sum": {18.9: (0.5, 1.0, 0.95), 8.2: (0.25, 0.5, 0.95), 3.7: (0.25, 1.0, 0.9),
                       1.7: (0.25, 0.5, 0.9), 0.8: (0.5, 0.5, 0.0)},
    "opt_momentum": {18.9: (1.0, 1.0, 0.9), 8.2: (0.25, 1.0, 0.95), 3.7: (0.25, 0.5, 0.9),
                     1.7: (0.25, 0.5, 0.9), 0.8: (0.5, 0.5, 0.0)},
}
# The four mechanisms of Fig 2 (Denisov Table 1), Table 4's rows, as run_stackoverflow.py
# --mechanism values (tff_mf.registry names).
FIG2_MECHANISMS = tuple(TABLE4)

# Fig 3 (App I): the shared setting of the decay / cooldown runs (server LR, client LR, momentum).
FIG3_SCHEDULE_SETTING = (0.5, 1.0, 0.95)
FIG3_MECHANISMS = ("opt_prefix_sum", "opt_momentum")
FIG3_NOISE_MULTIPLIER = 0.341  # ε = 18.9

# Flags shared by every paper run: the StackOverflow task of Kairouz et al. 2021 (App I).
PAPER_FIXED_FLAGS: Dict[str, object] = {
    "dataset": "stackoverflow",
    "delta": DELTA,
    "clip_norm": 1.0,
    "vocab_size": 10000,
    "num_oov_buckets": 1,
    "embedding_size": 96,
    "lstm_size": 670,
    "projection_size": 96,
    "sequence_length": 20,
    "max_elements_per_client": 256,
    "client_batch_size": 16,
    "max_validation_elements": 10000,  # App I: 10,000 evaluation sentences
    "rounds_per_eval": 16,
    "rounds_per_checkpoint": 16,
}


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """One training run of run_stackoverflow.py (one grid point and seed)."""
  mechanism: str
  noise_multiplier: Optional[float]  # None: non-private
  client_lr: float
  server_lr: float
  server_momentum: float
  seed: int = SEARCH_SEED
  clients_per_round: int = CLIENTS_PER_ROUND
  total_rounds: int = TOTAL_ROUNDS
  lr_schedule: str = "constant"
  schedule_rounds: Optional[int] = None
  delta: float = DELTA

  @property
  def name(self) -> str:
    """Experiment directory name; a function of the configuration, so grids that share a run share its directory."""
    z = "nonprivate" if self.noise_multiplier is None else f"z{self.noise_multiplier:g}"
    schedule = self.lr_schedule if self.schedule_rounds is None else (
        f"{self.lr_schedule}{self.schedule_rounds}")
    return (f"{self.mechanism}-{z}-slr{self.server_lr:g}-clr{self.client_lr:g}-"
            f"mom{self.server_momentum:g}-{schedule}-c{self.clients_per_round}-"
            f"r{self.total_rounds}-seed{self.seed}")

  @property
  def paper_epsilon(self) -> Optional[float]:
    """The paper's ε label for this noise multiplier (None if it has none)."""
    if self.noise_multiplier is None:
      return None
    return PAPER_EPSILON.get(self.noise_multiplier)

  def flag_values(self) -> Dict[str, object]:
    """Every run_stackoverflow.py flag this run sets (the fixed paper flags included)."""
    values: Dict[str, object] = {"mechanism": self.mechanism}
    values.update(PAPER_FIXED_FLAGS)
    values.update(
        total_rounds=self.total_rounds, clients_per_round=self.clients_per_round,
        client_lr=self.client_lr, server_lr=self.server_lr,
        server_momentum=self.server_momentum, lr_schedule=self.lr_schedule,
        seed=self.seed, delta=self.delta, experiment_name=self.name)
    if self.schedule_rounds is not None:
      values["schedule_rounds"] = self.schedule_rounds
    if self.noise_multiplier is not None:
      values["noise_multiplier"] = self.noise_multiplier
    return values

  def flags(self) -> List[str]:
    """``--name=value`` arguments for run_stackoverflow.py (add --root_output_dir)."""
    return [f"--{k}={_format_flag(v)}" for k, v in self.flag_values().items()]


def _format_flag(value) -> str:
  if isinstance(value, float):
    return repr(value)
  return str(value)


@dataclasses.dataclass(frozen=True)
class Grid:
  name: str
  description: str
  source: str
  runs: Tuple[RunConfig, ...]


def _table3_search() -> Tuple[RunConfig, ...]:
  runs = []
  for mechanism, z, client_lr, server_lr, momentum in itertools.product(
      FIG2_MECHANISMS, TABLE3_NOISE_MULTIPLIERS, TABLE3_CLIENT_LRS, TABLE3_SERVER_LRS,
      TABLE3_SERVER_MOMENTA):
    runs.append(RunConfig(mechanism, z, client_lr, server_lr, momentum))
  return tuple(runs)


def _noise_multiplier_of(paper_epsilon: float) -> float:
  (z,) = [z for z, eps in PAPER_EPSILON.items() if eps == paper_epsilon]
  return z


def _table4_repeats() -> Tuple[RunConfig, ...]:
  runs = []
  for mechanism in FIG2_MECHANISMS:
    for paper_eps, (server_lr, client_lr, momentum) in TABLE4[mechanism].items():
      for seed in range(NUM_REPEAT_SEEDS):
        runs.append(RunConfig(mechanism, _noise_multiplier_of(paper_eps), client_lr, server_lr,
                              momentum, seed=seed))
  return tuple(runs)


def _fig3_schedules() -> Tuple[RunConfig, ...]:
  runs = []
  server_lr, client_lr, momentum = FIG3_SCHEDULE_SETTING
  z = FIG3_NOISE_MULTIPLIER
  for mechanism in FIG3_MECHANISMS:
    const_server_lr, const_client_lr, const_momentum = TABLE4[mechanism][PAPER_EPSILON[z]]
    for seed in range(NUM_REPEAT_SEEDS):
      runs.append(RunConfig(mechanism, z, const_client_lr, const_server_lr, const_momentum,
                            seed=seed))
      for schedule in ("decay", "cooldown"):
        runs.append(RunConfig(mechanism, z, client_lr, server_lr, momentum, seed=seed,
                              lr_schedule=schedule, schedule_rounds=SCHEDULE_ROUNDS))
      runs.append(RunConfig(mechanism, z, client_lr, server_lr, momentum, seed=seed,
                            lr_schedule="cooldown", schedule_rounds=SCHEDULE_ROUNDS,
                            clients_per_round=MAX_CLIENTS_PER_ROUND))
  return tuple(runs)


# The papers' configuration, as one grid entry: Fig 2's headline pair at epsilon 18.9.
PAPER_CONFIG_MECHANISMS = ("opt_momentum", DP_FTRL_TREE)
PAPER_CONFIG_NOISE_MULTIPLIER = 0.341


def _paper_config() -> Tuple[RunConfig, ...]:
  z = PAPER_CONFIG_NOISE_MULTIPLIER
  return tuple(RunConfig(m, z, *_table4_setting(m, PAPER_EPSILON[z]))
               for m in PAPER_CONFIG_MECHANISMS)


def _table4_setting(mechanism: str, paper_epsilon: float) -> Tuple[float, float, float]:
  """(client LR, server LR, server momentum) of Table 4 for ``mechanism`` at ``paper_epsilon``."""
  server_lr, client_lr, momentum = TABLE4[mechanism][paper_epsilon]
  return client_lr, server_lr, momentum


def _nonprivate_reference() -> Tuple[RunConfig, ...]:
  return tuple(
      RunConfig("none", None, client_lr, server_lr, momentum)
      for client_lr, server_lr, momentum in itertools.product(
          TABLE3_CLIENT_LRS, TABLE3_SERVER_LRS, TABLE3_SERVER_MOMENTA))


GRIDS: Dict[str, Grid] = {
    "table3_search": Grid(
        "table3_search",
        "Initial search for Fig 2: 4 mechanisms x 5 noise multipliers x 2 client LRs x "
        "4 server LRs x 3 momenta, seed 0 (480 runs).",
        "Denisov et al. 2022, arXiv:2202.08312, App I Table 3",
        _table3_search()),
    "table4_repeats": Grid(
        "table4_repeats",
        "Fig 2 error bars: the Table 4 setting of each mechanism and epsilon, 10 seeds (200 runs).",
        "Denisov et al. 2022, arXiv:2202.08312, App I Table 4",
        _table4_repeats()),
    "fig3_schedules": Grid(
        "fig3_schedules",
        "Fig 3 at epsilon 18.9: constant (Table 4 settings), decay x0.15 and cooldown 1.0->0.05 "
        "over the last 512 rounds, cooldown with 167 clients/round; opt_prefix_sum vs "
        "opt_momentum, 10 seeds (80 runs).",
        "Denisov et al. 2022, arXiv:2202.08312, Sec 5, Fig 3 and App I",
        _fig3_schedules()),
    "paper_config": Grid(
        "paper_config",
        "The papers' StackOverflow configuration on the compiled engine: 4.05M-parameter "
        "LSTM, 100 clients/round, 2048 rounds, at most 256 sentences per client; opt_momentum "
        "vs the DP-FTRL tree (honaker_online) at epsilon 18.9 with their Table 4 settings, "
        "seed 0 (2 runs).",
        "Denisov et al. 2022, arXiv:2202.08312, Sec 5, Fig 2 and App I Table 4",
        _paper_config()),
    "nonprivate_reference": Grid(
        "nonprivate_reference",
        "Non-private model (Fig 3's top line) over Table 3's learning rates and momenta, seed 0 "
        "(24 runs). Not a table of the paper.",
        "Denisov et al. 2022, arXiv:2202.08312, Fig 3 reference line; grid values from App I "
        "Table 3",
        _nonprivate_reference()),
}


def get_grid(name: str) -> Grid:
  """The grid called ``name``; ValueError listing the known grids otherwise."""
  try:
    return GRIDS[name]
  except KeyError:
    raise ValueError(f"unknown grid {name!r}; known grids: {', '.join(GRIDS)}") from None


def epsilon_for(noise_multiplier: Optional[float], delta: float = DELTA,
                accountant: Optional[str] = None) -> Optional[float]:
  """ε of one Gaussian mechanism with sensitivity 1 (Denisov Thm 4.1); None when non-private.
  ``accountant``: one of ``tff_mf.accounting.ACCOUNTANTS`` (None: its default)."""
  if noise_multiplier is None:
    return None
  from tff_mf import accounting  # pylint: disable=g-import-not-at-top
  return float(accounting.epsilon(noise_multiplier, delta,
                                  accountant=accountant or accounting.DEFAULT_ACCOUNTANT))
