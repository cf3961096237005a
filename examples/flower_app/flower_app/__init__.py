"""A Flower App with tff-mf's matrix-factorization noise (see the App's README)."""
