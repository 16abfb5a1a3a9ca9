"""Webhooks with recorded GitHub and GitLab deliveries: signed, mis-signed and repeated."""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path
from urllib.parse import urlencode

import pytest

from builder.store import Build, Delivery, Project, open_store

from .test_web import Web, web_fixture  # noqa: F401 - the `web` fixture

HOOKS = Path(__file__).resolve().parents[1] / "data" / "hooks"
HEADERS = json.loads((HOOKS / "headers.json").read_text())
SECRET = "s3cret-for-tests-0123456789abcdef"
SOURCE = "https://git.example.org/kernel/hello-module.git"


@pytest.fixture
def project(web: Web) -> Web:
    """A registered project 'hello' with a secret and one default kernel."""
    with open_store(web.settings).session() as s:
        s.add(
            Project(
                name="hello",
                source_url=SOURCE,
                ref="main",
                secret=SECRET,
                default_kernels={
                    "kernels": [
                        {
                            "kernel_release": "6.1.0-57-amd64",
                            "flavour": "amd64",
                            "suite": "bookworm-security",
                            "headers_version": "6.1.158-1",
                        }
                    ],
                    "newest": False,
                    "all_in_suite": "",
                },
            )
        )
    return web


def recorded(name: str) -> tuple[bytes, dict[str, str]]:
    """A recorded delivery's body and headers."""
    return (HOOKS / name).read_bytes(), dict(HEADERS[name])


def github_signature(body: bytes, secret: str = SECRET) -> str:
    """X-Hub-Signature-256 as GitHub computes it."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def deliver_github(web: Web, name: str, *, secret: str = SECRET, project: str = "hello", **over):
    """POST a recorded GitHub delivery, signed with `secret`."""
    body, headers = recorded(name)
    headers["X-Hub-Signature-256"] = github_signature(body, secret)
    headers.update(over)
    headers = {k: v for k, v in headers.items() if v is not None}
    return web.client.post(
        f"/hooks/github/{project}", data=body, headers=headers, content_type="application/json"
    )


def deliver_gitlab(web: Web, name: str, *, token: str = SECRET, project: str = "hello", **over):
    """POST a recorded GitLab delivery carrying `token`."""
    body, headers = recorded(name)
    headers["X-Gitlab-Token"] = token
    headers.update(over)
    headers = {k: v for k, v in headers.items() if v is not None}
    return web.client.post(
        f"/hooks/gitlab/{project}", data=body, headers=headers, content_type="application/json"
    )


def builds(web: Web) -> list[Build]:
    """Every build in the database."""
    with web.session() as s:
        return list(s.query(Build).order_by(Build.id))


# --- GitHub ---------------------------------------------------------------------------------
def test_github_push_queues_one_build_of_the_pushed_commit(project: Web) -> None:
    """A signed push answers 202 with the id of a build of the project's URL at the commit."""
    resp = deliver_github(project, "github-push.json")
    assert resp.status_code == 202
    build_id = resp.get_json()["id"]
    assert project.queue.sent == [("moddeb.build", [build_id])]
    (b,) = builds(project)
    assert (b.id, b.trigger, b.source, b.ref) == (
        build_id,
        "github",
        SOURCE,  # the project's own URL, never the payload's
        "3f786850e387550fdab836ed7e6dc881de23001b",
    )
    with project.session() as s:
        assert [k.kernel_release for k in s.get(Build, build_id).kernels] == ["6.1.0-57-amd64"]
        assert s.get(Delivery, "github:72d3162e-cc78-11ee-8b6f-4c7a1f0e9d01").build_id == build_id


def test_github_tag_push_builds_the_tag(project: Web) -> None:
    """A tag push checks out the tag by name."""
    resp = deliver_github(project, "github-tag.json")
    assert resp.status_code == 202
    assert builds(project)[0].ref == "v1.1"


def test_github_ping_answers_and_queues_nothing(project: Web) -> None:
    """The ping GitHub sends when a hook is added gets a 200 and queues nothing."""
    resp = deliver_github(project, "github-ping.json")
    assert resp.status_code == 200 and resp.get_json() == {"pong": True}
    assert project.queue.sent == [] and builds(project) == []


def test_github_branch_deletion_and_other_events_are_ignored(project: Web) -> None:
    """Deleting a branch or an event other than push queues nothing."""
    assert deliver_github(project, "github-delete.json").status_code == 200
    resp = deliver_github(project, "github-push.json", **{"X-GitHub-Event": "issues"})
    assert resp.status_code == 200 and "ignored" in resp.get_json()
    assert project.queue.sent == []


