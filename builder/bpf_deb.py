"""NAME-bpf and NAME-bpf-dev packages, assembled reproducibly with dpkg-deb like mkbmdeb's.

Both are Architecture: ARCH, not all. BPF bytecode runs on any CPU, but an object is
still built for one target: its byte order is the target's (bpfel or bpfeb),
__TARGET_ARCH_* picks the pt_regs layout kprobe programs read, and vmlinux.h holds
that architecture's kernel types. Debian's libxdp1 ships its BPF objects the same way,
in an arch-specific, Multi-Arch: same package under /usr/lib/TRIPLET/bpf/.
"""

from __future__ import annotations

import email.utils
import gzip
import os
import shutil
import subprocess
import tempfile
import textwrap
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from debian import changelog, deb822

from builder.config import Settings
from builder.debpack import installed_size_kib, pack_deb
from builder.dkms import SUPPRESSED_LINTIAN
from builder.errors import InvalidInput
from builder.scaffold import check_field, check_maintainer, render

if TYPE_CHECKING:
    from builder.bpf import BpfLayout

# Debian architecture -> (multiarch triplet, libbpf's __TARGET_ARCH_*, little-endian)
TARGETS: dict[str, tuple[str, str, bool]] = {
    "amd64": ("x86_64-linux-gnu", "x86", True),
    "arm64": ("aarch64-linux-gnu", "arm64", True),
    "armhf": ("arm-linux-gnueabihf", "arm", True),
    "i386": ("i386-linux-gnu", "x86", True),
    "ppc64el": ("powerpc64le-linux-gnu", "powerpc", True),
    "riscv64": ("riscv64-linux-gnu", "riscv", True),
    "s390x": ("s390x-linux-gnu", "s390", False),
}


@dataclass
class BpfDebs:
    """The packages assemble_debs made and their Debian version."""

    version: str
    paths: list[Path]


def source_date_epoch(tree: Path) -> int:
    """The newest modification time in tree: the same source gives the same packages."""
    times = [int(p.lstat().st_mtime) for p in tree.rglob("*")]
    return max(times, default=0)


def debian_version(upstream_version: str, revision: str) -> str:
    """UPSTREAM-REVISION, refused when Debian could not use it."""
    version = f"{upstream_version}-{revision}"
    try:
        changelog.Version(version)
    except ValueError as exc:
        raise InvalidInput(f"version {version!r} is not a valid Debian version: {exc}") from None
    return version


def license_text(declared: str) -> str:
    """The copyright file's License field for what the programs' license sections say."""
    if "GPL" in declared:
        return (
            "GPL-2\n"
            f' The programs declare SEC("license") = "{declared}".\n'
            " .\n"
            " On Debian systems, the complete text of the GNU General Public License\n"
            " version 2 can be found in '/usr/share/common-licenses/GPL-2'."
        )
    return f'other\n The programs declare SEC("license") = "{declared}"; see the source.'


def changelog_gz(
    package: str, version: str, maintainer: str, distribution: str, entry: str, epoch: int
) -> bytes:
    """changelog.Debian.gz with a fixed date and no gzip timestamp."""
    log = changelog.Changelog()
    log.new_block(
        package=package,
        version=version,
        distributions=distribution,
        urgency="medium",
        author=maintainer,
        date=email.utils.format_datetime(datetime.fromtimestamp(epoch, UTC)),
    )
    log.add_change("")
    log.add_change(f"  * {entry}")
    log.add_change("")
    return gzip.compress(str(log).encode("utf-8"), compresslevel=9, mtime=0)


def _listing(names: list[str]) -> str:
    """Description lines listing files, verbatim (two spaces); the template adds the first."""
    return "\n ".join(f" {n}" for n in names)


def wrap_description(value: str, width: int = 79) -> str:
    """Re-wrap a Description's ordinary paragraphs (names vary in length); keep verbatim lines."""
    lines = value.split("\n")
    out: list[str] = lines[:1]
    para: list[str] = []

    def flush() -> None:
        if para:
            out.extend(
                textwrap.wrap(
                    " ".join(para),
                    width - 1,
                    initial_indent=" ",
                    subsequent_indent=" ",
                    break_on_hyphens=False,
                )
            )
            para.clear()

    for line in lines[1:]:
        if line.startswith(" ") and not line.startswith("  ") and line.strip() != ".":
            para.append(line.strip())
        else:
            flush()
            out.append(line)
    flush()
    return "\n".join(out)


