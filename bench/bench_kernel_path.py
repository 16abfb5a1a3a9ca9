"""moddeb's per-kernel path against a bare dkms build and against today's recipe, side by side.

    python bench/bench_kernel_path.py [--rounds 3] [--matrix]

Each round runs, interleaved so machine noise hits all alike, for kbench on a warm
per-kernel image:
  moddeb   build_kernel_package with an empty cache: container start, dkms build, packaging
  bare     (a) a fresh container of the same image: dkms add + dkms build, nothing else
  recipe   (b) what users do today: a fresh plain Debian container, apt-get install dkms and
           the headers, dkms build, package with dpkg-deb
It prints medians and the ratios moddeb/bare (target <= 1.5) and recipe/moddeb (target >= 8).
--matrix also times 3 modules x 4 kernels through the real pipeline against the sum of
their bare builds divided by the cores.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from builder import images  # noqa: E402
from builder.config import Settings, load_settings  # noqa: E402
from builder.kernels import list_kernels  # noqa: E402
from builder.mkbmdeb import build_kernel_package, read_dkms_deb  # noqa: E402
from builder.pipeline import BuildRequest, Pipeline  # noqa: E402
from builder.runner import Limits, Runner  # noqa: E402

KERNEL = "6.1.0-57-amd64"
MATRIX_KERNELS = [
    "6.1.0-57-amd64",
    "6.1.0-56-amd64",
    "6.12.117+deb12-amd64",
    "6.12.115+deb12-amd64",
]
MATRIX_MODULES = ["kbench", "hello", "vendornic-2.3.1"]

BARE = """\
mkdir -p /etc/dkms/framework.conf.d
echo 'sign_file="/nonexistent"' > /etc/dkms/framework.conf.d/nosign.conf
dpkg --unpack /build/in/*.deb >/dev/null
dkms add -m {name} -v {ver} >/dev/null
dkms build -m {name} -v {ver} -k {kver}
"""
RECIPE = (
    """\
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends dkms linux-headers-{kver} >/dev/null
"""
    + BARE
    + """\
mkdir -p /tmp/pkg/DEBIAN /tmp/pkg/lib/modules/{kver}/updates/dkms
cp /var/lib/dkms/{name}/{ver}/{kver}/*/module/* /tmp/pkg/lib/modules/{kver}/updates/dkms/
printf 'Package: {name}-modules-{kver}\\nVersion: {ver}\\nArchitecture: amd64\\nMaintainer: x <x@example.org>\\nDescription: x\\n' > /tmp/pkg/DEBIAN/control
dpkg-deb --build /tmp/pkg /tmp/out.deb >/dev/null
"""
)


def plain_image(settings: Settings, runner: Runner) -> str:
    """A plain minbase Debian image (no toolchain), as users start from."""
    tag = "moddeb-bench/minbase:" + settings.suite
    if runner.has_image(tag):
        return tag
    with tempfile.TemporaryDirectory() as tmp:
        rootfs = Path(tmp) / "rootfs.tar"
        subprocess.run(
            [
                "mmdebstrap",
                "--variant=minbase",
                "--quiet",
                settings.suite,
                str(rootfs),
                *images.archive_sources(settings),
            ],
            check=True,
        )
        runner.import_rootfs(rootfs, tag, {"moddeb.kind": "bench"})
    return tag


def timed(fn) -> float:
    """Seconds one call takes."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def make_dkms_deb(settings: Settings, runner: Runner, example: str, out: Path) -> Path:
    """The -dkms package of an example (built once, outside the timings)."""
    report = Pipeline(
        settings, BuildRequest(str(ROOT / "examples" / example), out_dir=out), runner=runner
    ).run()
    if report.status != "succeeded":
        sys.exit(f"cannot build {example}: {report.error}")
    return next(out.glob("*-dkms_*_all.deb"))


def step(runner: Runner, image: str, script: str, deb: Path, tmp: Path, network: bool) -> None:
    """Run one benchmark container and insist that it worked."""
    inbox = tmp / "in"
    shutil.rmtree(inbox, ignore_errors=True)
    inbox.mkdir(parents=True)
    shutil.copyfile(deb, inbox / deb.name)
    log = tmp / "step.log"
    log.unlink(missing_ok=True)
    limits = Limits(timeout=900)
    if network:
        res = runner.commit_step(image, script, None, {}, log, limits, inputs={"/build/in": inbox})
    else:
        res = runner.run_step(
            "bench",
            image,
            ["/bin/sh", "-ec", script],
            log_path=log,
            limits=limits,
            inputs={"/build/in": inbox},
        )
    if not res.ok:
        sys.exit(f"benchmark step failed:\n{log.read_text()[-3000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--matrix", action="store_true")
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="moddeb-bench-"))
    settings = load_settings(env={**os.environ, "MODDEB_HOME": str(home)})
    runner = Runner(owner="moddeb-bench")
    kinfo = {k.kernel_release: k for k in list_kernels(settings)}
    deb = make_dkms_deb(settings, runner, "kbench", home / "dkms")
    pkg = read_dkms_deb(deb)
    kimage = images.ensure_kernel_image(settings, runner, KERNEL)
    plain = plain_image(settings, runner)
    fmt = {"name": pkg.name, "ver": pkg.upstream_version, "kver": KERNEL}
    times: dict[str, list[float]] = {"moddeb": [], "bare": [], "recipe": []}
    for i in range(args.rounds):
        out = home / f"round{i}"
        s = load_settings(env={**os.environ, "MODDEB_HOME": str(home / f"h{i}")})
        s.home.mkdir()
        (s.cache_root).mkdir()
        shutil.copytree(settings.cache_root / "indexes", s.cache_root / "indexes")

        def ours() -> None:
            res = build_kernel_package(s, runner, deb, kinfo[KERNEL], out, out / "logs")
            if res.status != "built":
                sys.exit(f"moddeb path failed: {res.diagnosis}")

        times["moddeb"].append(timed(ours))
        times["bare"].append(
            timed(lambda: step(runner, kimage, BARE.format(**fmt), deb, out, False))
        )
        times["recipe"].append(
            timed(lambda: step(runner, plain, RECIPE.format(**fmt), deb, out, True))
        )
        print(f"round {i + 1}: " + "  ".join(f"{k} {v[-1]:.2f}s" for k, v in times.items()))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\nkbench for {KERNEL}, median of {args.rounds} interleaved rounds:")
    for k, v in med.items():
        print(f"  {k:<7} {v:7.2f} s")
    print(f"  moddeb / bare dkms build   = {med['moddeb'] / med['bare']:.2f}x  (target <= 1.5x)")
    print(f"  today's recipe / moddeb    = {med['recipe'] / med['moddeb']:.1f}x  (target >= 8x)")
    if args.matrix:
        matrix(settings, runner, home, kinfo)
    runner.remove_containers(owner="moddeb-bench")
    shutil.rmtree(home, ignore_errors=True)


def matrix(settings: Settings, runner: Runner, home: Path, kinfo: dict) -> None:
    """3 modules x 4 kernels through the pipeline vs the sum of bare builds / cores."""
    for k in MATRIX_KERNELS:
        images.ensure_kernel_image(settings, runner, k)  # warm images: not what is measured
    debs = {m: make_dkms_deb(settings, runner, m, home / f"m-{m}") for m in MATRIX_MODULES}
    bare_total = 0.0
    for deb in debs.values():
        pkg = read_dkms_deb(deb)
        for k in MATRIX_KERNELS:
            image = images.ensure_kernel_image(settings, runner, k)
            script = BARE.format(name=pkg.name, ver=pkg.upstream_version, kver=k)
            bare_total += timed(lambda: step(runner, image, script, deb, home / "mb", False))
    s = load_settings(env={**os.environ, "MODDEB_HOME": str(home / "matrix")})
    s.home.mkdir()
    s.cache_root.mkdir()
    shutil.copytree(settings.cache_root / "indexes", s.cache_root / "indexes")
    s.jobs = os.cpu_count() or 2
    t0 = time.perf_counter()
    for m in MATRIX_MODULES:
        req = BuildRequest(
            str(ROOT / "examples" / m),
            kernels=[kinfo[k] for k in MATRIX_KERNELS],
            out_dir=home / f"mx-{m}",
        )
        rep = Pipeline(s, req, runner=runner).run()
        if rep.status != "succeeded":
            sys.exit(f"matrix build of {m} failed: {[k.diagnosis for k in rep.kernels]}")
    wall = time.perf_counter() - t0
    ideal = bare_total / (os.cpu_count() or 2)
    print(
        f"\nmatrix {len(MATRIX_MODULES)} modules x {len(MATRIX_KERNELS)} kernels "
        f"({s.jobs} parallel):"
    )
    print(
        f"  wall time {wall:.1f} s; sum of bare builds / cores {ideal:.1f} s; "
        f"ratio {wall / ideal:.2f}x"
    )


if __name__ == "__main__":
    main()
