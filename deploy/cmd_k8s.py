"""`motor k8s secrets`: the NATS logins of a Kubernetes deployment, from its rendered manifests.

    kubectl kustomize deploy/k8s/overlays/smoke | motor k8s secrets > nats-secrets.yaml
    kubectl apply -f nats-secrets.yaml

The manifests say which node agent pods there are (StatefulSets) and where NATS is (the
config map); `deploy.k8s_secrets` turns that into the Secrets the pods and the NATS servers
mount. `--keep` an earlier output keeps every existing user's password.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("k8s", help="Kubernetes helpers (deploy/k8s, docs/kubernetes.md)")
    ksub = p.add_subparsers(dest="k8s_cmd", metavar="ACTION", required=True)
    s = ksub.add_parser(
        "secrets",
        help="print the NATS user Secrets for rendered manifests (one user per role and node agent)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument(
        "-f", "--filename", default="-", help="rendered manifests (kubectl kustomize output); - is stdin"
    )
    s.add_argument("--keep", metavar="FILE", help="an earlier output: its users keep their passwords")
    s.add_argument("--namespace", help="namespace of the Secrets; default: the manifests' namespace")
    s.set_defaults(func=_secrets)


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    return Path(path).read_text(encoding="utf-8")


def _secrets(args: argparse.Namespace) -> int:
    from deploy.k8s_secrets import ManifestError, dump, kept_passwords, load_objects, make_secrets, plan
    from streams.permissions import cluster_users

    try:
        objects = load_objects(_read(args.filename), "stdin" if args.filename == "-" else args.filename)
        keep = kept_passwords(load_objects(_read(args.keep), args.keep)) if args.keep else {}
        p = plan(objects, args.namespace)
        out = make_secrets(p, keep)
    except (ManifestError, OSError) as exc:
        print(f"motor k8s secrets: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(dump(out))
    kept = len(set(keep) & {u.name for u in cluster_users(p.node_ids)})
    print(
        f"motor k8s secrets: {len(p.node_ids)} node agents ({', '.join(p.node_ids)}), {kept} passwords kept",
        file=sys.stderr,
    )
    return 0