@pytest.mark.parametrize(
    "signature",
    [
        None,
        "",
        "sha256=",
        "sha1=2fd4e1c67a2d28fced849ee1bb76e7391b93eb12",
        github_signature(b"another body"),
        "sha256=" + "0" * 64,
    ],
)
def test_github_bad_signature_is_401_and_queues_nothing(
    project: Web, signature: str | None
) -> None:
    """A missing, malformed or wrong signature is refused before anything is recorded."""
    resp = deliver_github(project, "github-push.json", **{"X-Hub-Signature-256": signature})
    assert resp.status_code == 401
    assert resp.get_json()["error"]["code"] == "bad-signature"
    assert project.queue.sent == [] and builds(project) == []
    with project.session() as s:
        assert s.query(Delivery).count() == 0


def test_github_signature_with_another_projects_secret_is_401(project: Web) -> None:
    """Signing with the wrong secret is a bad signature."""
    resp = deliver_github(project, "github-push.json", secret="not-the-secret")
    assert resp.status_code == 401 and project.queue.sent == []


def test_github_unknown_project_is_404_and_queues_nothing(project: Web) -> None:
    """A delivery for a project that does not exist is a 404, whatever its signature."""
    for name in ("nope", "Bad%20Name", "x" * 100):
        resp = deliver_github(project, "github-push.json", project=name)
        assert resp.status_code == 404
    assert project.queue.sent == []


def test_github_repeated_delivery_queues_one_build(project: Web) -> None:
    """GitHub re-sending the same delivery id gets the first build's id back, nothing new."""
    first = deliver_github(project, "github-push.json")
    again = deliver_github(project, "github-push.json")
    assert first.status_code == 202 and again.status_code == 200
    assert again.get_json() == {"id": first.get_json()["id"], "duplicate": True}
    assert len(builds(project)) == 1 and len(project.queue.sent) == 1
    other = deliver_github(
        project, "github-push.json", **{"X-GitHub-Delivery": "0a0b0c0d-0000-11ee-8000-000000000001"}
    )
    assert other.status_code == 202 and len(builds(project)) == 2


@pytest.mark.parametrize("delivery", [None, "", "bad id with spaces", "x" * 101])
def test_github_missing_or_malformed_delivery_id_is_400(project: Web, delivery: str | None) -> None:
    """Without a usable delivery id a delivery cannot be de-duplicated, so it is refused."""
    resp = deliver_github(project, "github-push.json", **{"X-GitHub-Delivery": delivery})
    assert resp.status_code == 400 and "X-GitHub-Delivery" in resp.get_json()["error"]["message"]
    assert project.queue.sent == []


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "not a JSON object"),
        (b"[1, 2]", "not a JSON object"),
        (b"\xff\xfe", "not a JSON object"),
        (b'{"ref": "refs/heads/main"}', "needs 'ref' and 'after'"),
        (b'{"ref": "refs/heads/main", "after": "; rm -rf /"}', "not a commit id"),
    ],
)
def test_github_signed_but_malformed_payloads_are_400(
    project: Web, body: bytes, message: str
) -> None:
    """A correctly signed body that is not a usable push event is a 400."""
    headers = dict(HEADERS["github-push.json"], **{"X-Hub-Signature-256": github_signature(body)})
    resp = project.client.post(
        "/hooks/github/hello", data=body, headers=headers, content_type="application/json"
    )
    assert resp.status_code == 400 and message in resp.get_json()["error"]["message"]
    assert project.queue.sent == []


def test_github_form_encoded_delivery_is_accepted(project: Web) -> None:
    """GitHub's application/x-www-form-urlencoded variant (payload=JSON) works too."""
    payload, headers = recorded("github-push.json")
    body = urlencode({"payload": payload.decode()}).encode()
    headers["X-Hub-Signature-256"] = github_signature(body)
    resp = project.client.post(
        "/hooks/github/hello",
        data=body,
        headers=headers,
        content_type="application/x-www-form-urlencoded",
    )
    assert resp.status_code == 202


