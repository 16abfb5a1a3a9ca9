"""The operator UI through Flask's test client: login, CSRF, build form, build page, projects.

Fixtures here (`web`, `logged_in`, `api`) are shared by the other test_web_* files. Builds
are queued into a recording fake; no broker, worker or Docker is involved.
"""

from __future__ import annotations

import functools
import hashlib
import io
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from werkzeug.security import generate_password_hash

from builder.config import Settings, load_settings
from builder.errors import InvalidInput, Transient
from builder.kernels import KernelInfo
from builder.store import Blob, Build, BuildEvent, KernelJob, User, open_store
from web import create_app
from web.auth import create_token

CATALOG = [
    KernelInfo("6.1.0-56-amd64", "amd64", "bookworm", "6.1.153-1"),
    KernelInfo("6.1.0-57-amd64", "amd64", "bookworm-security", "6.1.158-1"),
    KernelInfo("6.1.0-57-cloud-amd64", "cloud-amd64", "bookworm-security", "6.1.158-1"),
    KernelInfo("6.12.117+deb12-amd64", "amd64", "bookworm-security", "6.12.117-1~deb12u1"),
]
PASSWORD = "correct horse battery"


@dataclass
class Queue:
    """Records tasks sent by name; can be made to fail like a broker that is down."""

    sent: list[tuple[str, list[Any]]] = field(default_factory=list)
    down: bool = False

    def __call__(self, name: str, args: list[Any]) -> None:
        if self.down:
            raise Transient("the build queue is unavailable: connection refused")
        self.sent.append((name, list(args)))

    def builds(self) -> list[int]:
        """Build ids queued with moddeb.build."""
        return [args[0] for name, args in self.sent if name == "moddeb.build"]


@dataclass
class Web:
    """An app, its client, its queue and its settings."""

    app: Flask
    client: FlaskClient
    queue: Queue
    settings: Settings
    catalog_calls: list[Any]

    def session(self):
        """A database session on the app's store."""
        return open_store(self.settings).session()


@functools.cache
def alice_hash() -> str:
    """alice's password hash, made once: hashing is slow by design."""
    return generate_password_hash(PASSWORD)


def fake_catalog(calls: list[Any]):
    def catalog(suites: list[str] | None = None) -> list[KernelInfo]:
        calls.append(suites)
        if suites:
            if suites[0] == "unreachable":
                raise Transient("cannot download the unreachable package index: timed out")
            known = {k.suite for k in CATALOG}
            if suites[0] not in known:
                raise InvalidInput(f"unknown suite {suites[0]!r}")
            return [k for k in CATALOG if k.suite in suites]
        return list(CATALOG)

    return catalog


@pytest.fixture(name="web")
def web_fixture(tmp_path: Path) -> Web:
    """A fresh app on a throwaway home with a fake queue and a fixed kernel catalog."""
    settings = load_settings(
        env={"MODDEB_HOME": str(tmp_path / "home"), "MODDEB_MAX_UPLOAD_BYTES": "200000"}
    )
    queue, calls = Queue(), []
    app = create_app(
        {
            "TESTING": True,
            "MODDEB_SETTINGS": settings,
            "MODDEB_ENQUEUE": queue,
            "MODDEB_CATALOG": fake_catalog(calls),
            "MODDEB_QUEUE_DEPTH": lambda q: {"build": 3, "publish": 0}[q],
        }
    )
    with open_store(settings).session() as s:
        s.add(User(name="alice", password_hash=alice_hash()))
    return Web(app, app.test_client(), queue, settings, calls)


def csrf_of(client: FlaskClient, path: str = "/login") -> str:
    """The CSRF token a page's form carries."""
    html = client.get(path).get_data(as_text=True)
    match = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert match, f"no csrf token on {path}"
    return match.group(1)


@pytest.fixture(name="logged_in")
def logged_in_fixture(web: Web) -> Web:
    """The same app with alice logged in."""
    token = csrf_of(web.client)
    resp = web.client.post(
        "/login", data={"csrf_token": token, "name": "alice", "password": PASSWORD}
    )
    assert resp.status_code == 302
    return web


@pytest.fixture(name="api")
def api_fixture(web: Web) -> tuple[Web, dict[str, str]]:
    """The app and the headers of a valid API token."""
    token = create_token(open_store(web.settings), "ci")
    return web, {"Authorization": f"Bearer {token}"}


