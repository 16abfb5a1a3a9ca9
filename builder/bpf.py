"""eBPF helper packages: detect BPF sources, compile them in a container, check and package them.

The lead's entry point is build_bpf(): detection, compilation (no network), the static
checks, the kernel's verifier and the two packages, in one call that never raises for
a bad source: what went wrong is the result's diagnosis.
"""

from __future__ import annotations

import logging
import re
import shlex
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from builder.bpf_btf import resolve_vmlinux_btf
from builder.bpf_checks import BpfCheck, check_object, program_sections, verify_on_host
from builder.bpf_deb import TARGETS, assemble_debs, lintian_debs, source_date_epoch
from builder.bpf_image import ensure_bpf_image
from builder.config import Settings
from builder.detect import (
    NAME_VERSION_RE,
    find_copyrights,
    validate_name,
    validate_version,
)
from builder.dkms import first_error_line, sha256_file
from builder.errors import BuildFailed, InvalidInput, ModdebError
from builder.kernels import build_arch
from builder.runner import BUILD_UID, Runner, limits_from

log = logging.getLogger(__name__)

SEC_RE = re.compile(r'\bSEC\s*\(\s*"([^"]+)"\s*\)')
LICENSE_RE = re.compile(r'SEC\s*\(\s*"license"\s*\)\s*=\s*"([^"]+)"')
SAFE_PATH_RE = re.compile(r"^[A-Za-z0-9_.+/-]+$")
# A verifier is handed an object and a log file and says whether a kernel accepts it.
Verifier = Callable[[Path, Path], BpfCheck]


@dataclass
class BpfProgram:
    """One BPF source file and the object, skeleton and sections it gives."""

    source: str  # path relative to the tree
    stem: str  # foo for foo.bpf.c or foo.c: foo.bpf.o, foo.skel.h, struct foo_bpf
    sections: list[str] = field(default_factory=list)  # SEC("...") names in the source

    @property
    def object_name(self) -> str:
        """The compiled object's file name."""
        return f"{self.stem}.bpf.o"

    @property
    def skeleton_name(self) -> str:
        """The generated skeleton header's file name."""
        return f"{self.stem}.skel.h"

    @property
    def skeleton_ident(self) -> str:
        """The C name of the skeleton struct (bpftool's own convention: STEM_bpf)."""
        return re.sub(r"[^A-Za-z0-9_]", "_", self.stem) + "_bpf"


@dataclass
class BpfLayout:
    """What moddeb found out about a source of BPF programs (kind "bpf")."""

    name: str
    upstream_version: str
    programs: list[BpfProgram]
    vmlinux_headers: list[str] = field(default_factory=list)  # carried vmlinux.h files
    license: str = "GPL"
    copyrights: list[str] = field(default_factory=list)
    kind: str = "bpf"

    @property
    def source_package(self) -> str:
        """The Debian source package name."""
        return self.name


@dataclass
class BpfResult:
    """The outcome of build_bpf: status, why it failed, the packages and every check."""

    name: str = ""
    upstream_version: str = ""
    version: str = ""
    status: str = "pending"  # built, failed
    diagnosis: str = ""
    error_code: str = ""
    artifacts: dict[str, str] = field(default_factory=dict)  # filename -> sha256
    checks: list[BpfCheck] = field(default_factory=list)
    programs: dict[str, list[str]] = field(default_factory=dict)  # object -> sections
    lintian: list[str] = field(default_factory=list)
    log_path: str = ""
    duration: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)


def _is_bpf_source(path: Path) -> bool:
    if path.name.endswith(".bpf.c"):
        return True
    text = path.read_text(encoding="utf-8", errors="replace")
    # A kernel module can use a SEC-like macro; MODULE_LICENSE says which it is.
    return bool(SEC_RE.search(text)) and "MODULE_LICENSE" not in text


def find_programs(tree: Path) -> list[BpfProgram]:
    """Every *.bpf.c, and every .c with SEC("...") programs, under tree."""
    programs: list[BpfProgram] = []
    for path in sorted(tree.rglob("*.c")):
        if not path.is_file() or path.is_symlink() or not _is_bpf_source(path):
            continue
        rel = path.relative_to(tree).as_posix()
        text = path.read_text(encoding="utf-8", errors="replace")
        stem = path.name.removesuffix(".c").removesuffix(".bpf")
        programs.append(BpfProgram(rel, stem, [s for s in SEC_RE.findall(text)]))
    return programs


