"""Composition root: the `motor` CLI, the local cluster launcher, Kubernetes manifests.

The manifests are data under `deploy/k8s/` (kustomize bases and overlays, values for the
official NATS Helm chart); `motor k8s secrets` makes their NATS logins. docs/kubernetes.md.
"""
