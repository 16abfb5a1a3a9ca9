"""Checks a compiled BPF object must pass before it is packaged, and loading it into a kernel."""

from __future__ import annotations

import logging
import os
import platform
import re
import shlex
import shutil
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

EM_BPF = 247
ET_REL = 1
SHF_EXECINSTR = 0x4
SHT_NOBITS = 8

# The program section names libbpf 1.1 (bookworm's, which bpftool and skeletons use)
# recognises, in its own notation: "x" exact, "x/" needs "x/extras", "x+" either.
PROGRAM_SECTIONS = (
    "socket+ sk_reuseport/migrate sk_reuseport "
    "kprobe+ uprobe+ uprobe.s+ kretprobe+ uretprobe+ uretprobe.s+ kprobe.multi+ "
    "kretprobe.multi+ ksyscall+ kretsyscall+ usdt+ tc classifier action "
    "tracepoint+ tp+ raw_tracepoint+ raw_tp+ raw_tracepoint.w+ raw_tp.w+ tp_btf+ "
    "fentry+ fmod_ret+ fexit+ fentry.s+ fmod_ret.s+ fexit.s+ freplace+ "
    "lsm+ lsm.s+ lsm_cgroup+ iter+ iter.s+ syscall "
    "xdp.frags/devmap xdp/devmap xdp.frags/cpumap xdp/cpumap xdp.frags xdp "
    "perf_event lwt_in lwt_out lwt_xmit lwt_seg6local sockops "
    "sk_skb/stream_parser sk_skb/stream_verdict sk_skb sk_msg lirc_mode2 flow_dissector "
    "cgroup_skb/ingress cgroup_skb/egress cgroup/skb cgroup/sock_create cgroup/sock_release "
    "cgroup/sock cgroup/post_bind4 cgroup/post_bind6 cgroup/bind4 cgroup/bind6 "
    "cgroup/connect4 cgroup/connect6 cgroup/sendmsg4 cgroup/sendmsg6 cgroup/recvmsg4 "
    "cgroup/recvmsg6 cgroup/getpeername4 cgroup/getpeername6 cgroup/getsockname4 "
    "cgroup/getsockname6 cgroup/sysctl cgroup/getsockopt cgroup/setsockopt cgroup/dev "
    "struct_ops+ sk_lookup"
).split()
# Loading these changes the kernel's behaviour (struct_ops registers its ops when
# libbpf fills its map), so they never go into the build host's kernel.
HOST_UNSAFE_SECTIONS = ("struct_ops",)


@dataclass
class BpfCheck:
    """One check of one object or package: passed, failed or skipped, with what it found."""

    name: str  # elf, btf, programs, license, verifier, lintian
    target: str  # the object or package file it is about
    status: str  # passed, failed, skipped
    detail: str = ""


@dataclass
class ElfInfo:
    """What moddeb reads from an object's ELF header and section table."""

    machine: int
    elf_type: int
    little_endian: bool
    sections: dict[str, tuple[int, bytes]]  # name -> (flags, contents)

    def programs(self) -> list[str]:
        """Sections holding BPF programs: executable, not empty, not .text (subprograms)."""
        return [
            n
            for n, (flags, data) in self.sections.items()
            if flags & SHF_EXECINSTR and data and n != ".text"
        ]


def read_elf(path: Path) -> ElfInfo:
    """Parse an ELF64 object's header and sections; ValueError when it is not one."""
    return parse_elf(path.read_bytes())


