"""Boot tests: load each NAME-modules-KVER package in kernel KVER under QEMU before publishing.

Stages per boot: kernel (fetch linux-image-KVER once, cached), initramfs (busybox, the modules
and their dependencies, an /init), vm (qemu with a hard timeout, no network), verdict (read the
MODDEB-* markers /init printed on the serial console).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import lzma
import os
import pwd
import re
import shutil
import struct
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from debian import deb822

from builder import initramfs
from builder.config import Settings
from builder.errors import BuildFailed, InvalidInput, ModdebError, Transient
from builder.kernels import KernelInfo, build_arch, fetch_index, suites_for

log = logging.getLogger(__name__)

# Bump when the cached kernel layout changes, so old caches are rebuilt.
KERNEL_CACHE_FORMAT = "2"
SMOKE_FILE = "moddeb-smoke.sh"
EXPECT_RE = re.compile(r"^#\s*moddeb-expect:\s*(?P<regex>.+?)\s*$", re.MULTILINE)
# A working KVM reaches /init in about a second; a broken one (nested, no EPT...) hangs.
KVM_GRACE = 10
KVM_BROKEN_TTL = 24 * 3600
QEMU_FOR_ARCH = {"amd64": "qemu-system-x86_64"}
# printk.devkmsg=on: /init reports through /dev/kmsg, which is otherwise rate limited.
CMDLINE = "console=ttyS0 panic=-1 oops=panic quiet printk.devkmsg=on"
PANIC_RE = re.compile(
    r"(Kernel panic - not syncing: .*|BUG: .*|Oops: .*|general protection fault.*"
    r"|Unable to handle kernel .*)"
)
KMSG_TIME_RE = re.compile(r"^\[\s*\d+\.\d+\]\s*")
# busybox's own wording for some insmod errors (libbb moderror()); the rest is strerror().
BUSYBOX_ERRORS = {
    "invalid module format": errno.ENOEXEC,
    "unknown symbol in module, or unknown parameter": errno.ENOENT,
    "module has wrong symbol version": errno.ESRCH,
    "kernel does not support requested operation": errno.ENOSYS,
}
KMSG_NOISE = ("loading out-of-tree module taints kernel", "module verification failed")


@dataclass
class BootKernel:
    """A kernel ready to boot: what qemu -kernel gets and the modules tree it ships."""

    kernel_release: str
    image: Path
    modules_dir: Path
    package: str
    version: str


@dataclass
class BootRequest:
    """One boot test for boot_many: a kernel, the packages to load in it, an optional smoke."""

    kernel: KernelInfo
    module_debs: list[Path]
    log_path: Path
    smoke: str | None = None
    expect: str | None = None


@dataclass
class BootResult:
    """The outcome of one boot test; status is passed, failed (the module) or error (moddeb)."""

    kernel_release: str
    status: str = "error"
    diagnosis: str = ""
    duration: float = 0.0
    log_path: str = ""
    accel: str = ""
    loaded: list[str] = field(default_factory=list)  # every insmod that worked, in order
    output: list[str] = field(default_factory=list)  # what the smoke command printed
    timings: dict[str, float] = field(default_factory=dict)


@dataclass
class Console:
    """What /init reported on the serial console."""

    kernel: str | None = None
    steps: list[tuple[str, str]] = field(default_factory=list)  # (role, name) begun
    loaded: list[str] = field(default_factory=list)
    failed: tuple[str, int, str] | None = None  # name, exit code, insmod's message
    soft_failed: list[str] = field(default_factory=list)  # softdeps that did not load
    requests: list[tuple[str, str]] = field(default_factory=list)  # (during step, module asked)
    warned: list[str] = field(default_factory=list)
    smoke_started: bool = False
    smoke_rc: int | None = None
    output: list[str] = field(default_factory=list)
    kmsg: list[str] = field(default_factory=list)
    early_panic: str | None = None  # before /init ran: the kernel's fault, not the module's
    panic: str | None = None
    done: bool = False


# --- the smoke convention --------------------------------------------------------------------


def read_smoke(source_tree: Path) -> tuple[str | None, str | None]:
    """The smoke script a source declares (moddeb-smoke.sh at its top) and its expected line."""
    path = source_tree / SMOKE_FILE
    if not path.is_file():
        return None, None
    text = path.read_text(encoding="utf-8")
    m = EXPECT_RE.search(text)
    return text, m.group("regex") if m else None


# --- kernel fetch and cache ------------------------------------------------------------------


def find_stanza(index_text: str, package: str) -> deb822.Deb822 | None:
    """The Packages stanza of one package, found by text search (indexes are tens of MB)."""
    needle = f"Package: {package}\n"
    at = 0 if index_text.startswith(needle) else index_text.find("\n" + needle)
    if at < 0:
        return None
    at += 0 if at == 0 else 1
    end = index_text.find("\n\n", at)
    return deb822.Deb822(index_text[at : end if end >= 0 else len(index_text)])


def find_image(settings: Settings, kernel: KernelInfo, arch: str) -> tuple[str, deb822.Deb822]:
    """(mirror, stanza) of linux-image-KVER (or -unsigned), the kernel's own suite first."""
    pairs = sorted(suites_for(settings), key=lambda p: p[1] != kernel.suite)
    kver = kernel.kernel_release
    for mirror, suite in pairs:
        try:
            text = fetch_index(settings, mirror, suite, arch).read_text(encoding="utf-8")
        except InvalidInput:
            continue  # a suite this archive lacks
        for package in (f"linux-image-{kver}", f"linux-image-{kver}-unsigned"):
            stanza = find_stanza(text, package)
            if stanza is not None and stanza.get("Filename"):
                return mirror, stanza
    raise InvalidInput(f"the archive has no linux-image-{kver} to boot")


