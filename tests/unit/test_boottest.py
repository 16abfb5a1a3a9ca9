"""Boot tests without QEMU: console markers, verdicts, the qemu command, timeouts, kernel cache."""

from __future__ import annotations

import hashlib
import lzma
import re
import struct
import sys
import threading
import time
from pathlib import Path

import pytest

from builder import boottest, initramfs
from builder.boottest import (
    BootKernel,
    BootRequest,
    BootResult,
    VmRun,
    choose_accel,
    diagnose,
    ensure_kernel,
    extract_vmlinux,
    find_stanza,
    insmod_error,
    parse_console,
    qemu_command,
    read_smoke,
    run_vm,
)
from builder.config import Settings
from builder.errors import InvalidInput, Transient
from builder.kernels import KernelInfo
from tests.unit.test_boottest_initramfs import fake_busybox, fake_ko, make_deb

ROOT = Path(__file__).resolve().parents[2]
KVER = "6.1.0-57-amd64"
OK_RUN = VmRun(0, False, False, 5.0)

BOOTED = f"""\
moddeb: qemu-system-x86_64 ...
\x1bc[    0.000000] Linux version {KVER}
MODDEB-INIT {KVER}
"""
# As /init reports through /dev/kmsg, each line carries the kernel's timestamp.
KBENCH_PASSED = (
    BOOTED
    + """\
[    1.802616] MODDEB-INSMOD-BEGIN test kbench
[    1.847661] MODDEB-INSMOD-OK kbench\r
[    1.917957] kmsg| [    1.823405] kbench: loaded, see /sys/kernel/kbench
[    1.921160] MODDEB-SMOKE-BEGIN
[    1.999429] smoke| min=181 max=89066 count=1000 p95=205 p90=196 p50=187 mad=2
[    2.000989] MODDEB-SMOKE-OK
[    2.001278] MODDEB-DONE
[    2.010615] reboot: Power down
"""
)
KBENCH_EXPECT = r"^min=\d+ max=\d+ count=\d+"


def verdict(text: str, run: VmRun = OK_RUN, expect: str | None = None) -> tuple[str, str]:
    """diagnose() on a console transcript, with the default timeouts."""
    return diagnose(parse_console(text), run, KVER, expect, 120, 60)


def test_a_clean_run_with_the_expected_line_passes_and_quotes_it() -> None:
    """Module loaded, smoke printed kbench's stats line: passed, the line in the diagnosis."""
    status, why = verdict(KBENCH_PASSED, expect=KBENCH_EXPECT)
    assert status == "passed"
    assert (
        why
        == "loaded kbench; smoke printed: min=181 max=89066 count=1000 p95=205 p90=196 p50=187 mad=2"
    )
    console = parse_console(KBENCH_PASSED)
    assert console.loaded == ["kbench"] and console.output[0].startswith("min=181")


def test_init_returning_enodev_is_a_failure_with_errno_and_kernel_message() -> None:
    """failinit's -ENODEV: failed, with busybox's reason, the errno and the module's own printk."""
    text = (
        BOOTED
        + "MODDEB-INSMOD-BEGIN test failinit\n"
        + "[    3.323004] failinit: no supported device present, refusing to load\n"
        + "MODDEB-INSMOD-FAIL failinit 19 insmod: can't insert '/moddeb/modules/failinit.ko': No such device \n"
        + "kmsg| [    3.316584] failinit: loading out-of-tree module taints kernel.\n"
        + "kmsg| [    3.323004] failinit: no supported device present, refusing to load\n"
        + "MODDEB-DONE\n"
    )
    assert verdict(text) == (
        "failed",
        "insmod failinit failed: No such device (-19); "
        "kernel: failinit: no supported device present, refusing to load",
    )


def test_a_missing_symbol_names_the_symbol() -> None:
    """'Unknown symbol' from the kernel log explains busybox's vague ENOENT message."""
    text = (
        BOOTED
        + "MODDEB-INSMOD-BEGIN test oldapi\n"
        + "MODDEB-INSMOD-FAIL oldapi 2 insmod: can't insert 'x': unknown symbol in module, or unknown parameter\n"
        + "kmsg| [    2.1] oldapi: Unknown symbol strlcpy (err -2)\nMODDEB-DONE\n"
    )
    status, why = verdict(text)
    assert status == "failed"
    assert why == (
        "insmod oldapi failed: unknown symbol in module, or unknown parameter (-2); "
        "kernel: oldapi: Unknown symbol strlcpy (err -2)"
    )