def test_github_oversized_payload_is_413(project: Web) -> None:
    """A payload beyond the hook limit is refused without being read."""
    body = b"{" + b" " * (6 * 1024 * 1024) + b"}"
    project.app.config["MAX_CONTENT_LENGTH"] = 10 * 1024 * 1024
    headers = dict(HEADERS["github-push.json"], **{"X-Hub-Signature-256": github_signature(body)})
    resp = project.client.post(
        "/hooks/github/hello", data=body, headers=headers, content_type="application/json"
    )
    assert resp.status_code == 413 and project.queue.sent == []


def test_hook_with_a_broken_queue_is_503(project: Web) -> None:
    """If the broker is down the provider sees a 503 (and will redeliver)."""
    project.queue.down = True
    resp = deliver_github(project, "github-push.json")
    assert resp.status_code == 503
    assert [b.state for b in builds(project)] == ["failed"]


def test_hooks_refuse_get(project: Web) -> None:
    """Hooks take POST only."""
    assert project.client.get("/hooks/github/hello").status_code == 405


# --- GitLab ---------------------------------------------------------------------------------
def test_gitlab_push_queues_one_build_of_the_checkout_sha(project: Web) -> None:
    """A GitLab push with the right token answers 202 with a build at checkout_sha."""
    resp = deliver_gitlab(project, "gitlab-push.json")
    assert resp.status_code == 202
    (b,) = builds(project)
    assert (b.trigger, b.source, b.ref) == (
        "gitlab",
        SOURCE,
        "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678",
    )
    assert project.queue.builds() == [b.id]


def test_gitlab_tag_push_builds_the_tag(project: Web) -> None:
    """A GitLab tag push builds the tag."""
    assert deliver_gitlab(project, "gitlab-tag.json").status_code == 202
    assert builds(project)[0].ref == "v1.2"


@pytest.mark.parametrize("token", [None, "", "wrong", SECRET + "x", SECRET[:-1]])
def test_gitlab_bad_token_is_401_and_queues_nothing(project: Web, token: str | None) -> None:
    """A missing or wrong X-Gitlab-Token is refused."""
    resp = deliver_gitlab(project, "gitlab-push.json", **{"X-Gitlab-Token": token})
    assert resp.status_code == 401 and resp.get_json()["error"]["code"] == "bad-token"
    assert project.queue.sent == [] and builds(project) == []


def test_gitlab_unknown_project_is_404(project: Web) -> None:
    """A GitLab delivery for an unknown project is a 404."""
    assert deliver_gitlab(project, "gitlab-push.json", project="nope").status_code == 404
    assert project.queue.sent == []


def test_gitlab_repeated_delivery_queues_one_build(project: Web) -> None:
    """The same X-Gitlab-Event-UUID twice queues one build."""
    first = deliver_gitlab(project, "gitlab-push.json")
    again = deliver_gitlab(project, "gitlab-push.json")
    assert again.status_code == 200 and again.get_json()["id"] == first.get_json()["id"]
    assert len(builds(project)) == 1


def test_gitlab_other_events_missing_uuid_and_deleted_branches(project: Web) -> None:
    """Other events are ignored; a missing event UUID is a 400; a deleted branch builds nothing."""
    resp = deliver_gitlab(project, "gitlab-push.json", **{"X-Gitlab-Event": "Issue Hook"})
    assert resp.status_code == 200 and "ignored" in resp.get_json()
    resp = deliver_gitlab(project, "gitlab-push.json", **{"X-Gitlab-Event-UUID": None})
    assert resp.status_code == 400
    body = json.loads(recorded("gitlab-push.json")[0])
    body["checkout_sha"] = None
    headers = dict(HEADERS["gitlab-push.json"], **{"X-Gitlab-Token": SECRET})
    resp = project.client.post(
        "/hooks/gitlab/hello",
        data=json.dumps(body),
        headers=headers,
        content_type="application/json",
    )
    assert resp.status_code == 200 and "deleted" in resp.get_json()["ignored"]
    body["checkout_sha"] = 12
    resp = project.client.post(
        "/hooks/gitlab/hello",
        data=json.dumps(body),
        headers=headers,
        content_type="application/json",
    )
    assert resp.status_code == 400
    assert project.queue.sent == []


def test_same_delivery_id_from_both_providers_are_different_deliveries(project: Web) -> None:
    """De-duplication is per provider."""
    uuid = "0f3b9c1e-6a52-4b7e-9d41-5c2e8a7f1b90"
    deliver_gitlab(project, "gitlab-push.json")
    resp = deliver_github(project, "github-push.json", **{"X-GitHub-Delivery": uuid})
    assert resp.status_code == 202 and len(builds(project)) == 2