def download(url: str, dest: Path, size: int, sha256: str) -> None:
    """Stream url to dest, checking the size and SHA256 the Packages index gives."""
    digest, got = hashlib.sha256(), 0
    try:
        with urllib.request.urlopen(url, timeout=60) as resp, open(dest, "wb") as out:
            for block in iter(lambda: resp.read(1 << 20), b""):
                digest.update(block)
                out.write(block)
                got += len(block)
    except (urllib.error.URLError, OSError) as exc:
        raise Transient(f"cannot download {url.rsplit('/', 1)[-1]}: {exc}") from None
    if got != size or digest.hexdigest() != sha256:
        raise Transient(
            f"{url.rsplit('/', 1)[-1]} does not match the archive index "
            f"(size {got}, expected {size}); the mirror may be syncing"
        )


def extract_vmlinux(bzimage: bytes) -> bytes | None:
    """The uncompressed kernel inside a bzImage, or None when its format is not one we read.

    Booted through its PVH entry, it skips the in-guest decompression that costs seconds
    under software emulation (xz: about 5 of 10 s for 6.1).
    """
    if len(bzimage) < 0x250 or bzimage[0x202:0x206] != b"HdrS":
        return None
    setup_sects = bzimage[0x1F1] or 4
    offset, length = struct.unpack_from("<II", bzimage, 0x248)
    start = (setup_sects + 1) * 512 + offset
    payload = bzimage[start : start + length]
    try:
        if payload.startswith(b"\xfd7zXZ\x00"):
            data = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(payload)
        elif payload.startswith(b"\x28\xb5\x2f\xfd"):
            data = subprocess.run(  # the kernel appends the size: 4 bytes zstd does not expect
                ["zstd", "-dcq"], input=payload[:-4], capture_output=True, check=True
            ).stdout
        elif payload.startswith(b"\x1f\x8b"):
            data = zlib.decompressobj(wbits=31).decompress(payload)
        else:
            return None
    except (lzma.LZMAError, zlib.error, OSError, subprocess.CalledProcessError):
        return None
    return data if data.startswith(b"\x7fELF") else None


@contextmanager
def kernel_lock(settings: Settings, kernel_release: str) -> Iterator[None]:
    """Serialise fetching one kernel across threads and processes on this host."""
    lock_dir = settings.cache_root / "locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / f"boot-{kernel_release}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _load_cached(root: Path) -> BootKernel | None:
    try:
        meta = json.loads((root / "ready.json").read_text())
    except (OSError, ValueError):
        return None
    if meta.get("format") != KERNEL_CACHE_FORMAT:
        return None
    kver = meta["kernel_release"]
    return BootKernel(
        kver,
        root / meta["image"],
        root / "lib/modules" / kver,
        meta["package"],
        meta["version"],
    )


