"""The Celery app and its thin tasks: build (the -dkms stage, then one task per kernel),
build_kernel, and publish (serialized on its own queue). Tasks take ids; the database holds
everything else, including the files, so a worker needs no disk shared with the web host.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from celery import Celery, Task
from sqlalchemy import select, update

from builder.config import Settings, load_settings
from builder.errors import ModdebError, Transient
from builder.store import (
    LEASE_SECONDS,
    TERMINAL,
    Blob,
    Build,
    KernelJob,
    Store,
    add_event,
    celery_config,
    claim,
    now,
    open_store,
    renew_lease,
    tail,
)

log = logging.getLogger(__name__)

app = Celery("moddeb", set_as_current=False)
_settings: Settings | None = None

# The one retry policy: only builder.errors.Transient is retried, because every other error
# is a verdict on the input that a second run would repeat. Transient is raised when
#  - the Docker engine does not answer or fails an API call (builder.runner);
#  - the archive is unreachable while a builder image is made or a Packages index read
#    (builder.images, builder.kernels), or mmdebstrap cannot fetch the base system;
#  - the state database is locked or unreachable (builder.store);
#  - another worker still holds the job's lease: a duplicate delivery looks again when the
#    lease would have run out, until the job is finished or its worker is found dead
#    (JobBusy; see _run: fixed countdown, not counted against max_retries).
# Backoff is exponential from 15 s, capped at 10 minutes, with jitter so that workers
# recovering together do not stampede the engine or the archive.
RETRY_POLICY: dict[str, Any] = {
    "autoretry_for": (Transient,),
    "max_retries": 8,
    "retry_backoff": 15,
    "retry_backoff_max": 600,
    "retry_jitter": True,
}
HEARTBEAT_SECONDS = 5.0
RESEND_AFTER = 2 * LEASE_SECONDS


class JobBusy(Transient):
    """Another worker holds this job's lease right now."""

    code = "busy"


def configure(settings: Settings) -> Celery:
    """Point the Celery app at the configured broker and remember the settings for tasks."""
    global _settings
    _settings = settings
    app.conf.update(celery_config(settings))
    return app


def current_settings() -> Settings:
    """The settings given to configure(), or those of the environment."""
    if _settings is None:
        configure(load_settings())
    assert _settings is not None
    return _settings


def send(name: str, args: list[Any]) -> None:
    """Queue a task by its stable name (routing puts publish on its own queue)."""
    app.send_task(name, args=args)


class _ModdebTask(Task):  # type: ignore[misc]
    """Records a task's final failure on its job, so no build is left 'running' forever."""

    def on_failure(self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any):
        try:
            record_failure(current_settings(), self.name, list(args), exc)
        except Exception:  # noqa: BLE001 - never mask the original failure
            log.exception("could not record the failure of %s%s", self.name, args)


# --- tasks ----------------------------------------------------------------------------------
def _run(task: Task, work: Callable[..., None], *args: Any) -> None:
    """Run a task's work; a job held by another worker is looked at again when its lease
    would have run out (not on the backoff schedule, and for as long as it is held)."""
    try:
        work(current_settings(), *args)
    except JobBusy as exc:
        raise task.retry(exc=exc, countdown=LEASE_SECONDS, max_retries=None) from None


@app.task(name="moddeb.build", base=_ModdebTask, bind=True, **RETRY_POLICY)
def build(self: Task, build_id: int) -> None:
    """Run the -dkms stage of a build, store the package, then queue one task per kernel."""
    _run(self, run_build, build_id)


@app.task(name="moddeb.build_kernel", base=_ModdebTask, bind=True, **RETRY_POLICY)
def build_kernel(self: Task, build_id: int, kernel_release: str) -> None:
    """Build one kernel's module package from the stored -dkms package."""
    _run(self, run_build_kernel, build_id, kernel_release)


@app.task(name="moddeb.publish", base=_ModdebTask, bind=True, **RETRY_POLICY)
def publish(self: Task, build_id: int) -> None:
    """Put a finished build's packages into the apt repository, once."""
    _run(self, run_publish, build_id)


