"""Real QEMU boots of real Debian kernels, with modules taken from those kernels (no Docker)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from builder import boottest
from builder.boottest import BootRequest, boot_many, ensure_kernel
from builder.config import Settings
from builder.errors import ModdebError
from tests.conftest import _require, require_vm, settings_sharing_cache

from .helpers import KERNEL_61, KERNEL_612, kernels


@pytest.fixture(scope="module")
def boot_settings(shared_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """Settings with the session's shared cache; skips (or fails in CI) without QEMU/busybox."""
    require_vm()
    return settings_sharing_cache(tmp_path_factory.mktemp("boot-home"), shared_home)


@pytest.fixture(scope="module")
def booted_kernels(boot_settings: Settings):
    """6.1 and 6.12 KernelInfo, their images fetched into the cache."""
    try:
        infos = kernels(boot_settings, KERNEL_61, KERNEL_612)
        return {k.kernel_release: (k, ensure_kernel(boot_settings, k)) for k in infos}
    except (ModdebError, KeyError) as exc:
        _require("the Debian archive's kernel images", str(exc))


def wrap_module(tmp: Path, module: Path, kernel_release: str) -> Path:
    """A NAME-modules-KVER package holding one module file, as mkbmdeb lays it out."""
    name = module.name.split(".ko")[0]
    root = tmp / f"pkg-{name}-{kernel_release}"
    dest = root / "lib/modules" / kernel_release / "updates/dkms"
    dest.mkdir(parents=True)
    shutil.copyfile(module, dest / module.name)
    (root / "DEBIAN").mkdir()
    (root / "DEBIAN/control").write_text(
        f"Package: {name.replace('_', '-')}-modules-{kernel_release}\nVersion: 1\n"
        "Architecture: amd64\nMaintainer: Test <test@example.org>\nDescription: test\n"
    )
    deb = tmp / f"{name}-modules-{kernel_release}_1_amd64.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-b", str(root), str(deb)], check=True)
    return deb


def find_module(modules_dir: Path, name: str) -> Path:
    """A module of the kernel's own tree, compressed or not."""
    return next(p for p in modules_dir.rglob(f"{name}.ko*") if p.is_file())


def test_kernel_modules_load_after_their_dependencies_and_softdeps(
    boot_settings: Settings, booted_kernels, tmp_path: Path
) -> None:
    """nf_nat in 6.1 and 6.12 (.ko.xz): nf_conntrack, libcrc32c and its crc32c softdep load first."""
    items = []
    for kver, (info, bk) in booted_kernels.items():
        deb = wrap_module(tmp_path, find_module(bk.modules_dir, "nf_nat"), kver)
        items.append(BootRequest(info, [deb], tmp_path / f"nf_nat-{kver}.log"))
    results = boot_many(boot_settings, items)
    for result in results:
        log = Path(result.log_path).read_text(errors="replace")
        assert result.status == "passed", f"{result.diagnosis}\n{log}"
        order = result.loaded
        assert order[-1] == "nf_nat"
        assert order.index("libcrc32c") < order.index("nf_conntrack")
        assert order.index("crc32c_generic") < order.index("libcrc32c")
        assert f"MODDEB-INIT {result.kernel_release}" in log
        print(f"{result.kernel_release}: {result.accel} {result.duration:.1f}s {result.timings}")


def test_a_module_built_for_another_kernel_is_refused_by_the_kernel(
    boot_settings: Settings, booted_kernels, tmp_path: Path
) -> None:
    """6.1's dummy.ko in 6.12: the real kernel rejects it and the diagnosis quotes why."""
    info, _ = booted_kernels[KERNEL_612]
    _, bk61 = booted_kernels[KERNEL_61]
    deb = wrap_module(tmp_path, find_module(bk61.modules_dir, "dummy"), KERNEL_612)
    result = boottest.boot_test(boot_settings, info, [deb], tmp_path / "wrong.log")
    assert result.status == "failed"
    assert result.diagnosis.startswith("insmod dummy failed: invalid module format (-8)")
    assert "kernel: " in result.diagnosis
