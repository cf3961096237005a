"""Strategy families: one module per family of encoders C, each with its own optimization (numpy core)."""