def ensure_kernel(settings: Settings, kernel: KernelInfo) -> BootKernel:
    """linux-image-KVER downloaded, checked, unpacked into cache_root/boot/KVER, once."""
    kver = kernel.kernel_release
    root = settings.cache_root / "boot" / kver
    cached = _load_cached(root)
    if cached:
        return cached
    with kernel_lock(settings, kver):
        cached = _load_cached(root)
        if cached:
            return cached
        arch = build_arch()
        mirror, stanza = find_image(settings, kernel, arch)
        package, version = stanza["Package"], stanza["Version"]
        log.info("boot kernel %s: fetching %s %s", kver, package, version)
        root.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{kver}-", dir=root.parent))
        try:
            deb = tmp / "image.deb"
            download(f"{mirror}/{stanza['Filename']}", deb, int(stanza["Size"]), stanza["SHA256"])
            unpacked = tmp / "unpacked"
            proc = subprocess.run(
                ["dpkg-deb", "-x", str(deb), str(unpacked)], capture_output=True, text=True
            )
            if proc.returncode != 0:
                raise Transient(f"cannot unpack {package}: {proc.stderr.strip()}")
            stage = tmp / "stage"
            stage.mkdir()
            _lay_out(unpacked, stage, kver, package)
            image = "vmlinux" if (stage / "vmlinux").exists() else "vmlinuz"
            meta = {
                "format": KERNEL_CACHE_FORMAT,
                "kernel_release": kver,
                "package": package,
                "version": version,
                "sha256": stanza["SHA256"],
                "image": image,
            }
            (stage / "ready.json").write_text(json.dumps(meta, indent=2) + "\n")
            shutil.rmtree(root, ignore_errors=True)
            stage.rename(root)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    loaded = _load_cached(root)
    if loaded is None:
        raise Transient(f"the cached kernel {kver} in {root} cannot be read")
    return loaded


def _lay_out(unpacked: Path, stage: Path, kver: str, package: str) -> None:
    """Keep vmlinuz, its config, the modules tree (depmod'ed) and, if it can be made, a PVH vmlinux."""
    vmlinuz = unpacked / "boot" / f"vmlinuz-{kver}"
    modules = next(
        (
            p
            for p in (unpacked / "lib/modules" / kver, unpacked / "usr/lib/modules" / kver)
            if p.is_dir()
        ),
        None,
    )
    if not vmlinuz.is_file() or modules is None:
        raise Transient(f"{package} has no /boot/vmlinuz-{kver} or modules tree")
    vmlinuz.rename(stage / "vmlinuz")
    (stage / "lib/modules").mkdir(parents=True)
    modules.rename(stage / "lib/modules" / kver)
    # modules.dep, .alias and .softdep: the image package leaves them to its postinst.
    proc = subprocess.run(
        [initramfs.host_tool("depmod"), "-b", str(stage), kver], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise Transient(f"depmod failed for {kver}: {proc.stderr.strip()}")
    config = unpacked / "boot" / f"config-{kver}"
    if config.is_file():
        config.rename(stage / "config")
        if "CONFIG_PVH=y" in (stage / "config").read_text(errors="replace").splitlines():
            vmlinux = extract_vmlinux((stage / "vmlinuz").read_bytes())
            if vmlinux:
                (stage / "vmlinux").write_bytes(vmlinux)


# --- running the VM --------------------------------------------------------------------------


def _kvm_stamp(settings: Settings) -> Path:
    return settings.cache_root / "boot" / "kvm-unusable"


def kvm_usable(settings: Settings) -> bool:
    """/dev/kvm opens read-write and no recent boot found it hanging."""
    try:
        os.close(os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC))
    except OSError:
        return False
    stamp = _kvm_stamp(settings)
    return not (stamp.exists() and time.time() - stamp.stat().st_mtime < KVM_BROKEN_TTL)


def choose_accel(settings: Settings) -> str:
    """kvm or tcg: the setting if it names one, else KVM when it works here."""
    if settings.boot_accel in ("kvm", "tcg"):
        return settings.boot_accel
    if settings.boot_accel != "auto":
        raise InvalidInput(f"boot_accel must be auto, kvm or tcg, not {settings.boot_accel!r}")
    return "kvm" if kvm_usable(settings) else "tcg"