# --- the work behind the tasks (plain functions, testable without a broker) ------------------
class Heartbeat:
    """While a job runs: renew its lease and copy its log into the database every few seconds."""

    def __init__(
        self,
        store: Store,
        model: type[Build] | type[KernelJob],
        row_id: int,
        read_log: Callable[[], str | None],
        every: float = HEARTBEAT_SECONDS,
    ) -> None:
        self.store, self.model, self.row_id = store, model, row_id
        self.read_log, self.every = read_log, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="moddeb-heartbeat")

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.beat()

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self.beat()

    def beat(self) -> None:
        """Renew the lease and store the log so far."""
        try:
            with self.store.session() as s:
                renew_lease(s, self.model, self.row_id)
                text = self.read_log()
                if text is not None:
                    s.execute(
                        update(self.model)
                        .where(self.model.id == self.row_id)
                        .values(log=tail(text))
                        .execution_options(synchronize_session=False)
                    )
        except Exception:  # noqa: BLE001 - a missed beat is retried on the next one
            log.warning(
                "heartbeat of %s %s failed", self.model.__name__, self.row_id, exc_info=True
            )


def _read_logs(log_dir: Path) -> Callable[[], str | None]:
    def read() -> str | None:
        files = sorted(log_dir.glob("*.log")) if log_dir.is_dir() else []
        if not files:
            return None
        return "".join(f.read_text(encoding="utf-8", errors="replace") for f in files)

    return read


def _store_blob(s: Any, build_id: int, kind: str, path: Path, kernel_release: str = "") -> None:
    data = path.read_bytes()
    s.add(
        Blob(
            build_id=build_id,
            kind=kind,
            kernel_release=kernel_release,
            filename=path.name,
            sha256=hashlib.sha256(data).hexdigest(),
            size=len(data),
            data=data,
        )
    )


def _write_blob(s: Any, blob_id: int, dest_dir: Path) -> Path:
    blob = s.get(Blob, blob_id)
    dest = dest_dir / Path(blob.filename).name
    dest.write_bytes(blob.data)
    return dest


def run_build(settings: Settings, build_id: int) -> None:
    """The -dkms stage: claim the build, run the pipeline with no kernels, store the .deb."""
    from builder.pipeline import BuildRequest, Pipeline

    store = open_store(settings)
    with store.session() as s:
        b = s.get(Build, build_id)
        if b is None:
            log.warning("build %s: no such build; nothing to do", build_id)
            return
        if b.state in TERMINAL:
            log.info("build %s: refusing to run a build that is %s", build_id, b.state)
            return
        if b.dkms_done:
            log.info("build %s: -dkms stage already done; queueing its kernels", build_id)
            resume = True
        else:
            resume = False
            if not claim(s, Build, build_id):
                raise JobBusy(f"build {build_id} is being worked on by another worker")
            s.refresh(b)
            b.started_at = b.started_at or now()
            add_event(s, build_id, "started", "-dkms stage started")
        job_id, kind, source, ref = b.job_id, b.source_kind, b.source, b.ref
        source_blob = next((x.id for x in b.blobs if x.kind == "source"), None)
    if resume:
        fan_out(settings, build_id)
        return

    settings.work_root.mkdir(parents=True, exist_ok=True)
    work = settings.work_root / job_id
    shutil.rmtree(work, ignore_errors=True)  # a dead worker's leftovers
    with tempfile.TemporaryDirectory(dir=settings.work_root, prefix=f"{job_id}-") as tmp:
        tmp_dir = Path(tmp)
        if kind == "upload":
            if source_blob is None:
                _finish_failed(store, build_id, "invalid-input", "the uploaded source is missing")
                return
            with store.session() as s:
                source = str(_write_blob(s, source_blob, tmp_dir))

        def progress(message: str) -> None:
            with store.session() as s:
                add_event(s, build_id, "stage", message)

        request = BuildRequest(
            source=source, ref=ref or None, out_dir=tmp_dir / "out", job_id=job_id
        )
        try:
            with Heartbeat(store, Build, build_id, _read_logs(work / "logs")):
                report = Pipeline(settings, request, progress=progress).run()
        finally:
            shutil.rmtree(work, ignore_errors=True)
        if report.status != "succeeded" and report.error_code == Transient.code:
            _release(store, Build, build_id)
            raise Transient(report.error)
        with store.session() as s:
            b = s.get(Build, build_id)
            if b is None or b.state != "running":
                log.info(
                    "build %s: %s while its -dkms stage ran; result dropped",
                    build_id,
                    b.state if b else "deleted",
                )
                return
            # The -dkms package names itself (NAME-dkms_VERSION_all.deb) should the report not.
            dkms_name = next((f.split("-dkms_")[0] for f in report.artifacts if "-dkms_" in f), "")
            b.name, b.version = report.name or dkms_name, report.version
            b.modules = list(report.layout.get("modules") or [])
            if report.status != "succeeded":
                add_event(s, build_id, "failed", f"-dkms stage failed: {report.error}")
                s.flush()
                _fail_build(s, b, report.error_code or "build-failed", report.error)
                return
            for filename in sorted(report.artifacts):
                _store_blob(s, build_id, "dkms", Path(report.out_dir) / filename)
            b.dkms_done = 1
            if report.kind == "bpf":
                # CO-RE objects: the one NAME-bpf package serves every kernel asked for.
                for k in b.kernels:
                    if k.state not in TERMINAL:
                        k.state = "succeeded"
                        k.diagnosis = "BPF (CO-RE): the NAME-bpf package serves this kernel"
            add_event(s, build_id, "dkms", f"built {', '.join(sorted(report.artifacts))}")
    fan_out(settings, build_id)