def detect_bpf(
    tree: Path,
    hint: str | None = None,
    *,
    name: str | None = None,
    version: str | None = None,
) -> BpfLayout | None:
    """A BpfLayout when tree holds BPF programs, else None; flags override what is found."""
    programs = find_programs(tree)
    if not programs:
        return None
    stems: dict[str, str] = {}
    for prog in programs:
        if not SAFE_PATH_RE.match(prog.source):
            raise InvalidInput(f"BPF source {prog.source!r} has characters moddeb cannot build")
        if prog.stem in stems:
            raise InvalidInput(
                f"two BPF sources would make the same object {prog.object_name}: "
                f"{stems[prog.stem]} and {prog.source}",
                hint="rename one of them",
            )
        stems[prog.stem] = prog.source
    hint_match = NAME_VERSION_RE.match(hint if hint is not None else tree.name)
    candidate = name or (hint_match.group("name") if hint_match else "")
    if not candidate and len(programs) == 1:
        candidate = programs[0].stem
    if not candidate:
        raise InvalidInput(
            "could not work out the BPF package name: looked for a NAME-VERSION directory or "
            f"tarball name and a single BPF program (found {len(programs)}: "
            f"{', '.join(p.source for p in programs)})",
            hint="pass --name",
        )
    final_name = validate_name(name if name else candidate.lower().replace("_", "-"))
    version_file = tree / "VERSION"
    file_version = ""
    if version_file.is_file() and not version_file.is_symlink():
        lines = version_file.read_text(encoding="utf-8", errors="replace").split()
        file_version = lines[0] if lines else ""
    candidate = version or (hint_match.group("version") if hint_match else "") or file_version
    if not candidate:
        raise InvalidInput(
            "could not work out the upstream version of the BPF programs: looked for a "
            "NAME-VERSION directory or tarball name and a VERSION file",
            hint="pass --version",
        )
    licenses = []
    for prog in programs:
        text = (tree / prog.source).read_text(encoding="utf-8", errors="replace")
        licenses += [lic for lic in LICENSE_RE.findall(text) if lic not in licenses]
    return BpfLayout(
        name=final_name,
        upstream_version=validate_version(candidate),
        programs=programs,
        vmlinux_headers=sorted(
            p.relative_to(tree).as_posix() for p in tree.rglob("vmlinux.h") if p.is_file()
        ),
        license=" and ".join(licenses) or "GPL",
        copyrights=find_copyrights(tree),
    )


def compile_script(layout: BpfLayout, arch: str, generate_vmlinux: bool) -> str:
    """The shell script that compiles, strips and skeletons each program in the container."""
    triplet, target_arch, _little = TARGETS[arch]
    lines = ["cd /build/src", "mkdir -p /build/out/obj /build/out/skel /build/gen"]
    if generate_vmlinux:
        # A carried vmlinux.h sits next to its program, where #include "vmlinux.h" looks
        # first: replace it, so the configured kernel's types are the ones compiled in.
        lines += [
            "bpftool btf dump file /build/btf/vmlinux format c > /build/gen/vmlinux.h",
            "echo moddeb: vmlinux.h generated from the configured BTF "
            "\"($(grep -c '^struct .* {$' /build/gen/vmlinux.h) structs)\"",
            "find /build/src -name vmlinux.h -exec cp /build/gen/vmlinux.h {} \\;",
        ]
    for prog in layout.programs:
        src = shlex.quote(prog.source)
        obj = f"/build/out/obj/{prog.object_name}"
        include_dir = shlex.quote(str(Path(prog.source).parent))
        lines += [
            f"echo moddeb: compiling {src}",
            f"clang -target bpf -O2 -g -Wall -D__TARGET_ARCH_{target_arch} -I/build/gen "
            f"-I{include_dir} -I/build/src -I/usr/include/{triplet} -c {src} -o {obj}",
            # DWARF is dropped (it names build paths and is large); .BTF and .BTF.ext stay.
            f"llvm-strip -g {obj}",
            f"bpftool gen skeleton {obj} name {prog.skeleton_ident} "
            f"> /build/out/skel/{prog.skeleton_name}",
        ]
    return "\n".join(lines) + "\n"


def _compile(
    settings: Settings,
    runner: Runner,
    image: str,
    tree: Path,
    layout: BpfLayout,
    arch: str,
    work: Path,
    log_path: Path,
    labels: dict[str, str],
) -> tuple[Path, Path, float]:
    """Compile in a network-less container; return the object and skeleton directories."""
    inputs = {"/build/src": tree}
    btf = resolve_vmlinux_btf(settings, runner, work)
    if btf is not None:
        (work / "btf").mkdir()
        shutil.copyfile(btf, work / "btf" / "vmlinux")
        inputs["/build/btf"] = work / "btf"
    outbox = work / "out"
    step = runner.run_step(
        "bpf-compile",
        image,
        ["/bin/sh", "-ec", compile_script(layout, arch, btf is not None)],
        log_path=log_path,
        limits=limits_from(settings),
        inputs=inputs,
        outputs={"/build/out": outbox},
        env={"LC_ALL": "C.UTF-8", "HOME": "/build"},
        labels=labels,
        uid=BUILD_UID,  # clang and bpftool gen need no root
    )
    if not step.ok:
        why = (
            f"timed out after {settings.step_timeout}s"
            if step.timed_out
            else first_error_line(log_path.read_text(encoding="utf-8", errors="replace"))
        )
        raise BuildFailed(f"{layout.name} {layout.upstream_version}: compiling failed: {why}")
    return outbox / "obj", outbox / "skel", step.duration


