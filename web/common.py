"""What every blueprint shares: settings, the store, the queue, the kernel catalog, errors."""

from __future__ import annotations

import threading
import time
from typing import Any

from flask import current_app, jsonify, render_template, request
from werkzeug.wrappers import Response

from builder.config import Settings
from builder.store import Store, open_store

MODDEB = "moddeb"
CATALOG_TTL = 600  # seconds a kernel catalog is reused before asking the archive again
JSON_PREFIXES = ("/api/", "/hooks/", "/metrics", "/healthz")

_catalog_lock = threading.Lock()


def settings() -> Settings:
    """The app's Settings."""
    return current_app.extensions[MODDEB]["settings"]  # type: ignore[no-any-return]


def store() -> Store:
    """This process's state database."""
    return open_store(settings())


def enqueue(name: str, args: list[Any]) -> None:
    """Queue a task by its stable name (no build code is imported here)."""
    current_app.extensions[MODDEB]["enqueue"](name, args)


def kernel_catalog(suites: list[str] | None = None) -> list[Any]:
    """The kernel ABIs the archive offers (KernelInfo), cached for a few minutes."""
    ext = current_app.extensions[MODDEB]
    cache = ext["catalog_cache"]
    key = tuple(suites) if suites else None
    with _catalog_lock:
        hit = cache.get(key)
        if hit and time.monotonic() - hit[0] < CATALOG_TTL:
            return hit[1]
    rows = list(ext["catalog"](suites))
    with _catalog_lock:
        cache[key] = (time.monotonic(), rows)
    return rows


def wants_json() -> bool:
    """True for machine endpoints (API, hooks, metrics) and for clients asking for JSON."""
    if request.path.startswith(JSON_PREFIXES):
        return True
    best = request.accept_mimetypes.best_match(["text/html", "application/json"])
    return best == "application/json"


def error_response(status: int, code: str, message: str) -> Response:
    """A refusal in the caller's terms: JSON naming the problem, or an HTML page."""
    if wants_json():
        resp = jsonify({"error": {"code": code, "message": message}})
    else:
        resp = current_app.make_response(
            (render_template("error.html", status=status, code=code, message=message), status)
        )
    resp.status_code = status
    if status == 401 and request.path.startswith("/api/"):
        resp.headers["WWW-Authenticate"] = 'Bearer realm="moddeb"'
    return resp


class ApiError(Exception):
    """A refusal raised from deep inside a handler; turned into error_response()."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def base_url() -> str:
    """The service's external URL, for apt lines and links."""
    return (settings().public_url or request.host_url).rstrip("/")
