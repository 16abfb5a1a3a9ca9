"""One build request as named stages: fetch, detect, scaffold, dkms-package, kernels, report."""

from __future__ import annotations

import json
import logging
import secrets
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from builder import images
from builder.archive import TarLimits
from builder.bpf import build_bpf, detect_bpf
from builder.config import Settings
from builder.detect import Layout, detect_layout
from builder.dkms import build_dkms_package, sha256_file
from builder.errors import BuildFailed, InvalidInput, ModdebError
from builder.kernels import KernelInfo
from builder.runner import Runner, limits_from
from builder.scaffold import write_debian_dir
from builder.sources import FetchedSource, fetch_source

log = logging.getLogger(__name__)

Progress = Callable[[str], None]


@dataclass
class BuildRequest:
    """What a user asked for: a source, optional overrides and the target kernels."""

    source: str
    ref: str | None = None
    name: str | None = None
    version: str | None = None
    modules: list[str] | None = None
    kernels: list[KernelInfo] = field(default_factory=list)
    out_dir: Path | None = None
    job_id: str = ""
    boot_test: bool = False  # boot each kernel's package under QEMU (builder.boottest)


@dataclass
class KernelResult:
    """The outcome for one kernel ABI."""

    kernel_release: str
    status: str = "pending"  # pending, running, built, cached, failed
    diagnosis: str = ""
    duration: float = 0.0
    log_path: str = ""
    artifacts: dict[str, str] = field(default_factory=dict)  # filename -> sha256
    timings: dict[str, float] = field(default_factory=dict)
    boot: dict[str, Any] = field(default_factory=dict)  # boot test: status, diagnosis, log

    @property
    def publishable(self) -> bool:
        """Built, and not refused by a boot test that ran."""
        return self.status in ("built", "cached") and self.boot.get("status") in (None, "passed")


@dataclass
class StageRecord:
    """One stage's name, outcome and duration."""

    name: str
    status: str = "running"
    duration: float = 0.0
    error_code: str = ""
    error: str = ""
    cached: bool = False


@dataclass
class BuildReport:
    """Everything a build produced and every stage's outcome; written as report.json."""

    job_id: str
    source: str
    status: str = "running"
    name: str = ""
    upstream_version: str = ""
    version: str = ""
    origin: str = ""
    layout: dict[str, Any] = field(default_factory=dict)
    artifacts: dict[str, str] = field(default_factory=dict)  # filename -> sha256
    lintian: dict[str, list[str]] = field(default_factory=dict)
    kernels: list[KernelResult] = field(default_factory=list)
    stages: list[StageRecord] = field(default_factory=list)
    error_code: str = ""
    error: str = ""
    kind: str = "module"  # "module" (kernel module via DKMS) or "bpf" (BPF programs)
    bpf: dict[str, Any] = field(default_factory=dict)
    work_dir: str = ""
    out_dir: str = ""

    def to_json(self) -> str:
        """Serialise the report as stable, human-readable JSON."""
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"