def fan_out(settings: Settings, build_id: int) -> None:
    """Queue one build_kernel task per unfinished kernel, or publish when there is none."""
    store = open_store(settings)
    with store.session() as s:
        b = s.get(Build, build_id)
        if b is None or b.state in TERMINAL:
            return
        pending = [k for k in b.kernels if k.state not in TERMINAL]
        for k in pending:
            k.enqueued_at = now()
        releases = [k.kernel_release for k in pending]
    for kver in releases:
        send("moddeb.build_kernel", [build_id, kver])
    if not releases:
        send("moddeb.publish", [build_id])


def _kernel_job(s: Any, build_id: int, kernel_release: str) -> KernelJob | None:
    return s.scalars(
        select(KernelJob).where(
            KernelJob.build_id == build_id, KernelJob.kernel_release == kernel_release
        )
    ).first()


def run_build_kernel(settings: Settings, build_id: int, kernel_release: str) -> None:
    """Build one kernel: fetch the -dkms blob, run mkbmdeb, store the .deb, status and log."""
    from builder import images
    from builder.kernels import KernelInfo
    from builder.mkbmdeb import build_kernel_package
    from builder.runner import Runner

    store = open_store(settings)
    with store.session() as s:
        kj = _kernel_job(s, build_id, kernel_release)
        if kj is None:
            log.warning("build %s: no kernel %s; nothing to do", build_id, kernel_release)
            return
        b = kj.build
        if b.state in TERMINAL or kj.state in TERMINAL:
            log.info("build %s: kernel %s is %s; nothing to do", build_id, kernel_release, kj.state)
            done = True
        else:
            done = False
            if not claim(s, KernelJob, kj.id):
                raise JobBusy(f"{kernel_release} of build {build_id} is held by another worker")
            add_event(s, build_id, "kernel", f"{kernel_release}: building")
            dkms_blob = next(
                (x.id for x in b.blobs if x.kind == "dkms" and x.filename.endswith("_all.deb")),
                None,
            )
            kernel = KernelInfo(**kj.kernel_info())
            kj_id, job_id = kj.id, b.job_id
    if done:
        maybe_publish(settings, build_id)
        return
    if dkms_blob is None:
        _finish_kernel(store, kj_id, "failed", "the -dkms package of this build is missing")
        maybe_publish(settings, build_id)
        return

    settings.work_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=settings.work_root, prefix=f"{job_id}-k-") as tmp:
        tmp_dir = Path(tmp)
        (tmp_dir / "in").mkdir()
        with store.session() as s:
            deb = _write_blob(s, dkms_blob, tmp_dir / "in")
        runner = Runner()
        log_dir = tmp_dir / "logs"
        try:
            # Engine and image problems are transient; find them before mkbmdeb turns every
            # error into a kernel's diagnosis.
            runner.client  # noqa: B018 - connects, or raises Transient
            images.ensure_kernel_image(settings, runner, kernel_release, suite=kernel.suite)
        except Transient:
            _release(store, KernelJob, kj_id)
            raise
        with Heartbeat(store, KernelJob, kj_id, _read_logs(log_dir)):
            result = build_kernel_package(
                settings, runner, deb, kernel, tmp_dir / "out", log_dir, {"moddeb.job": job_id}
            )
        boot = None
        if result.status in ("built", "cached") and settings.service_boot_test:
            boot = _boot_test(settings, kernel, deb, tmp_dir / "out", result.artifacts, log_dir)
        log_text = _read_logs(log_dir)() or ""
        with store.session() as s:
            kj = s.get(KernelJob, kj_id)
            if kj is None or kj.state != "running":
                log.info(
                    "build %s: kernel %s was cancelled; result dropped", build_id, kernel_release
                )
                return
            ok = result.status in ("built", "cached")
            diagnosis = "" if ok else result.diagnosis
            if ok and boot is not None:
                boot_line = f"boot test {boot.status}: {boot.diagnosis}"
                add_event(s, build_id, "kernel", f"{kernel_release}: {boot_line}")
                diagnosis = boot_line  # the matrix cell shows the boot test's verdict
                if boot.status != "passed" and settings.require_boot_test:
                    ok = False
            kj.state = "succeeded" if ok else "failed"
            kj.diagnosis = diagnosis
            kj.duration = result.duration
            kj.log = tail(log_text)
            if ok:
                for filename in sorted(result.artifacts):
                    _store_blob(s, build_id, "module", tmp_dir / "out" / filename, kernel_release)
            add_event(
                s,
                build_id,
                "kernel",
                f"{kernel_release}: {result.status} in {result.duration:.1f}s"
                + (f": {result.diagnosis}" if result.diagnosis else ""),
            )
    maybe_publish(settings, build_id)


