"""The JSON API (/api/v1), /apt/, /metrics and /healthz through Flask's test client."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from builder.errors import Transient
from builder.store import Build, open_store
from web.auth import create_token, hash_token

from .test_web import Web, api_fixture, finished_build, tarball, web_fixture  # noqa: F401

Api = tuple[Web, dict[str, str]]


def post_json(web: Web, headers: dict[str, str], body: object, path: str = "/api/v1/builds"):
    """POST a JSON body."""
    return web.client.post(
        path, data=json.dumps(body), headers=headers, content_type="application/json"
    )


# --- authentication -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "header",
    [None, "Bearer", "Bearer ", "Basic YWxpY2U6cHc=", "Bearer moddeb_not-a-real-token", "token x"],
)
def test_api_refuses_missing_and_bad_tokens(web: Web, header: str | None) -> None:
    """Without a valid bearer token every API route answers 401 in JSON, and nothing is queued."""
    headers = {"Authorization": header} if header is not None else {}
    for method, path in (
        ("get", "/api/v1/builds"),
        ("post", "/api/v1/builds"),
        ("get", "/api/v1/builds/1"),
        ("get", "/api/v1/builds/1/artifacts"),
        ("post", "/api/v1/builds/1/cancel"),
        ("post", "/api/v1/builds/1/rerun"),
        ("get", "/api/v1/kernels"),
        ("get", "/api/v1/projects"),
    ):
        resp = getattr(web.client, method)(path, headers=headers)
        assert resp.status_code == 401, (method, path)
        assert resp.get_json()["error"]["code"] == "unauthorized"
        assert resp.headers["WWW-Authenticate"].startswith("Bearer")
    assert web.queue.sent == []


def test_tokens_are_stored_hashed(web: Web) -> None:
    """The database holds a token's SHA-256, never its text."""
    from builder.store import ApiToken

    token = create_token(open_store(web.settings), "ci")
    with web.session() as s:
        (row,) = s.query(ApiToken).all()
        assert row.token_hash == hash_token(token) and token not in row.token_hash


# --- creating builds -------------------------------------------------------------------------
def test_multipart_upload_is_queued_with_202_and_an_id(api: Api) -> None:
    """POST /builds with a `source` file answers 202 {"id"} and queues moddeb.build(id)."""
    web, headers = api
    resp = web.client.post(
        "/api/v1/builds",
        data={
            "source": (io.BytesIO(tarball()), "hello-1.0.tar.gz"),
            "kernels": ["6.1.0-57-amd64", "6.12.117+deb12-amd64"],
        },
        headers=headers,
        content_type="multipart/form-data",
    )
    assert resp.status_code == 202
    body = resp.get_json()
    assert body["state"] == "queued" and resp.headers["Location"] == body["url"]
    assert web.queue.sent == [("moddeb.build", [body["id"]])]
    got = web.client.get(body["url"], headers=headers).get_json()
    assert got["state"] == "queued" and got["trigger"] == "api"
    assert got["requested_by"] == "token:ci"
    assert [k["kernel_release"] for k in got["kernels"]] == [
        "6.1.0-57-amd64",
        "6.12.117+deb12-amd64",
    ]
    assert all(k["state"] == "queued" for k in got["kernels"])


def test_json_git_url_and_ref_with_comma_separated_kernels(api: Api) -> None:
    """A JSON body with git_url, ref and kernels (list or comma string) is queued."""
    web, headers = api
    resp = post_json(
        web,
        headers,
        {
            "git_url": "https://git.example.org/hello.git",
            "ref": "v1.0",
            "kernels": ["6.1.0-57-amd64,6.1.0-56-amd64"],
        },
    )
    assert resp.status_code == 202
    got = web.client.get(resp.get_json()["url"], headers=headers).get_json()
    assert got["source"] == {
        "kind": "git",
        "location": "https://git.example.org/hello.git",
        "ref": "v1.0",
    }
    assert len(got["kernels"]) == 2


def test_form_encoded_git_build_and_dkms_only_build(api: Api) -> None:
    """A urlencoded form works too; no kernels means a -dkms-only build."""
    web, headers = api
    resp = web.client.post(
        "/api/v1/builds", data={"git_url": "git@git.example.org:team/hello.git"}, headers=headers
    )
    assert resp.status_code == 202
    got = web.client.get(resp.get_json()["url"], headers=headers).get_json()
    assert got["kernels"] == []


