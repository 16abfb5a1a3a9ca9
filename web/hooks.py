"""CI webhooks: /hooks/github/PROJECT and /hooks/gitlab/PROJECT queue a build per push or tag.

Checks run cheapest-first and nothing is written before all pass: the project must exist
(404), the signature or token must match its secret, compared in constant time (401), the
delivery must carry its id; a delivery id already seen answers with the build it queued.
The clone URL is always the project's own, never one from the payload.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Callable
from typing import Any

from flask import Blueprint, Response, jsonify, request, url_for
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from builder.errors import InvalidInput, Transient
from builder.store import Delivery, Project
from web.builds import PROJECT_RE, project_kernels, queue_build, record_build, table
from web.common import ApiError, store

bp = Blueprint("hooks", __name__)
MAX_HOOK_BYTES = 5 * 1024 * 1024
DELIVERY_RE = re.compile(r"^[A-Za-z0-9._:-]{1,100}$")
SHA_RE = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")
ZERO_SHA = "0" * 40


def _project(s: Session, name: str) -> Any:
    """The project's row (id, name, source_url, ref, secret, default_kernels), or 404."""
    t = table(Project)
    row = None
    if PROJECT_RE.match(name):
        row = s.connection().execute(select(t).where(t.c.name == name)).first()
    if row is None:
        raise ApiError(404, "unknown-project", f"no project named {name[:64]!r}")
    return row


def _body() -> bytes:
    if (request.content_length or 0) > MAX_HOOK_BYTES:
        raise ApiError(413, "too-large", f"a webhook payload is at most {MAX_HOOK_BYTES} bytes")
    return request.get_data(cache=True)


def _payload(body: bytes) -> dict[str, Any]:
    """The JSON event (GitHub may also send it form-encoded as `payload`)."""
    text: str | None = None
    try:
        if request.mimetype == "application/x-www-form-urlencoded":
            text = request.form.get("payload")
        else:
            text = body.decode("utf-8")
        data = json.loads(text) if text else None
    except (UnicodeDecodeError, ValueError):
        data = None
    if not isinstance(data, dict):
        raise InvalidInput("the payload is not a JSON object")
    return data


def _delivery(header: str) -> str:
    value = request.headers.get(header, "").strip()
    if not DELIVERY_RE.match(value):
        raise InvalidInput(f"the {header} header is missing or malformed")
    return value


def _accept(
    s: Session, provider: str, project: Any, delivery: str, ref: str, what: str
) -> tuple[int, bool]:
    """Record one build for a delivery in the handler's session; (build id, is it new)."""
    key = f"{provider}:{delivery}"
    t = table(Delivery)
    seen = s.connection().execute(select(t.c.build_id).where(t.c.delivery_id == key)).first()
    if seen is not None:
        return seen.build_id or 0, False
    build_id = record_build(
        s,
        kind="git",
        source=project.source_url,
        ref=ref,
        project_id=project.id,
        kernels=project_kernels(project),
        trigger=provider,
        requested_by=f"{provider} delivery {delivery}",
        delivery_id=key,
        note=f"{provider} {what}",
    )
    return build_id, True


def _handle(provider: str, project: str, check: Callable[[Session, Any], Any]) -> Any:
    """One delivery in one transaction: find the project, let `check` authenticate and parse
    it (returning (delivery, ref, what), or a Response to send as is), record the build;
    only after the commit is the build queued."""
    try:
        with store().session() as s:
            p = _project(s, project)
            outcome = check(s, p)
            if isinstance(outcome, Response):  # answered without a build (ping, ignored)
                return outcome
            delivery, ref, what = outcome
            build_id, new = _accept(s, provider, p, delivery, ref, what)
    except IntegrityError:  # the same delivery arrived twice at once; the other copy won
        with store().session() as s:
            seen = s.get(Delivery, f"{provider}:{delivery}")
            if seen is None:
                raise Transient("could not record the delivery; send it again") from None
            build_id, new = seen.build_id or 0, False
    if not new:
        return jsonify({"id": build_id, "duplicate": True}), 200
    queue_build(build_id)
    url = url_for("api.get_build", build_id=build_id)
    return jsonify({"id": build_id, "state": "queued", "url": url}), 202


def _ref_to_build(ref: str, commit: str) -> tuple[str, str]:
    """What to check out and how to describe it: the tag name, or the pushed commit."""
    if ref.startswith("refs/tags/"):
        tag = ref.removeprefix("refs/tags/")
        return tag, f"tag {tag}"
    branch = ref.removeprefix("refs/heads/")
    return commit, f"push to {branch} at {commit[:12]}"


@bp.post("/github/<project>")
def github(project: str) -> Any:
    """A GitHub delivery, signed with X-Hub-Signature-256 (HMAC-SHA256 of the body)."""

    def check(s: Session, p: Any) -> Any:
        body = _body()
        expected = "sha256=" + hmac.new(p.secret.encode(), body, hashlib.sha256).hexdigest()
        sent = request.headers.get("X-Hub-Signature-256", "")
        if not hmac.compare_digest(sent.encode(), expected.encode()):
            raise ApiError(401, "bad-signature", "X-Hub-Signature-256 does not match the secret")
        delivery = _delivery("X-GitHub-Delivery")
        event = request.headers.get("X-GitHub-Event", "")
        if event == "ping":
            return jsonify({"pong": True})
        if event != "push":
            return jsonify({"ignored": f"event {event[:50]!r} does not trigger builds"})
        payload = _payload(body)
        ref, commit = payload.get("ref"), payload.get("after")
        if not isinstance(ref, str) or not isinstance(commit, str):
            raise InvalidInput("a push payload needs 'ref' and 'after'")
        if payload.get("deleted") or commit == ZERO_SHA:
            return jsonify({"ignored": f"{ref[:100]} was deleted"})
        if not SHA_RE.match(commit):
            raise InvalidInput("'after' is not a commit id")
        return (delivery, *_ref_to_build(ref, commit))

    return _handle("github", project, check)


@bp.post("/gitlab/<project>")
def gitlab(project: str) -> Any:
    """A GitLab delivery, authenticated by X-Gitlab-Token (the project's secret)."""

    def check(s: Session, p: Any) -> Any:
        sent = request.headers.get("X-Gitlab-Token", "")
        if not hmac.compare_digest(sent.encode(), p.secret.encode()):
            raise ApiError(401, "bad-token", "X-Gitlab-Token does not match the secret")
        body = _body()
        delivery = _delivery("X-Gitlab-Event-UUID")
        event = request.headers.get("X-Gitlab-Event", "")
        if event not in ("Push Hook", "Tag Push Hook"):
            return jsonify({"ignored": f"event {event[:50]!r} does not trigger builds"})
        payload = _payload(body)
        ref, commit = payload.get("ref"), payload.get("checkout_sha")
        if not isinstance(ref, str):
            raise InvalidInput("a push payload needs 'ref'")
        if commit is None or commit == ZERO_SHA:
            return jsonify({"ignored": f"{ref[:100]} was deleted"})
        if not isinstance(commit, str) or not SHA_RE.match(commit):
            raise InvalidInput("'checkout_sha' is not a commit id")
        return (delivery, *_ref_to_build(ref, commit))

    return _handle("gitlab", project, check)
