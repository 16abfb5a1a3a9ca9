"""Kernel BTF for generating vmlinux.h: from a BTF file, a vmlinux, a vmlinuz or the archive.

settings.bpf_vmlinux_btf names one of:
- a file: raw BTF (/sys/kernel/btf/vmlinux), a vmlinux ELF with a .BTF section, or a
  vmlinuz whose compressed kernel (gzip, xz or zstd, as Debian's are) has one;
- linux-image-KVER: that kernel package from the configured archive, downloaded once
  in a trusted step and its BTF cached under <cache>/btf/.
"""

from __future__ import annotations

import logging
import lzma
import re
import shutil
import subprocess
import tempfile
import zlib
from pathlib import Path

from builder import images
from builder.bpf_checks import parse_elf
from builder.config import Settings
from builder.errors import InvalidInput, Transient
from builder.runner import Runner, limits_from

log = logging.getLogger(__name__)

ELF_MAGIC = b"\x7fELF"
BTF_MAGICS = (b"\x9f\xeb", b"\xeb\x9f")  # 0xeB9F in either byte order
KERNEL_RELEASE_RE = re.compile(r"^[a-z0-9][a-z0-9.+~-]*$")
DOWNLOAD_SCRIPT = """\
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
mkdir -p /build/out /tmp/pkg
cd /tmp/pkg
apt-get download -qq {package}
dpkg-deb --fsys-tarfile ./*.deb | tar -x -C /tmp/pkg ./boot
cp /tmp/pkg/boot/vmlinuz-{kver} /build/out/vmlinuz
"""


def _decompress_at(data: bytes, offset: int, kind: str) -> bytes:
    """Decompress the stream starting at offset, ignoring what follows it; b"" on failure."""
    try:
        if kind == "gzip":
            return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data[offset:])
        if kind == "xz":
            return lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(data[offset:])
    except (zlib.error, lzma.LZMAError, EOFError):
        return b""
    if shutil.which("zstd") is None:
        return b""
    # zstd exits 1 on the bytes after the kernel's frame; what it wrote before is whole.
    proc = subprocess.run(["zstd", "-dcq"], input=data[offset:], capture_output=True)
    return proc.stdout


def _elf_btf(blob: bytes) -> bytes:
    try:
        return parse_elf(blob).sections.get(".BTF", (0, b""))[1]
    except ValueError:
        return b""


def btf_from_file(path: Path) -> bytes:
    """The kernel BTF in a raw BTF file, a vmlinux or a vmlinuz; InvalidInput when none."""
    data = path.read_bytes()
    if data[:2] in BTF_MAGICS:
        return data
    if data[:4] == ELF_MAGIC:
        btf = _elf_btf(data)
        if btf:
            return btf
    else:
        for kind, magic in (
            ("zstd", b"\x28\xb5\x2f\xfd"),
            ("xz", b"\xfd7zXZ\x00"),
            ("gzip", b"\x1f\x8b\x08"),
        ):
            offset = data.find(magic)
            for _ in range(16):  # the magic can also occur by chance; try a few places
                if offset < 0:
                    break
                kernel = _decompress_at(data, offset, kind)
                if kernel[:4] == ELF_MAGIC:
                    btf = _elf_btf(kernel)
                    if btf:
                        return btf
                offset = data.find(magic, offset + 1)
    raise InvalidInput(
        f"{path} holds no kernel BTF: it is not a BTF file, a vmlinux with a .BTF section, "
        "or a vmlinuz (gzip, xz or zstd) whose kernel has one",
        hint="set bpf_vmlinux_btf to /sys/kernel/btf/vmlinux or linux-image-KVER",
    )


def kernel_btf(settings: Settings, runner: Runner, kernel_release: str) -> Path:
    """The BTF of linux-image-KVER from the archive, downloaded and extracted once."""
    if not KERNEL_RELEASE_RE.match(kernel_release):
        raise InvalidInput(f"{kernel_release!r} is not a kernel release such as 6.1.0-57-amd64")
    cached = settings.cache_root / "btf" / f"{kernel_release}.btf"
    if cached.is_file():
        return cached
    base = images.ensure_base(settings, runner)
    cached.parent.mkdir(parents=True, exist_ok=True)
    log_path = settings.cache_root / "image-logs" / f"btf-{kernel_release}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(dir=cached.parent) as tmp:
        result = runner.commit_step(
            base,
            DOWNLOAD_SCRIPT.format(package=f"linux-image-{kernel_release}", kver=kernel_release),
            None,
            {},
            log_path,
            limits_from(settings),
            outputs={"/build/out": Path(tmp)},
        )
        if not result.ok:
            raise Transient(
                f"could not download linux-image-{kernel_release} for its BTF",
                hint=f"see {log_path}",
            )
        btf = btf_from_file(Path(tmp) / "vmlinuz")
        part = cached.with_suffix(".part")
        part.write_bytes(btf)
        part.rename(cached)
    log.info("kernel BTF of %s: %d bytes", kernel_release, len(btf))
    return cached


def resolve_vmlinux_btf(settings: Settings, runner: Runner, work: Path) -> Path | None:
    """A raw BTF file to make vmlinux.h from, or None for the source's own vmlinux.h."""
    value = settings.bpf_vmlinux_btf
    if not value:
        return None
    if value.startswith("linux-image-"):
        return kernel_btf(settings, runner, value.removeprefix("linux-image-"))
    path = Path(value)
    if not path.is_file():
        raise InvalidInput(
            f"bpf_vmlinux_btf names {value}, which is not a file",
            hint="use a kernel BTF file such as /sys/kernel/btf/vmlinux, a vmlinux or vmlinuz, "
            "linux-image-KVER, or nothing for the source's own vmlinux.h",
        )
    out = work / "vmlinux.btf"
    out.write_bytes(btf_from_file(path))
    return out