def test_a_registered_project_builds_with_its_defaults(api: Api) -> None:
    """`project` uses the project's URL, ref and default kernels unless kernels are given."""
    web, headers = api
    resp = post_json(
        web,
        headers,
        {
            "name": "hello",
            "source_url": "https://git.example.org/hello.git",
            "ref": "main",
            "kernels": ["6.1.0-57-amd64"],
        },
        "/api/v1/projects",
    )
    assert resp.status_code == 201 and len(resp.get_json()["secret"]) > 30
    resp = post_json(web, headers, {"project": "hello"})
    got = web.client.get(resp.get_json()["url"], headers=headers).get_json()
    assert got["project"] == "hello" and got["source"]["ref"] == "main"
    assert [k["kernel_release"] for k in got["kernels"]] == ["6.1.0-57-amd64"]
    resp = post_json(web, headers, {"project": "hello", "ref": "v2", "newest": True})
    got = web.client.get(resp.get_json()["url"], headers=headers).get_json()
    assert got["source"]["ref"] == "v2" and len(got["kernels"]) == 2


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({}, 400, "give exactly one source"),
        ({"git_url": "https://h/x.git", "project": "p"}, 400, "got git_url, project"),
        ({"git_url": "file:///etc/passwd"}, 400, "not a remote git URL"),
        ({"git_url": "-oProxyCommand=x"}, 400, "not a remote git URL"),
        ({"git_url": 42}, 400, "'git_url' must be a string"),
        ({"git_url": "https://h/x.git", "ref": "a..b"}, 400, "not a git ref"),
        ({"git_url": "https://h/x.git", "kernels": "9.9.9-1-amd64"}, 400, "has no kernel"),
        ({"git_url": "https://h/x.git", "kernels": [1, 2]}, 400, "must be a list of kernel"),
        ({"git_url": "https://h/x.git", "kernels": {"a": 1}}, 400, "must be a list of kernel"),
        ({"git_url": "https://h/x.git", "kernels": ["x" * 300]}, 400, "is not a kernel release"),
        ({"git_url": "https://h/x.git", "kernels": ["6.1.0-57-amd64"] * 201}, 400, "at most 200"),
        ({"git_url": "https://h/x.git", "newest": "maybe"}, 400, "'newest' must be true or false"),
        ({"git_url": "https://h/x.git", "all_in_suite": "Not A Suite"}, 400, "is not a suite name"),
        ({"git_url": "https://h/x.git", "all_in_suite": "unreachable"}, 503, "cannot download"),
        ({"project": "nope"}, 404, "project 'nope' does not exist"),
        ([1, 2], 400, "must be a JSON object"),
    ],
)
def test_bad_build_requests_are_refused_with_the_problem_named(
    api: Api, body: object, status: int, message: str
) -> None:
    """Every bad input is a 4xx (or 503 for an outage) with a JSON error; nothing is queued."""
    web, headers = api
    resp = post_json(web, headers, body)
    assert resp.status_code == status, resp.get_json()
    assert message in resp.get_json()["error"]["message"]
    assert web.queue.sent == []


def test_malformed_json_and_unknown_media_types_are_refused(api: Api) -> None:
    """Invalid JSON is a 400; a body of another type is a 415."""
    web, headers = api
    resp = web.client.post(
        "/api/v1/builds", data="{nope", headers=headers, content_type="application/json"
    )
    assert resp.status_code == 400
    resp = web.client.post(
        "/api/v1/builds", data="hello", headers=headers, content_type="text/plain"
    )
    assert resp.status_code == 415 and resp.get_json()["error"]["code"] == "unsupported-media-type"


@pytest.mark.parametrize(
    ("filename", "data", "extra", "message"),
    [
        ("hello.zip", b"PK", {}, "not a tarball name"),
        ("../../hello-1.0.tar.gz", b"", {}, "is empty"),
        ("hello-1.0.tar.gz", tarball(), {"ref": "main"}, "'ref' only applies"),
        ("hello-1.0.tar.gz", tarball(), {"git_url": "https://h/x.git"}, "got source, git_url"),
        ("-rf.tar.gz", b"x", {}, "not a tarball name"),
    ],
)
def test_bad_uploads_are_refused(
    api: Api, filename: str, data: bytes, extra: dict, message: str
) -> None:
    """Wrong names, empty files and conflicting fields are refused with 400."""
    web, headers = api
    resp = web.client.post(
        "/api/v1/builds",
        data={"source": (io.BytesIO(data), filename), **extra},
        headers=headers,
        content_type="multipart/form-data",
    )
    assert resp.status_code == 400
    assert message in resp.get_json()["error"]["message"]
    assert web.queue.sent == []


