"""/apt/: the signed apt repository, served as static files to anyone (apt needs no login)."""

from __future__ import annotations

from pathlib import Path

from flask import Blueprint, Response, abort, render_template, send_from_directory

from web.common import settings

bp = Blueprint("apt", __name__)
# Index files change with every publish; pool files never change once written.
INDEX_MAX_AGE = 0
POOL_MAX_AGE = 86400


def repo_dir() -> Path:
    """The repository directory (settings.repo_dir, default <home>/repo; see builder.repo)."""
    s = settings()
    return Path(s.repo_dir).expanduser() if s.repo_dir else s.home / "repo"


@bp.get("/", defaults={"path": ""})
@bp.get("/<path:path>")
def serve(path: str) -> Response | str:
    """A file of the repository, or a listing of one of its directories."""
    parts = [p for p in path.split("/") if p]
    if any(p.startswith(".") for p in parts):  # the publisher's state and lock stay private
        abort(404)
    root = repo_dir()
    target = root.joinpath(*parts)
    if not target.resolve().is_relative_to(root.resolve()):
        abort(404)
    if target.is_dir():
        if path and not path.endswith("/"):
            return Response(status=301, headers={"Location": f"/apt/{path}/"})
        entries = sorted(
            (e.name + ("/" if e.is_dir() else ""))
            for e in target.iterdir()
            if not e.name.startswith(".")
        )
        return render_template("apt_index.html", path="/".join(parts), entries=entries)
    if not target.is_file():
        abort(404)
    max_age = POOL_MAX_AGE if parts and parts[0] == "pool" else INDEX_MAX_AGE
    return send_from_directory(root, "/".join(parts), max_age=max_age)
