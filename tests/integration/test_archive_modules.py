"""Realistic sources: DKMS modules Debian ships, given bare (no debian/, no dkms.conf)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from builder.runner import Limits

from .helpers import KERNEL_61, KERNEL_612, build

pytestmark = pytest.mark.docker

# Source package -> the .ko files its upstream Makefile builds.
ARCHIVE_MODULES = {
    "acpi-call": ["acpi_call"],
    "bbswitch": ["bbswitch"],
    "nat-rtsp": ["nf_conntrack_rtsp", "nf_nat_rtsp"],
}

FETCH = """\
sed -n 's/^deb /deb-src /p' /etc/apt/sources.list > /etc/apt/sources.list.d/src.list
apt-get update -qq
mkdir -p /build/work /build/out && cd /build/work
# Only the upstream tarball is wanted: Debian's packaging is what moddeb replaces.
apt-get source --download-only -qq {package} >/dev/null 2>&1 || true
orig=$(ls {package}_*.orig.tar.* | head -1)
ver=${{orig#*_}}; ver=${{ver%.orig.tar.*}}
mkdir x && tar -C x -xf "$orig"
dir=$(find x -mindepth 1 -maxdepth 1 -type d | head -1)
rm -rf "$dir/debian" "$dir/dkms.conf"
tar -C "$dir" --transform "s,^\\.,{package}-$ver," -czf "/build/out/{package}-$ver.tar.gz" .
"""


@pytest.fixture(scope="module")
def archive_sources(runner, base_image, tmp_path_factory) -> dict[str, Path]:
    """Upstream tarballs of Debian's DKMS packages, their debian/ and dkms.conf removed."""
    out: dict[str, Path] = {}
    for package in ARCHIVE_MODULES:
        dest = tmp_path_factory.mktemp(f"src-{package}")
        log = dest.parent / f"{package}-fetch.log"
        result = runner.commit_step(
            base_image,
            FETCH.format(package=package),
            None,
            {},
            log,
            Limits(timeout=600),
            outputs={"/build/out": dest},
        )
        assert result.ok, log.read_text()[-3000:]
        out[package] = next(dest.glob(f"{package}-*.tar.gz"))
    return out


@pytest.mark.parametrize("package", sorted(ARCHIVE_MODULES))
def test_debian_shipped_module_builds_from_bare_source(
    package: str, archive_sources, settings, runner, tmp_path: Path
) -> None:
    """Name, version and every .ko are found; each kernel gives a package or a diagnosis.

    Bare upstream sources are what users bring, and some no longer build without
    Debian's patches: such a kernel must fail with the compiler's own words and a
    file:line, and never hide the kernels that did build.
    """
    tarball = archive_sources[package]
    report = build(settings, runner, str(tarball), tmp_path / "out", KERNEL_61, KERNEL_612)
    assert report.error == "", report.error
    assert report.name == package
    assert sorted(report.layout["modules"]) == sorted(ARCHIVE_MODULES[package])
    assert report.artifacts[f"{package}-dkms_{report.version}_all.deb"]
    for k in report.kernels:
        if k.status == "failed":
            assert re.search(r"\(\S+\.[ch]:\d+\)$", k.diagnosis), k
            assert not k.artifacts
            continue
        deb = tmp_path / "out" / next(iter(k.artifacts))
        listing = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True)
        for module in ARCHIVE_MODULES[package]:
            assert f"/lib/modules/{k.kernel_release}/updates/dkms/{module}.ko" in listing.stdout


def test_some_archive_module_builds_everywhere(archive_sources, settings, runner, tmp_path):
    """At least one of Debian's modules builds bare for both ABIs (the matrix is not all red)."""
    built = []
    for package, tarball in sorted(archive_sources.items()):
        report = build(settings, runner, str(tarball), tmp_path / package, KERNEL_61, KERNEL_612)
        if all(k.status in ("built", "cached") for k in report.kernels):
            built.append(package)
    assert built, "no archive module built for both kernels"