def qemu_command(settings: Settings, image: Path, initrd: Path, accel: str, arch: str) -> list[str]:
    """The qemu command line: one CPU, no network, no devices but a serial console."""
    binary = QEMU_FOR_ARCH.get(arch)
    if binary is None:
        raise InvalidInput(f"boot tests support {', '.join(QEMU_FOR_ARCH)} only, not {arch}")
    cmd = [binary, "-accel", accel, *(["-cpu", "host"] if accel == "kvm" else [])]
    cmd += ["-m", settings.boot_memory, "-smp", "1", "-nodefaults", "-display", "none"]
    cmd += ["-serial", "stdio", "-no-reboot", "-nic", "none"]
    cmd += ["-kernel", str(image), "-initrd", str(initrd), "-append", CMDLINE]
    # A seccomp filter, and no root: the module under test is untrusted.
    sandbox = "on,obsolete=deny,spawn=deny,resourcecontrol=deny"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("nobody")
            cmd += ["-runas", "nobody"]
        except KeyError:
            sandbox += ",elevateprivileges=deny"
    else:
        sandbox += ",elevateprivileges=deny"
    return cmd + ["-sandbox", sandbox]


@dataclass
class VmRun:
    """How the qemu process ended."""

    returncode: int | None
    timed_out: bool
    stalled: bool  # did not reach /init within the grace period
    duration: float


def run_vm(cmd: list[str], log_path: Path, timeout: float, grace: float | None = None) -> VmRun:
    """Run qemu with its console appended to log_path; kill it at timeout (or grace if stalled)."""
    started = time.monotonic()
    with open(log_path, "ab") as out:
        start_offset = out.tell()
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            while True:
                try:
                    rc = proc.wait(timeout=0.25)
                    return VmRun(rc, False, False, time.monotonic() - started)
                except subprocess.TimeoutExpired:
                    pass
                elapsed = time.monotonic() - started
                if grace is not None and elapsed > grace:
                    with open(log_path, "rb") as fh:
                        fh.seek(start_offset)
                        if b"MODDEB-INIT" not in fh.read():
                            proc.kill()
                            proc.wait()
                            return VmRun(None, False, True, elapsed)
                    grace = None
                if elapsed > timeout:
                    proc.kill()
                    proc.wait()
                    return VmRun(None, True, False, elapsed)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


# --- reading the console ---------------------------------------------------------------------


def parse_console(text: str) -> Console:
    """Collect /init's MODDEB-* markers, the smoke output and any kernel crash line."""
    c = Console()
    for raw in text.replace("\r", "").split("\n"):
        line = KMSG_TIME_RE.sub("", raw.rstrip(), count=1)
        if line.startswith("smoke| "):
            c.output.append(line[7:])
            continue
        if m := PANIC_RE.search(line):
            if c.kernel is None:
                c.early_panic = c.early_panic or m.group(1)
            elif c.panic is None:
                c.panic = m.group(1)
        if line.startswith("kmsg| "):
            c.kmsg.append(KMSG_TIME_RE.sub("", line[6:]))
        elif line.startswith("MODDEB-"):
            word, _, rest = line.partition(" ")
            args = rest.split(" ", 2)
            if word == "MODDEB-INIT":
                c.kernel = rest.strip()
            elif word == "MODDEB-INSMOD-BEGIN" and len(args) >= 2:
                c.steps.append((args[0], args[1]))
            elif word == "MODDEB-INSMOD-OK":
                c.loaded.append(rest.strip())
            elif word == "MODDEB-INSMOD-WARN":
                c.warned.append(rest.strip())
            elif word == "MODDEB-INSMOD-SOFTFAIL":
                c.soft_failed.append(args[0])
            elif word == "MODDEB-MODPROBE":
                during = c.steps[-1][1] if c.steps else ""
                c.requests.append((during, rest.split()[-1] if rest.split() else ""))
            elif word == "MODDEB-INSMOD-FAIL" and len(args) >= 2:
                c.failed = (args[0], _int(args[1]), args[2].strip() if len(args) > 2 else "")
            elif word == "MODDEB-SMOKE-BEGIN":
                c.smoke_started = True
            elif word == "MODDEB-SMOKE-OK":
                c.smoke_rc = 0
            elif word == "MODDEB-SMOKE-FAIL":
                c.smoke_rc = _int(rest.strip())
            elif word == "MODDEB-DONE":
                c.done = True
    return c


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return -1


