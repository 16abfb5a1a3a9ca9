"""The moddeb web service: create_app() and its blueprints (ui, api, hooks, apt, metrics).

The web side never imports build code: it records a build in the database and queues the
task `moddeb.build` by name; workers do the rest.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from typing import Any

from flask import Flask, request
from werkzeug.exceptions import HTTPException

from builder.config import Settings, load_settings
from builder.errors import InvalidInput, ModdebError, Transient
from builder.store import make_celery, open_store
from web.common import MODDEB, ApiError, error_response

log = logging.getLogger(__name__)


def _secret_key(settings: Settings) -> str:
    """The session-signing key: configured, or random and kept in <home>/state/secret_key."""
    if settings.secret_key:
        return settings.secret_key
    path = settings.state_root / "secret_key"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"secret_key.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32))
        try:
            os.link(tmp, path)  # atomic, and the first of several workers wins
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
    return path.read_text().strip()


def _celery_enqueue(settings: Settings) -> Any:
    """Send tasks by name through a Celery client made on first use in this process."""
    client: dict[str, Any] = {}

    def enqueue(name: str, args: list[Any]) -> None:
        if "app" not in client:
            client["app"] = make_celery(settings, "moddeb-web")
        try:
            client["app"].send_task(name, args=args)
        except Exception as exc:  # noqa: BLE001 - any broker failure is a transient one
            raise Transient(f"the build queue is unavailable: {exc}") from None

    return enqueue


def create_app(test_config: dict[str, Any] | None = None) -> Flask:
    """Make the Flask app; settings come from MODDEB_* (or test_config['MODDEB_SETTINGS'])."""
    app = Flask(__name__)
    test_config = dict(test_config or {})
    settings: Settings = test_config.pop("MODDEB_SETTINGS", None) or load_settings()
    app.config.update(
        SECRET_KEY=_secret_key(settings),
        MAX_CONTENT_LENGTH=settings.max_upload_bytes,
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        SESSION_COOKIE_SECURE=settings.public_url.startswith("https://"),
    )
    enqueue = test_config.pop("MODDEB_ENQUEUE", None) or _celery_enqueue(settings)
    catalog = test_config.pop("MODDEB_CATALOG", None)
    if catalog is None:
        from builder.kernels import list_kernels

        def catalog(suites: list[str] | None = None) -> list[Any]:
            return list_kernels(settings, suites=suites)

    queue_depth = test_config.pop("MODDEB_QUEUE_DEPTH", None)
    app.config.update(test_config)
    app.extensions[MODDEB] = {
        "settings": settings,
        "enqueue": enqueue,
        "catalog": catalog,
        "catalog_cache": {},
        "queue_depth": queue_depth,
    }
    open_store(settings)  # creates the schema on first start

    from web import api, apt, hooks, metrics, ui

    app.register_blueprint(ui.bp)
    app.register_blueprint(api.bp, url_prefix="/api/v1")
    app.register_blueprint(hooks.bp, url_prefix="/hooks")
    app.register_blueprint(apt.bp, url_prefix="/apt")
    app.register_blueprint(metrics.bp)

    app.jinja_env.filters["timestamp"] = lambda t: time.strftime(
        "%Y-%m-%d %H:%M:%S UTC", time.gmtime(t)
    )

    @app.errorhandler(ApiError)
    def refusal(exc: ApiError) -> Any:
        return error_response(exc.status, exc.code, exc.message)

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> Any:
        return error_response(
            exc.code or 500, exc.name.lower().replace(" ", "-"), exc.description or exc.name
        )

    @app.errorhandler(ModdebError)
    def moddeb_error(exc: ModdebError) -> Any:
        status = (
            503 if isinstance(exc, Transient) else 400 if isinstance(exc, InvalidInput) else 422
        )
        return error_response(status, exc.code, str(exc))

    @app.errorhandler(Exception)
    def internal_error(exc: Exception) -> Any:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(500, "internal-error", "an internal error occurred; see the logs")

    return app