def host_verifier(settings: Settings) -> Verifier | None:
    """The verifier settings.bpf_verify asks for: the host's kernel, or none ("off")."""
    mode = settings.bpf_verify
    if mode == "off":
        return None
    if mode not in ("auto", "host"):
        raise InvalidInput(f"bpf_verify is {mode!r}; use auto, host or off")

    def verify(obj: Path, log_path: Path) -> BpfCheck:
        check = verify_on_host(obj, log_path)
        if check.status == "skipped" and mode == "host":
            check.status = "failed"
            check.detail = f"bpf_verify=host, but {check.detail}"
        return check

    return verify


def build_bpf(
    settings: Settings,
    runner: Runner,
    tree: Path,
    out_dir: Path,
    log_dir: Path,
    name: str | None = None,
    version: str | None = None,
    *,
    hint: str | None = None,
    origin: str = "",
    date_epoch: int | None = None,
    verifiers: list[Verifier] | None = None,
    labels: dict[str, str] | None = None,
) -> BpfResult:
    """Detect, compile, check, verify and package a BPF source; failures become a diagnosis.

    hint is the source's directory or tarball name (NAME-VERSION); origin says where the
    source came from (for the copyright file); date_epoch dates the
    packages (default: the newest file in tree); verifiers replace the host check chosen
    by settings.bpf_verify (the boot test adds its QEMU loader here).
    """
    started = time.monotonic()
    log_path = log_dir / "bpf-build.log"
    result = BpfResult(log_path=str(log_path))
    try:
        layout = detect_bpf(tree, hint, name=name, version=version)
        if layout is None:
            raise InvalidInput(
                'found no BPF program: looked for *.bpf.c files and .c files with SEC("...") '
                "programs",
                hint="point moddeb at the directory that holds the BPF sources",
            )
        result.name, result.upstream_version = layout.name, layout.upstream_version
        arch = build_arch()
        if arch not in TARGETS:
            raise InvalidInput(f"moddeb does not know how to build BPF objects for {arch}")
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path.unlink(missing_ok=True)
        t0 = time.monotonic()
        image = ensure_bpf_image(settings, runner)
        result.timings["image"] = round(time.monotonic() - t0, 3)
        settings.work_root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=settings.work_root) as tmp:
            obj_dir, skel_dir, took = _compile(
                settings, runner, image, tree, layout, arch, Path(tmp), log_path, labels or {}
            )
            result.timings["compile"] = round(took, 3)
            objects = [obj_dir / p.object_name for p in layout.programs]
            _check(layout, objects, arch, result)
            t0 = time.monotonic()
            chosen = (
                verifiers if verifiers is not None else [v for v in [host_verifier(settings)] if v]
            )
            for verify in chosen:
                for obj in objects:
                    check = verify(obj, log_path)
                    result.checks.append(check)
                    if check.status == "failed":
                        raise BuildFailed(
                            f"{layout.name} {layout.upstream_version}: {check.detail}"
                        )
            result.timings["verify"] = round(time.monotonic() - t0, 3)
            t0 = time.monotonic()
            out_dir.mkdir(parents=True, exist_ok=True)
            debs = assemble_debs(
                settings,
                layout,
                objects,
                sorted(skel_dir.glob("*.skel.h")),
                out_dir,
                arch,
                date_epoch if date_epoch is not None else source_date_epoch(tree),
                origin,
            )
            result.version = debs.version
            result.timings["package"] = round(time.monotonic() - t0, 3)
        for deb in debs.paths:
            result.artifacts[deb.name] = sha256_file(deb)
        _lintian(debs.paths, result)
        result.status = "built"
    except ModdebError as exc:
        result.status, result.error_code, result.diagnosis = "failed", exc.code, str(exc)
    finally:
        result.duration = round(time.monotonic() - started, 3)
    log.info("bpf %s %s: %s", result.name, result.upstream_version, result.status)
    return result


def _check(layout: BpfLayout, objects: list[Path], arch: str, result: BpfResult) -> None:
    """Run the static checks on every object; the first failure stops the build."""
    little = TARGETS[arch][2]
    for obj in objects:
        if not obj.is_file():
            raise BuildFailed(f"the compiler made no {obj.name}")
        result.programs[obj.name] = program_sections(obj)
        result.checks += check_object(obj, little_endian=little)
    failed = [c for c in result.checks if c.status == "failed"]
    if failed:
        raise BuildFailed(f"{layout.name} {layout.upstream_version}: {failed[0].detail}")


def _lintian(debs: list[Path], result: BpfResult) -> None:
    """Run lintian on the host; errors fail the build, warnings are reported."""
    errors, warnings, ran = lintian_debs(debs)
    result.lintian = errors + warnings
    target = " ".join(d.name for d in debs)
    if not ran:
        result.checks.append(BpfCheck("lintian", target, "skipped", "lintian is not installed"))
    elif errors:
        result.checks.append(BpfCheck("lintian", target, "failed", "\n".join(errors)))
        raise BuildFailed(f"lintian found errors in the packages: {errors[0]}")
    else:
        result.checks.append(
            BpfCheck("lintian", target, "passed", f"no errors, {len(warnings)} warning(s)")
        )
