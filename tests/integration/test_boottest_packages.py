"""kbench and failinit, built by the real pipeline, each booted in its own 6.1 and 6.12 kernel."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from builder.boottest import BootRequest, boot_many, read_smoke
from builder.config import Settings

from .helpers import EXAMPLES, KERNEL_61, KERNEL_612, build, kernels
from .test_boottest_kernels import boot_settings  # noqa: F401 - fixture

pytestmark = pytest.mark.docker

STATS = re.compile(r"^min=\d+ max=\d+ count=1000 p95=\d+ p90=\d+ p50=\d+ mad=\d+$")


@pytest.fixture(scope="module")
def results(boot_settings: Settings, runner, base_image, tmp_path_factory):  # noqa: F811
    """Build kbench and failinit for both kernels, then boot all four packages side by side."""
    items = []
    infos = kernels(boot_settings, KERNEL_61, KERNEL_612)
    for example in ("kbench", "failinit"):
        out = tmp_path_factory.mktemp(f"{example}-out")
        report = build(boot_settings, runner, str(EXAMPLES / example), out, KERNEL_61, KERNEL_612)
        assert report.status == "succeeded", report.error
        smoke, expect = read_smoke(EXAMPLES / example)
        for info in infos:
            debs = sorted(out.glob(f"{example}-modules-{info.kernel_release}_*.deb"))
            assert len(debs) == 1
            log = out / f"boot-{info.kernel_release}.log"
            items.append(BootRequest(info, debs, log, smoke, expect))
    found = boot_many(boot_settings, items)
    return {
        (item.module_debs[0].name.split("-modules-")[0], r.kernel_release): r
        for item, r in zip(items, found, strict=True)
    }


@pytest.mark.parametrize("kernel_release", [KERNEL_61, KERNEL_612])
def test_kbench_loads_and_the_vm_prints_its_statistics(results, kernel_release: str) -> None:
    """kbench loads in its own kernel; with a route, reading run prints the stats line."""
    result = results[("kbench", kernel_release)]
    log = Path(result.log_path).read_text(errors="replace")
    assert result.status == "passed", f"{result.diagnosis}\n{log}"
    assert result.loaded == ["kbench"]
    assert any(STATS.match(line) for line in result.output), result.output
    assert "smoke| min=" in log and "MODDEB-SMOKE-OK" in log
    print(f"{kernel_release}: {result.diagnosis} ({result.accel}, {result.duration:.1f}s)")


@pytest.mark.parametrize("kernel_release", [KERNEL_61, KERNEL_612])
def test_failinit_is_caught_with_its_errno_and_message(results, kernel_release: str) -> None:
    """failinit builds but its init returns -ENODEV: failed, saying so in one line."""
    result = results[("failinit", kernel_release)]
    assert result.status == "failed"
    assert result.diagnosis == (
        "insmod failinit failed: No such device (-19); "
        "kernel: failinit: no supported device present, refusing to load"
    )
    assert "MODDEB-INSMOD-FAIL failinit" in Path(result.log_path).read_text(errors="replace")
