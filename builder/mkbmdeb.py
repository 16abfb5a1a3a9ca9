"""Per-kernel binary module packages (the old `dkms mkbmdeb` contract), one container per kernel.

Input is only the NAME-dkms .deb and a kernel ABI, so a worker on any host can do it.
"""

from __future__ import annotations

import email.utils
import gzip
import hashlib
import json
import logging
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from debian import changelog, deb822, debfile

from builder import images
from builder.config import Settings
from builder.debpack import installed_size_kib, pack_deb
from builder.dkms import first_error_line, sha256_file
from builder.errors import BuildFailed, ModdebError
from builder.kernels import KernelInfo, build_arch
from builder.pipeline import KernelResult
from builder.runner import Runner, limits_from
from builder.scaffold import render

if TYPE_CHECKING:
    from builder.pipeline import Pipeline

log = logging.getLogger(__name__)

# Bump when the produced package changes shape, so cached results are rebuilt.
MKBMDEB_FORMAT = "2"
DKMS_SCRIPT = """\
# Never sign: no key may enter a build container, and a generated one would
# make every build different.
mkdir -p /etc/dkms/framework.conf.d
echo 'sign_file="/nonexistent/moddeb-no-signing"' > /etc/dkms/framework.conf.d/moddeb.conf
dpkg --unpack /build/in/*.deb
dkms add -m {name} -v {upstream}
if ! dkms build -m {name} -v {upstream} -k {kver}; then
    cat /var/lib/dkms/{name}/{upstream}/build/make.log || true
    exit 1
fi
mkdir -p /build/out/modules
cp /var/lib/dkms/{name}/{upstream}/{kver}/*/module/* /build/out/modules/
grep -E '^CONFIG_MODULE_COMPRESS' /lib/modules/{kver}/build/.config > /build/out/compress || true
"""
COMPRESSORS = {
    # The flags the kernel's own build uses, so the result matches its modules.
    "xz": (".xz", ["xz", "--check=crc32", "--lzma2=dict=1MiB", "-T1", "--stdout"]),
    "zstd": (".zst", ["zstd", "-T1", "-q", "--stdout"]),
    "gzip": (".gz", ["gzip", "-n", "-9", "--stdout"]),
}


@dataclass
class DkmsPackage:
    """What a NAME-dkms .deb says about itself."""

    path: Path
    name: str
    upstream_version: str
    version: str
    maintainer: str
    date_epoch: int
    changelog_gz: bytes
    copyright: bytes
    sha256: str


def read_dkms_deb(path: Path) -> DkmsPackage:
    """Read name, versions, date, changelog and copyright out of a NAME-dkms .deb."""
    deb = debfile.DebFile(str(path))
    control = deb.debcontrol()
    package = control["Package"]
    if not package.endswith("-dkms"):
        raise BuildFailed(f"{path.name} is not a -dkms package (Package: {package})")
    name = package.removesuffix("-dkms")
    version = control["Version"]
    doc = f"usr/share/doc/{package}"
    changelog_gz = deb.data.get_content(f"./{doc}/changelog.Debian.gz")
    copyright_text = deb.data.get_content(f"./{doc}/copyright")
    if changelog_gz is None or copyright_text is None:
        raise BuildFailed(f"{path.name} lacks /{doc}/changelog.Debian.gz or copyright")
    entries = changelog.Changelog(gzip.decompress(changelog_gz).decode("utf-8"), max_blocks=1)
    date = email.utils.parsedate_to_datetime(entries.date)
    return DkmsPackage(
        path=path,
        name=name,
        upstream_version=str(changelog.Version(version).upstream_version),
        version=version,
        maintainer=control["Maintainer"],
        date_epoch=int(date.timestamp()),
        changelog_gz=changelog_gz,
        copyright=copyright_text,
        sha256=sha256_file(path),
    )


def smoke_tree(dkms_deb: Path, dest: Path) -> Path:
    """Copy the source's top-level moddeb-smoke.sh (if any) out of a -dkms .deb into dest."""
    deb = debfile.DebFile(str(dkms_deb))
    for member in deb.data.tgz().getmembers():
        parts = member.name.lstrip("./").split("/")
        if len(parts) == 4 and parts[:2] == ["usr", "src"] and parts[3] == "moddeb-smoke.sh":
            data = deb.data.get_content(member.name)
            if data is not None:
                (dest / "moddeb-smoke.sh").write_bytes(data)
    return dest


def package_name(name: str, kernel_release: str) -> str:
    """NAME-modules-KVER, lower-cased as Debian package names must be."""
    return f"{name}-modules-{kernel_release}".lower()


