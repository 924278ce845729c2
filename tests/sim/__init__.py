"""The seeded simulation of the whole control plane: `python -m tests.sim` (`just sim`)."""