def test_a_failing_dependency_and_undeclared_requests_are_named() -> None:
    """A dependency's failure says so, with what the kernel asked modprobe for meanwhile."""
    text = (
        BOOTED
        + "MODDEB-INSMOD-BEGIN soft crc32c_intel\n"
        + "MODDEB-INSMOD-SOFTFAIL crc32c_intel 19 insmod: can't insert 'x': No such device\n"
        + "MODDEB-INSMOD-BEGIN dep libcrc32c\n"
        + "MODDEB-MODPROBE -q -- crypto-crc32c\n"
        + "MODDEB-INSMOD-FAIL libcrc32c 2 insmod: can't insert 'x': unknown symbol in module, or unknown parameter\n"
        + "MODDEB-DONE\n"
    )
    status, why = verdict(text)
    assert status == "failed"
    assert why.startswith("insmod of dependency libcrc32c failed: unknown symbol")
    assert "it asked the kernel for crypto-crc32c, which nothing declared" in why
    assert parse_console(text).soft_failed == ["crc32c_intel"]


def test_a_softdep_that_does_not_load_does_not_fail_the_test() -> None:
    """Softdeps are best effort, as with modprobe."""
    text = KBENCH_PASSED.replace(
        "[    1.802616] MODDEB-INSMOD-BEGIN test kbench\n",
        "MODDEB-INSMOD-BEGIN soft crc32c_intel\nMODDEB-INSMOD-SOFTFAIL crc32c_intel 19 x\n"
        "MODDEB-INSMOD-BEGIN test kbench\n",
    )
    assert verdict(text)[0] == "passed"


@pytest.mark.parametrize(
    ("tail", "run", "expected"),
    [
        (
            "MODDEB-SMOKE-BEGIN\nsmoke| cat: can't open '/sys/kernel/kbench/run': No such file\n"
            "MODDEB-SMOKE-FAIL 1\nMODDEB-DONE\n",
            OK_RUN,
            (
                "failed",
                "the smoke command failed (exit 1): cat: can't open '/sys/kernel/kbench/run': No such file",
            ),
        ),
        (
            "MODDEB-SMOKE-BEGIN\nMODDEB-SMOKE-FAIL 143\nMODDEB-DONE\n",
            OK_RUN,
            ("failed", "the smoke command timed out after 60s"),
        ),
        (
            "MODDEB-SMOKE-BEGIN\nsmoke| min=1 max=2 count=1000 err=1000\nMODDEB-SMOKE-OK\nMODDEB-DONE\n",
            OK_RUN,
            (
                "failed",
                "the smoke check did not print the expected line (/^min=\\d+ max=\\d+ count=\\d+$/)",
            ),
        ),
        (
            "MODDEB-SMOKE-BEGIN\nsmoke| working...\n",
            VmRun(None, True, False, 120.0),
            ("failed", "timed out after 120s during the smoke command"),
        ),
        (
            "MODDEB-SMOKE-BEGIN\n[    4.1] BUG: kernel NULL pointer dereference, address: 0000000000000008\n"
            "[    4.2] Kernel panic - not syncing: Fatal exception\n",
            VmRun(0, False, False, 6.0),
            (
                "failed",
                "kernel crashed during the smoke command: BUG: kernel NULL pointer dereference, address: 0000000000000008",
            ),
        ),
    ],
)
def test_smoke_problems_fail_with_a_one_line_reason(tail: str, run: VmRun, expected: tuple) -> None:
    """Smoke exit codes, its in-VM timeout, a wrong line, the host timeout and a crash."""
    text = BOOTED + "MODDEB-INSMOD-BEGIN test kbench\nMODDEB-INSMOD-OK kbench\n" + tail
    assert verdict(text, run, r"^min=\d+ max=\d+ count=\d+$") == expected


def test_a_hang_or_crash_inside_insmod_names_the_module() -> None:
    """A module whose init never returns times out 'during loading NAME'; an oops says crashed."""
    text = BOOTED + "MODDEB-INSMOD-BEGIN test hang\n"
    assert verdict(text, VmRun(None, True, False, 120.0)) == (
        "failed",
        "timed out after 120s during loading hang",
    )
    oops = text + "[ 3.1] Oops: 0002 [#1] PREEMPT SMP NOPTI\n"
    assert verdict(oops) == (
        "failed",
        "kernel crashed during loading hang: Oops: 0002 [#1] PREEMPT SMP NOPTI",
    )