def _control(template: Path, values: dict[str, str]) -> str:
    with open(template, encoding="utf-8") as fh:
        parsed = deb822.Deb822(fh)
    control = deb822.Deb822()
    for key, value in parsed.items():
        control[key] = render(value, values)
    control["Description"] = wrap_description(control["Description"])
    return control.dump()


def _build_one(root: Path, package: str, control: str, epoch: int, target: Path) -> Path:
    """Build one package of the pair from its laid-out tree (builder.debpack)."""
    return pack_deb(root, target, control=control, epoch=epoch)


def _installed_kib(root: Path) -> str:
    return str(installed_size_kib(root))


def assemble_debs(
    settings: Settings,
    layout: BpfLayout,
    objects: list[Path],
    skeletons: list[Path],
    out_dir: Path,
    arch: str,
    epoch: int,
    origin: str = "",
) -> BpfDebs:
    """Build NAME-bpf (objects) and NAME-bpf-dev (skeletons) for arch into out_dir."""
    templates = settings.templates_dir / "bpf"
    maintainer = check_maintainer(settings.maintainer)
    version = debian_version(layout.upstream_version, settings.debian_revision)
    distribution = check_field("distribution", settings.distribution)
    triplet = TARGETS[arch][0]
    values = {
        "name": layout.name,
        "source_package": layout.source_package,
        "version": version,
        "arch": arch,
        "maintainer": maintainer,
        "multiarch": triplet,
        "origin": origin or f"{layout.name} {layout.upstream_version}",
        "license": license_text(layout.license),
        "copyright": "\n ".join(layout.copyrights) or f"the {layout.name} upstream authors",
    }
    copyright_text = render((templates / "copyright.in").read_text(), values).encode()
    entry = render((templates / "changelog-entry.in").read_text(), values).strip()
    file_version = version.split(":")[-1]
    paths: list[Path] = []
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        for dev in (False, True):
            package = f"{layout.name}-bpf" + ("-dev" if dev else "")
            root = Path(tmp) / package
            if dev:
                dest = root / "usr/include" / triplet / layout.name
                files = skeletons
            else:
                dest = root / "usr/lib" / triplet / "bpf"
                files = objects
            dest.mkdir(parents=True)
            for path in sorted(files):
                shutil.copyfile(path, dest / path.name)
            doc = root / "usr/share/doc" / package
            doc.mkdir(parents=True)
            (doc / "copyright").write_bytes(copyright_text)
            (doc / "changelog.Debian.gz").write_bytes(
                changelog_gz(layout.source_package, version, maintainer, distribution, entry, epoch)
            )
            pkg_values = {**values, "package": package}
            if not dev:
                overrides = root / "usr/share/lintian/overrides"
                overrides.mkdir(parents=True)
                (overrides / package).write_text(
                    render((templates / "lintian-overrides.in").read_text(), pkg_values)
                )
            pkg_values["installed_size"] = _installed_kib(root)
            pkg_values["object_lines"] = _listing(sorted(p.name for p in objects))
            pkg_values["skeleton_lines"] = _listing(sorted(p.name for p in skeletons))
            control = _control(templates / ("control-dev.in" if dev else "control.in"), pkg_values)
            target = out_dir / f"{package}_{file_version}_{arch}.deb"
            paths.append(_build_one(root, package, control, epoch, target))
    return BpfDebs(version, paths)


def lintian_debs(debs: list[Path]) -> tuple[list[str], list[str], bool]:
    """(errors, warnings, ran) from lintian on the host over the given packages."""
    lintian = shutil.which("lintian")
    if lintian is None:
        return [], [], False
    proc = subprocess.run(
        [
            lintian,
            "--tag-display-limit",
            "0",
            # the same tags the -dkms build suppresses: about uploads to Debian itself
            "--suppress-tags",
            ",".join(SUPPRESSED_LINTIAN),
            *map(str, debs),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "LC_ALL": "C.UTF-8"},
    )
    lines = proc.stdout.splitlines()
    return (
        [ln for ln in lines if ln.startswith("E: ")],
        [ln for ln in lines if ln.startswith("W: ")],
        True,
    )