def deb_filename(name: str, kernel_release: str, version: str, arch: str) -> str:
    """NAME-modules-KVER_VER_ARCH.deb (epochs never appear in file names)."""
    return f"{package_name(name, kernel_release)}_{version.split(':')[-1]}_{arch}.deb"


def compression_of(config_lines: str) -> str | None:
    """Which compressor the kernel's own modules use, from its CONFIG_MODULE_COMPRESS_*."""
    for kind, key in (("xz", "XZ"), ("zstd", "ZSTD"), ("gzip", "GZIP")):
        if f"CONFIG_MODULE_COMPRESS_{key}=y" in config_lines:
            return kind
    return None


def _normalise_module(src: Path, dest_dir: Path, compression: str | None) -> Path:
    """Store one module uncompressed, or compressed the way its kernel's modules are."""
    data = src.read_bytes()
    stem = src.name
    for suffix, tool in (
        (".xz", ["xz", "-dc"]),
        (".zst", ["zstd", "-dcq"]),
        (".gz", ["gzip", "-dc"]),
    ):
        if stem.endswith(suffix):
            data = subprocess.run(tool, input=data, capture_output=True, check=True).stdout
            stem = stem.removesuffix(suffix)
    if compression:
        suffix, tool = COMPRESSORS[compression]
        data = subprocess.run(tool, input=data, capture_output=True, check=True).stdout
        stem += suffix
    out = dest_dir / stem
    out.write_bytes(data)
    return out


def assemble_deb(
    settings: Settings,
    pkg: DkmsPackage,
    kernel: KernelInfo,
    modules: list[Path],
    compression: str | None,
    out_dir: Path,
    arch: str,
) -> Path:
    """Lay out and build NAME-modules-KVER_VER_ARCH.deb reproducibly with dpkg-deb."""
    templates = settings.templates_dir / "modules"
    kver = kernel.kernel_release
    package = package_name(pkg.name, kver)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        root = Path(tmp) / "root"
        mod_dir = root / "lib/modules" / kver / "updates/dkms"
        mod_dir.mkdir(parents=True)
        for module in sorted(modules):
            _normalise_module(module, mod_dir, compression)
        doc = root / "usr/share/doc" / package
        doc.mkdir(parents=True)
        (doc / "changelog.Debian.gz").write_bytes(pkg.changelog_gz)
        (doc / "copyright").write_bytes(pkg.copyright)
        values = {
            "package": package,
            "source_package": pkg.name,
            "name": pkg.name,
            "version": pkg.version,
            "arch": arch,
            "maintainer": pkg.maintainer,
            "installed_size": str(installed_size_kib(root)),
            "kernel_release": kver,
        }
        with open(templates / "control.in", encoding="utf-8") as fh:
            template = deb822.Deb822(fh)
        control = deb822.Deb822()
        for key, value in template.items():
            control[key] = render(value, values)
        scripts = {
            name: render((templates / f"{name}.in").read_text(), values)
            for name in ("postinst", "postrm")
        }
        target = out_dir / deb_filename(pkg.name, kver, pkg.version, arch)
        pack_deb(root, target, control=control.dump(), epoch=pkg.date_epoch, scripts=scripts)
    return target


def cache_key(pkg: DkmsPackage, kernel: KernelInfo, image_id: str, arch: str) -> str:
    """What decides a per-kernel result: the -dkms package, the kernel, the builder image."""
    text = "\n".join([MKBMDEB_FORMAT, pkg.sha256, kernel.kernel_release, image_id, arch])
    return hashlib.sha256(text.encode()).hexdigest()


def build_kernel_package(
    settings: Settings,
    runner: Runner,
    dkms_deb: Path,
    kernel: KernelInfo,
    out_dir: Path,
    log_dir: Path,
    labels: dict[str, str] | None = None,
) -> KernelResult:
    """Build NAME-modules-KVER from a -dkms .deb for one kernel; failures become a diagnosis."""
    kver = kernel.kernel_release
    result = KernelResult(kver, status="running", log_path=str(log_dir / f"kernel-{kver}.log"))
    started = time.monotonic()
    try:
        pkg = read_dkms_deb(dkms_deb)
        arch = build_arch()
        t0 = time.monotonic()
        image = images.ensure_kernel_image(settings, runner, kver, suite=kernel.suite)
        result.timings["image"] = round(time.monotonic() - t0, 3)
        key = cache_key(pkg, kernel, runner.image_id(image), arch)
        cached = settings.cache_root / "modules" / key
        if (cached / "result.json").is_file():
            _restore(cached, out_dir, result)
            return result
        _build(
            settings,
            runner,
            pkg,
            kernel,
            image,
            out_dir,
            Path(result.log_path),
            arch,
            result,
            labels or {},
        )
        _store(cached, out_dir, result)
    except ModdebError as exc:
        result.status, result.diagnosis = "failed", str(exc)
    except Exception as exc:  # noqa: BLE001 - one kernel's crash must not hide the others
        log.exception("kernel %s: unexpected error", kver)
        result.status, result.diagnosis = "failed", f"internal error: {exc!r}"
    finally:
        result.duration = round(time.monotonic() - started, 3)
    return result


