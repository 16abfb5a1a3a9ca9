"""BPF objects loaded in real Debian kernels under QEMU: the example passes the verifier of
6.1 and 6.12, an unchecked packet read is refused by both with the verifier's words."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from builder.boottest import ensure_kernel
from builder.bpf import build_bpf
from builder.bpf_boot import qemu_verifiers, verify_in_kernel
from builder.bpf_checks import BpfCheck
from builder.config import Settings
from builder.errors import ModdebError
from tests.conftest import _require, require_vm, settings_sharing_cache

from .helpers import EXAMPLES, KERNEL_61, KERNEL_612, kernels
from .test_bpf import BAD_PACKET_READ

pytestmark = pytest.mark.docker  # the objects are compiled in moddeb's BPF image


@pytest.fixture(scope="module")
def vm_settings(shared_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """Settings with the session's shared cache; skips (or fails in CI) without QEMU,
    a static busybox or bpftool."""
    require_vm()
    if not any(Path(p).is_file() for p in ("/usr/sbin/bpftool", "/sbin/bpftool")):
        _require("bpftool", "apt-get install bpftool")
    return settings_sharing_cache(tmp_path_factory.mktemp("bpf-boot-home"), shared_home)


@pytest.fixture(scope="module")
def targets(vm_settings: Settings):
    """6.1 and 6.12, their images fetched into the cache."""
    try:
        infos = kernels(vm_settings, KERNEL_61, KERNEL_612)
        for info in infos:
            ensure_kernel(vm_settings, info)
        return infos
    except (ModdebError, KeyError) as exc:
        _require("the Debian archive's kernel images", str(exc))


def test_example_object_loads_in_both_kernels(vm_settings, runner, base_image, targets, tmp_path):
    """build_bpf with the QEMU verifiers: xdp-sport-random passes 6.1's and 6.12's verifier."""
    result = build_bpf(
        vm_settings,
        runner,
        EXAMPLES / "xdp-sport-random",
        tmp_path / "out",
        tmp_path / "logs",
        verifiers=qemu_verifiers(vm_settings, targets, required=True),
    )
    log = Path(result.log_path).read_text(errors="replace")
    assert result.status == "built", f"{result.diagnosis}\n{log}"
    verdicts = [(c.status, c.detail) for c in result.checks if c.name == "verifier"]
    assert verdicts == [
        ("passed", f"{KERNEL_61} under QEMU loaded sport_random"),
        ("passed", f"{KERNEL_612} under QEMU loaded sport_random"),
    ]
    assert f"MODDEB-INIT {KERNEL_61}" in log and f"MODDEB-INIT {KERNEL_612}" in log
    assert "MODDEB-BPF-OK xdp_sport_random.bpf.o sport_random" in log
    print({k: v for k, v in result.timings.items()})


def test_unchecked_packet_read_is_refused_by_both_kernels(
    vm_settings, runner, base_image, targets, tmp_path
):
    """The out-of-bounds packet read compiles, and each kernel's verifier refuses it; the
    detail carries the verifier's reason and the source line it annotated."""
    kept = tmp_path / "kept"
    kept.mkdir()

    def keep(obj: Path, log_path: Path) -> BpfCheck:
        shutil.copyfile(obj, kept / obj.name)
        return BpfCheck("verifier", obj.name, "skipped", "kept for the QEMU check")

    tree = tmp_path / "peek-0.1"
    tree.mkdir()
    (tree / "peek.bpf.c").write_text(BAD_PACKET_READ)
    build_bpf(vm_settings, runner, tree, tmp_path / "out", tmp_path / "logs", verifiers=[keep])
    obj = kept / "peek.bpf.o"
    assert obj.is_file()
    for kernel in targets:
        log_path = tmp_path / f"{kernel.kernel_release}.log"
        check = verify_in_kernel(vm_settings, kernel, obj, log_path)
        log = log_path.read_text(errors="replace")
        assert check.status == "failed", f"{check.detail}\n{log}"
        assert check.detail.startswith(
            f"{kernel.kernel_release} under QEMU's verifier rejected peek.bpf.o: program 'peek': "
            "BPF program load failed: Permission denied: R1 offset is outside of the packet"
        ), check.detail
        assert "invalid access to packet, off=12 size=1" in check.detail
        assert "data[12]" in check.detail  # the source line the verifier annotated
        assert "MODDEB-BPF-FAIL peek.bpf.o" in log
