"""Subcommands of the ``tff-mf`` console script (see ``tff_mf.cli``)."""
