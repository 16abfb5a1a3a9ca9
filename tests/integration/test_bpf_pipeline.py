"""A source of BPF programs goes through the same `moddeb build` as kernel modules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .helpers import EXAMPLES, run_cli

pytestmark = pytest.mark.docker


def test_bpf_source_is_recognised_and_packaged_by_the_cli(settings, base_image, tmp_path: Path):
    """`moddeb build` on the XDP example reports kind bpf, its checks, and NAME-bpf packages."""
    proc = run_cli(
        settings,
        "build",
        str(EXAMPLES / "xdp-sport-random"),
        "--out",
        str(tmp_path / "out"),
        "--json",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["kind"] == "bpf" and report["status"] == "succeeded"
    names = sorted(report["artifacts"])
    assert names == [
        f"xdp-sport-random-bpf-dev_{report['version']}_amd64.deb",
        f"xdp-sport-random-bpf_{report['version']}_amd64.deb",
    ]
    checks = {c["name"]: c["status"] for c in report["bpf"]["checks"]}
    assert checks and "failed" not in checks.values(), checks


def test_bpf_boot_test_checks_each_target_kernels_verifier(settings, base_image, tmp_path):
    """With --boot-test and kernels, every target kernel's verifier loads the objects."""
    proc = run_cli(
        settings,
        "build",
        str(EXAMPLES / "xdp-sport-random"),
        "--kernel",
        "6.1.0-57-amd64",
        "--kernel",
        "6.12.117+deb12-amd64",
        "--boot-test",
        "--out",
        str(tmp_path / "out"),
        "--json",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    checks = json.loads(proc.stdout)["bpf"]["checks"]
    qemu = [c["detail"] for c in checks if c["name"] == "verifier" and "under QEMU" in c["detail"]]
    assert len(qemu) == 2 and all("loaded sport_random" in d for d in qemu), checks
