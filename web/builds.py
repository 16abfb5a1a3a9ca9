"""Requesting, cancelling, re-running and describing builds: shared by the UI, API and hooks."""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import Table, insert, select
from sqlalchemy.orm import Session

from builder.errors import InvalidInput, Transient
from builder.kernels import find_kernel, newest_per_flavour
from builder.store import (
    TERMINAL,
    Blob,
    Build,
    BuildEvent,
    Delivery,
    KernelJob,
    Project,
    add_event,
    now,
)
from web.common import enqueue, kernel_catalog, store

# The tarball kinds the worker's source stage accepts (it checks the content itself).
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.xz", ".txz", ".tar.bz2", ".tbz2")
# Remote git only: a local path or file:// URL would let a user read the server's disk.
GIT_URL_RE = re.compile(r"^(?:https?|git|ssh)://[^\s/][^\s]{0,990}$|^[\w.-]+@[\w.-]+:[^\s-][^\s]*$")
REF_RE = re.compile(r"^(?!-)(?!.*\.\.)[A-Za-z0-9._/+@-]{1,250}$")
FILENAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+~-]{0,200}$")
KVER_RE = re.compile(r"^[0-9][A-Za-z0-9.+_~-]{0,99}$")
SUITE_RE = re.compile(r"^[a-z0-9][a-z0-9.+-]{0,99}$")
PROJECT_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
MAX_KERNELS = 200
TRUE_WORDS = {"1", "true", "yes", "on"}
FALSE_WORDS = {"", "0", "false", "no", "off"}


@dataclass
class KernelChoice:
    """Which kernels a request names: explicit ABIs, the newest of each flavour, a suite."""

    kernels: list[str] = field(default_factory=list)
    newest: bool = False
    all_in_suite: str = ""

    def empty(self) -> bool:
        """True when no kernel was asked for."""
        return not (self.kernels or self.newest or self.all_in_suite)


def as_bool(value: Any, what: str) -> bool:
    """A JSON boolean or a form checkbox value."""
    if isinstance(value, bool):
        return value
    if value is None:
        return False
    if isinstance(value, str) and value.strip().lower() in TRUE_WORDS | FALSE_WORDS:
        return value.strip().lower() in TRUE_WORDS
    raise InvalidInput(f"'{what}' must be true or false, not {value!r}")


