"""The coordinator: routing table, policies, the /v1 proxy and the management API."""