def insmod_error(message: str) -> str:
    """busybox insmod's complaint as 'reason (-errno)' where the errno can be known."""
    reason = message.rsplit("': ", 1)[-1].strip() if "': " in message else message.strip()
    known = {os.strerror(e): e for e in errno.errorcode} | BUSYBOX_ERRORS
    code = known.get(reason)
    return f"{reason} (-{code})" if code else reason or "no message"


def _kmsg_hint(console: Console, name: str) -> str:
    """The kernel's last word about a module, minus the taint notices every out-of-tree gets."""
    lines = [k for k in console.kmsg if name in k and not any(n in k for n in KMSG_NOISE)]
    return lines[-1] if lines else ""


def _where(console: Console) -> str:
    """What the VM was doing when it stopped: the smoke, loading a module, or finishing."""
    if console.smoke_started and console.smoke_rc is None:
        return "the smoke command"
    finished = len(console.loaded) + len(console.soft_failed)
    if console.steps and finished < len(console.steps):
        return f"loading {console.steps[-1][1]}"
    return "the end of the test"


def diagnose(
    console: Console,
    run: VmRun,
    kernel_release: str,
    expect: str | None,
    timeout: float,
    smoke_timeout: int,
) -> tuple[str, str]:
    """(status, one-line diagnosis) from what the VM printed and how qemu ended."""
    if console.kernel is None:
        if console.early_panic:
            return "error", f"{kernel_release} did not reach /init: {console.early_panic}"
        if run.timed_out or run.stalled:
            return "error", f"{kernel_release} did not reach /init within {run.duration:.0f}s"
        return "error", f"{kernel_release} did not reach /init (qemu exited with {run.returncode})"
    if console.kernel != kernel_release:
        return "error", f"the VM booted {console.kernel}, not {kernel_release}"
    roles = dict((name, role) for role, name in console.steps)
    if console.failed:
        name, _rc, message = console.failed
        what = f"insmod {name}" if roles.get(name) != "dep" else f"insmod of dependency {name}"
        why = f"{what} failed: {insmod_error(message)}"
        asked = sorted({m for during, m in console.requests if during == name and m})
        if asked:
            why += f"; it asked the kernel for {', '.join(asked)}, which nothing declared"
        hint = _kmsg_hint(console, name)
        return "failed", why + (f"; kernel: {hint}" if hint else "")
    where = _where(console)
    if console.panic:
        return "failed", f"kernel crashed during {where}: {console.panic}"
    if run.timed_out:
        return "failed", f"timed out after {timeout:.0f}s during {where}"
    if console.warned:
        return "failed", f"kernel warning (WARN_ON) while loading {console.warned[0]}"
    if console.smoke_rc not in (None, 0):
        if console.smoke_rc in (124, 143):
            return "failed", f"the smoke command timed out after {smoke_timeout}s"
        last = next((o for o in reversed(console.output) if o.strip()), "")
        return "failed", f"the smoke command failed (exit {console.smoke_rc})" + (
            f": {last.strip()}" if last else ""
        )
    if not console.done:
        return "error", f"the VM stopped before the test finished, during {where}"
    tested = [name for role, name in console.steps if role == "test"]
    summary = f"loaded {', '.join(tested)}"
    if expect is not None:
        match = next((o for o in console.output if re.search(expect, o)), None)
        if match is None:
            return "failed", f"the smoke check did not print the expected line (/{expect}/)"
        summary += f"; smoke printed: {match.strip()}"
    elif console.smoke_rc == 0:
        summary += "; smoke command passed"
    return "passed", summary


# --- the public API --------------------------------------------------------------------------