def test_oversized_upload_is_413(api: Api) -> None:
    """An upload larger than max_upload_bytes is refused before it is stored."""
    web, headers = api
    resp = web.client.post(
        "/api/v1/builds",
        data={"source": (io.BytesIO(b"\0" * 300_000), "big-1.0.tar")},
        headers=headers,
        content_type="multipart/form-data",
    )
    assert resp.status_code == 413
    assert resp.get_json()["error"]["code"] == "request-entity-too-large"
    with web.session() as s:
        assert s.query(Build).count() == 0


def test_a_broken_queue_is_503_and_the_build_is_marked_failed(api: Api) -> None:
    """If the broker is down the client is told to retry and the build does not hang queued."""
    web, headers = api
    web.queue.down = True
    resp = post_json(web, headers, {"git_url": "https://h/x.git"})
    assert resp.status_code == 503 and resp.get_json()["error"]["code"] == "transient"
    with web.session() as s:
        assert [(b.state, b.error_code) for b in s.query(Build)] == [("failed", "transient")]


# --- reading, cancelling, re-running -----------------------------------------------------------
def test_get_build_shows_per_kernel_results_and_error_code(api: Api) -> None:
    """GET /builds/ID has the state, error code and each kernel's state and diagnosis."""
    web, headers = api
    build_id = finished_build(web, state="failed")
    got = web.client.get(f"/api/v1/builds/{build_id}", headers=headers).get_json()
    assert got["state"] == "failed" and got["error"]["code"] == "build-failed"
    assert got["published"] is True and got["duration"] > 0 and got["modules"] == ["hello"]
    assert got["kernels"][1]["diagnosis"] == "implicit declaration of 'strlcpy' (hello.c:42)"
    for path in ("/api/v1/builds/999", "/api/v1/builds/99999999999999999999", "/api/v1/builds/x"):
        resp = web.client.get(path, headers=headers)
        assert resp.status_code == 404 and "error" in resp.get_json()


def test_artifacts_are_listed_and_downloaded(api: Api) -> None:
    """The artifact list names each .deb with its hash, and each downloads."""
    web, headers = api
    build_id = finished_build(web)
    rows = web.client.get(f"/api/v1/builds/{build_id}/artifacts", headers=headers).get_json()[
        "artifacts"
    ]
    assert [(r["filename"], r["kind"]) for r in rows] == [
        ("hello-dkms_1.0-1_all.deb", "dkms"),
        ("hello-modules-6.1.0-57-amd64_1.0-1_amd64.deb", "module"),
    ]
    resp = web.client.get(rows[1]["url"], headers=headers)
    assert resp.status_code == 200 and resp.data.startswith(b"!<arch>")
    for path in (
        f"/api/v1/builds/{build_id}/artifacts/hello-1.0.tar.gz",
        f"/api/v1/builds/{build_id}/artifacts/none.deb",
        "/api/v1/builds/999/artifacts",
        "/api/v1/builds/999/artifacts/x.deb",
    ):
        assert web.client.get(path, headers=headers).status_code == 404


def test_cancel_then_cancel_again_is_409_and_rerun_is_202(api: Api) -> None:
    """Cancelling a queued build works once; re-running it queues a copy."""
    web, headers = api
    build_id = post_json(
        web, headers, {"git_url": "https://h/x.git", "kernels": ["6.1.0-57-amd64"]}
    ).get_json()["id"]
    resp = web.client.post(f"/api/v1/builds/{build_id}/cancel", headers=headers)
    assert resp.status_code == 200 and resp.get_json()["state"] == "cancelled"
    resp = web.client.post(f"/api/v1/builds/{build_id}/cancel", headers=headers)
    assert resp.status_code == 409 and "already cancelled" in resp.get_json()["error"]["message"]
    resp = web.client.post(f"/api/v1/builds/{build_id}/rerun", headers=headers)
    assert resp.status_code == 202
    new = web.client.get(resp.get_json()["url"], headers=headers).get_json()
    assert new["state"] == "queued" and new["source"]["location"] == "https://h/x.git"
    assert web.client.post("/api/v1/builds/999/cancel", headers=headers).status_code == 404
    assert web.client.post("/api/v1/builds/999/rerun", headers=headers).status_code == 404


