"""Helpers for integration tests: run builds and check packages in real containers."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from builder.config import Settings
from builder.kernels import list_kernels
from builder.pipeline import BuildReport, BuildRequest, Pipeline
from builder.runner import Limits, Runner

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
KERNEL_61 = "6.1.0-57-amd64"
KERNEL_612 = "6.12.117+deb12-amd64"


def kernels(settings: Settings, *releases: str):
    """KernelInfo rows for the given ABIs, straight from the archive's catalog."""
    catalog = {k.kernel_release: k for k in list_kernels(settings)}
    return [catalog[r] for r in releases]


def build(
    settings: Settings, runner: Runner, source: str, out: Path, *releases: str
) -> BuildReport:
    """Run a full moddeb build (the same Pipeline the CLI and the workers use)."""
    request = BuildRequest(source=source, kernels=kernels(settings, *releases), out_dir=out)
    return Pipeline(settings, request, runner=runner).run()


def run_in(runner: Runner, image: str, script: str, debs: list[Path], tmp: Path) -> tuple[int, str]:
    """Run a shell script in a fresh, network-less container with the .debs under /build/in."""
    inbox = tmp / "inbox"
    shutil.rmtree(inbox, ignore_errors=True)
    inbox.mkdir(parents=True)
    for deb in debs:
        shutil.copyfile(deb, inbox / deb.name)
    log = tmp / "check.log"
    log.unlink(missing_ok=True)
    result = runner.run_step(
        "test-check",
        image,
        ["/bin/sh", "-c", script],
        log_path=log,
        limits=Limits(timeout=600),
        inputs={"/build/in": inbox},
    )
    return result.exit_code, log.read_text(errors="replace")


def run_cli(settings: Settings, *args: str) -> subprocess.CompletedProcess:
    """Run the `moddeb` command line as a user would, on this test's MODDEB_HOME."""
    return subprocess.run(
        [sys.executable, "-m", "builder.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=1200,
        env={"MODDEB_HOME": str(settings.home), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
    )
