"""The BPF check in a target kernel without QEMU: initramfs contents, console, verdicts."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from builder import bpf_boot, initramfs
from builder.boottest import VmRun
from builder.bpf_boot import (
    BpfConsole,
    build_bpf_initramfs,
    judge,
    parse_bpf_console,
    qemu_verifiers,
)
from builder.bpf_checks import BpfCheck
from builder.kernels import KernelInfo
from tests.conftest import _require
from tests.unit.test_boottest_initramfs import fake_busybox

ROOT = Path(__file__).resolve().parents[2]
INIT = (ROOT / "debian-templates/boottest/init-bpf").read_text()
KVER = "6.1.0-57-amd64"
KERNEL = KernelInfo(KVER, "amd64", "bookworm", "6.1.158-1")
FINISHED = VmRun(0, False, False, 3.0)


def host_bpftool() -> Path:
    found = bpf_boot.find_bpftool()
    if found is None:
        _require("bpftool", "apt-get install bpftool")
    assert found is not None
    return found


def entries_of(initrd: Path) -> dict[str, initramfs.CpioEntry]:
    return {e.name: e for e in initramfs.read_newc(initrd.read_bytes())}


def test_initramfs_holds_bpftool_its_libraries_and_the_objects(tmp_path: Path) -> None:
    """bpftool at /usr/sbin, every library ldd names and the dynamic loader at their host
    paths with the real files' bytes, the objects under /moddeb/bpf, the init-bpf /init."""
    bpftool = host_bpftool()
    objs = [tmp_path / "a.bpf.o", tmp_path / "b.bpf.o"]
    for i, obj in enumerate(objs):
        obj.write_bytes(b"\x7fELF object %d" % i)
    initrd = build_bpf_initramfs(
        tmp_path / "initrd.gz", INIT, objs, bpftool, 90, busybox=fake_busybox(tmp_path / "bb")
    )
    found = entries_of(initrd)
    names = list(found)
    assert found["init"].data.decode() == INIT and found["init"].mode == 0o100755
    tool = found["usr/sbin/bpftool"]
    assert tool.mode == 0o100755 and tool.data == bpftool.resolve().read_bytes()
    libs = initramfs.shared_libraries(bpftool)
    assert any("ld-linux" in str(p) for p in libs), libs  # the dynamic loader
    assert any(p.name.startswith("libc.so") for p in libs), libs
    for lib in libs:
        entry = found[str(lib).lstrip("/")]
        assert entry.mode == 0o100755 and entry.data == lib.resolve().read_bytes()
        for parent in Path(entry.name).parents[:-1]:  # each directory comes before its files
            assert found[str(parent)].mode == 0o040755
            assert names.index(str(parent)) < names.index(entry.name)
    assert found["moddeb/bpf/a.bpf.o"].data == b"\x7fELF object 0"
    assert found["moddeb/bpf/b.bpf.o"].data == b"\x7fELF object 1"
    assert found["moddeb/env"].data == b"BPF_TIMEOUT=90\n"
    assert found["dev/console"].rdev == (5, 1) and found["bin/sh"].data == b"busybox"
    assert len(names) == len(set(names))  # no path twice


def test_bpftool_from_elsewhere_still_lands_at_usr_sbin(tmp_path: Path) -> None:
    """A bpftool found outside /usr/sbin (a symlink, say) is copied where /init runs it."""
    real = host_bpftool()
    elsewhere = tmp_path / "tools" / "bpftool"
    elsewhere.parent.mkdir()
    elsewhere.symlink_to(real)
    initrd = build_bpf_initramfs(
        tmp_path / "i.gz", INIT, [], elsewhere, 30, busybox=fake_busybox(tmp_path / "bb")
    )
    found = entries_of(initrd)
    assert found["usr/sbin/bpftool"].data == real.resolve().read_bytes()
    assert not any("tools" in name for name in found)
    assert {"usr", "usr/sbin"} <= set(found)


