"""`moddeb build --boot-test --publish`: a module that fails to load never reaches the repository."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .helpers import EXAMPLES, KERNEL_61, run_cli

pytestmark = pytest.mark.docker


def test_module_whose_init_fails_is_caught_and_not_published(settings, base_image, tmp_path: Path):
    """failinit builds, its boot test fails with insmod's error, and --publish skips it."""
    out = tmp_path / "out"
    proc = run_cli(
        settings,
        "build",
        str(EXAMPLES / "failinit"),
        "--kernel",
        KERNEL_61,
        "--out",
        str(out),
        "--boot-test",
        "--publish",
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    kernel = report["kernels"][0]
    assert kernel["status"] in ("built", "cached")
    assert kernel["boot"]["status"] == "failed"
    assert "No such device" in kernel["boot"]["diagnosis"], kernel["boot"]
    assert "not publishing" in proc.stderr
    listed = run_cli(settings, "repo", "list", "--json")
    packages = [row["package"] for row in json.loads(listed.stdout)]
    assert "failinit-dkms" in packages
    assert f"failinit-modules-{KERNEL_61}" not in packages


def test_module_that_loads_is_published_after_its_boot_test(settings, base_image, tmp_path: Path):
    """hello boots, loads, and its package is published with the -dkms one."""
    out = tmp_path / "out"
    proc = run_cli(
        settings,
        "build",
        str(EXAMPLES / "hello"),
        "--kernel",
        KERNEL_61,
        "--out",
        str(out),
        "--boot-test",
        "--publish",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "passed" in proc.stdout
    listed = run_cli(settings, "repo", "list", "--json")
    packages = {row["package"] for row in json.loads(listed.stdout)}
    assert {"hello-dkms", f"hello-modules-{KERNEL_61}"} <= packages