def parse_elf(blob: bytes) -> ElfInfo:
    """Parse ELF64 bytes (an object, a vmlinux); ValueError when they are not ELF64."""
    if blob[:4] != b"\x7fELF":
        raise ValueError("not an ELF file")
    if blob[4] != 2:
        raise ValueError("not a 64-bit ELF file")
    order = "<" if blob[5] == 1 else ">"
    try:
        elf_type, machine = struct.unpack_from(order + "HH", blob, 16)
        (shoff,) = struct.unpack_from(order + "Q", blob, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from(order + "HHH", blob, 0x3A)
        headers = [
            struct.unpack_from(order + "IIQQQQIIQQ", blob, shoff + i * shentsize)
            for i in range(shnum)
        ]
        strtab = headers[shstrndx]
        names = blob[strtab[4] : strtab[4] + strtab[5]]
        sections: dict[str, tuple[int, bytes]] = {}
        for sh_name, sh_type, flags, _addr, offset, size, *_ in headers[1:]:
            name = names[sh_name : names.index(b"\0", sh_name)].decode("utf-8", "replace")
            data = b"" if sh_type == SHT_NOBITS else blob[offset : offset + size]
            sections[name] = (flags, data)
    except (struct.error, IndexError, ValueError) as exc:
        raise ValueError(f"corrupt ELF section table: {exc}") from None
    return ElfInfo(machine, elf_type, order == "<", sections)


def known_program_section(name: str) -> bool:
    """True when libbpf knows which program type SEC(name) means."""
    for spec in PROGRAM_SECTIONS:
        if spec.endswith("+"):
            stem = spec[:-1]
            if name == stem or name.startswith(stem + "/"):
                return True
        elif spec.endswith("/"):
            if name.startswith(spec) and len(name) > len(spec):
                return True
        elif name == spec:
            return True
    return False


def check_object(path: Path, little_endian: bool = True) -> list[BpfCheck]:
    """The static checks: BPF ELF of the target's byte order, BTF, known programs, license."""
    target = path.name
    try:
        elf = read_elf(path)
    except (OSError, ValueError) as exc:
        return [BpfCheck("elf", target, "failed", f"{target} is not a BPF object: {exc}")]
    checks: list[BpfCheck] = []
    order = "little" if little_endian else "big"
    if elf.machine != EM_BPF or elf.elf_type != ET_REL:
        checks.append(
            BpfCheck(
                "elf",
                target,
                "failed",
                f"{target} is not a BPF object file (ELF machine {elf.machine}, type "
                f"{elf.elf_type}; expected machine {EM_BPF} EM_BPF, type {ET_REL} relocatable)",
            )
        )
        return checks
    if elf.little_endian != little_endian:
        checks.append(
            BpfCheck("elf", target, "failed", f"{target} is not {order}-endian like the target")
        )
        return checks
    checks.append(BpfCheck("elf", target, "passed", f"ELF64 {order}-endian, EM_BPF, relocatable"))
    if ".BTF" in elf.sections:
        ext = " and .BTF.ext" if ".BTF.ext" in elf.sections else ""
        checks.append(BpfCheck("btf", target, "passed", f".BTF{ext} present"))
    else:
        checks.append(
            BpfCheck(
                "btf",
                target,
                "failed",
                f"{target} has no .BTF section: CO-RE and skeletons need BTF (compile with -g)",
            )
        )
    programs = elf.programs()
    unknown = [p for p in programs if not known_program_section(p)]
    if not programs:
        checks.append(
            BpfCheck("programs", target, "failed", f'{target} holds no SEC("...") program')
        )
    elif unknown:
        checks.append(
            BpfCheck(
                "programs",
                target,
                "failed",
                f"{target}: section(s) {', '.join(repr(u) for u in unknown)} are not a BPF "
                'program type libbpf knows (SEC("xdp"), SEC("tc"), SEC("sk_reuseport"), '
                'SEC("kprobe/FUNC"), SEC("tracepoint/CAT/NAME"), SEC("fentry/FUNC"), ...)',
            )
        )
    else:
        checks.append(BpfCheck("programs", target, "passed", ", ".join(programs)))
    license_data = elf.sections.get("license", (0, b""))[1].split(b"\0")[0]
    if license_data:
        checks.append(
            BpfCheck("license", target, "passed", license_data.decode("ascii", "replace"))
        )
    else:
        checks.append(
            BpfCheck(
                "license",
                target,
                "failed",
                f'{target} has no "license" section: add char LICENSE[] SEC("license") = "GPL";',
            )
        )
    return checks


def program_sections(path: Path) -> list[str]:
    """The program sections of an object ([] when it cannot be read)."""
    try:
        return read_elf(path).programs()
    except (OSError, ValueError):
        return []


# ---------------------------------------------------------------------------
# Loading into a kernel: the verifier's verdict.

LOG_BEGIN = "-- BEGIN PROG LOAD LOG --"
LOG_END = "-- END PROG LOAD LOG --"


def loadall_command(obj: str, pin_dir: str, bpftool: str = "bpftool") -> str:
    """The shell command that loads every program of obj (and pins it under pin_dir).

    Loading attaches nothing, so no program runs; the kernel's verifier checks each one.
    The boot test (QEMU) runs this inside the guest and hands the output to
    parse_load_output().
    """
    return f"{shlex.quote(bpftool)} prog loadall {shlex.quote(obj)} {shlex.quote(pin_dir)}"


def parse_load_output(output: str) -> tuple[str, str]:
    """(summary, verifier log) from a failed `bpftool prog loadall`'s output."""
    lines = output.splitlines()
    summary = ""
    for ln in lines:
        m = re.search(r"prog '([^']+)': (BPF program load failed: .*)$", ln)
        if m:
            summary = f"program '{m.group(1)}': {m.group(2)}"
            break
    verifier: list[str] = []
    inside = False
    for ln in lines:
        if LOG_BEGIN in ln:
            inside = True
            continue
        if LOG_END in ln:
            break
        if inside:
            verifier.append(ln)
    # The verifier's reason is the last line before its "processed N insns" statistics.
    reason = next(
        (
            ln
            for ln in reversed(verifier)
            if ln.strip() and not ln.startswith(("processed ", "verification time"))
        ),
        "",
    )
    if reason:
        summary = f"{summary}: {reason}" if summary else reason
    if not summary:
        errors = [ln for ln in lines if ln.startswith(("Error:", "libbpf:"))]
        summary = errors[-1] if errors else (lines[-1] if lines else "no output")
    text = "\n".join(verifier[-40:]) if verifier else "\n".join(lines[-20:])
    return summary, text


def verify_on_host(obj: Path, log_path: Path) -> BpfCheck:
    """Load obj's programs into this host's kernel with bpftool; unpin and unload after.

    The pins live in a private bpffs mounted for this check only, so unmounting it
    drops the last reference and the kernel frees the programs and their maps.
    """
    target = obj.name
    kernel = platform.release()
    if os.geteuid() != 0:
        return BpfCheck("verifier", target, "skipped", "loading into the host kernel needs root")
    bpftool = shutil.which("bpftool") or next(
        (p for p in ("/usr/sbin/bpftool", "/sbin/bpftool") if os.access(p, os.X_OK)), None
    )
    if bpftool is None:
        return BpfCheck(
            "verifier",
            target,
            "skipped",
            "bpftool is not installed on the host (apt-get install bpftool)",
        )
    unsafe = [
        p for p in program_sections(obj) if p.split("/")[0].split(".")[0] in HOST_UNSAFE_SECTIONS
    ]
    if unsafe:
        return BpfCheck(
            "verifier",
            target,
            "skipped",
            f"not loaded into the build host: loading {', '.join(unsafe)} would register it",
        )
    log_path.parent.mkdir(parents=True, exist_ok=True)
    mount_dir = Path(tempfile.mkdtemp(prefix="moddeb-bpffs-"))
    try:
        mounted = subprocess.run(
            ["mount", "-t", "bpf", "moddeb-bpf", str(mount_dir)], capture_output=True, text=True
        )
        if mounted.returncode != 0:
            return BpfCheck(
                "verifier",
                target,
                "skipped",
                f"cannot mount a bpf filesystem on the host: {mounted.stderr.strip()}",
            )
        try:
            proc = subprocess.run(
                [bpftool, "prog", "loadall", str(obj), str(mount_dir / "progs")],
                capture_output=True,
                text=True,
                timeout=300,
            )
            output = proc.stdout + proc.stderr
            loaded = sorted(p.name for p in (mount_dir / "progs").glob("*"))
        except subprocess.TimeoutExpired:
            return BpfCheck("verifier", target, "failed", "bpftool prog loadall took over 300s")
        finally:
            subprocess.run(["umount", str(mount_dir)], capture_output=True)
    finally:
        try:
            mount_dir.rmdir()
        except OSError:
            log.warning("could not remove %s", mount_dir)
    with open(log_path, "a", encoding="utf-8") as fh:
        fh.write(f"$ bpftool prog loadall {target} (host kernel {kernel})\n{output}\n")
    return load_result(target, proc.returncode, output, f"the host kernel {kernel}", loaded)


def load_result(
    target: str, returncode: int, output: str, where: str, loaded: list[str] | None = None
) -> BpfCheck:
    """The verifier check from one `bpftool prog loadall` run's exit code and output.

    `where` names the kernel for the user: "the host kernel 6.18.1", "6.1.0-57-amd64
    under QEMU" (the boot test builds its checks with this too).
    """
    if returncode == 0:
        return BpfCheck(
            "verifier", target, "passed", f"{where} loaded {', '.join(loaded or []) or 'it'}"
        )
    summary, text = parse_load_output(output)
    return BpfCheck(
        "verifier", target, "failed", f"{where}'s verifier rejected {target}: {summary}\n{text}"
    )
