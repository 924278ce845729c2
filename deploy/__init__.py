"""Composition root: the `motor` CLI, the local cluster launcher, Kubernetes manifests."""