def tarball(name: str = "hello-1.0", size: int = 0) -> bytes:
    """A small source tarball (optionally padded to about `size` bytes)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = b"obj-m := hello.o\n" + b"#" * size
        info = tarfile.TarInfo(f"{name}/Kbuild")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def finished_build(web: Web, state: str = "succeeded", published: bool = True) -> int:
    """A build as the workers would leave it: kernels, artifacts, events, logs."""
    from builder.store import now

    with web.session() as s:
        b = Build(
            job_id="20260101-000000-abcdef",
            state=state,
            trigger="api",
            requested_by="token:ci",
            source_kind="upload",
            source="hello-1.0.tar.gz",
            name="hello",
            version="1.0-1",
            modules=["hello"],
            log="dpkg-buildpackage: info: source package hello-dkms\n",
            started_at=now() - 42,
            finished_at=now(),
            dkms_done=1,
            published_at=now() if published else None,
        )
        if state == "failed":
            b.error_code, b.error = "build-failed", "hello 1.0-1 failed to build for 6.12"
        s.add(b)
        s.flush()
        s.add(
            KernelJob(
                build_id=b.id,
                kernel_release="6.1.0-57-amd64",
                flavour="amd64",
                suite="bookworm-security",
                state="succeeded",
                duration=3.5,
                log="dkms build ok\n",
            )
        )
        s.add(
            KernelJob(
                build_id=b.id,
                kernel_release="6.12.117+deb12-amd64",
                flavour="amd64",
                suite="bookworm-security",
                state="failed",
                diagnosis="implicit declaration of 'strlcpy' (hello.c:42)",
                log="hello.c:42: error: implicit declaration of function 'strlcpy'\n",
            )
        )
        deb = b"!<arch>\nfake deb"
        for kind, kver, fname in (
            ("source", "", "hello-1.0.tar.gz"),
            ("dkms", "", "hello-dkms_1.0-1_all.deb"),
            ("module", "6.1.0-57-amd64", "hello-modules-6.1.0-57-amd64_1.0-1_amd64.deb"),
        ):
            s.add(
                Blob(
                    build_id=b.id,
                    kind=kind,
                    kernel_release=kver,
                    filename=fname,
                    sha256=hashlib.sha256(deb).hexdigest(),
                    size=len(deb),
                    data=deb,
                )
            )
        s.add(BuildEvent(build_id=b.id, kind="queued", message="queued by token:ci (api)"))
        s.add(BuildEvent(build_id=b.id, kind="published", message="published 2 package(s)"))
        s.flush()
        return b.id


# --- login and CSRF --------------------------------------------------------------------------
def test_pages_need_a_login(web: Web) -> None:
    """An anonymous visitor is sent to the login page, remembering where they were going."""
    for path in ("/", "/builds", "/builds/new", "/builds/1", "/projects", "/projects/x"):
        resp = web.client.get(path)
        assert resp.status_code == 302, path
        assert "/login" in resp.headers["Location"]


def test_login_refuses_a_post_without_its_csrf_token(web: Web) -> None:
    """A login form posted without (or with a forged) CSRF token is refused."""
    web.client.get("/login")
    resp = web.client.post("/login", data={"name": "alice", "password": PASSWORD})
    assert resp.status_code == 400
    assert "form has expired" in resp.get_data(as_text=True)
    resp = web.client.post(
        "/login", data={"csrf_token": "forged", "name": "alice", "password": PASSWORD}
    )
    assert resp.status_code == 400


def test_login_refuses_a_wrong_password_and_an_unknown_user(web: Web) -> None:
    """Wrong password and unknown user get the same 401 answer."""
    for name, password in (("alice", "wrong"), ("mallory", PASSWORD)):
        token = csrf_of(web.client)
        resp = web.client.post(
            "/login", data={"csrf_token": token, "name": name, "password": password}
        )
        assert resp.status_code == 401
        assert "Wrong user name or password" in resp.get_data(as_text=True)
    assert web.client.get("/builds").status_code == 302


def test_login_returns_to_the_page_asked_for_but_never_off_site(web: Web) -> None:
    """`next` is honoured for local paths and ignored for other sites."""
    token = csrf_of(web.client)
    resp = web.client.post(
        "/login?next=/projects",
        data={"csrf_token": token, "name": "alice", "password": PASSWORD},
    )
    assert resp.headers["Location"].endswith("/projects")
    web.client.post("/logout", data={"csrf_token": csrf_of(web.client, "/projects")})
    token = csrf_of(web.client)
    resp = web.client.post(
        "/login?next=//evil.example/x",
        data={"csrf_token": token, "name": "alice", "password": PASSWORD},
    )
    assert resp.headers["Location"].endswith("/builds")


def test_logout_needs_csrf_and_ends_the_session(logged_in: Web) -> None:
    """Logging out is a CSRF-protected post; afterwards pages need a login again."""
    assert logged_in.client.post("/logout").status_code == 400
    assert logged_in.client.get("/builds").status_code == 200
    token = csrf_of(logged_in.client, "/builds")
    assert logged_in.client.post("/logout", data={"csrf_token": token}).status_code == 302
    assert logged_in.client.get("/builds").status_code == 302


# --- the new-build form --------------------------------------------------------------------
def test_new_build_form_offers_the_catalog_and_the_choices(logged_in: Web) -> None:
    """The form lists every catalog ABI, 'newest of each flavour' and the suites."""
    html = logged_in.client.get("/builds/new").get_data(as_text=True)
    for k in CATALOG:
        assert f'value="{k.kernel_release}"' in html
    assert 'name="newest"' in html
    assert 'value="bookworm-security"' in html
    assert 'type="file" name="source"' in html


def post_form(web: Web, data: dict[str, Any], path: str = "/builds/new"):
    """Post a form with a valid CSRF token."""
    data = {"csrf_token": csrf_of(web.client, path), **data}
    return web.client.post(path, data=data, content_type="multipart/form-data")


def test_uploading_a_tarball_queues_a_build_for_the_chosen_kernels(logged_in: Web) -> None:
    """An upload with two kernels becomes one queued build with two kernel jobs."""
    resp = post_form(
        logged_in,
        {
            "source_kind": "upload",
            "source": (io.BytesIO(tarball()), "hello-1.0.tar.gz"),
            "kernels": ["6.1.0-57-amd64", "6.12.117+deb12-amd64"],
        },
    )
    assert resp.status_code == 302
    (build_id,) = logged_in.queue.builds()
    assert resp.headers["Location"].endswith(f"/builds/{build_id}")
    with logged_in.session() as s:
        b = s.get(Build, build_id)
        assert (b.state, b.trigger, b.requested_by, b.source) == (
            "queued",
            "ui",
            "alice",
            "hello-1.0.tar.gz",
        )
        assert [k.kernel_release for k in b.kernels] == ["6.1.0-57-amd64", "6.12.117+deb12-amd64"]
        assert b.kernels[0].suite == "bookworm-security"
        assert [x.kind for x in b.blobs] == ["source"]


def test_newest_of_each_flavour_and_a_whole_suite_are_resolved(logged_in: Web) -> None:
    """'newest' picks one ABI per flavour; a suite adds every ABI in it, without duplicates."""
    post_form(
        logged_in,
        {"source_kind": "git", "git_url": "https://git.example.org/hello.git", "newest": "1"},
    )
    post_form(
        logged_in,
        {
            "source_kind": "git",
            "git_url": "https://git.example.org/hello.git",
            "ref": "v1.0",
            "kernels": ["6.1.0-57-amd64"],
            "all_in_suite": "bookworm-security",
        },
    )
    newest, suite = logged_in.queue.builds()
    with logged_in.session() as s:
        got = sorted(k.kernel_release for k in s.get(Build, newest).kernels)
        assert got == ["6.1.0-57-cloud-amd64", "6.12.117+deb12-amd64"]
        b = s.get(Build, suite)
        assert b.ref == "v1.0"
        assert sorted(k.kernel_release for k in b.kernels) == [
            "6.1.0-57-amd64",
            "6.1.0-57-cloud-amd64",
            "6.12.117+deb12-amd64",
        ]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"source_kind": "upload"}, "choose a source tarball"),
        ({"source_kind": "git"}, "enter a git URL"),
        ({"source_kind": ""}, "choose where the source comes from"),
        ({"source_kind": "git", "git_url": "file:///etc"}, "not a remote git URL"),
        ({"source_kind": "git", "git_url": "/srv/src/hello"}, "not a remote git URL"),
        (
            {"source_kind": "git", "git_url": "https://h/x.git", "ref": "--upload-pack=x"},
            "is not a git ref",
        ),
        (
            {"source_kind": "git", "git_url": "https://h/x.git", "kernels": ["6.1.0-99-amd64"]},
            "closest: 6.1.0-57-amd64",
        ),
        (
            {"source_kind": "git", "git_url": "https://h/x.git", "kernels": ["../../etc"]},
            "is not a kernel release",
        ),
        (
            {"source_kind": "git", "git_url": "https://h/x.git", "all_in_suite": "sid-nope"},
            "unknown suite",
        ),
        ({"source_kind": "project", "project": "nope"}, "choose a registered project"),
        (
            {"source_kind": "upload", "source": (io.BytesIO(b"x"), "hello.zip")},
            "is not a tarball name",
        ),
        (
            {"source_kind": "upload", "source": (io.BytesIO(b""), "hello-1.0.tar.gz")},
            "is empty",
        ),
    ],
)
def test_the_build_form_refuses_bad_input_and_queues_nothing(
    logged_in: Web, data: dict[str, Any], message: str
) -> None:
    """Every bad form answers 400 with the problem named on the page; nothing is queued."""
    resp = post_form(logged_in, data)
    assert resp.status_code == 400
    assert message in resp.get_data(as_text=True).replace("&#39;", "'")
    assert logged_in.queue.sent == []
    with logged_in.session() as s:
        assert s.query(Build).count() == 0


def test_the_build_form_refuses_a_post_without_csrf(logged_in: Web) -> None:
    """A cross-site post (no CSRF token) queues nothing."""
    resp = logged_in.client.post(
        "/builds/new",
        data={"source_kind": "git", "git_url": "https://git.example.org/hello.git"},
    )
    assert resp.status_code == 400
    assert logged_in.queue.sent == []


def test_the_build_form_refuses_an_oversized_upload(logged_in: Web) -> None:
    """An upload over max_upload_bytes is refused with 413."""
    token = csrf_of(logged_in.client, "/builds/new")
    resp = logged_in.client.post(
        "/builds/new",
        data={
            "csrf_token": token,
            "source_kind": "upload",
            "source": (io.BytesIO(b"\0" * 300_000), "hello-1.0.tar"),
        },
        content_type="multipart/form-data",
    )
    assert resp.status_code == 413
    assert logged_in.queue.sent == []


def test_the_build_form_reports_a_broken_queue(logged_in: Web) -> None:
    """When the broker is down the operator is told so (503) and the build is marked failed."""
    logged_in.queue.down = True
    resp = post_form(logged_in, {"source_kind": "git", "git_url": "https://h/hello.git"})
    assert resp.status_code == 503
    assert "queue is unavailable" in resp.get_data(as_text=True)
    with logged_in.session() as s:
        (b,) = s.query(Build).all()
        assert (b.state, b.error_code) == ("failed", "transient")


def test_the_form_still_works_when_the_catalog_is_unreachable(logged_in: Web) -> None:
    """An archive outage is shown on the form instead of breaking it."""

    def broken(suites=None):
        raise Transient("cannot download the bookworm package index: timed out")

    logged_in.app.extensions["moddeb"]["catalog"] = broken
    html = logged_in.client.get("/builds/new").get_data(as_text=True)
    assert "kernel catalog is unavailable" in html
    resp = post_form(logged_in, {"source_kind": "git", "git_url": "https://h/x.git", "newest": "1"})
    assert resp.status_code == 503


# --- the build page --------------------------------------------------------------------------
def test_build_page_shows_matrix_diagnosis_artifacts_and_install_line(logged_in: Web) -> None:
    """The page colours each kernel by state, shows its diagnosis, links artifacts, and the apt line."""
    build_id = finished_build(logged_in, state="failed")
    html = logged_in.client.get(f"/builds/{build_id}").get_data(as_text=True)
    assert 'class="cell succeeded"' in html
    assert 'class="cell failed"' in html
    assert "implicit declaration of &#39;strlcpy&#39; (hello.c:42)" in html
    assert f"/builds/{build_id}/artifacts/hello-dkms_1.0-1_all.deb" in html
    assert "hello-1.0.tar.gz</a>" not in html  # the uploaded source is not an artifact
    assert "http://localhost/apt bookworm main" in html
    assert "apt-get install hello-modules-$(uname -r)" in html
    assert "[build-failed]" in html


def test_install_line_waits_for_publishing_and_uses_public_url(logged_in: Web) -> None:
    """No install line before publishing; afterwards it names the configured public URL."""
    build_id = finished_build(logged_in, state="running", published=False)
    html = logged_in.client.get(f"/builds/{build_id}").get_data(as_text=True)
    assert "appear once the packages are published" in html
    logged_in.settings.public_url = "https://builds.example.org/"
    build_id = finished_build_again(logged_in)
    html = logged_in.client.get(f"/builds/{build_id}").get_data(as_text=True)
    assert "deb [signed-by=/usr/share/keyrings/moddeb-archive-keyring.gpg] " in html
    assert "https://builds.example.org/apt bookworm main" in html


def finished_build_again(web: Web) -> int:
    """A second finished build (job ids must differ)."""
    with web.session() as s:
        s.query(Build).update({Build.job_id: Build.job_id + "-old"})
    return finished_build(web)


def test_status_endpoint_feeds_the_live_page(logged_in: Web) -> None:
    """The polled status has the state, kernel cells, artifacts and only new log lines."""
    build_id = finished_build(logged_in)
    status = logged_in.client.get(f"/builds/{build_id}/status").get_json()
    assert status["state"] == "succeeded" and status["terminal"]
    assert [k["state"] for k in status["kernels"]] == ["succeeded", "failed"]
    assert [e["kind"] for e in status["events"]] == ["queued", "published"]
    last = status["events"][-1]["id"]
    again = logged_in.client.get(f"/builds/{build_id}/status?after={last}").get_json()
    assert again["events"] == []
    assert logged_in.client.get(f"/builds/{build_id}/status?after=x").status_code == 200
    assert len(status["artifacts"]) == 2


def test_logs_of_the_dkms_stage_and_of_each_kernel(logged_in: Web) -> None:
    """The log endpoint serves the -dkms log, a kernel's log, and 404 for an unknown kernel."""
    build_id = finished_build(logged_in)
    c = logged_in.client
    assert "source package hello-dkms" in c.get(f"/builds/{build_id}/log").get_data(as_text=True)
    text = c.get(f"/builds/{build_id}/log?kernel=6.12.117%2Bdeb12-amd64").get_data(as_text=True)
    assert "strlcpy" in text
    assert c.get(f"/builds/{build_id}/log?kernel=9.9").status_code == 404


