"""Matrix-factorization DP for Flower (flwr's Message API): a thin layer over the numpy core.

The numpy core realizes a resolved mechanism's noise rows (``tff_mf.noise.rows``); the
strategy wrapper (``tff_mf.flower.strategy``, which imports flwr) clips, sums, adds them
and applies the workload's server optimizer. Importing this package imports neither flwr
nor TensorFlow.
"""