def test_a_kernel_warning_while_loading_fails_the_module() -> None:
    """A WARN_ON hit while the module loaded (taint W) is a failure."""
    text = KBENCH_PASSED.replace(
        "MODDEB-INSMOD-OK kbench", "MODDEB-INSMOD-WARN kbench\nMODDEB-INSMOD-OK kbench"
    )
    assert verdict(text) == ("failed", "kernel warning (WARN_ON) while loading kbench")


def test_never_reaching_init_is_moddebs_error_not_the_modules_failure() -> None:
    """No MODDEB-INIT: the kernel or the VM is at fault, so the status is error."""
    assert verdict("SeaBIOS\n", VmRun(None, True, False, 120.0)) == (
        "error",
        f"{KVER} did not reach /init within 120s",
    )
    assert verdict("[0.5] Kernel panic - not syncing: VFS: Unable to mount root fs\n")[0] == "error"
    assert verdict(
        "qemu-system-x86_64: -m 1T: cannot set up guest memory\n", VmRun(1, False, False, 0.1)
    ) == (
        "error",
        f"{KVER} did not reach /init (qemu exited with 1)",
    )
    assert verdict(BOOTED.replace(f"INIT {KVER}", "INIT 6.12.117+deb12-amd64"))[0] == "error"


def test_markers_are_only_trusted_at_the_start_of_a_line() -> None:
    """Smoke output is prefixed, so a smoke that prints a marker cannot fake a result."""
    text = BOOTED + "MODDEB-INSMOD-BEGIN test m\nMODDEB-INSMOD-OK m\nMODDEB-SMOKE-BEGIN\n"
    text += "smoke| MODDEB-SMOKE-OK\nsmoke| MODDEB-DONE\nMODDEB-SMOKE-FAIL 3\nMODDEB-DONE\n"
    assert verdict(text)[0] == "failed"


def test_a_smoke_that_prints_kernel_words_is_not_a_crash() -> None:
    """'BUG:' or 'Oops:' in the smoke's own output is data, not a kernel crash."""
    text = KBENCH_PASSED.replace("smoke| min=", "smoke| BUG: none here\n[ 1.99] smoke| min=")
    assert verdict(text)[0] == "passed"


def test_a_panic_before_init_is_not_blamed_on_the_module() -> None:
    """A crash line before MODDEB-INIT belongs to the kernel's boot, not to the test."""
    text = "[ 0.4] BUG: unable to handle page fault\n" + KBENCH_PASSED
    assert verdict(text)[0] == "passed"


def test_insmod_messages_map_to_errnos() -> None:
    """busybox's strerror() text and its own wording both give the errno."""
    assert insmod_error("insmod: can't insert 'a.ko': No such device") == "No such device (-19)"
    assert (
        insmod_error("insmod: can't insert 'a.ko': invalid module format")
        == "invalid module format (-8)"
    )
    assert insmod_error("something odd") == "something odd"
    assert insmod_error("") == "no message"


def test_kbench_declares_a_smoke_whose_expectation_matches_its_readme() -> None:
    """examples/kbench/moddeb-smoke.sh adds the route and expects the README's stats line."""
    smoke, expect = read_smoke(ROOT / "examples/kbench")
    assert smoke and "ip route add default dev lo" in smoke and "/sys/kernel/kbench/run" in smoke
    assert expect and re.search(
        expect, "min=192 max=113722 count=1000 p95=240 p90=230 p50=199 mad=3"
    )
    assert not re.search(
        expect, "min=126 max=401817 count=1000 p95=154 p90=143 p50=130 mad=1 err=1000"
    )
    assert read_smoke(ROOT / "examples/hello") == (None, None)