def test_artifacts_download_and_unknown_ones_are_404(logged_in: Web) -> None:
    """A .deb downloads from the database; unknown names, builds and the source are 404."""
    build_id = finished_build(logged_in)
    c = logged_in.client
    resp = c.get(f"/builds/{build_id}/artifacts/hello-dkms_1.0-1_all.deb")
    assert resp.status_code == 200 and resp.data == b"!<arch>\nfake deb"
    assert c.get(f"/builds/{build_id}/artifacts/hello-1.0.tar.gz").status_code == 404
    assert c.get(f"/builds/{build_id}/artifacts/nope.deb").status_code == 404
    assert c.get("/builds/999/artifacts/x.deb").status_code == 404
    assert c.get("/builds/999").status_code == 404
    assert c.get("/builds/99999999999999999999").status_code == 404


def test_cancel_and_rerun_from_the_page(logged_in: Web) -> None:
    """Cancel stops a queued build; re-run queues a copy with the same source and kernels."""
    post_form(
        logged_in,
        {
            "source_kind": "upload",
            "source": (io.BytesIO(tarball()), "hello-1.0.tar.gz"),
            "kernels": ["6.1.0-57-amd64"],
        },
    )
    (build_id,) = logged_in.queue.builds()
    page = f"/builds/{build_id}"
    assert logged_in.client.post(f"{page}/cancel").status_code == 400  # no CSRF
    resp = logged_in.client.post(
        f"{page}/cancel", data={"csrf_token": csrf_of(logged_in.client, page)}
    )
    assert resp.status_code == 302
    with logged_in.session() as s:
        b = s.get(Build, build_id)
        assert b.state == "cancelled" and b.kernels[0].state == "cancelled"
    resp = logged_in.client.post(
        f"{page}/cancel", data={"csrf_token": csrf_of(logged_in.client, page)}
    )
    assert "already cancelled" in logged_in.client.get(resp.headers["Location"]).get_data(
        as_text=True
    )
    resp = logged_in.client.post(
        f"{page}/rerun", data={"csrf_token": csrf_of(logged_in.client, page)}
    )
    assert resp.status_code == 302
    first, second = logged_in.queue.builds()
    with logged_in.session() as s:
        b = s.get(Build, second)
        assert b.state == "queued" and [k.kernel_release for k in b.kernels] == ["6.1.0-57-amd64"]
        assert [x.filename for x in b.blobs] == ["hello-1.0.tar.gz"]
    assert (
        logged_in.client.post(
            "/builds/999/rerun", data={"csrf_token": csrf_of(logged_in.client, page)}
        ).status_code
        == 404
    )