def boot_test(
    settings: Settings,
    kernel: KernelInfo,
    module_debs: list[Path],
    log_path: Path,
    smoke: str | None = None,
    expect: str | None = None,
) -> BootResult:
    """Boot kernel KVER under QEMU, load the packages' modules, run the smoke; never raises."""
    kver = kernel.kernel_release
    result = BootResult(kver, log_path=str(log_path))
    started = time.monotonic()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text(
        f"moddeb: boot test of {', '.join(d.name for d in module_debs)} in {kver}\n"
    )
    try:
        _boot(settings, kernel, module_debs, log_path, smoke, expect, result)
    except BuildFailed as exc:
        result.status, result.diagnosis = "failed", str(exc)
    except ModdebError as exc:
        result.status, result.diagnosis = "error", str(exc)
    except Exception as exc:  # noqa: BLE001 - one kernel's crash must not hide the others
        log.exception("boot test %s: unexpected error", kver)
        result.status, result.diagnosis = "error", f"internal error: {exc!r}"
    finally:
        result.duration = round(time.monotonic() - started, 3)
    with open(log_path, "a", encoding="utf-8") as fh:
        fh.write(f"\nmoddeb: {result.status}: {result.diagnosis} ({result.duration:.1f}s)\n")
    log.info(
        "boot test %s: %s in %.1fs: %s", kver, result.status, result.duration, result.diagnosis
    )
    return result


def _boot(
    settings: Settings,
    kernel: KernelInfo,
    module_debs: list[Path],
    log_path: Path,
    smoke: str | None,
    expect: str | None,
    result: BootResult,
) -> None:
    kver = kernel.kernel_release
    if expect is not None:
        if smoke is None:
            raise InvalidInput("an expected line was given without a smoke command")
        try:
            re.compile(expect)
        except re.error as exc:
            raise InvalidInput(
                f"the expected line /{expect}/ is not a valid regex: {exc}"
            ) from None
    arch = build_arch()
    t0 = time.monotonic()
    boot_kernel = ensure_kernel(settings, kernel)
    result.timings["kernel"] = round(time.monotonic() - t0, 3)
    settings.work_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="boot-", dir=settings.work_root) as tmp:
        t0 = time.monotonic()
        targets = initramfs.extract_module_debs(module_debs, kver, Path(tmp) / "debs")
        tree = initramfs.read_module_tree(boot_kernel.modules_dir)
        steps = initramfs.resolve_load_order(targets, tree, kver)
        init = (settings.templates_dir / "boottest" / "init").read_text(encoding="utf-8")
        initrd = initramfs.build_initramfs(
            Path(tmp) / "initrd.gz", init, steps, smoke, settings.boot_smoke_timeout
        )
        result.timings["initramfs"] = round(time.monotonic() - t0, 3)
        accel = choose_accel(settings)
        auto = settings.boot_accel == "auto"
        t0 = time.monotonic()
        cmd = qemu_command(settings, boot_kernel.image, initrd, accel, arch)
        with open(log_path, "a", encoding="utf-8") as fh:
            fh.write(f"moddeb: {' '.join(cmd)}\n")
        offset = log_path.stat().st_size
        run = run_vm(
            cmd, log_path, settings.boot_timeout, KVM_GRACE if accel == "kvm" and auto else None
        )
        if run.stalled:
            log.warning("KVM did not reach /init in %ss; using software emulation", KVM_GRACE)
            _kvm_stamp(settings).parent.mkdir(parents=True, exist_ok=True)
            _kvm_stamp(settings).write_text(f"KVM boot of {kver} stalled\n")
            accel = "tcg"
            cmd = qemu_command(settings, boot_kernel.image, initrd, accel, arch)
            with open(log_path, "a", encoding="utf-8") as fh:
                fh.write(
                    f"\nmoddeb: KVM stalled; again with software emulation\nmoddeb: {' '.join(cmd)}\n"
                )
            offset = log_path.stat().st_size
            run = run_vm(cmd, log_path, settings.boot_timeout)
        result.timings["vm"] = round(time.monotonic() - t0, 3)
        result.accel = accel
    with open(log_path, "rb") as fh:
        fh.seek(offset)
        console = parse_console(fh.read().decode("utf-8", errors="replace"))
    result.loaded, result.output = console.loaded, console.output
    result.status, result.diagnosis = diagnose(
        console, run, kver, expect, settings.boot_timeout, settings.boot_smoke_timeout
    )


def boot_many(
    settings: Settings, items: list[BootRequest], parallel: int | None = os.cpu_count()
) -> list[BootResult]:
    """Run boot tests side by side, up to `parallel` VMs at once; results in request order."""
    with ThreadPoolExecutor(max_workers=max(1, parallel or 1)) as pool:
        return list(
            pool.map(
                lambda r: boot_test(
                    settings, r.kernel, r.module_debs, r.log_path, r.smoke, r.expect
                ),
                items,
            )
        )