def test_qemu_runs_without_network_reboot_or_root() -> None:
    """One CPU, no NIC, no reboot, serial console, panic=-1, seccomp; -cpu host only with KVM."""
    s = Settings(boot_memory="384M")
    cmd = qemu_command(s, Path("/k/vmlinux"), Path("/w/initrd.gz"), "tcg", "amd64")
    text = " ".join(cmd)
    for part in (
        "-accel tcg",
        "-m 384M",
        "-smp 1",
        "-nic none",
        "-no-reboot",
        "-nodefaults",
        "-serial stdio",
        "-kernel /k/vmlinux",
        "-initrd /w/initrd.gz",
        "-sandbox on",
    ):
        assert part in text
    append = cmd[cmd.index("-append") + 1]
    assert {"console=ttyS0", "panic=-1", "oops=panic"} <= set(append.split())
    assert "-cpu" not in cmd
    kvm = qemu_command(s, Path("k"), Path("i"), "kvm", "amd64")
    assert kvm[kvm.index("-accel") + 1] == "kvm" and kvm[kvm.index("-cpu") + 1] == "host"
    with pytest.raises(InvalidInput, match="not arm64"):
        qemu_command(s, Path("k"), Path("i"), "tcg", "arm64")


def test_accel_follows_the_setting_and_remembers_a_stalled_kvm(tmp_path: Path, monkeypatch) -> None:
    """tcg/kvm are taken as given; auto uses KVM only if it opens and has not stalled lately."""
    s = Settings(home=tmp_path, boot_accel="tcg")
    assert choose_accel(s) == "tcg"
    s.boot_accel = "kvm"
    assert choose_accel(s) == "kvm"
    s.boot_accel = "fast"
    with pytest.raises(InvalidInput, match="auto, kvm or tcg"):
        choose_accel(s)
    s.boot_accel = "auto"
    monkeypatch.setattr(boottest.os, "open", lambda *a: (_ for _ in ()).throw(OSError(2, "x")))
    assert choose_accel(s) == "tcg"
    monkeypatch.setattr(boottest.os, "open", lambda *a: 99)
    monkeypatch.setattr(boottest.os, "close", lambda fd: None)
    assert choose_accel(s) == "kvm"
    stamp = tmp_path / "cache/boot/kvm-unusable"
    stamp.parent.mkdir(parents=True)
    stamp.write_text("stalled")
    assert choose_accel(s) == "tcg"


def test_run_vm_kills_a_vm_at_the_timeout(tmp_path: Path) -> None:
    """The hard timeout is enforced from Python: the process is killed, the run marked so."""
    log = tmp_path / "console.log"
    started = time.monotonic()
    run = run_vm(
        [sys.executable, "-c", "print('booting', flush=True); import time; time.sleep(60)"],
        log,
        1.0,
    )
    assert run.timed_out and not run.stalled and run.returncode is None
    assert time.monotonic() - started < 10
    assert "booting" in log.read_text()