def test_builds_list_filters_by_state_project_and_trigger(logged_in: Web) -> None:
    """The list shows builds and narrows them by state, project and trigger."""
    finished_build(logged_in, state="failed")
    post_form(logged_in, {"source_kind": "git", "git_url": "https://h/hello.git"})
    c = logged_in.client
    html = c.get("/builds").get_data(as_text=True)
    assert html.count('<span class="state') == 2
    assert c.get("/builds?state=failed").get_data(as_text=True).count('<span class="state') == 1
    assert c.get("/builds?trigger=ui").get_data(as_text=True).count('<span class="state') == 1
    assert c.get("/builds?project=none").get_data(as_text=True).count('<span class="state') == 0
    assert c.get("/builds?state=bogus").status_code == 200


# --- projects --------------------------------------------------------------------------------
def make_project(web: Web, name: str = "hello", **extra: Any):
    """Register a project through the form."""
    data = {"name": name, "source_url": "https://git.example.org/hello.git", "ref": "main"}
    data.update(extra)
    return post_form(web, data, "/projects/new")


def test_registering_a_project_shows_its_secret_hooks_and_defaults(logged_in: Web) -> None:
    """A new project page shows the webhook URLs, the secret and its default kernels."""
    resp = make_project(logged_in, kernels=["6.1.0-57-amd64"], newest="1")
    assert resp.status_code == 302 and resp.headers["Location"].endswith("/projects/hello")
    html = logged_in.client.get("/projects/hello").get_data(as_text=True)
    assert "http://localhost/hooks/github/hello" in html
    assert "http://localhost/hooks/gitlab/hello" in html
    assert re.search(r'<code id="secret">[\w-]{40,}</code>', html)
    assert '<option value="6.1.0-57-amd64" selected>' in html
    assert "hello" in logged_in.client.get("/projects").get_data(as_text=True)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"name": "Bad Name"}, "a project name is"),
        ({"source_url": "file:///srv"}, "not a remote git URL"),
        ({"kernels": ["7.0-nope"]}, "the archive has no kernel"),
    ],
)
def test_project_form_refuses_bad_input(
    logged_in: Web, extra: dict[str, str], message: str
) -> None:
    """Bad names, local URLs and unknown kernels are refused with the problem named."""
    resp = make_project(logged_in, **extra)
    assert resp.status_code == 400
    assert message in resp.get_data(as_text=True)


