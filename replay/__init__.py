"""Analysis of the event log for `motor replay`: explain, timeline, verify (pure; no JetStream)."""
