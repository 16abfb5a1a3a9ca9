"""Server-rendered pages for operators: log in, request builds, watch them, manage projects."""

from __future__ import annotations

import secrets
from typing import Any

from flask import (
    Blueprint,
    Response,
    flash,
    g,
    jsonify,
    redirect,
    render_template,
    request,
    session,
    url_for,
)
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from builder.errors import InvalidInput, ModdebError
from builder.kernels import suites_for
from builder.store import BUILD_STATES, TERMINAL, Blob, Build, BuildEvent, KernelJob, Project
from web.auth import check_csrf, check_login, csrf_token, login_required
from web.builds import (
    PROJECT_RE,
    KernelChoice,
    artifact_dicts,
    build_dict,
    cancel_build,
    check_git,
    check_upload,
    find_project,
    parse_kernel_choice,
    project_kernels,
    rerun_build,
    resolve_kernels,
    submit_build,
)
from web.common import ApiError, base_url, kernel_catalog, settings, store

bp = Blueprint("ui", __name__)
MAX_ID = 2**31 - 1


@bp.before_request
def _csrf() -> None:
    """Every form post carries the session's CSRF token."""
    if request.method == "POST":
        check_csrf()


@bp.app_context_processor
def _globals() -> dict[str, Any]:
    return {"csrf_token": csrf_token, "user": session.get("user")}


def _safe_next(target: str | None) -> str:
    """Only redirect to a path on this site."""
    if target and target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target
    return url_for("ui.builds")


@bp.route("/login", methods=["GET", "POST"])
def login() -> Any:
    """The login form."""
    if request.method == "POST":
        name = request.form.get("name", "")
        if check_login(name, request.form.get("password", "")):
            session.clear()
            session["user"] = name
            return redirect(_safe_next(request.args.get("next")))
        flash("Wrong user name or password.")
        return render_template("login.html"), 401
    return render_template("login.html")


@bp.post("/logout")
def logout() -> Any:
    """End the session."""
    session.clear()
    return redirect(url_for("ui.login"))


@bp.get("/")
@login_required
def index() -> Any:
    """The builds list is the home page."""
    return redirect(url_for("ui.builds"))


@bp.get("/builds")
@login_required
def builds() -> str:
    """Recent builds, filtered by state, project or trigger."""
    state = request.args.get("state", "")
    project = request.args.get("project", "")
    trigger = request.args.get("trigger", "")
    query = select(Build).order_by(Build.id.desc()).limit(100)
    if state in BUILD_STATES:
        query = query.where(Build.state == state)
    if trigger:
        query = query.where(Build.trigger == trigger[:16])
    with store().session() as s:
        if project:
            p = find_project(s, project)
            query = query.where(Build.project_id == (p.id if p else -1))
        rows = list(s.scalars(query))
        projects = [p.name for p in s.scalars(select(Project).order_by(Project.name))]
        return render_template(
            "builds.html",
            builds=rows,
            states=BUILD_STATES,
            projects=projects,
            filters={"state": state, "project": project, "trigger": trigger},
        )


def _catalog_or_error() -> tuple[list[Any], str]:
    try:
        return kernel_catalog(), ""
    except ModdebError as exc:
        return [], str(exc)


def _suites() -> list[str]:
    return [suite for _, suite in suites_for(settings())]


@bp.route("/builds/new", methods=["GET", "POST"])
@login_required
def new_build() -> Any:
    """Request a build: upload, git URL and ref, or a registered project; pick kernels."""
    with store().session() as s:
        projects = [p.name for p in s.scalars(select(Project).order_by(Project.name))]
    catalog, catalog_error = _catalog_or_error()
    form = request.form
    if request.method == "POST":
        try:
            build_id = _submit_form()
            return redirect(url_for("ui.build", build_id=build_id))
        except (ModdebError, ApiError) as exc:
            flash(exc.message if isinstance(exc, ApiError) else str(exc))
            status = 503 if getattr(exc, "code", "") == "transient" else 400
    else:
        status = 200
    return render_template(
        "new_build.html",
        catalog=catalog,
        catalog_error=catalog_error,
        projects=projects,
        suites=_suites(),
        form=form,
        selected=set(form.getlist("kernels")),
        preset_project=request.args.get("project", ""),
    ), status