def test_project_names_are_unique(logged_in: Web) -> None:
    """A second project of the same name is refused."""
    make_project(logged_in)
    resp = make_project(logged_in)
    assert resp.status_code == 400 and "already exists" in resp.get_data(as_text=True)


def test_project_settings_edit_secret_rotation_and_history(logged_in: Web) -> None:
    """Editing saves URL, ref and kernels; a new secret replaces the old; builds are listed."""
    make_project(logged_in)
    page = "/projects/hello"
    old = re.search(r'id="secret">([^<]+)<', logged_in.client.get(page).get_data(as_text=True))[1]
    resp = post_form(
        logged_in,
        {
            "source_url": "https://git.example.org/hello2.git",
            "ref": "v2",
            "all_in_suite": "bookworm",
        },
        page,
    )
    assert resp.status_code == 200 and "Saved." in resp.get_data(as_text=True)
    resp = post_form(logged_in, {"source_url": "file:///x"}, page)
    assert resp.status_code == 400
    post_form(logged_in, {}, f"{page}/secret")
    html = logged_in.client.get(page).get_data(as_text=True)
    new = re.search(r'id="secret">([^<]+)<', html)[1]
    assert new != old and "hello2.git" in html
    post_form(logged_in, {"source_kind": "project", "project": "hello"})
    (build_id,) = logged_in.queue.builds()
    with logged_in.session() as s:
        b = s.get(Build, build_id)
        assert (b.source, b.ref) == ("https://git.example.org/hello2.git", "v2")
        assert [k.kernel_release for k in b.kernels] == ["6.1.0-56-amd64"]
    assert f"/builds/{build_id}" in logged_in.client.get(page).get_data(as_text=True)
    assert logged_in.client.get("/projects/nope").status_code == 404
    assert post_form(logged_in, {}, "/projects/hello").status_code == 400
    resp = logged_in.client.post(
        "/projects/nope/secret", data={"csrf_token": csrf_of(logged_in.client, page)}
    )
    assert resp.status_code == 404


def test_error_pages_are_html_for_browsers(logged_in: Web) -> None:
    """A browser hitting a missing page gets an HTML error page, not JSON."""
    resp = logged_in.client.get("/no/such/page", headers={"Accept": "text/html"})
    assert resp.status_code == 404 and resp.mimetype == "text/html"
