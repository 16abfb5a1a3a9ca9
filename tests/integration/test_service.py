"""The build service for real: `moddeb serve`, `moddeb worker`, Redis, PostgreSQL, Docker.

The helpers at the top (Service, Proc, start_redis, ...) are shared with the browser test.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from builder.config import load_settings
from builder.store import BuildEvent, open_store
from tests.conftest import _require

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
KERNEL = "6.1.0-57-amd64"
TERMINAL = {"succeeded", "failed", "cancelled"}


def free_port() -> int:
    """A TCP port nobody listens on right now (loopback only)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def hello_tarball() -> bytes:
    """examples/hello as hello-1.0.tar.gz, the way a user would upload it."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(EXAMPLES / "hello", arcname="hello-1.0")
    return buf.getvalue()


def multipart(fields: dict[str, Any], files: dict[str, tuple[str, bytes]]) -> tuple[bytes, str]:
    """A multipart/form-data body (list values become repeated fields)."""
    boundary = "moddeb-test-boundary-7f3a"
    out = io.BytesIO()
    for name, value in fields.items():
        for v in value if isinstance(value, list) else [value]:
            out.write(
                f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'.encode()
            )
            out.write(f"{v}\r\n".encode())
    for name, (filename, data) in files.items():
        out.write(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; '
            f'filename="{filename}"\r\nContent-Type: application/gzip\r\n\r\n'.encode()
        )
        out.write(data + b"\r\n")
    out.write(f"--{boundary}--\r\n".encode())
    return out.getvalue(), f"multipart/form-data; boundary={boundary}"


def moddeb(env: dict[str, str], *args: str, stdin: str | None = None) -> str:
    """Run a service subcommand to completion and return its output."""
    proc = subprocess.run(
        [sys.executable, "-m", "builder.service_cli", *args],
        env=env,
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@dataclass
class Proc:
    """A long-running service process in its own session, with its output in a file."""

    name: str
    args: list[str]
    env: dict[str, str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        """Start it."""
        fh = open(self.log, "ab")  # noqa: SIM115 - owned by the child for its lifetime
        self.popen = subprocess.Popen(
            self.args,
            env=self.env,
            cwd=ROOT,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        fh.close()
        return self

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal its whole process group (a worker and anything it started)."""
        if self.popen is not None and self.popen.poll() is None:
            os.killpg(self.popen.pid, sig)

    def stop(self) -> None:
        """Stop it politely, then firmly."""
        if self.popen is None or self.popen.poll() is not None:
            return
        self.kill(signal.SIGTERM)
        try:
            self.popen.wait(timeout=45)
        except subprocess.TimeoutExpired:
            self.kill(signal.SIGKILL)
            self.popen.wait(timeout=10)

    def tail(self, n: int = 60) -> str:
        """The end of its output (for failure messages)."""
        if not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