def _boot_test(
    settings: Settings,
    kernel: Any,
    dkms_deb: Path,
    out_dir: Path,
    artifacts: dict[str, str],
    log_dir: Path,
) -> Any:
    """Boot the kernel under QEMU with the built module; the smoke script rides in the -dkms."""
    from builder.boottest import boot_test, read_smoke
    from builder.mkbmdeb import smoke_tree

    with tempfile.TemporaryDirectory() as tmp:
        smoke, expect = read_smoke(smoke_tree(dkms_deb, Path(tmp)))
    debs = [out_dir / name for name in sorted(artifacts)]
    return boot_test(
        settings, kernel, debs, log_dir / f"boot-{kernel.kernel_release}.log", smoke, expect
    )


def maybe_publish(settings: Settings, build_id: int) -> None:
    """Queue publish once every kernel of the build has finished (publish is idempotent)."""
    with open_store(settings).session() as s:
        b = s.get(Build, build_id)
        if b is None or b.state in TERMINAL or not b.dkms_done:
            return
        if any(k.state not in TERMINAL for k in b.kernels):
            return
    send("moddeb.publish", [build_id])


def publish_debs(settings: Settings, debs: list[Path]) -> list[str]:
    """Add .debs to the configured apt repository's suite; return the names it now holds."""
    from builder import repo

    result = repo.publish(settings, settings.distribution, debs)
    return sorted(result.added + result.unchanged)


def run_publish(settings: Settings, build_id: int) -> None:
    """Publish a finished build's packages, exactly once, and settle its final state."""
    store = open_store(settings)
    with store.session() as s:
        b = s.get(Build, build_id)
        if b is None or b.published_at or b.state in TERMINAL:
            log.info("build %s: already published or finished; nothing to do", build_id)
            return
        if not b.dkms_done or any(k.state not in TERMINAL for k in b.kernels):
            log.info("build %s: not every kernel has finished; not publishing yet", build_id)
            return
        failed = [k for k in b.kernels if k.state == "failed"]
        good = {k.kernel_release for k in b.kernels if k.state == "succeeded"}
        if b.kernels and not good:
            _fail_build(s, b, "build-failed", _failure_summary(b, failed))
            return
        blob_ids = [x.id for x in b.blobs if x.kind == "dkms"] + [
            x.id for x in b.blobs if x.kind == "module" and x.kernel_release in good
        ]
    with tempfile.TemporaryDirectory(prefix=f"moddeb-publish-{build_id}-") as tmp:
        with store.session() as s:
            debs = [_write_blob(s, blob_id, Path(tmp)) for blob_id in blob_ids]
        try:
            names = publish_debs(settings, debs)
        except Transient:
            raise
        except ModdebError as exc:
            with store.session() as s:
                b = s.get(Build, build_id)
                if b is not None:
                    _fail_build(s, b, exc.code, f"publishing failed: {exc}")
            return
    with store.session() as s:
        b = s.get(Build, build_id)
        if b is None:
            return
        b.published_at = now()
        add_event(
            s,
            build_id,
            "published",
            f"published {len(debs)} package(s) to {settings.distribution}: {', '.join(names)}",
        )
        if failed:
            s.flush()
            _fail_build(s, b, "build-failed", _failure_summary(b, failed))
        else:
            b.state, b.finished_at = "succeeded", now()
            add_event(s, build_id, "succeeded", "build succeeded")