def new_job_id() -> str:
    """A sortable, unique job id."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


class Pipeline:
    """Runs one BuildRequest stage by stage; each stage has its own error boundary."""

    def __init__(
        self,
        settings: Settings,
        request: BuildRequest,
        runner: Runner | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.settings = settings
        self.request = request
        self.runner = runner or Runner()
        self.progress = progress or (lambda msg: None)
        request.job_id = request.job_id or new_job_id()
        self.work = settings.work_root / request.job_id
        self.out = (request.out_dir or self.work / "out").resolve()
        self.logs = self.work / "logs"
        self.report = BuildReport(
            job_id=request.job_id,
            source=request.source,
            work_dir=str(self.work),
            out_dir=str(self.out),
        )
        self.layout: Layout | None = None
        self.dkms_debs: list[Path] = []
        self.limits = limits_from(settings)

    @contextmanager
    def stage(self, name: str) -> Iterator[StageRecord]:
        """Time a stage and record its outcome; errors propagate after being recorded."""
        record = StageRecord(name)
        self.report.stages.append(record)
        self.progress(f"[{self.request.job_id}] {name} ...")
        started = time.monotonic()
        try:
            yield record
            record.status = "ok"
        except ModdebError as exc:
            record.status, record.error_code, record.error = "failed", exc.code, str(exc)
            raise
        finally:
            record.duration = round(time.monotonic() - started, 3)
            log.info(
                "job %s stage %s: %s in %.1fs",
                self.request.job_id,
                name,
                record.status,
                record.duration,
            )

    def run(self) -> BuildReport:
        """Run every stage; a failure is recorded in the report, which is always written."""
        self.work.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        try:
            self._run_stages()
            failed = [
                k
                for k in self.report.kernels
                if k.status == "failed" or k.boot.get("status") not in (None, "passed")
            ]
            self.report.status = "failed" if failed else "succeeded"
        except ModdebError as exc:
            self.report.status = "failed"
            self.report.error_code, self.report.error = exc.code, str(exc)
        finally:
            self._write_report()
        return self.report

    def _run_stages(self) -> None:
        req, s = self.request, self.settings
        with self.stage("fetch"):
            fetched = fetch_source(
                req.source,
                self.work / "source",
                TarLimits(s.max_archive_bytes, s.max_archive_files),
                ref=req.ref,
            )
            self.report.origin = fetched.origin
        with self.stage("detect"):
            try:
                layout = detect_layout(
                    fetched.tree,
                    fetched.hint,
                    name=req.name,
                    version=req.version,
                    modules=req.modules,
                )
            except InvalidInput:
                # Not kernel module source: it may be BPF programs (*.bpf.c, SEC(...)).
                if detect_bpf(fetched.tree, fetched.hint, name=req.name, version=req.version):
                    self.report.kind = "bpf"
                else:
                    raise
            else:
                self.layout = layout
                self.report.name = layout.name
                self.report.upstream_version = layout.upstream_version
                self.report.layout = {
                    "style": layout.style,
                    "build_dir": layout.build_dir,
                    "modules": layout.modules,
                    "own_dkms_conf": layout.dkms_conf is not None,
                }
        if self.report.kind == "bpf":
            self._build_bpf(fetched)
            return
        with self.stage("scaffold"):
            pkg_tree = self.work / "pkg" / f"{layout.name}-{layout.upstream_version}"
            shutil.copytree(fetched.tree, pkg_tree, symlinks=True)
            self.report.version = write_debian_dir(
                pkg_tree,
                layout,
                templates=s.templates_dir,
                maintainer=s.maintainer,
                distribution=s.distribution,
                revision=s.debian_revision,
                origin=fetched.origin,
                date_epoch=fetched.date_epoch,
            )
        with self.stage("image"):
            base = images.ensure_base(s, self.runner)
        with self.stage("dkms-package") as stage:
            result = build_dkms_package(
                self.runner,
                base,
                pkg_tree,
                self.out,
                self.logs / "dkms-package.log",
                self.limits,
                {"moddeb.job": req.job_id},
                cache_root=s.cache_root,
            )
            stage.cached = result.cached
            for deb in result.debs:
                self.report.artifacts[deb.name] = sha256_file(deb)
            self.report.lintian[f"{layout.name}-dkms"] = (
                result.lintian_errors + result.lintian_warnings
            )
        self.dkms_debs = result.debs
        if req.kernels:
            self._build_kernels()
            if req.boot_test:
                self._boot_test(fetched.tree)

    def _boot_test(self, source_tree: Path) -> None:
        """Boot every built kernel under QEMU with its module loaded (and the smoke command)."""
        from builder.boottest import BootRequest, boot_many, read_smoke

        smoke, expect = read_smoke(source_tree)
        by_kver = {k.kernel_release: k for k in self.request.kernels}
        todo = [k for k in self.report.kernels if k.status in ("built", "cached")]
        with self.stage("boot-test"):
            items = [
                BootRequest(
                    by_kver[k.kernel_release],
                    [self.out / n for n in sorted(k.artifacts)],
                    self.logs / f"boot-{k.kernel_release}.log",
                    smoke,
                    expect,
                )
                for k in todo
            ]
            for k, res in zip(todo, boot_many(self.settings, items), strict=True):
                k.boot = {
                    "status": res.status,
                    "diagnosis": res.diagnosis,
                    "duration": round(res.duration, 3),
                    "log_path": res.log_path,
                    "accel": res.accel,
                    "output": res.output,
                }
                self.progress(
                    f"[{self.request.job_id}] {k.kernel_release}: boot test {res.status}"
                    + (f": {res.diagnosis}" if res.diagnosis else "")
                )

    def _build_bpf(self, fetched: FetchedSource) -> None:
        """BPF programs: compile, check, verify and package (builder.bpf)."""
        req = self.request
        verifiers = None
        if req.boot_test and req.kernels:
            # The verifier of every target kernel, under QEMU, after the host's (if allowed).
            from builder.bpf import host_verifier
            from builder.bpf_boot import qemu_verifiers

            host = host_verifier(self.settings)
            verifiers = [*([host] if host else []), *qemu_verifiers(self.settings, req.kernels)]
        with self.stage("bpf"):
            result = build_bpf(
                self.settings,
                self.runner,
                fetched.tree,
                self.out,
                self.logs,
                name=req.name,
                version=req.version,
                hint=fetched.hint,
                origin=fetched.origin,
                date_epoch=fetched.date_epoch,
                labels={"moddeb.job": req.job_id},
                verifiers=verifiers,
            )
            self.report.name, self.report.version = result.name, result.version
            self.report.upstream_version = result.upstream_version
            self.report.artifacts.update(result.artifacts)
            self.report.lintian[f"{result.name}-bpf"] = list(result.lintian)
            self.report.bpf = {
                "status": result.status,
                "diagnosis": result.diagnosis,
                "programs": result.programs,
                "log_path": str(result.log_path or ""),
                "checks": [asdict(c) for c in result.checks],
            }
            if result.status != "built":
                raise BuildFailed(result.diagnosis)
        if req.kernels:
            self.progress(
                f"[{req.job_id}] BPF objects are CO-RE: one package serves every kernel"
                + ("; each kernel's verifier checked them" if req.boot_test else "")
            )

    def _build_kernels(self) -> None:
        """Per-kernel module packages; filled in by builder.mkbmdeb."""
        from builder.mkbmdeb import build_kernels

        with self.stage("kernels"):
            build_kernels(self)

    def _write_report(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        tmp = self.out / "report.json.tmp"
        tmp.write_text(self.report.to_json(), encoding="utf-8")
        tmp.replace(self.out / "report.json")
        (self.work / "report.json").write_text(self.report.to_json(), encoding="utf-8")
