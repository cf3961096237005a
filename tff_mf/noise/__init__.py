"""Noise of the numpy core (no TensorFlow).

``streams``: the streaming form of a residual noise matrix N = C⁻¹, one linear recurrence
that the family modules build and every framework layer evaluates with the same tables
(Denisov et al. 2022, arXiv:2202.08312, App H; Dvijotham et al. 2024, arXiv:2404.16706).
``discrete_gaussian``: integer noise on the integer release round(γ·C·x), its sampler and
its zCDP accounting (Canonne, Kamath, Steinke 2020, arXiv:2004.00010).
``keys``: the Philox key the noise is drawn from: two secret words from HKDF over OS entropy
(RFC 5869) unless pinned; a pinned integer seed keeps the public tag.
"""