def _submit_form() -> int:
    form = request.form
    kind = form.get("source_kind", "")
    choice = parse_kernel_choice(
        form.getlist("kernels"), form.get("newest"), form.get("all_in_suite")
    )
    common: dict[str, Any] = {"trigger": "ui", "requested_by": g.user}
    if kind == "upload":
        upload = request.files.get("source")
        if upload is None or not upload.filename:
            raise InvalidInput("choose a source tarball to upload")
        data = upload.read()
        name = check_upload(upload.filename, data)
        return submit_build(
            kind="upload", source=name, upload=data, kernels=resolve_kernels(choice), **common
        )
    if kind == "git":
        url, ref = form.get("git_url", "").strip(), form.get("ref", "").strip()
        if not url:
            raise InvalidInput("enter a git URL")
        check_git(url, ref)
        return submit_build(
            kind="git", source=url, ref=ref, kernels=resolve_kernels(choice), **common
        )
    if kind == "project":
        with store().session() as s:
            p = find_project(s, form.get("project", ""))
            if p is None:
                raise InvalidInput("choose a registered project")
            ref = form.get("ref", "").strip() or p.ref
            check_git(p.source_url, ref)
            kernels = project_kernels(p) if choice.empty() else resolve_kernels(choice)
            source, pid = p.source_url, p.id
        return submit_build(
            kind="git", source=source, ref=ref, project_id=pid, kernels=kernels, **common
        )
    raise InvalidInput("choose where the source comes from: upload, git URL or project")


def _load(s: Any, build_id: int) -> Build:
    b = s.get(Build, build_id) if build_id <= MAX_ID else None
    if b is None:
        raise ApiError(404, "not-found", f"build {build_id} does not exist")
    return b  # type: ignore[no-any-return]


def install_lines(b: Build) -> list[str]:
    """The commands that add this service's repository and install the build's packages."""
    url = base_url() + "/apt"
    keyring = "/usr/share/keyrings/moddeb-archive-keyring.gpg"
    suite = settings().distribution
    package = f"{b.name}-modules-$(uname -r)" if b.kernels else f"{b.name}-dkms"
    return [
        f"curl -fsSL {url}/moddeb-archive-keyring.gpg | sudo tee {keyring} >/dev/null",
        f'echo "deb [signed-by={keyring}] {url} {suite} main" '
        "| sudo tee /etc/apt/sources.list.d/moddeb.list",
        f"sudo apt-get update && sudo apt-get install {package}",
    ]


@bp.get("/builds/<int:build_id>")
@login_required
def build(build_id: int) -> str:
    """A build: kernel matrix with diagnoses, live log, artifacts and the apt install line."""
    with store().session() as s:
        b = _load(s, build_id)
        return render_template(
            "build.html",
            b=b,
            info=build_dict(b),
            artifacts=artifact_dicts(b),
            install=install_lines(b) if b.name else [],
            terminal=b.state in TERMINAL,
        )


@bp.get("/builds/<int:build_id>/status")
@login_required
def build_status(build_id: int) -> Response:
    """What the build page polls: state, kernel cells, new log lines since `after`."""
    try:
        after = int(request.args.get("after", "0"))
    except ValueError:
        after = 0
    with store().session() as s:
        b = _load(s, build_id)
        events = s.scalars(
            select(BuildEvent)
            .where(BuildEvent.build_id == build_id, BuildEvent.id > after)
            .order_by(BuildEvent.id)
        ).all()
        out = build_dict(b)
        out["terminal"] = b.state in TERMINAL
        out["events"] = [{"id": e.id, "kind": e.kind, "message": e.message} for e in events]
        out["artifacts"] = artifact_dicts(b)
    return jsonify(out)


@bp.get("/builds/<int:build_id>/log")
@login_required
def build_log(build_id: int) -> Response:
    """The -dkms stage's log, or one kernel's (?kernel=KVER), as it is so far."""
    kernel = request.args.get("kernel", "")
    with store().session() as s:
        b = _load(s, build_id)
        if kernel:
            kj = s.scalars(
                select(KernelJob).where(
                    KernelJob.build_id == build_id, KernelJob.kernel_release == kernel
                )
            ).first()
            if kj is None:
                raise ApiError(404, "not-found", f"build {build_id} has no kernel {kernel[:100]!r}")
            text = kj.log
        else:
            text = b.log
    return Response(text, mimetype="text/plain")


@bp.get("/builds/<int:build_id>/artifacts/<filename>")
@login_required
def artifact(build_id: int, filename: str) -> Response:
    """Download one package of a build."""
    with store().session() as s:
        _load(s, build_id)
        blob = s.scalars(
            select(Blob).where(
                Blob.build_id == build_id, Blob.filename == filename, Blob.kind != "source"
            )
        ).first()
        if blob is None:
            raise ApiError(404, "not-found", f"build {build_id} has no artifact {filename[:200]!r}")
        return Response(
            blob.data,
            mimetype="application/vnd.debian.binary-package",
            headers={"Content-Disposition": f"attachment; filename={blob.filename}"},
        )