def test_builds_list_filters_and_refuses_bad_filters(api: Api) -> None:
    """GET /builds filters by state, project and trigger; bad values are 400 or 404."""
    web, headers = api
    finished_build(web, state="failed")
    post_json(web, headers, {"git_url": "https://h/x.git"})
    get = lambda q: web.client.get(f"/api/v1/builds{q}", headers=headers)  # noqa: E731
    assert len(get("").get_json()["builds"]) == 2
    assert [b["state"] for b in get("?state=queued").get_json()["builds"]] == ["queued"]
    assert len(get("?limit=1").get_json()["builds"]) == 1
    assert len(get("?trigger=ui").get_json()["builds"]) == 0
    assert get("?state=bogus").status_code == 400
    assert get("?limit=0").status_code == 400
    assert get("?limit=x").status_code == 400
    assert get("?project=nope").status_code == 404


def test_kernel_catalog_and_its_outage(api: Api) -> None:
    """GET /kernels lists the catalog (or one suite); an unreachable archive is a 503."""
    web, headers = api
    rows = web.client.get("/api/v1/kernels", headers=headers).get_json()["kernels"]
    assert len(rows) == 4
    rows = web.client.get("/api/v1/kernels?suite=bookworm", headers=headers).get_json()["kernels"]
    assert [r["kernel_release"] for r in rows] == ["6.1.0-56-amd64"]
    assert web.client.get("/api/v1/kernels?suite=unreachable", headers=headers).status_code == 503
    assert web.client.get("/api/v1/kernels?suite=Bad!", headers=headers).status_code == 400
    assert web.client.get("/api/v1/kernels?suite=nope", headers=headers).status_code == 400


def test_catalog_is_cached_between_requests(api: Api) -> None:
    """The archive's index is not re-read on every request."""
    web, headers = api
    for _ in range(3):
        web.client.get("/api/v1/kernels", headers=headers)
    assert web.catalog_calls == [None]


def test_projects_api_create_list_get_and_refusals(api: Api) -> None:
    """Projects can be created once, listed and read; bad input is refused."""
    web, headers = api
    body = {"name": "hello", "source_url": "https://git.example.org/hello.git"}
    assert post_json(web, headers, body, "/api/v1/projects").status_code == 201
    assert post_json(web, headers, body, "/api/v1/projects").status_code == 409
    assert post_json(web, headers, {**body, "name": "Bad"}, "/api/v1/projects").status_code == 400
    assert (
        post_json(web, headers, {"name": "x", "source_url": "/srv"}, "/api/v1/projects").status_code
        == 400
    )
    listed = web.client.get("/api/v1/projects", headers=headers).get_json()["projects"]
    assert [p["name"] for p in listed] == ["hello"] and "secret" not in listed[0]
    got = web.client.get("/api/v1/projects/hello", headers=headers).get_json()
    assert got["hooks"]["github"].endswith("/hooks/github/hello")
    assert web.client.get("/api/v1/projects/nope", headers=headers).status_code == 404


def test_unknown_api_routes_and_methods_answer_json(api: Api) -> None:
    """Routing errors under /api are JSON too (404, 405)."""
    web, headers = api
    resp = web.client.get("/api/v1/nope", headers=headers)
    assert resp.status_code == 404 and resp.get_json()["error"]["code"] == "not-found"
    resp = web.client.delete("/api/v1/builds", headers=headers)
    assert resp.status_code == 405 and "error" in resp.get_json()


def test_openapi_describes_every_api_route(web: Web) -> None:
    """/api/v1/openapi.json is public and names every route of the API blueprint."""
    doc = web.client.get("/api/v1/openapi.json").get_json()
    assert doc["openapi"].startswith("3.")
    documented = {(path, method) for path, ops in doc["paths"].items() for method in ops}
    for rule in web.app.url_map.iter_rules():
        if rule.endpoint.startswith("api.") and rule.endpoint != "api.openapi":
            path = rule.rule.removeprefix("/api/v1").replace("<int:build_id>", "{build_id}")
            path = path.replace("<filename>", "{filename}").replace("<name>", "{name}")
            for method in rule.methods - {"HEAD", "OPTIONS"}:
                assert (path, method.lower()) in documented, (path, method)