def _failure_summary(b: Build, failed: list[KernelJob]) -> str:
    what = f"{b.name} {b.version}".strip() or b.job_id
    first = failed[0]
    more = f" (and {len(failed) - 1} more kernel(s))" if len(failed) > 1 else ""
    return f"{what} failed to build for {first.kernel_release}: {first.diagnosis}{more}"


# --- state changes -----------------------------------------------------------------------------
def _release(store: Store, model: type[Build] | type[KernelJob], row_id: int) -> None:
    """Give a job back (lease expired now) so that the retry can take it at once."""
    with store.session() as s:
        s.execute(
            update(model)
            .where(model.id == row_id, model.state == "running")
            .values(lease_until=0.0)
            .execution_options(synchronize_session=False)
        )


def _fail_build(s: Any, b: Build, code: str, message: str) -> None:
    """Mark a build failed with an error code; kernels not yet built are cancelled."""
    b.state, b.error_code, b.error, b.finished_at = "failed", code, message, now()
    for k in b.kernels:
        if k.state not in TERMINAL:
            k.state, k.diagnosis = "cancelled", "not built: the build failed before it"
    add_event(s, b.id, "failed", f"[{code}] {message}")


def _finish_failed(store: Store, build_id: int, code: str, message: str) -> None:
    with store.session() as s:
        b = s.get(Build, build_id)
        if b is not None and b.state not in TERMINAL:
            _fail_build(s, b, code, message)


def _finish_kernel(store: Store, kj_id: int, state: str, diagnosis: str) -> None:
    with store.session() as s:
        kj = s.get(KernelJob, kj_id)
        if kj is not None and kj.state not in TERMINAL:
            kj.state, kj.diagnosis = state, diagnosis
            add_event(s, kj.build_id, "kernel", f"{kj.kernel_release}: {state}: {diagnosis}")


def record_failure(settings: Settings, task_name: str, args: list[Any], exc: BaseException) -> None:
    """A task gave up (retries exhausted or an unexpected error): record it on the job."""
    if isinstance(exc, JobBusy):
        return  # the job's holder finishes it, or recover_stalled() re-queues it
    code = exc.code if isinstance(exc, ModdebError) else "internal-error"
    message = str(exc) or type(exc).__name__
    store = open_store(settings)
    if task_name == "moddeb.build_kernel" and len(args) == 2:
        with store.session() as s:
            kj = _kernel_job(s, int(args[0]), str(args[1]))
            kj_id = kj.id if kj is not None else None
        if kj_id is not None:
            _finish_kernel(store, kj_id, "failed", f"[{code}] {message}")
            maybe_publish(settings, int(args[0]))
        return
    if args:
        _finish_failed(store, int(args[0]), code, message)


def recover_stalled(settings: Settings) -> int:
    """Re-queue work whose message was lost with its worker; return how many tasks were sent.

    A broker with a visibility timeout (Redis) re-delivers such work by itself; kombu's
    SQLAlchemy transport (the embedded default) never does. Re-sending is always safe:
    a duplicate finds the job finished, or held under a live lease, and steps aside.
    """
    from builder.store import visibility_timeout

    t = now()
    stale = t - visibility_timeout(settings)
    # A job whose lease ran out is re-sent at most once per RESEND_AFTER: its copy may
    # still be waiting in the queue behind other work.
    resent = t - RESEND_AFTER
    sends: list[tuple[str, list[Any]]] = []
    with open_store(settings).session() as s:
        for b in s.scalars(select(Build).where(Build.state.in_(("queued", "running")))):
            if not b.dkms_done:
                lost = (b.state == "running" and b.lease_until < t and b.enqueued_at < resent) or (
                    b.state == "queued" and b.enqueued_at < stale
                )
                if lost:
                    b.enqueued_at = t
                    sends.append(("moddeb.build", [b.id]))
                continue
            pending = [k for k in b.kernels if k.state not in TERMINAL]
            for k in pending:
                if (k.state == "running" and k.lease_until < t and k.enqueued_at < resent) or (
                    k.state == "queued" and k.enqueued_at < stale
                ):
                    k.enqueued_at = t
                    sends.append(("moddeb.build_kernel", [b.id, k.kernel_release]))
            if not pending and b.enqueued_at < stale:  # finished, yet never published
                b.enqueued_at = t
                sends.append(("moddeb.publish", [b.id]))
    for name, args in sends:
        log.warning("re-queueing %s%s: its worker is gone", name, args)
        send(name, args)
    return len(sends)