def test_run_vm_gives_up_on_a_vm_that_never_reaches_init(tmp_path: Path) -> None:
    """With a grace period (the KVM probe), no MODDEB-INIT by then means stalled."""
    run = run_vm(
        [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "l", 60, grace=0.5
    )
    assert run.stalled and not run.timed_out
    ok = run_vm([sys.executable, "-c", "print('MODDEB-INIT x')"], tmp_path / "m", 60, grace=0.5)
    assert ok.returncode == 0 and not ok.stalled


PACKAGES_TEXT = """\
Package: linux-headers-9.9.9-test
Version: 9.9.9-1

Package: linux-image-9.9.9-test
Version: 9.9.9-1
Filename: pool/main/l/linux/linux-image-9.9.9-test_9.9.9-1_amd64.deb
"""


def test_find_stanza_locates_one_package_in_a_large_index() -> None:
    """Text search finds the whole stanza, only for the exact package name."""
    stanza = find_stanza(PACKAGES_TEXT, "linux-image-9.9.9-test")
    assert stanza is not None and stanza["Filename"].endswith("_amd64.deb")
    assert find_stanza(PACKAGES_TEXT, "linux-image-9.9.9") is None
    assert find_stanza(PACKAGES_TEXT, "linux-headers-9.9.9-test")["Version"] == "9.9.9-1"


def fake_bzimage(payload: bytes) -> bytes:
    """A bzImage-shaped file: setup header with HdrS, payload offset and length, then payload."""
    setup_sects = 1
    image = bytearray((setup_sects + 1) * 512)
    image[0x1F1] = setup_sects
    image[0x202:0x206] = b"HdrS"
    struct.pack_into("<II", image, 0x248, 16, len(payload))
    return bytes(image) + b"\0" * 16 + payload + b"tail"


def test_the_uncompressed_kernel_is_extracted_for_a_direct_pvh_boot() -> None:
    """xz payloads (6.1) unpack to the ELF vmlinux; anything unknown falls back to None."""
    elf = b"\x7fELF" + b"kernel" * 100
    xz = lzma.compress(elf, check=lzma.CHECK_CRC32) + struct.pack("<I", len(elf))
    assert extract_vmlinux(fake_bzimage(xz)) == elf
    assert extract_vmlinux(fake_bzimage(b"LZ4!" + b"x" * 64)) is None
    assert extract_vmlinux(b"not a kernel") is None


def write_index(packages_xz: Path, text: str) -> None:
    """Write a suite's Packages.xz and the (unsigned) InRelease that lists its SHA256."""
    packed = lzma.compress(text.encode())
    packages_xz.parent.mkdir(parents=True, exist_ok=True)
    packages_xz.write_bytes(packed)
    suite_dir = packages_xz.parents[2]
    (suite_dir / "InRelease").write_text(
        f"Suite: {suite_dir.name}\nSHA256:\n"
        f" {hashlib.sha256(packed).hexdigest()} {len(packed)} main/binary-amd64/Packages.xz\n"
    )


def fake_archive(tmp_path: Path, kver: str) -> tuple[Settings, Path]:
    """A file:// archive with one linux-image package (vmlinuz, config, two modules)."""
    elf = b"\x7fELF" + b"vmlinux" * 50
    xz = lzma.compress(elf, check=lzma.CHECK_CRC32) + struct.pack("<I", len(elf))
    mods = f"lib/modules/{kver}/kernel"
    deb = make_deb(
        tmp_path,
        f"linux-image-{kver}",
        {
            f"boot/vmlinuz-{kver}": fake_bzimage(xz),
            f"boot/config-{kver}": b"CONFIG_PVH=y\n",
            f"{mods}/lib/libcrc32c.ko": fake_ko({"name": "libcrc32c", "softdep": "pre: crc32c"}),
            f"{mods}/crypto/crc32c_generic.ko": fake_ko(
                {"name": "crc32c_generic", "alias": "crc32c"}
            ),
            f"usr/share/doc/linux-image-{kver}/copyright": b"GPL\n",
        },
    )
    archive = tmp_path / "archive"
    pool = archive / "pool/main/l/linux"
    pool.mkdir(parents=True)
    (pool / deb.name).write_bytes(deb.read_bytes())
    data = deb.read_bytes()
    index = (
        f"Package: linux-image-{kver}\nVersion: 9-1\nArchitecture: amd64\n"
        f"Filename: pool/main/l/linux/{deb.name}\nSize: {len(data)}\n"
        f"SHA256: {hashlib.sha256(data).hexdigest()}\n\n"
    )
    dists = archive / "dists/bookworm/main/binary-amd64"
    write_index(dists / "Packages.xz", index)
    write_index(archive / "dists/bookworm-updates/main/binary-amd64/Packages.xz", "")
    # The index signature is tested in test_archive_index.py; this archive is unsigned.
    settings = Settings(
        home=tmp_path / "home", mirror=f"file://{archive}", security_mirror="", archive_keyring=""
    )
    return settings, dists / "Packages.xz"


def test_a_kernel_is_fetched_checked_unpacked_and_depmodded_once(
    tmp_path: Path, monkeypatch
) -> None:
    """Parallel boots of one kernel download it once; the cache has a PVH vmlinux and depmod data."""
    monkeypatch.setattr(boottest, "build_arch", lambda: "amd64")
    kver = "9.9.9-test"
    settings, _ = fake_archive(tmp_path, kver)
    calls = []
    real_download = boottest.download

    def counting(*args):
        calls.append(args[0])
        time.sleep(0.2)  # widen the race window
        return real_download(*args)

    monkeypatch.setattr(boottest, "download", counting)
    kernel = KernelInfo(kver, "test", "bookworm", "9-1")
    got: list[BootKernel] = []
    threads = [
        threading.Thread(target=lambda: got.append(ensure_kernel(settings, kernel)))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [f"{settings.mirror}/pool/main/l/linux/linux-image-{kver}.deb"]
    assert len(got) == 3 and got[0] == got[1] == got[2]
    bk = got[0]
    assert bk.image.name == "vmlinux" and bk.image.read_bytes().startswith(b"\x7fELF")
    assert (bk.modules_dir / "modules.alias").read_text().count("alias crc32c crc32c_generic") == 1
    assert "softdep libcrc32c pre: crc32c" in (bk.modules_dir / "modules.softdep").read_text()
    assert not (bk.modules_dir.parents[2] / "usr").exists()  # docs are not kept


def test_a_kernel_package_that_fails_its_checksum_is_not_cached(
    tmp_path: Path, monkeypatch
) -> None:
    """A download that does not match the index's SHA256 is a transient error; nothing is kept."""
    monkeypatch.setattr(boottest, "build_arch", lambda: "amd64")
    settings, packages = fake_archive(tmp_path, "9.9.8-test")
    text = lzma.decompress(packages.read_bytes()).decode()
    text = re.sub(r"SHA256: \w+", "SHA256: " + "0" * 64, text)
    write_index(packages, text)
    with pytest.raises(Transient, match="does not match the archive index"):
        ensure_kernel(settings, KernelInfo("9.9.8-test", "test", "bookworm", "9-1"))
    assert [p.name for p in (settings.cache_root / "boot").iterdir()] == []
    with pytest.raises(InvalidInput, match="no linux-image-9.9.7-test"):
        ensure_kernel(settings, KernelInfo("9.9.7-test", "test", "bookworm", "9-1"))


def test_boot_test_writes_the_log_and_never_raises(tmp_path: Path, monkeypatch) -> None:
    """The glue: packages unpacked, initramfs built, the VM's console read into a verdict."""
    modules = tmp_path / "k/lib/modules" / KVER
    modules.mkdir(parents=True)
    for name in ("modules.dep", "modules.alias"):
        (modules / name).write_text("")
    monkeypatch.setattr(
        boottest,
        "ensure_kernel",
        lambda s, k: BootKernel(KVER, tmp_path / "vmlinux", modules, "linux-image", "1"),
    )
    monkeypatch.setattr(boottest, "build_arch", lambda: "amd64")
    monkeypatch.setattr(initramfs, "DEFAULT_BUSYBOX", fake_busybox(tmp_path / "busybox"))
    monkeypatch.setattr(initramfs, "read_modinfo", lambda p: initramfs.ModInfo())
    seen: list[list[str]] = []

    def fake_vm(cmd, log_path, timeout, grace=None):
        seen.append(cmd)
        with open(log_path, "a") as fh:
            fh.write(KBENCH_PASSED)
        return OK_RUN

    monkeypatch.setattr(boottest, "run_vm", fake_vm)
    deb = make_deb(
        tmp_path, f"kbench-modules-{KVER}", {f"lib/modules/{KVER}/updates/dkms/kbench.ko": b"ELF"}
    )
    settings = Settings(home=tmp_path / "home", boot_accel="tcg")
    kernel = KernelInfo(KVER, "amd64", "bookworm", "1")
    log = tmp_path / "logs/boot.log"
    result = boottest.boot_test(
        settings, kernel, [deb], log, smoke="cat /sys/kernel/kbench/run", expect=KBENCH_EXPECT
    )
    assert (result.status, result.accel, result.loaded) == ("passed", "tcg", ["kbench"])
    assert set(result.timings) == {"kernel", "initramfs", "vm"}
    text = log.read_text()
    assert text.startswith(f"moddeb: boot test of {deb.name} in {KVER}\n")
    assert (
        text.rstrip()
        .splitlines()[-1]
        .startswith("moddeb: passed: loaded kbench; smoke printed: min=181")
    )
    assert seen and "-nic" in seen[0]

    bad = boottest.boot_test(settings, kernel, [deb], log, smoke=None, expect="x")
    assert bad.status == "error" and "without a smoke command" in bad.diagnosis
    assert "moddeb: error:" in log.read_text()


def test_boot_many_runs_side_by_side_and_keeps_request_order(tmp_path: Path, monkeypatch) -> None:
    """Up to `parallel` boots run at once; results come back in the order asked."""
    running, peak, lock = [0], [0], threading.Lock()

    def fake_boot(settings, kernel, debs, log_path, smoke=None, expect=None):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.2)
        with lock:
            running[0] -= 1
        return BootResult(kernel.kernel_release, "passed")

    monkeypatch.setattr(boottest, "boot_test", fake_boot)
    items = [
        BootRequest(KernelInfo(f"k{i}", "amd64", "bookworm", "1"), [], tmp_path / f"{i}.log")
        for i in range(5)
    ]
    results = boottest.boot_many(Settings(home=tmp_path), items, parallel=2)
    assert [r.kernel_release for r in results] == [f"k{i}" for i in range(5)]
    assert peak[0] == 2
