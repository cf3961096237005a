"""Participation schemas: which rounds one user may join, and what follows from it (numpy core).

A schema is one frozen object of its kind's class (``kinds``): ``single()``,
``fixed_epoch(k)``, ``min_sep(b, k)``, ``balls_in_bins(k)`` (fixed bin) and
``random_allocation(k)``. Each kind owns its parameters, label and stored form, its
separation rules, its sensitivity bounds (``bounds``: the L2 sensitivity of an
encoder C, Choquette-Choo, McMahan, Rush, Thakurta 2023, arXiv:2211.06530), its client
sampler (``samplers``, the same for every framework) and its cache-key fragment. A new
schema is one class in ``kinds`` with its sampler in ``samplers``.
"""

# pylint: disable=g-importing-member,unused-import
from tff_mf.participation.kinds import ALIASES
from tff_mf.participation.kinds import BallsInBins
from tff_mf.participation.kinds import CLASSES
from tff_mf.participation.kinds import EPOCH_KINDS
from tff_mf.participation.kinds import FIXED_BIN_MARKER
from tff_mf.participation.kinds import FixedEpoch
from tff_mf.participation.kinds import HELP
from tff_mf.participation.kinds import KINDS
from tff_mf.participation.kinds import LEGACY_KINDS
from tff_mf.participation.kinds import MinSep
from tff_mf.participation.kinds import Participation
from tff_mf.participation.kinds import RandomAllocation
from tff_mf.participation.kinds import SAMPLERS
from tff_mf.participation.kinds import SINGLE
from tff_mf.participation.kinds import SPELLINGS
from tff_mf.participation.kinds import Schema
from tff_mf.participation.kinds import Single
from tff_mf.participation.kinds import balls_in_bins
from tff_mf.participation.kinds import canonical_kind
from tff_mf.participation.kinds import fixed_epoch
from tff_mf.participation.kinds import flags
from tff_mf.participation.kinds import from_args
from tff_mf.participation.kinds import from_dict
from tff_mf.participation.kinds import min_sep
from tff_mf.participation.kinds import random_allocation
from tff_mf.participation.kinds import report_from_bounds
from tff_mf.participation.kinds import sensitivity
from tff_mf.participation.kinds import sensitivity_report
from tff_mf.participation.kinds import single
from tff_mf.participation.kinds import toeplitz_sensitivity_report
from tff_mf.participation.kinds import toeplitz_upper_bound_report
from tff_mf.participation.samplers import SamplingError
from tff_mf.participation.bounds import ENUMERATION_LIMIT
from tff_mf.participation.bounds import EXACT_RTOL
from tff_mf.participation.bounds import MIN_SEP_ANALYSIS_VERSION
from tff_mf.participation.bounds import RANDOM_ALLOCATION_ENUMERATION_LIMIT
from tff_mf.participation.bounds import ROUNDING_MARGIN
from tff_mf.participation.bounds import SIGN_ENUMERATION_MAX
from tff_mf.participation.bounds import toeplitz_coefficients