def as_text(value: Any, what: str) -> str:
    """A string field (absent means empty)."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidInput(f"'{what}' must be a string")
    return value.strip()


def parse_kernel_choice(kernels: Any, newest: Any, all_in_suite: Any) -> KernelChoice:
    """Check the shape of a kernel selection (a list, or names separated by commas/spaces)."""
    if kernels is None:
        names: list[str] = []
    elif isinstance(kernels, str):
        names = [k for k in re.split(r"[\s,]+", kernels) if k]
    elif isinstance(kernels, list) and all(isinstance(k, str) for k in kernels):
        names = [n for k in kernels for n in re.split(r"[\s,]+", k) if n]
    else:
        raise InvalidInput("'kernels' must be a list of kernel releases such as 6.1.0-57-amd64")
    if len(names) > MAX_KERNELS:
        raise InvalidInput(f"at most {MAX_KERNELS} kernels per build")
    for name in names:
        if not KVER_RE.match(name):
            raise InvalidInput(f"{name[:120]!r} is not a kernel release (e.g. 6.1.0-57-amd64)")
    suite = as_text(all_in_suite, "all_in_suite")
    if suite and not SUITE_RE.match(suite):
        raise InvalidInput(f"{suite[:120]!r} is not a suite name (e.g. bookworm-security)")
    return KernelChoice(names, as_bool(newest, "newest"), suite)


def resolve_kernels(choice: KernelChoice) -> list[dict[str, str]]:
    """The catalog entries a choice names, de-duplicated; an unknown ABI names the closest."""
    if choice.empty():
        return []
    catalog = kernel_catalog()
    chosen = [find_kernel(catalog, k) for k in choice.kernels]
    if choice.newest:
        chosen += newest_per_flavour(catalog)
    if choice.all_in_suite:
        chosen += kernel_catalog([choice.all_in_suite])
    unique: dict[str, dict[str, str]] = {}
    for k in chosen:
        unique.setdefault(k.kernel_release, asdict(k))
    if len(unique) > MAX_KERNELS:
        raise InvalidInput(f"the selection names {len(unique)} kernels; at most {MAX_KERNELS}")
    return list(unique.values())


def check_git(url: str, ref: str) -> None:
    """Refuse git URLs the service will not clone and refs git would misread."""
    if len(url) > 1000 or not GIT_URL_RE.match(url):
        raise InvalidInput(
            f"{url[:120]!r} is not a remote git URL (https://, git://, ssh:// or user@host:path)"
        )
    if ref and not REF_RE.match(ref):
        raise InvalidInput(f"{ref[:120]!r} is not a git ref (a branch, tag or commit)")


def check_upload(filename: str, data: bytes) -> str:
    """Refuse an upload that is empty or not named like a tarball; return its safe name."""
    name = filename.replace("\\", "/").rsplit("/", 1)[-1].strip()
    if not name:
        raise InvalidInput("the uploaded source has no file name")
    if not FILENAME_RE.match(name) or not name.endswith(TAR_SUFFIXES):
        raise InvalidInput(
            f"{name[:120]!r} is not a tarball name: expected NAME-VERSION with one of "
            f"{', '.join(TAR_SUFFIXES)}"
        )
    if not data:
        raise InvalidInput(f"the uploaded source {name} is empty")
    return name


def table(model: Any) -> Table:
    """A model's Table, for plain Core statements."""
    return cast(Table, model.__table__)


def new_job_id() -> str:
    """A sortable, unique job id (the label of the build's containers and work dirs)."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(6)


def record_build(
    s: Session,
    *,
    kind: str,
    source: str,
    ref: str = "",
    project_id: int | None = None,
    upload: bytes | None = None,
    kernels: list[dict[str, str]],
    trigger: str,
    requested_by: str,
    delivery_id: str | None = None,
    note: str = "",
) -> int:
    """Insert a queued build, its kernel jobs, uploaded source, delivery and first log line;
    return its id. Plain INSERTs, not the ORM's unit of work: the webhook path is hot."""
    conn = s.connection()  # Core on the session's transaction: no ORM bookkeeping
    build_id: int = conn.execute(
        insert(table(Build))
        .values(
            job_id=new_job_id(),
            state="queued",
            trigger=trigger,
            requested_by=requested_by,
            source_kind=kind,
            source=source,
            ref=ref,
            project_id=project_id,
        )
        .returning(table(Build).c.id)
    ).scalar_one()
    if kernels:
        conn.execute(insert(table(KernelJob)), [{"build_id": build_id, **k} for k in kernels])
    if upload is not None:
        conn.execute(
            insert(table(Blob)).values(
                build_id=build_id,
                kind="source",
                filename=source,
                sha256=hashlib.sha256(upload).hexdigest(),
                size=len(upload),
                data=upload,
            )
        )
    if delivery_id:
        conn.execute(insert(table(Delivery)).values(delivery_id=delivery_id, build_id=build_id))
    message = note or f"queued by {requested_by} ({trigger})"
    conn.execute(
        insert(table(BuildEvent)).values(build_id=build_id, kind="queued", message=message)
    )
    return build_id


def queue_build(build_id: int) -> None:
    """Send the build to the workers; if the queue is down, fail the build and say so."""
    try:
        enqueue("moddeb.build", [build_id])
    except Transient as exc:
        with store().session() as s:
            b = s.get(Build, build_id)
            if b is not None:
                b.state, b.error_code, b.error = "failed", exc.code, str(exc)
                b.finished_at = now()
        raise


def submit_build(**kwargs: Any) -> int:
    """Record a build (see record_build) in its own transaction, then queue it."""
    with store().session() as s:
        build_id = record_build(s, **kwargs)
    queue_build(build_id)
    return build_id


