"""Seconds per boot test under software emulation (TCG), for a 6.1 and a 6.12 kernel.

    python bench/bench_boottest.py [--rounds 5] [--no-docker] [--parallel]

Each round boots kbench (built by the real pipeline; --no-docker wraps the kernel's own
dummy.ko instead) once per kernel, interleaved, one VM at a time, with the cached kernel:
  moddeb   boot_test as the pipeline calls it: unpack the package, resolve dependencies,
           build the initramfs, boot the PVH vmlinux, load, run the smoke, power off
  bzImage  the same boot test booting the packaged vmlinuz, which decompresses itself in
           the guest (what a plain `qemu -kernel vmlinuz` runner does)
It prints the median per kernel against the 15 s target and the bzImage/moddeb ratio.
--parallel also times one boot_many of 2 boots per kernel at os.cpu_count() VMs.
Kernel downloads are not timed (the first fetch of each is reported once).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from builder import boottest  # noqa: E402
from builder.boottest import BootRequest, boot_many, boot_test, ensure_kernel, read_smoke  # noqa: E402
from builder.config import Settings, load_settings  # noqa: E402
from builder.kernels import KernelInfo, list_kernels  # noqa: E402

KERNELS = ["6.1.0-57-amd64", "6.12.117+deb12-amd64"]
TARGET = 15.0


def kbench_debs(settings: Settings, out: Path, infos: list[KernelInfo]) -> dict[str, Path]:
    """kbench-modules-KVER for each kernel, through the real pipeline (cached builds: seconds)."""
    from builder.pipeline import BuildRequest, Pipeline
    from builder.runner import Runner

    req = BuildRequest(source=str(ROOT / "examples/kbench"), kernels=infos, out_dir=out)
    report = Pipeline(settings, req, runner=Runner(owner="moddeb-bench")).run()
    if report.status != "succeeded":
        sys.exit(f"cannot build kbench: {report.error or [k.diagnosis for k in report.kernels]}")
    return {
        k.kernel_release: next(out.glob(f"kbench-modules-{k.kernel_release}_*.deb")) for k in infos
    }


def dummy_debs(settings: Settings, out: Path, infos: list[KernelInfo]) -> dict[str, Path]:
    """The kernel's own dummy.ko wrapped as dummy-modules-KVER (no Docker needed)."""
    debs = {}
    for info in infos:
        kver = info.kernel_release
        module = next(ensure_kernel(settings, info).modules_dir.rglob("dummy.ko*"))
        root = out / f"pkg-{kver}"
        dest = root / "lib/modules" / kver / "updates/dkms"
        dest.mkdir(parents=True)
        shutil.copyfile(module, dest / module.name)
        (root / "DEBIAN").mkdir()
        (root / "DEBIAN/control").write_text(
            f"Package: dummy-modules-{kver}\nVersion: 1\nArchitecture: amd64\n"
            "Maintainer: Bench <bench@example.org>\nDescription: bench\n"
        )
        debs[kver] = out / f"dummy-modules-{kver}_1_amd64.deb"
        subprocess.run(
            ["dpkg-deb", "--root-owner-group", "-b", str(root), str(debs[kver])],
            check=True,
            capture_output=True,
        )
    return debs


def one(settings: Settings, info: KernelInfo, deb: Path, log: Path, smoke, expect, bzimage: bool):
    """One boot test; with bzimage, boot the packaged vmlinuz instead of the PVH vmlinux."""
    real = boottest.ensure_kernel
    if bzimage:

        def as_bzimage(s, k):
            bk = real(s, k)
            return replace(bk, image=bk.image.with_name("vmlinuz"))

        boottest.ensure_kernel = as_bzimage
    try:
        result = boot_test(settings, info, [deb], log, smoke, expect)
    finally:
        boottest.ensure_kernel = real
    if result.status != "passed":
        sys.exit(f"boot test failed on {info.kernel_release}: {result.diagnosis}; see {log}")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-docker", action="store_true", help="boot dummy.ko, not kbench")
    ap.add_argument("--parallel", action="store_true")
    args = ap.parse_args()
    settings = load_settings()
    settings.boot_accel = "tcg"  # what is measured: software emulation, as on machines without KVM
    catalog = {k.kernel_release: k for k in list_kernels(settings)}
    infos = [catalog[k] for k in KERNELS]
    for info in infos:
        t0 = time.perf_counter()
        ensure_kernel(settings, info)
        took = time.perf_counter() - t0
        if took > 1:
            print(f"first fetch of {info.kernel_release}: {took:.1f} s (cached from now on)")
    work = Path(tempfile.mkdtemp(prefix="moddeb-bench-boot-"))
    if args.no_docker:
        debs, (smoke, expect) = dummy_debs(settings, work, infos), (None, None)
    else:
        debs, (smoke, expect) = (
            kbench_debs(settings, work, infos),
            read_smoke(ROOT / "examples/kbench"),
        )
    times: dict[tuple[str, str], list[float]] = {}
    for i in range(args.rounds):
        line = []
        for info in infos:
            for variant in ("moddeb", "bzImage"):
                log = work / f"{variant}-{info.kernel_release}-{i}.log"
                r = one(
                    settings,
                    info,
                    debs[info.kernel_release],
                    log,
                    smoke,
                    expect,
                    variant == "bzImage",
                )
                times.setdefault((info.kernel_release, variant), []).append(r.duration)
                line.append(f"{info.kernel_release} {variant} {r.duration:.2f}s")
        print(f"round {i + 1}: " + "  ".join(line))
    what = "dummy.ko" if args.no_docker else "kbench + its smoke"
    print(f"\nboot test of {what}, TCG, median of {args.rounds} rounds (min-max):")
    worst = 0.0
    for info in infos:
        kver = info.kernel_release
        ours, bz = times[(kver, "moddeb")], times[(kver, "bzImage")]
        med = statistics.median(ours)
        worst = max(worst, med)
        print(
            f"  {kver:<22} moddeb {med:6.2f} s ({min(ours):.2f}-{max(ours):.2f})"
            f"   bzImage {statistics.median(bz):6.2f} s"
            f"   bzImage/moddeb = {statistics.median(bz) / med:.2f}x"
        )
    verdict = "meets" if worst <= TARGET else "MISSES"
    print(f"  slowest kernel's median {worst:.2f} s: {verdict} the {TARGET:.0f} s target")
    if args.parallel:
        items = [
            BootRequest(
                info,
                [debs[info.kernel_release]],
                work / f"par-{info.kernel_release}-{j}.log",
                smoke,
                expect,
            )
            for info in infos
            for j in range(2)
        ]
        t0 = time.perf_counter()
        results = boot_many(settings, items)
        wall = time.perf_counter() - t0
        bad = [r for r in results if r.status != "passed"]
        if bad:
            sys.exit(f"parallel boot failed: {bad[0].diagnosis}")
        print(
            f"  boot_many: {len(items)} boots on {os.cpu_count()} cores in {wall:.1f} s"
            f" = {wall / len(items):.2f} s per boot test"
        )
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
