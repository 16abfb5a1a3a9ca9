"""Real builds in real containers: -dkms packages and per-kernel module packages."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from debian.debfile import DebFile

from builder import images
from builder.config import load_settings
from tests.conftest import settings_sharing_cache

from .helpers import EXAMPLES, KERNEL_61, KERNEL_612, build, run_in

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def module_settings(shared_home: Path, tmp_path_factory: pytest.TempPathFactory):
    """Settings whose module cache is shared by this file's builds."""
    return settings_sharing_cache(tmp_path_factory.mktemp("pkg-home"), shared_home)


@pytest.fixture(scope="module")
def kbench(module_settings, runner, base_image, tmp_path_factory):
    """kbench built for a 6.1 and a 6.12 ABI."""
    out = tmp_path_factory.mktemp("kbench-out")
    report = build(module_settings, runner, str(EXAMPLES / "kbench"), out, KERNEL_61, KERNEL_612)
    return report, out


@pytest.fixture(scope="module")
def vendornic(module_settings, runner, base_image, tmp_path_factory):
    """The Intel-layout example, given as a tarball whose directory carries the version."""
    tmp = tmp_path_factory.mktemp("vendornic")
    tarball = tmp / "vendornic-2.3.1.tar.gz"
    subprocess.run(
        ["tar", "-C", str(EXAMPLES), "-czf", str(tarball), "vendornic-2.3.1"], check=True
    )
    report = build(module_settings, runner, str(tarball), tmp / "out", KERNEL_61, KERNEL_612)
    return report, tmp / "out"


def _lintian_errors(debs: list[Path]) -> list[str]:
    proc = subprocess.run(
        ["lintian", "--tag-display-limit", "0", *map(str, debs)], capture_output=True, text=True
    )
    return [ln for ln in proc.stdout.splitlines() if ln.startswith("E:")]


@pytest.mark.parametrize("example", ["hello", "kbench", "vendornic-2.3.1", "oldapi", "failinit"])
def test_dkms_package_installs_and_dkms_builds_it(
    example: str, settings, runner, base_image, tmp_path: Path
) -> None:
    """Each example becomes NAME-dkms_VER_all.deb; installing it with headers makes dkms build it."""
    report = build(settings, runner, str(EXAMPLES / example), tmp_path / "out")
    assert report.status == "succeeded", report.error
    debs = [tmp_path / "out" / n for n in report.artifacts]
    assert [d.name for d in debs] == [f"{report.name}-dkms_{report.version}_all.deb"]
    assert report.lintian[f"{report.name}-dkms"] == [
        t for t in report.lintian[f"{report.name}-dkms"] if not t.startswith("E:")
    ]
    assert _lintian_errors(debs) == []
    image = images.ensure_kernel_image(settings, runner, KERNEL_61)
    upstream = report.upstream_version
    code, out = run_in(
        runner,
        image,
        "set -e; dpkg -i /build/in/*.deb; dkms status; "
        f"ls /usr/src/{report.name}-{upstream}/dkms.conf",
        debs,
        tmp_path,
    )
    assert code == 0, out
    assert f"{report.name}/{upstream}, {KERNEL_61}, x86_64: installed" in out


def test_kernel_packages_follow_the_mkbmdeb_contract(kbench) -> None:
    """NAME-modules-KVER: version, arch, section, Depends, versioned Provides, .ko path."""
    report, out = kbench
    assert report.status == "succeeded", report.kernels
    for kver in (KERNEL_61, KERNEL_612):
        deb = out / f"kbench-modules-{kver}_0.1-1_amd64.deb"
        control = DebFile(str(deb)).debcontrol()
        assert control["Package"] == f"kbench-modules-{kver}"
        assert (control["Version"], control["Architecture"]) == ("0.1-1", "amd64")
        assert control["Section"] == "kernel"
        assert control["Depends"] == f"linux-image-{kver}"
        assert control["Provides"] == "kbench-modules (= 0.1-1)"
        assert kver in control["Description"] and "kbench" in control["Description"]
        listing = subprocess.run(
            ["dpkg-deb", "-c", str(deb)], capture_output=True, text=True
        ).stdout
        suffix = ".ko.xz" if kver == KERNEL_612 else ".ko"  # 6.12's own modules are xz
        assert f"./lib/modules/{kver}/updates/dkms/kbench{suffix}\n" in listing
    assert _lintian_errors(sorted(out.glob("*.deb"))) == []
    saved = json.loads((out / "report.json").read_text())
    for k in saved["kernels"]:
        assert k["status"] in ("built", "cached") and k["log_path"]
        for name, digest in k["artifacts"].items():
            assert (
                subprocess.run(
                    ["sha256sum", str(out / name)], capture_output=True, text=True
                ).stdout.split()[0]
                == digest
            )