def test_a_static_binary_needs_no_library(tmp_path: Path) -> None:
    """ldd's "not a dynamic executable" means nothing to copy."""
    static = shutil.copy(fake_busybox(tmp_path / "bb"), tmp_path / "static")
    Path(static).chmod(0o755)
    assert initramfs.shared_libraries(Path(static)) == []


def test_objects_with_the_same_name_are_refused(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    objs = [tmp_path / d / "x.bpf.o" for d in ("a", "b")]
    for obj in objs:
        obj.write_bytes(b"x")
    with pytest.raises(ValueError, match="share a name"):
        build_bpf_initramfs(
            tmp_path / "i.gz", INIT, objs, host_bpftool(), 30, fake_busybox(tmp_path / "bb")
        )


def test_module_boot_initramfs_is_unchanged_by_the_shared_base(tmp_path: Path) -> None:
    """build_initramfs (modules) still lays out the same entries in the same order."""
    initrd = initramfs.build_initramfs(
        tmp_path / "m.gz", "#!/bin/sh\n", [], busybox=fake_busybox(tmp_path / "bb")
    )
    assert list(entries_of(initrd)) == [
        "bin",
        "dev",
        "proc",
        "sys",
        "tmp",
        "moddeb",
        "dev/console",
        "dev/null",
        "bin/busybox",
        "bin/sh",
        "init",
        "moddeb/modules",
        "moddeb/load",
        "moddeb/env",
    ]


REJECTED = """\
[    1.90] MODDEB-INIT 6.1.0-57-amd64
[    1.91] MODDEB-BPF-BEGIN peek.bpf.o
[    2.10] bpf| libbpf: prog 'peek': BPF program load failed: Permission denied
[    2.10] bpf| libbpf: prog 'peek': -- BEGIN PROG LOAD LOG --
[    2.10] bpf| ; return data[12] == 0x08 ? XDP_DROP : XDP_PASS;
[    2.10] bpf| 1: (71) r1 = *(u8 *)(r1 +12)
[    2.10] bpf| invalid access to packet, off=12 size=1, R1(id=0,off=12,r=0)
[    2.10] bpf| R1 offset is outside of the packet
[    2.10] bpf| processed 2 insns (limit 1000000) max_states_per_insn 0 total_states 0
[    2.10] bpf| -- END PROG LOAD LOG --
[    2.10] bpf| Error: failed to load object file
[    2.11] MODDEB-BPF-FAIL peek.bpf.o 255
[    2.12] MODDEB-DONE
"""


def test_a_rejected_program_fails_with_the_verifiers_words() -> None:
    console = parse_bpf_console(REJECTED)
    assert console.kernel == KVER and console.done
    assert console.results == {"peek.bpf.o": (255, [])}
    assert console.output["peek.bpf.o"][-1] == "Error: failed to load object file"
    check = judge(console, FINISHED, KVER, "peek.bpf.o", 90)
    assert (check.name, check.target, check.status) == ("verifier", "peek.bpf.o", "failed")
    first = check.detail.splitlines()[0]
    assert first == (
        "6.1.0-57-amd64 under QEMU's verifier rejected peek.bpf.o: program 'peek': BPF program"
        " load failed: Permission denied: R1 offset is outside of the packet"
    )
    assert "invalid access to packet" in check.detail and "data[12]" in check.detail


def test_a_loaded_object_passes_and_names_its_programs() -> None:
    console = parse_bpf_console(
        "MODDEB-INIT 6.1.0-57-amd64\r\nMODDEB-BPF-BEGIN x.bpf.o\n"
        "[ 2.1] MODDEB-BPF-OK x.bpf.o sport_random other \nMODDEB-DONE\n"
    )
    check = judge(console, FINISHED, KVER, "x.bpf.o", 90)
    assert check.status == "passed"
    assert check.detail == "6.1.0-57-amd64 under QEMU loaded sport_random, other"


@pytest.mark.parametrize(
    ("text", "run", "status", "words"),
    [
        ("", VmRun(None, True, False, 120.0), "skipped", "did not reach /init within 120s"),
        ("Kernel panic - not syncing: VFS\n", FINISHED, "skipped", "did not reach /init: Kernel"),
        ("MODDEB-INIT 6.12.1\n", FINISHED, "skipped", "the VM booted 6.12.1"),
        (
            f"MODDEB-INIT {KVER}\nMODDEB-BPF-SETUP-FAIL cannot mount bpffs: no\nMODDEB-DONE\n",
            FINISHED,
            "skipped",
            "cannot mount bpffs: no",
        ),
        (
            f"MODDEB-INIT {KVER}\nMODDEB-BPF-BEGIN x.bpf.o\nBUG: kernel NULL pointer x\n",
            VmRun(0, False, False, 3.0),
            "failed",
            "crashed while loading x.bpf.o: BUG: kernel NULL pointer x",
        ),
        (
            f"MODDEB-INIT {KVER}\nMODDEB-BPF-BEGIN x.bpf.o\n",
            VmRun(None, True, False, 120.0),
            "failed",
            "loading x.bpf.o timed out after 120s",
        ),
        (
            f"MODDEB-INIT {KVER}\nMODDEB-BPF-BEGIN x.bpf.o\nMODDEB-BPF-FAIL x.bpf.o 124\n",
            FINISHED,
            "failed",
            "bpftool prog loadall x.bpf.o took over 90s",
        ),
        (f"MODDEB-INIT {KVER}\n", FINISHED, "skipped", "the VM stopped before loading it"),
    ],
    ids=[
        "no-boot",
        "early-panic",
        "wrong-kernel",
        "no-bpffs",
        "crash",
        "hang",
        "bpftool-timeout",
        "stopped",
    ],
)
def test_verdicts(text: str, run: VmRun, status: str, words: str) -> None:
    check = judge(parse_bpf_console(text), run, KVER, "x.bpf.o", 90)
    assert check.status == status and words in check.detail, check.detail


def test_bpf_output_cannot_pass_for_a_marker() -> None:
    """A line bpftool prints that looks like a marker stays output."""
    console = parse_bpf_console(
        f"MODDEB-INIT {KVER}\nMODDEB-BPF-BEGIN x.bpf.o\nbpf| MODDEB-BPF-OK x.bpf.o\n"
        "bpf| BUG: not a crash\nMODDEB-BPF-FAIL x.bpf.o 1\n"
    )
    assert console.results == {"x.bpf.o": (1, [])} and console.panic is None
    assert isinstance(console, BpfConsole)


def test_qemu_verifiers_one_per_kernel(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each verifier boots its own kernel; required turns skipped into failed."""
    seen: list[str] = []

    def fake(settings, kernel, obj, log_path):  # noqa: ANN001 - a stand-in
        seen.append(kernel.kernel_release)
        return BpfCheck("verifier", obj.name, "skipped", "no qemu")

    monkeypatch.setattr(bpf_boot, "verify_in_kernel", fake)
    other = KernelInfo("6.12.117+deb12-amd64", "amd64", "bookworm", "6.12.117-1")
    loose = qemu_verifiers(object(), [KERNEL, other])  # type: ignore[arg-type]
    assert [v(tmp_path / "x.bpf.o", tmp_path / "log").status for v in loose] == ["skipped"] * 2
    assert seen == [KVER, "6.12.117+deb12-amd64"]
    strict = qemu_verifiers(object(), [KERNEL], required=True)  # type: ignore[arg-type]
    assert strict[0](tmp_path / "x.bpf.o", tmp_path / "log").status == "failed"


def test_no_qemu_skips_without_raising(
    monkeypatch: pytest.MonkeyPatch, settings, tmp_path: Path
) -> None:
    monkeypatch.setitem(bpf_boot.boottest.QEMU_FOR_ARCH, "amd64", "qemu-moddeb-absent")
    obj = tmp_path / "x.bpf.o"
    obj.write_bytes(b"x")
    check = bpf_boot.verify_in_kernel(settings, KERNEL, obj, tmp_path / "logs" / "b.log")
    assert check.status == "skipped"
    assert "qemu-moddeb-absent is not installed" in check.detail
    assert "verifier skipped in 6.1.0-57-amd64" in (tmp_path / "logs" / "b.log").read_text()