@dataclass
class Service:
    """`moddeb serve` on a loopback port, plus any separate workers, and an API client."""

    env: dict[str, str]
    logs: Path
    port: int = field(default_factory=free_port)
    procs: list[Proc] = field(default_factory=list)
    token: str = ""

    @property
    def url(self) -> str:
        """Base URL."""
        return f"http://127.0.0.1:{self.port}"

    def serve(self, *extra: str) -> Proc:
        """Start `moddeb serve` and wait until it answers."""
        proc = Proc(
            "serve",
            [
                sys.executable,
                "-m",
                "builder.service_cli",
                "serve",
                "--listen",
                f"127.0.0.1:{self.port}",
                *extra,
            ],
            self.env,
            self.logs / "serve.log",
        ).start()
        self.procs.append(proc)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as resp:
                    if resp.status == 200:
                        return proc
            except OSError:
                pass
            assert proc.popen and proc.popen.poll() is None, proc.tail()
            time.sleep(0.3)
        raise AssertionError(f"serve did not answer:\n{proc.tail()}")

    def worker(self, env: dict[str, str], name: str = "worker") -> Proc:
        """Start a separate `moddeb worker` with its own environment."""
        proc = Proc(
            name,
            [sys.executable, "-m", "builder.service_cli", "worker"],
            env,
            self.logs / f"{name}.log",
        ).start()
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        """Stop every process this service started."""
        for proc in reversed(self.procs):
            proc.stop()

    def request(
        self, method: str, path: str, body: bytes | None = None, content_type: str = ""
    ) -> tuple[int, Any]:
        """Call the API with the service's token; JSON answers are decoded."""
        req = urllib.request.Request(self.url + path, data=body, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        if content_type:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                status, data, ctype = resp.status, resp.read(), resp.headers.get_content_type()
        except urllib.error.HTTPError as exc:
            status, data, ctype = exc.code, exc.read(), exc.headers.get_content_type()
        return status, json.loads(data) if ctype == "application/json" else data

    def submit_hello(self, *kernels: str) -> int:
        """Upload examples/hello for the given kernels; return the build id."""
        body, ctype = multipart(
            {"kernels": list(kernels)}, {"source": ("hello-1.0.tar.gz", hello_tarball())}
        )
        status, answer = self.request("POST", "/api/v1/builds", body, ctype)
        assert status == 202, answer
        return int(answer["id"])

    def wait(self, build_id: int, timeout: float = 600, until=None) -> dict[str, Any]:
        """Poll a build until it finishes (or `until(build)` holds)."""
        until = until or (lambda b: b["state"] in TERMINAL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status, build = self.request("GET", f"/api/v1/builds/{build_id}")
            assert status == 200, build
            if until(build):
                return build  # type: ignore[no-any-return]
            time.sleep(0.25)
        logs = "\n\n".join(f"--- {p.name}\n{p.tail()}" for p in self.procs)
        raise AssertionError(f"build {build_id} did not get there in {timeout}s: {build}\n{logs}")


def service_env(home: Path, shared_cache: Path | None, **settings: str) -> dict[str, str]:
    """The environment of a service process: its own home and, unless None, the session's
    shared caches (archive indexes, but also finished -dkms and per-kernel results)."""
    home.mkdir(parents=True, exist_ok=True)
    if shared_cache is not None and not (home / "cache").exists():
        (home / "cache").symlink_to(shared_cache)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODDEB_")}
    env["MODDEB_HOME"] = str(home)
    env["PYTHONUNBUFFERED"] = "1"
    env.update({f"MODDEB_{k.upper()}": v for k, v in settings.items()})
    return env


def start_redis(tmp: Path) -> tuple[subprocess.Popen[bytes], int]:
    """A private redis-server on a free loopback port, persisting nothing."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise FileNotFoundError("redis-server (apt-get install redis-server)")
    port = free_port()
    proc = subprocess.Popen(
        [
            exe,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp),
            "--daemonize",
            "no",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    import redis

    client = redis.Redis(host="127.0.0.1", port=port)
    for _ in range(100):
        try:
            if client.ping():
                return proc, port
        except redis.ConnectionError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("redis-server did not start")


def start_postgres(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A private PostgreSQL cluster (trust auth, loopback only); return it and its URL."""
    bins = sorted(Path("/usr/lib/postgresql").glob("*/bin"))
    if not bins:
        raise FileNotFoundError("PostgreSQL server (apt-get install postgresql)")
    bindir = bins[-1]
    data = tmp / "pgdata"
    data.mkdir()
    run_as: list[str] = []
    if os.geteuid() == 0:  # postgres refuses to run as root
        shutil.chown(tmp, "postgres")
        shutil.chown(data, "postgres")
        run_as = ["runuser", "-u", "postgres", "--"]
    subprocess.run(
        [*run_as, str(bindir / "initdb"), "-D", str(data), "-U", "moddeb", "--auth=trust"],
        check=True,
        capture_output=True,
    )
    port = free_port()
    proc = subprocess.Popen(
        [
            *run_as,
            str(bindir / "postgres"),
            "-D",
            str(data),
            "-p",
            str(port),
            "-h",
            "127.0.0.1",
            "-k",
            str(tmp),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"postgresql+psycopg://moddeb@127.0.0.1:{port}/postgres"
    import sqlalchemy

    engine = sqlalchemy.create_engine(url)
    for _ in range(100):
        try:
            with engine.connect():
                engine.dispose()
                return proc, url
        except sqlalchemy.exc.OperationalError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("postgres did not start")


# --- fixtures ------------------------------------------------------------------------------------
pytestmark = pytest.mark.docker


@pytest.fixture
def logs_dir(tmp_path: Path) -> Path:
    """Where the service processes write their output."""
    d = tmp_path / "logs"
    d.mkdir()
    return d


@pytest.fixture
def redis_url(tmp_path: Path):
    """A private Redis for this test."""
    try:
        proc, port = start_redis(tmp_path)
    except (FileNotFoundError, RuntimeError) as exc:
        _require("redis-server", str(exc))
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture
def postgres_url():
    """A private PostgreSQL cluster for this test (the multi-host database)."""
    # Not under pytest's private tmp: the postgres user must reach its data directory.
    tmp = Path(tempfile.mkdtemp(prefix="moddeb-pg-"))
    try:
        import psycopg  # noqa: F401

        proc, url = start_postgres(tmp)
    except (ImportError, FileNotFoundError, RuntimeError, subprocess.CalledProcessError) as exc:
        _require("PostgreSQL and psycopg", str(exc))
    yield url
    proc.terminate()
    proc.wait(timeout=20)
    shutil.rmtree(tmp, ignore_errors=True)


def remove_job_containers(job_id: str) -> None:
    """Containers a killed worker left behind (they carry the job's label)."""
    from builder.runner import Runner

    client = Runner().client
    for c in client.containers.list(all=True, filters={"label": f"moddeb.job={job_id}"}):
        c.remove(force=True)


def published_packages(service: Service, suite: str = "bookworm") -> list[str]:
    """Package names in the served repository's Packages index (one entry per version)."""
    with urllib.request.urlopen(
        f"{service.url}/apt/dists/{suite}/main/binary-amd64/Packages", timeout=30
    ) as resp:
        text = resp.read().decode()
    return [line.split(": ", 1)[1] for line in text.splitlines() if line.startswith("Package: ")]


def check_finished_hello(service: Service, build_id: int) -> dict[str, Any]:
    """The build succeeded for KERNEL, its packages download and are in the served repo."""
    build = service.wait(build_id)
    assert build["state"] == "succeeded", build
    assert [(k["kernel_release"], k["state"]) for k in build["kernels"]] == [(KERNEL, "succeeded")]
    assert build["published"] and build["name"] == "hello" and build["error"] is None
    status, listing = service.request("GET", f"/api/v1/builds/{build_id}/artifacts")
    names = sorted(a["filename"] for a in listing["artifacts"])
    assert names == ["hello-dkms_1.0-1_all.deb", f"hello-modules-{KERNEL}_1.0-1_amd64.deb"]
    for art in listing["artifacts"]:
        status, data = service.request("GET", art["url"])
        assert status == 200 and data.startswith(b"!<arch>\ndebian-binary")
        assert hashlib.sha256(data).hexdigest() == art["sha256"]
    packages = published_packages(service)
    assert packages.count(f"hello-modules-{KERNEL}") == 1 and "hello-dkms" in packages
    with urllib.request.urlopen(f"{service.url}/apt/dists/bookworm/InRelease", timeout=10) as r:
        assert b"-----BEGIN PGP SIGNED MESSAGE-----" in r.read()
    return build


# --- tests ---------------------------------------------------------------------------------------
def test_embedded_default_builds_hello_with_no_server_but_itself(
    tmp_path: Path, shared_home: Path, logs_dir: Path, runner, base_image
) -> None:
    """`moddeb serve` alone (SQLite state, SQLAlchemy broker, its own worker) builds, publishes
    and serves hello for one kernel; the artifacts download through the API and apt."""
    env = service_env(tmp_path / "home", shared_home)
    service = Service(env, logs_dir)
    service.token = moddeb(env, "token", "create", "integration").strip()
    try:
        serve = service.serve()
        assert "embedded queue and database" in serve.tail()
        build_id = service.submit_hello(KERNEL)
        check_finished_hello(service, build_id)
        with urllib.request.urlopen(f"{service.url}/metrics", timeout=10) as resp:
            metrics = resp.read().decode()
        assert 'moddeb_builds{state="succeeded"} 1' in metrics
        assert 'moddeb_queue_depth{queue="build"} 0' in metrics
    finally:
        service.stop()
    assert (tmp_path / "home/state/broker.sqlite").is_file()


def test_redis_and_postgres_with_a_separate_worker_sharing_no_disk(
    tmp_path: Path,
    shared_home: Path,
    logs_dir: Path,
    redis_url: str,
    postgres_url: str,
    runner,
    base_image,
) -> None:
    """With MODDEB_BROKER_URL (Redis) and MODDEB_DATABASE_URL (PostgreSQL), `moddeb serve`
    runs no build worker; a `moddeb worker` with a different home does the build, and its
    packages still reach the web host's repository through the database."""
    shared = {"broker_url": redis_url, "database_url": postgres_url}
    web_env = service_env(tmp_path / "web-home", shared_home, **shared)
    worker_env = service_env(tmp_path / "worker-home", shared_home, **shared)
    service = Service(web_env, logs_dir)
    service.token = moddeb(web_env, "token", "create", "integration").strip()
    try:
        serve = service.serve()
        assert "embedded" not in serve.tail()
        build_id = service.submit_hello(KERNEL)
        time.sleep(3)
        status, build = service.request("GET", f"/api/v1/builds/{build_id}")
        assert build["state"] == "queued", "nothing but a separate worker may take builds"
        service.worker(worker_env)
        check_finished_hello(service, build_id)
    finally:
        service.stop()
    assert not (tmp_path / "worker-home/repo").exists()  # published on the web host only
    assert (tmp_path / "web-home/repo/dists/bookworm").exists()


def test_a_worker_killed_mid_build_has_its_work_rerun_and_published_once(
    tmp_path: Path, shared_home: Path, logs_dir: Path, redis_url: str, runner, base_image
) -> None:
    """SIGKILL a worker while it builds a kernel: after a new worker starts, the build
    completes, and the repository receives its packages exactly once."""
    shared = {
        "broker_url": redis_url,
        "database_url": f"sqlite:///{tmp_path}/shared.sqlite",
        # Short, so the test need not wait an hour for Redis to re-deliver; about as long
        # as hello's -dkms stage takes here, so early re-deliveries (which must find the
        # job held and step aside) happen too.
        "visibility_timeout": "30",
    }
    web_env = service_env(tmp_path / "web-home", shared_home, **shared)
    service = Service(web_env, logs_dir)
    service.token = moddeb(web_env, "token", "create", "integration").strip()
    job_id = ""
    try:
        service.serve()
        # Workers with caches of their own: a cached result would finish before the kill.
        first = service.worker(service_env(tmp_path / "w1", None, **shared), "worker-1")
        build_id = service.submit_hello(KERNEL)
        running = service.wait(
            build_id,
            timeout=600,
            until=lambda b: (
                b["state"] in TERMINAL or any(k["state"] == "running" for k in b["kernels"])
            ),
        )
        assert running["state"] == "running", (
            f"the build ended before it could be killed: {running}"
        )
        job_id = running["job_id"]
        first.kill(signal.SIGKILL)
        first.popen.wait(timeout=10)
        killed_at = time.monotonic()
        status, build = service.request("GET", f"/api/v1/builds/{build_id}")
        assert build["state"] == "running"
        service.worker(service_env(tmp_path / "w2", None, **shared), "worker-2")
        check_finished_hello(service, build_id)
        assert time.monotonic() - killed_at < 300
    finally:
        service.stop()
        if job_id:
            remove_job_containers(job_id)
    settings = load_settings(
        env={
            "MODDEB_HOME": str(tmp_path / "web-home"),
            **{f"MODDEB_{k.upper()}": v for k, v in shared.items()},
        }
    )
    with open_store(settings).session() as s:
        kinds = [e.kind for e in s.query(BuildEvent).filter_by(build_id=build_id)]
    assert kinds.count("published") == 1, kinds
    assert kinds.count("succeeded") == 1