@pytest.mark.parametrize("fixture", ["kbench", "vendornic"])
@pytest.mark.parametrize("kver", [KERNEL_61, KERNEL_612])
def test_module_package_installs_in_its_kernel_and_removal_runs_depmod(
    fixture: str, kver: str, request, module_settings, runner, tmp_path: Path
) -> None:
    """Installed with dpkg in a fresh container of its kernel: .ko in place, vermagic KVER, depmod."""
    report, out = request.getfixturevalue(fixture)
    assert report.status == "succeeded", [(k.kernel_release, k.diagnosis) for k in report.kernels]
    name = report.name
    deb = next(out.glob(f"{name}-modules-{kver}_*.deb"))
    image = images.ensure_kernel_image(module_settings, runner, kver)
    script = f"""
set -e
mkdir -p /lib/modules/{kver}
dpkg --force-depends -i /build/in/{deb.name}
ko=$(ls /lib/modules/{kver}/updates/dkms/{name}.ko*)
modinfo -F vermagic "$ko" | sed 's/^/vermagic: /'
grep -c 'updates/dkms/{name}.ko' /lib/modules/{kver}/modules.dep | sed 's/^/dep-before: /'
dpkg -r {deb.name.split("_")[0]}
test ! -e "$ko" && echo removed
grep -c 'updates/dkms/{name}.ko' /lib/modules/{kver}/modules.dep | sed 's/^/dep-after: /' || true
"""
    code, log = run_in(runner, image, script, [deb], tmp_path)
    assert code == 0, log
    assert f"vermagic: {kver} SMP" in log
    assert "dep-before: 1" in log and "removed" in log and "dep-after: 0" in log


def test_removed_interface_fails_only_for_the_newer_kernel(settings, runner, base_image, tmp_path):
    """oldapi uses strlcpy: 6.1 gets its package, 6.12 fails with a diagnosis naming it."""
    report = build(
        settings, runner, str(EXAMPLES / "oldapi"), tmp_path / "out", KERNEL_61, KERNEL_612
    )
    by_kver = {k.kernel_release: k for k in report.kernels}
    assert report.status == "failed"
    assert by_kver[KERNEL_61].status in ("built", "cached")
    assert (tmp_path / "out" / f"oldapi-modules-{KERNEL_61}_0.3-1_amd64.deb").is_file()
    failed = by_kver[KERNEL_612]
    assert failed.status == "failed" and not failed.artifacts
    assert "strlcpy" in failed.diagnosis and "oldapi.c:" in failed.diagnosis
    assert Path(failed.log_path).is_file()


def test_same_source_builds_byte_identical_packages(runner, base_image, shared_home, tmp_path):
    """Two independent builds (separate caches) of one source give byte-identical .debs."""
    digests = []
    for i in range(2):
        home = tmp_path / f"home{i}"
        s = load_settings(env={"MODDEB_HOME": str(home)})
        home.mkdir()
        (home / "cache").mkdir()
        (home / "cache" / "indexes").symlink_to(shared_home / "indexes")
        src = tmp_path / f"copy{i}" / "hello"
        shutil.copytree(EXAMPLES / "hello", src)  # new mtimes and paths: must not matter...
        for p in [src, *src.rglob("*")]:  # ...except the newest mtime, which dates the changelog
            os.utime(p, (1767225600, 1767225600))
        report = build(s, runner, str(src), tmp_path / f"out{i}", KERNEL_61)
        assert report.status == "succeeded", report.kernels
        assert report.kernels[0].status == "built"
        digests.append(report.artifacts)
    assert digests[0] == digests[1]


class CountingRunner:
    """Wraps the real runner and counts the containers it starts."""

    def __init__(self, real) -> None:
        self.real, self.started = real, []

    def __getattr__(self, name):
        return getattr(self.real, name)

    def run_step(self, name, *args, **kwargs):
        self.started.append(name)
        return self.real.run_step(name, *args, **kwargs)


def test_unchanged_source_and_kernel_is_a_cache_hit(settings, runner, base_image, tmp_path):
    """A second build of the same source for the same kernel starts no kernel container."""
    first = build(settings, runner, str(EXAMPLES / "hello"), tmp_path / "a", KERNEL_61)
    assert first.status == "succeeded"
    counting = CountingRunner(runner)
    second = build(settings, counting, str(EXAMPLES / "hello"), tmp_path / "b", KERNEL_61)
    assert second.kernels[0].status == "cached"
    assert not [n for n in counting.started if n.startswith("dkms-build")]
    assert second.artifacts == first.artifacts