def cancel_build(s: Session, b: Build, who: str) -> bool:
    """Cancel a build that has not finished; workers drop its results. False if finished."""
    if b.state in TERMINAL:
        return False
    b.state, b.finished_at = "cancelled", now()
    b.error_code, b.error = "cancelled", f"cancelled by {who}"
    for k in b.kernels:
        if k.state not in TERMINAL:
            k.state, k.diagnosis = "cancelled", f"cancelled by {who}"
    add_event(s, b.id, "cancelled", f"cancelled by {who}")
    return True


def rerun_build(old_id: int, trigger: str, who: str) -> int:
    """Queue a new build with the same source and kernels as an earlier one."""
    with store().session() as s:
        old = s.get(Build, old_id)
        if old is None:
            raise LookupError(old_id)
        upload = None
        if old.source_kind == "upload":
            blob = next((x for x in old.blobs if x.kind == "source"), None)
            if blob is None:
                raise InvalidInput(f"build {old_id}'s uploaded source is no longer stored")
            upload = blob.data
        build_id = record_build(
            s,
            kind=old.source_kind,
            source=old.source,
            ref=old.ref,
            project_id=old.project_id,
            upload=upload,
            kernels=[k.kernel_info() for k in old.kernels],
            trigger=trigger,
            requested_by=who,
            note=f"re-run of build {old_id} by {who}",
        )
    queue_build(build_id)
    return build_id


def find_project(s: Session, name: str) -> Project | None:
    """A project by name."""
    if not PROJECT_RE.match(name):
        return None
    return s.scalars(select(Project).where(Project.name == name)).first()


def project_kernels(project: Any) -> list[dict[str, str]]:
    """A project's default kernels: the stored ABIs plus newest/suite resolved now."""
    spec = project.default_kernels or {}
    fixed = [dict(k) for k in spec.get("kernels", [])]
    dynamic = KernelChoice([], bool(spec.get("newest")), str(spec.get("all_in_suite") or ""))
    unique = {k["kernel_release"]: k for k in fixed}
    for k in resolve_kernels(dynamic):
        unique.setdefault(k["kernel_release"], k)
    return list(unique.values())


# --- descriptions ----------------------------------------------------------------------------
def iso(t: float | None) -> str | None:
    """A timestamp as ISO 8601 UTC."""
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds") if t else None


def kernel_dict(k: KernelJob) -> dict[str, Any]:
    """One kernel's result."""
    return {
        "kernel_release": k.kernel_release,
        "flavour": k.flavour,
        "suite": k.suite,
        "state": k.state,
        "diagnosis": k.diagnosis,
        "duration": round(k.duration, 3),
    }


def build_dict(b: Build, detail: bool = True) -> dict[str, Any]:
    """A build as the API shows it."""
    out: dict[str, Any] = {
        "id": b.id,
        "job_id": b.job_id,
        "state": b.state,
        "trigger": b.trigger,
        "requested_by": b.requested_by,
        "source": {"kind": b.source_kind, "location": b.source, "ref": b.ref},
        "project": b.project.name if b.project else None,
        "name": b.name,
        "version": b.version,
        "error": {"code": b.error_code, "message": b.error} if b.error_code else None,
        "created_at": iso(b.created_at),
        "started_at": iso(b.started_at),
        "finished_at": iso(b.finished_at),
        "duration": round(b.duration, 3) if b.duration is not None else None,
        "published": b.published_at is not None,
    }
    if detail:
        out["modules"] = list(b.modules or [])
        out["kernels"] = [kernel_dict(k) for k in b.kernels]
    return out


def artifact_dicts(b: Build) -> list[dict[str, Any]]:
    """The packages a build produced (uploaded sources are not artifacts)."""
    return [
        {
            "filename": x.filename,
            "kind": x.kind,
            "kernel_release": x.kernel_release or None,
            "sha256": x.sha256,
            "size": x.size,
        }
        for x in b.blobs
        if x.kind != "source"
    ]
