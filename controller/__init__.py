"""The controller: `decide(state, cfg, now)` (pure) and the shell that folds, decides and appends."""