@bp.post("/builds/<int:build_id>/cancel")
@login_required
def cancel(build_id: int) -> Any:
    """Cancel a running or queued build."""
    with store().session() as s:
        b = _load(s, build_id)
        if not cancel_build(s, b, g.user):
            flash(f"Build {build_id} has already {b.state}.")
    return redirect(url_for("ui.build", build_id=build_id))


@bp.post("/builds/<int:build_id>/rerun")
@login_required
def rerun(build_id: int) -> Any:
    """Queue the same build again."""
    with store().session() as s:
        _load(s, build_id)
    new_id = rerun_build(build_id, "ui", g.user)
    return redirect(url_for("ui.build", build_id=new_id))


# --- projects --------------------------------------------------------------------------------
@bp.get("/projects")
@login_required
def projects() -> str:
    """Registered projects."""
    with store().session() as s:
        rows = list(s.scalars(select(Project).order_by(Project.name)))
        return render_template("projects.html", projects=rows)


def _project_spec(form: Any) -> dict[str, Any]:
    choice = parse_kernel_choice(
        form.getlist("kernels"), form.get("newest"), form.get("all_in_suite")
    )
    fixed = resolve_kernels(KernelChoice(choice.kernels))
    return {"kernels": fixed, "newest": choice.newest, "all_in_suite": choice.all_in_suite}


@bp.route("/projects/new", methods=["GET", "POST"])
@login_required
def new_project() -> Any:
    """Register a project: its git URL, default ref and default kernels."""
    catalog, catalog_error = _catalog_or_error()
    form = request.form
    if request.method == "POST":
        try:
            name = form.get("name", "").strip()
            if not PROJECT_RE.match(name):
                raise InvalidInput(
                    "a project name is 1-64 of a-z, 0-9, '.', '_', '-', starting alphanumeric"
                )
            url, ref = form.get("source_url", "").strip(), form.get("ref", "").strip()
            check_git(url, ref)
            spec = _project_spec(form)
            with store().session() as s:
                if find_project(s, name) is not None:
                    raise InvalidInput(f"project {name!r} already exists")
                s.add(
                    Project(
                        name=name,
                        source_url=url,
                        ref=ref,
                        secret=secrets.token_urlsafe(32),
                        default_kernels=spec,
                    )
                )
            return redirect(url_for("ui.project", name=name))
        except (ModdebError, IntegrityError) as exc:
            flash(str(exc) if isinstance(exc, ModdebError) else "that project already exists")
    return render_template(
        "project_form.html",
        p=None,
        form=form,
        catalog=catalog,
        catalog_error=catalog_error,
        suites=_suites(),
        selected=set(form.getlist("kernels")),
    ), (400 if request.method == "POST" else 200)


@bp.route("/projects/<name>", methods=["GET", "POST"])
@login_required
def project(name: str) -> Any:
    """A project: source, secret, webhook URLs, default kernels (editable) and history."""
    catalog, catalog_error = _catalog_or_error()
    status = 200
    with store().session() as s:
        p = find_project(s, name)
        if p is None:
            raise ApiError(404, "not-found", f"project {name[:64]!r} does not exist")
        if request.method == "POST":
            try:
                url, ref = (
                    request.form.get("source_url", "").strip(),
                    request.form.get("ref", "").strip(),
                )
                check_git(url, ref)
                p.source_url, p.ref = url, ref
                p.default_kernels = _project_spec(request.form)
                flash("Saved.")
            except ModdebError as exc:
                s.rollback()
                flash(str(exc))
                status = 400
            p = find_project(s, name)
            assert p is not None
        history = list(
            s.scalars(
                select(Build).where(Build.project_id == p.id).order_by(Build.id.desc()).limit(50)
            )
        )
        spec = p.default_kernels or {}
        return render_template(
            "project.html",
            p=p,
            history=history,
            catalog=catalog,
            catalog_error=catalog_error,
            suites=_suites(),
            selected={k["kernel_release"] for k in spec.get("kernels", [])},
            spec=spec,
            hooks={
                "github": url_for("hooks.github", project=p.name, _external=True),
                "gitlab": url_for("hooks.gitlab", project=p.name, _external=True),
            },
        ), status


@bp.post("/projects/<name>/secret")
@login_required
def new_secret(name: str) -> Any:
    """Replace a project's webhook secret."""
    with store().session() as s:
        p = find_project(s, name)
        if p is None:
            raise ApiError(404, "not-found", f"project {name[:64]!r} does not exist")
        p.secret = secrets.token_urlsafe(32)
    flash("A new secret is set; update it in your CI's webhook settings.")
    return redirect(url_for("ui.project", name=name))
