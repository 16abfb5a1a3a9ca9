"""The verifier check in a target kernel: boot KVER under QEMU and load a BPF object there.

The boot test's machinery (the cached kernel, the qemu command, run_vm, the cpio writer)
with a second /init (debian-templates/boottest/init-bpf): the initramfs holds the host's
bpftool and the libraries it needs, and the objects; /init mounts bpffs and runs
`bpftool prog loadall OBJ /sys/fs/bpf/moddeb-test` for each.
"""

from __future__ import annotations

import gzip
import logging
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from builder import boottest, initramfs
from builder.bpf import Verifier
from builder.bpf_checks import BpfCheck, load_result
from builder.config import Settings
from builder.errors import ModdebError
from builder.kernels import KernelInfo, build_arch

log = logging.getLogger(__name__)

INIT_TEMPLATE = "init-bpf"
GUEST_BPFTOOL = "/usr/sbin/bpftool"
PIN_DIR = "/sys/fs/bpf/moddeb-test"
OUTPUT_PREFIX = "bpf| "
# bpftool's own time limit in the guest, as a share of boot_timeout (qemu is killed at that).
GUEST_SHARE = 0.75


@dataclass
class BpfConsole:
    """What init-bpf reported on the serial console."""

    kernel: str | None = None
    setup_failed: str | None = None
    begun: list[str] = field(default_factory=list)  # objects whose loadall started
    results: dict[str, tuple[int, list[str]]] = field(default_factory=dict)  # rc, pinned
    output: dict[str, list[str]] = field(default_factory=dict)  # bpftool's lines per object
    early_panic: str | None = None
    panic: str | None = None
    done: bool = False


def find_bpftool() -> Path | None:
    """The host's bpftool (sbin is not on every user's PATH)."""
    found = shutil.which("bpftool")
    candidates = [Path(found)] if found else []
    candidates += [Path("/usr/sbin/bpftool"), Path("/sbin/bpftool")]
    return next((p for p in candidates if p.is_file()), None)


def build_bpf_initramfs(
    out: Path,
    init_script: str,
    objects: list[Path],
    bpftool: Path,
    bpf_timeout: int,
    busybox: Path | None = None,
) -> Path:
    """Write the initramfs: busybox, /init, bpftool at /usr/sbin with its libraries and
    loader at their host paths, /moddeb/bpf/OBJ for each object, /moddeb/env."""
    entries = initramfs.base_entries(init_script, busybox)
    entries.append(initramfs.dir_entry("moddeb/bpf"))
    taken = {e.name for e in entries}
    names = [obj.name for obj in objects]
    if len(set(names)) != len(names):
        raise ValueError(f"two objects share a name: {names}")
    for obj in objects:
        entries.append(initramfs.file_entry(f"moddeb/bpf/{obj.name}", obj.read_bytes()))
    entries += initramfs.host_binary_entries(bpftool, taken, GUEST_BPFTOOL)
    entries.append(initramfs.file_entry("moddeb/env", f"BPF_TIMEOUT={bpf_timeout}\n".encode()))
    out.write_bytes(gzip.compress(initramfs.newc_bytes(entries), compresslevel=1, mtime=0))
    return out


def parse_bpf_console(text: str) -> BpfConsole:
    """Collect init-bpf's markers, bpftool's output per object and any kernel crash line."""
    c = BpfConsole()
    current = ""
    for raw in text.replace("\r", "").split("\n"):
        line = boottest.KMSG_TIME_RE.sub("", raw.rstrip(), count=1)
        if line.startswith(OUTPUT_PREFIX):
            c.output.setdefault(current, []).append(line[len(OUTPUT_PREFIX) :])
            continue
        if m := boottest.PANIC_RE.search(line):
            if c.kernel is None:
                c.early_panic = c.early_panic or m.group(1)
            elif c.panic is None:
                c.panic = m.group(1)
        if not line.startswith("MODDEB-"):
            continue
        word, _, rest = line.partition(" ")
        if word == "MODDEB-INIT":
            c.kernel = rest.strip()
        elif word == "MODDEB-BPF-SETUP-FAIL":
            c.setup_failed = rest.strip()
        elif word == "MODDEB-BPF-BEGIN":
            current = rest.strip()
            c.begun.append(current)
        elif word == "MODDEB-BPF-OK":
            name, *pinned = rest.split()
            c.results[name] = (0, pinned)
        elif word == "MODDEB-BPF-FAIL":
            args = rest.split()
            if args:
                c.results[args[0]] = (boottest._int(args[1]) if len(args) > 1 else -1, [])
        elif word == "MODDEB-DONE":
            c.done = True
    return c


def judge(
    console: BpfConsole, run: boottest.VmRun, kver: str, target: str, bpf_timeout: int
) -> BpfCheck:
    """The verifier check for one object from what the VM printed and how qemu ended."""
    where = f"{kver} under QEMU"

    def skipped(why: str) -> BpfCheck:
        return BpfCheck("verifier", target, "skipped", f"not loaded in {where}: {why}")

    if console.kernel is None:
        if console.early_panic:
            return skipped(f"the kernel did not reach /init: {console.early_panic}")
        if run.timed_out or run.stalled:
            return skipped(f"the kernel did not reach /init within {run.duration:.0f}s")
        return skipped(f"the kernel did not reach /init (qemu exited with {run.returncode})")
    if console.kernel != kver:
        return skipped(f"the VM booted {console.kernel}")
    if console.setup_failed:
        return skipped(console.setup_failed)
    output = "\n".join(console.output.get(target, []))
    if target in console.results:
        rc, pinned = console.results[target]
        if rc in (124, 143):
            return BpfCheck(
                "verifier",
                target,
                "failed",
                f"{where}: bpftool prog loadall {target} took over {bpf_timeout}s\n{output}",
            )
        return load_result(target, rc, output, where, pinned)
    if target in console.begun:
        if console.panic:
            return BpfCheck(
                "verifier",
                target,
                "failed",
                f"{where} crashed while loading {target}: {console.panic}\n{output}",
            )
        if run.timed_out:
            return BpfCheck(
                "verifier",
                target,
                "failed",
                f"{where}: loading {target} timed out after {run.duration:.0f}s\n{output}",
            )
    return skipped("the VM stopped before loading it")