def _build(
    settings: Settings,
    runner: Runner,
    pkg: DkmsPackage,
    kernel: KernelInfo,
    image: str,
    out_dir: Path,
    log_path: Path,
    arch: str,
    result: KernelResult,
    labels: dict[str, str],
) -> None:
    kver = kernel.kernel_release
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.unlink(missing_ok=True)
    settings.work_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=settings.work_root) as tmp:
        inbox, outbox = Path(tmp) / "in", Path(tmp) / "out"
        inbox.mkdir()
        shutil.copyfile(pkg.path, inbox / pkg.path.name)
        script = DKMS_SCRIPT.format(name=pkg.name, upstream=pkg.upstream_version, kver=kver)
        step = runner.run_step(
            f"dkms-build-{kver}",
            image,
            ["/bin/sh", "-ec", script],
            log_path=log_path,
            limits=limits_from(settings),
            inputs={"/build/in": inbox},
            outputs={"/build/out": outbox},
            env={"LANG": "C"},  # ASCII quotes in compiler diagnostics
            labels={**labels, "moddeb.kernel": kver},
        )
        result.timings["build"] = round(step.duration, 3)
        if not step.ok:
            why = (
                f"timed out after {settings.step_timeout}s"
                if step.timed_out
                else first_error_line(log_path.read_text(encoding="utf-8", errors="replace"))
            )
            raise BuildFailed(why)
        modules = sorted((outbox / "modules").glob("*.ko*"))
        if not modules:
            raise BuildFailed("dkms built no .ko file")
        compress_file = outbox / "compress"
        compression = compression_of(compress_file.read_text() if compress_file.exists() else "")
        t0 = time.monotonic()
        out_dir.mkdir(parents=True, exist_ok=True)
        deb = assemble_deb(settings, pkg, kernel, modules, compression, out_dir, arch)
        result.timings["package"] = round(time.monotonic() - t0, 3)
    result.artifacts[deb.name] = sha256_file(deb)
    result.status = "built"


def _store(cached: Path, out_dir: Path, result: KernelResult) -> None:
    """Keep a built result for later cache hits (written aside, then renamed into place)."""
    tmp = cached.with_name(cached.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in result.artifacts:
        shutil.copyfile(out_dir / name, tmp / name)
    (tmp / "result.json").write_text(json.dumps(asdict(result), indent=2))
    shutil.rmtree(cached, ignore_errors=True)
    tmp.rename(cached)


def _restore(cached: Path, out_dir: Path, result: KernelResult) -> None:
    """Copy a cached result's artifacts out, checking they are what was recorded."""
    recorded = json.loads((cached / "result.json").read_text())
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, digest in recorded["artifacts"].items():
        if sha256_file(cached / name) != digest:
            raise BuildFailed(f"cached artifact {name} is corrupt; remove {cached}")
        shutil.copyfile(cached / name, out_dir / name)
        result.artifacts[name] = digest
    result.status = "cached"
    result.timings.update({"build": recorded["timings"].get("build", 0.0)})


def build_kernels(pipeline: Pipeline) -> None:
    """Build every requested kernel in parallel (settings.jobs at once), in request order."""
    settings, req = pipeline.settings, pipeline.request
    dkms_deb = next(d for d in pipeline.dkms_debs if d.name.endswith("_all.deb"))
    results = [KernelResult(k.kernel_release) for k in req.kernels]
    pipeline.report.kernels = results

    def one(index: int) -> None:
        kernel = req.kernels[index]
        pipeline.progress(f"[{req.job_id}] {kernel.kernel_release}: building")
        res = build_kernel_package(
            settings,
            pipeline.runner,
            dkms_deb,
            kernel,
            pipeline.out,
            pipeline.logs,
            {"moddeb.job": req.job_id},
        )
        results[index] = res
        pipeline.report.kernels = results
        for name, digest in res.artifacts.items():
            pipeline.report.artifacts[name] = digest
        pipeline.progress(
            f"[{req.job_id}] {kernel.kernel_release}: {res.status} in {res.duration:.1f}s"
            + (f": {res.diagnosis}" if res.diagnosis else "")
        )

    with ThreadPoolExecutor(max_workers=max(1, settings.jobs)) as pool:
        list(pool.map(one, range(len(req.kernels))))
