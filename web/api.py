"""The JSON API under /api/v1: builds, artifacts, projects and the kernel catalog."""

from __future__ import annotations

import secrets
from typing import Any

from flask import Blueprint, Response, g, jsonify, request, url_for
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from werkzeug.datastructures import FileStorage

from builder.errors import InvalidInput
from builder.store import BUILD_STATES, Blob, Build, Project
from web.auth import token_required
from web.builds import (
    PROJECT_RE,
    SUITE_RE,
    artifact_dicts,
    as_text,
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
from web.common import ApiError, kernel_catalog, store
from web.openapi import openapi_document

bp = Blueprint("api", __name__)
MAX_ID = 2**31 - 1


def _not_found(what: str) -> ApiError:
    return ApiError(404, "not-found", f"{what} does not exist")


def _body() -> tuple[dict[str, Any], FileStorage | None]:
    """The request's fields from JSON, a form or a multipart body (with its `source` file)."""
    if request.mimetype == "application/json":
        data = request.get_json(silent=True)
        if not isinstance(data, dict):
            raise InvalidInput("the body must be a JSON object")
        return data, None
    if request.mimetype in ("multipart/form-data", "application/x-www-form-urlencoded"):
        form = request.form
        fields: dict[str, Any] = {k: form.get(k) for k in form if k != "kernels"}
        if "kernels" in form:
            fields["kernels"] = form.getlist("kernels")
        return fields, request.files.get("source")
    if not request.get_data(cache=True):
        return {}, None
    raise ApiError(415, "unsupported-media-type", "send application/json or multipart/form-data")


@bp.get("/openapi.json")
def openapi() -> Response:
    """The OpenAPI description of this API."""
    return jsonify(openapi_document())


@bp.post("/builds")
@token_required
def create_build() -> tuple[Response, int, dict[str, str]]:
    """Queue a build from an uploaded tarball, a git URL and ref, or a registered project."""
    fields, upload = _body()
    git_url = as_text(fields.get("git_url"), "git_url")
    ref = as_text(fields.get("ref"), "ref")
    project_name = as_text(fields.get("project"), "project")
    if upload is not None and not upload.filename and not upload.content_length:
        upload = None
    given = [
        n for n, v in (("source", upload), ("git_url", git_url), ("project", project_name)) if v
    ]
    if len(given) != 1:
        raise InvalidInput(
            "give exactly one source: a 'source' tarball file, a 'git_url' or a 'project'"
            + (f" (got {', '.join(given)})" if given else "")
        )
    choice = parse_kernel_choice(
        fields.get("kernels"), fields.get("newest"), fields.get("all_in_suite")
    )
    common = {"trigger": "api", "requested_by": g.user}
    if upload is not None:
        if ref:
            raise InvalidInput("'ref' only applies to a git_url or a project")
        data = upload.read()
        name = check_upload(upload.filename or "", data)
        kernels = resolve_kernels(choice)
        build_id = submit_build(kind="upload", source=name, upload=data, kernels=kernels, **common)
    elif git_url:
        check_git(git_url, ref)
        kernels = resolve_kernels(choice)
        build_id = submit_build(kind="git", source=git_url, ref=ref, kernels=kernels, **common)
    else:
        with store().session() as s:
            project = find_project(s, project_name)
            if project is None:
                raise _not_found(f"project {project_name[:64]!r}")
            check_git(project.source_url, ref)
            kernels = project_kernels(project) if choice.empty() else resolve_kernels(choice)
            source, ref, pid = project.source_url, ref or project.ref, project.id
        build_id = submit_build(
            kind="git", source=source, ref=ref, project_id=pid, kernels=kernels, **common
        )
    url = url_for("api.get_build", build_id=build_id)
    return jsonify({"id": build_id, "state": "queued", "url": url}), 202, {"Location": url}


@bp.get("/builds")
@token_required
def list_builds() -> Response:
    """Recent builds, newest first, filtered by state, project or trigger."""
    state = request.args.get("state", "")
    if state and state not in BUILD_STATES:
        raise InvalidInput(f"'state' must be one of {', '.join(BUILD_STATES)}")
    try:
        limit = int(request.args.get("limit", "50"))
    except ValueError:
        raise InvalidInput("'limit' must be a number from 1 to 200") from None
    if not 1 <= limit <= 200:
        raise InvalidInput("'limit' must be a number from 1 to 200")
    query = select(Build).order_by(Build.id.desc()).limit(limit)
    if state:
        query = query.where(Build.state == state)
    if request.args.get("trigger"):
        query = query.where(Build.trigger == request.args["trigger"][:16])
    with store().session() as s:
        if request.args.get("project"):
            project = find_project(s, request.args["project"])
            if project is None:
                raise _not_found(f"project {request.args['project'][:64]!r}")
            query = query.where(Build.project_id == project.id)
        rows = [build_dict(b, detail=False) for b in s.scalars(query)]
    return jsonify({"builds": rows})


def _load(s: Any, build_id: int) -> Build:
    b = s.get(Build, build_id) if build_id <= MAX_ID else None
    if b is None:
        raise _not_found(f"build {build_id}")
    return b  # type: ignore[no-any-return]


@bp.get("/builds/<int:build_id>")
@token_required
def get_build(build_id: int) -> Response:
    """One build with its state and per-kernel results."""
    with store().session() as s:
        return jsonify(build_dict(_load(s, build_id)))


@bp.get("/builds/<int:build_id>/artifacts")
@token_required
def list_artifacts(build_id: int) -> Response:
    """The packages a build produced, with download URLs."""
    with store().session() as s:
        rows = artifact_dicts(_load(s, build_id))
    for row in rows:
        row["url"] = url_for("api.get_artifact", build_id=build_id, filename=row["filename"])
    return jsonify({"artifacts": rows})


@bp.get("/builds/<int:build_id>/artifacts/<filename>")
@token_required
def get_artifact(build_id: int, filename: str) -> Response:
    """Download one package a build produced."""
    with store().session() as s:
        _load(s, build_id)
        blob = s.scalars(
            select(Blob).where(
                Blob.build_id == build_id, Blob.filename == filename, Blob.kind != "source"
            )
        ).first()
        if blob is None:
            raise _not_found(f"artifact {filename[:250]!r} of build {build_id}")
        data = blob.data
    return Response(
        data,
        mimetype="application/vnd.debian.binary-package",
        headers={"Content-Disposition": f"attachment; filename={blob.filename}"},
    )


@bp.post("/builds/<int:build_id>/cancel")
@token_required
def cancel(build_id: int) -> Response | tuple[Response, int]:
    """Cancel a build that has not finished."""
    with store().session() as s:
        b = _load(s, build_id)
        if not cancel_build(s, b, g.user):
            raise ApiError(409, "finished", f"build {build_id} already {b.state}")
        return jsonify({"id": build_id, "state": b.state})


@bp.post("/builds/<int:build_id>/rerun")
@token_required
def rerun(build_id: int) -> tuple[Response, int, dict[str, str]]:
    """Queue a new build with the same source and kernels."""
    with store().session() as s:
        _load(s, build_id)
    new_id = rerun_build(build_id, "api", g.user)
    url = url_for("api.get_build", build_id=new_id)
    return jsonify({"id": new_id, "state": "queued", "url": url}), 202, {"Location": url}


@bp.get("/kernels")
@token_required
def kernels() -> Response:
    """The kernel ABIs the archive offers (optionally of one suite)."""
    suite = request.args.get("suite", "")
    if suite and not SUITE_RE.match(suite):
        raise InvalidInput(f"{suite[:100]!r} is not a suite name")
    rows = kernel_catalog([suite] if suite else None)
    return jsonify({"kernels": [dict(k.__dict__) for k in rows]})


def project_dict(p: Project, with_secret: bool = False) -> dict[str, Any]:
    """A project as the API shows it (the secret only when just created)."""
    spec = p.default_kernels or {}
    out: dict[str, Any] = {
        "name": p.name,
        "source_url": p.source_url,
        "ref": p.ref,
        "default_kernels": {
            "kernels": [k["kernel_release"] for k in spec.get("kernels", [])],
            "newest": bool(spec.get("newest")),
            "all_in_suite": spec.get("all_in_suite") or "",
        },
        "hooks": {
            "github": url_for("hooks.github", project=p.name, _external=True),
            "gitlab": url_for("hooks.gitlab", project=p.name, _external=True),
        },
    }
    if with_secret:
        out["secret"] = p.secret
    return out


@bp.get("/projects")
@token_required
def list_projects() -> Response:
    """Registered projects."""
    with store().session() as s:
        rows = [project_dict(p) for p in s.scalars(select(Project).order_by(Project.name))]
    return jsonify({"projects": rows})


@bp.post("/projects")
@token_required
def create_project() -> tuple[Response, int]:
    """Register a project; the answer carries its webhook secret."""
    fields, _ = _body()
    name = as_text(fields.get("name"), "name")
    if not PROJECT_RE.match(name):
        raise InvalidInput("'name' must be 1-64 of a-z, 0-9, '.', '_', '-', starting alphanumeric")
    source_url = as_text(fields.get("source_url"), "source_url")
    ref = as_text(fields.get("ref"), "ref")
    check_git(source_url, ref)
    choice = parse_kernel_choice(
        fields.get("kernels"), fields.get("newest"), fields.get("all_in_suite")
    )
    fixed = resolve_kernels(type(choice)(choice.kernels))
    spec = {"kernels": fixed, "newest": choice.newest, "all_in_suite": choice.all_in_suite}
    exists = ApiError(409, "exists", f"project {name!r} already exists")
    try:
        with store().session() as s:
            if find_project(s, name) is not None:
                raise exists
            project = Project(
                name=name,
                source_url=source_url,
                ref=ref,
                secret=secrets.token_urlsafe(32),
                default_kernels=spec,
            )
            s.add(project)
            s.flush()
            return jsonify(project_dict(project, with_secret=True)), 201
    except IntegrityError:  # created by a concurrent request
        raise exists from None


@bp.get("/projects/<name>")
@token_required
def get_project(name: str) -> Response:
    """One project."""
    with store().session() as s:
        project = find_project(s, name)
        if project is None:
            raise _not_found(f"project {name[:64]!r}")
        return jsonify(project_dict(project))
