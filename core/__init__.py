"""Shared kernel: event schemas, subjects, ids, config models and the pure reducers. No I/O."""