def test_an_unexpected_error_is_a_json_500_without_details(api: Api, monkeypatch) -> None:
    """Should a bug slip through, the client gets a plain JSON 500 and the log gets the trace."""
    web, headers = api
    web.app.config["PROPAGATE_EXCEPTIONS"] = False
    monkeypatch.setattr("web.api.build_dict", lambda *a, **k: 1 / 0)
    build_id = finished_build(web)
    resp = web.client.get(f"/api/v1/builds/{build_id}", headers=headers)
    assert resp.status_code == 500 and resp.get_json()["error"]["code"] == "internal-error"
    assert "ZeroDivision" not in resp.get_data(as_text=True)


# --- /apt, /metrics, /healthz ---------------------------------------------------------------------
def test_apt_serves_the_repository_without_login(web: Web) -> None:
    """Files and directory listings of the repository are public; its private state is not."""
    root = Path(web.settings.home) / "repo"
    (root / "dists/bookworm").mkdir(parents=True)
    (root / "dists/bookworm/InRelease").write_text("Origin: moddeb\n")
    (root / "moddeb-archive-keyring.gpg").write_bytes(b"\x99key")
    (root / ".moddeb").mkdir()
    (root / ".moddeb/state.json").write_text("{}")
    c = web.client
    assert c.get("/apt/dists/bookworm/InRelease").data == b"Origin: moddeb\n"
    assert c.get("/apt/moddeb-archive-keyring.gpg").data == b"\x99key"
    listing = c.get("/apt/").get_data(as_text=True)
    assert "dists/" in listing and ".moddeb" not in listing
    assert c.get("/apt/dists").status_code == 301
    assert "bookworm/" in c.get("/apt/dists/").get_data(as_text=True)
    for path in ("/apt/.moddeb/state.json", "/apt/../secret_key", "/apt/%2e%2e/x", "/apt/nope"):
        assert c.get(path).status_code == 404, path


def test_apt_serves_a_configured_repo_dir(web: Web, tmp_path: Path) -> None:
    """settings.repo_dir moves the repository."""
    web.settings.repo_dir = str(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere/x.txt").write_text("here")
    assert web.client.get("/apt/x.txt").data == b"here"


def test_metrics_report_queue_depth_builds_by_state_and_durations(web: Web) -> None:
    """/metrics is Prometheus text with queue depth, builds by state and a duration histogram."""
    finished_build(web, state="succeeded")
    text = web.client.get("/metrics").get_data(as_text=True)
    assert 'moddeb_queue_depth{queue="build"} 3' in text
    assert 'moddeb_builds{state="succeeded"} 1' in text
    assert 'moddeb_builds{state="queued"} 0' in text
    assert 'moddeb_kernel_jobs{state="failed"} 1' in text
    assert 'moddeb_build_duration_seconds_bucket{le="60"} 1' in text
    assert 'moddeb_build_duration_seconds_bucket{le="30"} 0' in text
    assert "moddeb_build_duration_seconds_count 1" in text
    assert "# TYPE moddeb_build_duration_seconds histogram" in text


def test_metrics_read_the_real_broker_queue_depth(web: Web) -> None:
    """Without a probe, queue depth comes from the broker (here the embedded SQLite one)."""
    web.app.extensions["moddeb"]["queue_depth"] = None
    text = web.client.get("/metrics").get_data(as_text=True)
    assert 'moddeb_queue_depth{queue="build"} 0' in text


def test_healthz(web: Web) -> None:
    """/healthz answers when the database does."""
    assert web.client.get("/healthz").data == b"ok\n"


def test_catalog_outage_during_project_creation_is_503(api: Api) -> None:
    """Creating a project whose kernels need the archive while it is down is a 503."""
    web, headers = api

    def broken(suites=None):
        raise Transient("cannot download the bookworm package index: timed out")

    web.app.extensions["moddeb"]["catalog"] = broken
    body = {"name": "x", "source_url": "https://h/x.git", "kernels": ["6.1.0-57-amd64"]}
    assert post_json(web, headers, body, "/api/v1/projects").status_code == 503