def verify_in_kernel(settings: Settings, kernel: KernelInfo, obj: Path, log_path: Path) -> BpfCheck:
    """Load obj's programs in kernel KVER under QEMU with bpftool; never raises.

    The VM's console is appended to log_path. The check is "failed" when the kernel refused
    a program (the detail carries the verifier's log), crashed or hung loading it, and
    "skipped" when moddeb or the host could not run the test (no qemu, no bpftool, no
    kernel image, a VM that did not boot).
    """
    kver = kernel.kernel_release
    target = obj.name
    started = time.monotonic()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", encoding="utf-8") as fh:
        fh.write(f"\nmoddeb: bpftool prog loadall {target} in {kver} under QEMU\n")
    try:
        check = _verify(settings, kernel, obj, log_path)
    except ModdebError as exc:
        check = BpfCheck("verifier", target, "skipped", f"not loaded in {kver} under QEMU: {exc}")
    except Exception as exc:  # noqa: BLE001 - a broken VM must not hide the build's result
        log.exception("BPF check of %s in %s: unexpected error", target, kver)
        check = BpfCheck(
            "verifier",
            target,
            "skipped",
            f"not loaded in {kver} under QEMU: internal error {exc!r}",
        )
    took = time.monotonic() - started
    with open(log_path, "a", encoding="utf-8") as fh:
        first = check.detail.splitlines()[0] if check.detail else ""
        fh.write(f"moddeb: verifier {check.status} in {kver} ({took:.1f}s): {first}\n")
    log.info("BPF check of %s in %s: %s in %.1fs", target, kver, check.status, took)
    return check


def _verify(settings: Settings, kernel: KernelInfo, obj: Path, log_path: Path) -> BpfCheck:
    kver = kernel.kernel_release
    arch = build_arch()
    binary = boottest.QEMU_FOR_ARCH.get(arch)
    if binary is None or shutil.which(binary) is None:
        return BpfCheck(
            "verifier",
            obj.name,
            "skipped",
            f"not loaded in {kver} under QEMU: {binary or 'qemu for ' + arch} is not installed",
        )
    bpftool = find_bpftool()
    if bpftool is None:
        return BpfCheck(
            "verifier",
            obj.name,
            "skipped",
            f"not loaded in {kver} under QEMU: bpftool is not installed on the host "
            "(apt-get install bpftool)",
        )
    boot_kernel = boottest.ensure_kernel(settings, kernel)
    bpf_timeout = max(10, int(settings.boot_timeout * GUEST_SHARE))
    settings.work_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bpfboot-", dir=settings.work_root) as tmp:
        init = (settings.templates_dir / "boottest" / INIT_TEMPLATE).read_text(encoding="utf-8")
        initrd = build_bpf_initramfs(Path(tmp) / "initrd.gz", init, [obj], bpftool, bpf_timeout)
        accel = boottest.choose_accel(settings)
        grace = boottest.KVM_GRACE if accel == "kvm" and settings.boot_accel == "auto" else None
        offset, run = _run(settings, boot_kernel.image, initrd, accel, arch, log_path, grace)
        if run.stalled:
            log.warning("KVM did not reach /init in %ss; using software emulation", grace)
            stamp = boottest._kvm_stamp(settings)
            stamp.parent.mkdir(parents=True, exist_ok=True)
            stamp.write_text(f"KVM boot of {kver} stalled\n")
            offset, run = _run(settings, boot_kernel.image, initrd, "tcg", arch, log_path, None)
    with open(log_path, "rb") as fh:
        fh.seek(offset)
        console = parse_bpf_console(fh.read().decode("utf-8", errors="replace"))
    return judge(console, run, kver, obj.name, bpf_timeout)


def _run(
    settings: Settings,
    image: Path,
    initrd: Path,
    accel: str,
    arch: str,
    log_path: Path,
    grace: float | None,
) -> tuple[int, boottest.VmRun]:
    """One qemu run, its command logged first; (where its console starts in log_path, run)."""
    cmd = boottest.qemu_command(settings, image, initrd, accel, arch)
    with open(log_path, "a", encoding="utf-8") as fh:
        fh.write(f"moddeb: {' '.join(cmd)}\n")
    offset = log_path.stat().st_size
    return offset, boottest.run_vm(cmd, log_path, settings.boot_timeout, grace)


def qemu_verifiers(
    settings: Settings, kernels: list[KernelInfo], required: bool = False
) -> list[Verifier]:
    """One verifier per target kernel, for build_bpf(verifiers=...): each boots its kernel
    and loads the object there. required turns a skipped check (QEMU unavailable...) into
    a failed one."""

    def make(kernel: KernelInfo) -> Verifier:
        def verify(obj: Path, log_path: Path) -> BpfCheck:
            check = verify_in_kernel(settings, kernel, obj, log_path)
            if required and check.status == "skipped":
                check.status = "failed"
            return check

        return verify

    return [make(k) for k in kernels]
