"""Who may do what: operator logins (sessions + CSRF) and API bearer tokens."""

from __future__ import annotations

import functools
import hashlib
import hmac
import secrets
from collections.abc import Callable
from typing import Any

from flask import g, redirect, request, session, url_for
from sqlalchemy import select
from werkzeug.security import check_password_hash, generate_password_hash

from builder.store import ApiToken, Store, User
from web.common import ApiError, store

TOKEN_PREFIX = "moddeb_"
CSRF_FIELD = "csrf_token"


@functools.cache
def _dummy_hash() -> str:
    """Checked when a user name is unknown, so a miss costs as much as a wrong password."""
    return generate_password_hash("moddeb-no-such-user")


def hash_token(token: str) -> str:
    """How a token is stored: SHA-256 of its text (tokens are long and random)."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """A fresh API token."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def create_token(db: Store, name: str) -> str:
    """Record a new token for NAME and return its text (shown once, never stored)."""
    token = new_token()
    with db.session() as s:
        s.add(ApiToken(name=name, token_hash=hash_token(token)))
    return token


def create_user(db: Store, name: str, password: str) -> None:
    """Add an operator, or set the password of an existing one."""
    with db.session() as s:
        user = s.scalars(select(User).where(User.name == name)).first()
        if user is None:
            s.add(User(name=name, password_hash=generate_password_hash(password)))
        else:
            user.password_hash = generate_password_hash(password)


def check_login(name: str, password: str) -> bool:
    """True when NAME exists and PASSWORD is theirs."""
    with store().session() as s:
        user = s.scalars(select(User).where(User.name == name)).first()
        stored = user.password_hash if user else _dummy_hash()
    return check_password_hash(stored, password) and user is not None


def csrf_token() -> str:
    """This session's CSRF token, made on first use."""
    if CSRF_FIELD not in session:
        session[CSRF_FIELD] = secrets.token_urlsafe(32)
    return str(session[CSRF_FIELD])


def check_csrf() -> None:
    """Refuse a form post whose token does not match the session's."""
    sent = request.form.get(CSRF_FIELD, "")
    expected = session.get(CSRF_FIELD, "")
    if not sent or not expected or not hmac.compare_digest(sent.encode(), str(expected).encode()):
        raise ApiError(
            400, "csrf", "the form has expired or did not come from this site; reload it"
        )


def login_required(view: Callable[..., Any]) -> Callable[..., Any]:
    """Send anonymous visitors to the login page."""

    @functools.wraps(view)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if not session.get("user"):
            return redirect(url_for("ui.login", next=request.full_path.rstrip("?")))
        g.user = session["user"]
        return view(*args, **kwargs)

    return wrapped


def token_required(view: Callable[..., Any]) -> Callable[..., Any]:
    """Refuse API calls without a valid `Authorization: Bearer TOKEN`."""

    @functools.wraps(view)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(401, "unauthorized", "send an API token: Authorization: Bearer TOKEN")
        with store().session() as s:
            row = s.scalars(
                select(ApiToken).where(ApiToken.token_hash == hash_token(token.strip()))
            ).first()
            name = row.name if row else None
        if name is None:
            raise ApiError(401, "unauthorized", "the API token is not valid")
        g.user = f"token:{name}"
        return view(*args, **kwargs)

    return wrapped
