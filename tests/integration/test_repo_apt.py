"""A real apt client in a clean container installs from the signed repository over HTTP."""

from __future__ import annotations

import functools
import io
import os
import signal
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import docker.errors
import pytest

from builder import repo, signing
from builder.config import Settings
from tests.unit.test_repo import make_deb

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]
KEYRING = "/usr/share/keyrings/moddeb-archive-keyring.gpg"


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib name
        pass


@contextmanager
def serve(directory: Path) -> Iterator[str]:
    """Serve a directory over HTTP on loopback, as any static web server would."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class AptClient:
    """A throwaway container from the base image, on the host network, to run apt in."""

    def __init__(self, runner, image: str) -> None:
        self.container = runner.client.containers.run(
            image,
            ["sleep", "infinity"],
            detach=True,
            network_mode="host",
            # An owner of its own: another test session's cleanup of the shared test
            # owner must not remove this container while it is in use.
            labels={
                **runner.labels(**{"moddeb.step": "test-apt-client"}),
                "moddeb.owner": f"{runner.owner}-apt-{os.getpid()}",
            },
        )

    def put(self, path: str, data: bytes) -> None:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
        self.container.put_archive("/", buf.getvalue())

    def sh(self, script: str) -> tuple[int, str]:
        rc, out = self.container.exec_run(
            ["/bin/sh", "-c", script], environment={"DEBIAN_FRONTEND": "noninteractive"}
        )
        return rc, out.decode(errors="replace")

    def use_repository(self, url: str, keyring: bytes, suite: str = "bookworm") -> None:
        """Only our repository, verified by Signed-By: never trusted=yes."""
        self.put(KEYRING, keyring)
        sources = (
            f"Types: deb\nURIs: {url}\nSuites: {suite}\nComponents: main\nSigned-By: {KEYRING}\n"
        )
        rc, out = self.sh("rm -f /etc/apt/sources.list /etc/apt/sources.list.d/*")
        assert rc == 0, out
        self.put("/etc/apt/sources.list.d/moddeb.sources", sources.encode())

    def remove(self) -> None:
        try:
            self.container.remove(force=True)
        except docker.errors.NotFound:
            pass


@pytest.fixture
def apt_client(runner, base_image):
    client = AptClient(runner, base_image)
    yield client
    client.remove()


@pytest.fixture
def rs(settings: Settings):
    yield settings
    signing.stop_agent(settings)


def module_deb(out: Path, kernel_release: str, version: str = "0.1-1") -> Path:
    """A synthetic NAME-modules-KVER package shipping a (dummy) testmod.ko for that kernel."""
    ko = f"lib/modules/{kernel_release}/updates/dkms/testmod.ko"
    return make_deb(
        out,
        f"testmod-modules-{kernel_release}",
        version,
        source="testmod",
        files={ko: b"\x7fELF dummy module for " + kernel_release.encode()},
    )


def _installed(client: AptClient) -> set[str]:
    rc, out = client.sh("dpkg-query -W -f '${Package}=${Version} ${db:Status-Status}\\n'")
    assert rc == 0, out
    return {line.split()[0] for line in out.splitlines() if line.endswith(" installed")}


def test_apt_installs_a_module_package_and_follows_the_newest_abi(
    rs: Settings, apt_client: AptClient, tmp_path: Path
) -> None:
    """apt-get install NAME-modules-KVER puts the .ko in place; NAME-modules-FLAVOUR follows newer ABIs."""
    root = repo.repo_root(rs)
    repo.publish(rs, "bookworm", [module_deb(tmp_path, "6.1.0-57-amd64")])
    with serve(root) as url:
        apt_client.use_repository(url, (root / signing.KEYRING_NAME).read_bytes())
        rc, out = apt_client.sh("apt-get update 2>&1")
        assert rc == 0 and "W:" not in out and "E:" not in out, out
        print(out)
        rc, out = apt_client.sh("apt-get install -y testmod-modules-6.1.0-57-amd64 2>&1")
        assert rc == 0, out
        rc, out = apt_client.sh("cat /lib/modules/6.1.0-57-amd64/updates/dkms/testmod.ko")
        assert rc == 0 and "dummy module for 6.1.0-57-amd64" in out, out

        # A newer ABI is published: the flavour metapackage now brings that one.
        repo.publish(rs, "bookworm", [module_deb(tmp_path, "6.12.117+deb12-amd64")])
        rc, out = apt_client.sh(
            "apt-get update 2>&1 && apt-get install -y testmod-modules-amd64 2>&1"
        )
        assert rc == 0, out
        installed = _installed(apt_client)
        assert "testmod-modules-amd64=6.12.117+deb12-1" in installed
        assert "testmod-modules-6.12.117+deb12-amd64=0.1-1" in installed
        rc, out = apt_client.sh("test -f /lib/modules/6.12.117+deb12-amd64/updates/dkms/testmod.ko")
        assert rc == 0

        # A publisher killed after signing leaves the repository apt already trusts usable.
        env = {
            "MODDEB_HOME": str(rs.home),
            "MODDEB_REPO_FAULT": "signed",
            "PYTHONPATH": str(ROOT),
            "PATH": "/usr/bin:/bin",
        }
        code = "import sys; from builder import repo; from builder.config import load_settings; "
        code += "repo.publish(load_settings(), 'bookworm', sys.argv[1:])"
        deb = module_deb(tmp_path, "6.12.118+deb12-amd64")
        proc = subprocess.run([sys.executable, "-c", code, str(deb)], env=env, cwd=ROOT)
        assert proc.returncode == -signal.SIGKILL
        rc, out = apt_client.sh("apt-get update 2>&1")
        assert rc == 0 and "W:" not in out and "E:" not in out, out
        assert repo.open_repository(rs).check(deep=True) == []


def test_apt_refuses_a_tampered_inrelease(
    rs: Settings, apt_client: AptClient, tmp_path: Path
) -> None:
    """Changing one byte of a hash in InRelease makes apt-get update fail on the signature."""
    root = repo.repo_root(rs)
    repo.publish(rs, "bookworm", [module_deb(tmp_path, "6.1.0-57-amd64")])
    inrelease = root / "dists/bookworm/InRelease"
    lines = inrelease.read_text().splitlines(keepends=True)
    i = next(n for n, line in enumerate(lines) if line.startswith(" ") and "Packages" in line)
    digit = lines[i][1]
    lines[i] = " " + ("0" if digit != "0" else "1") + lines[i][2:]
    inrelease.write_text("".join(lines))
    with serve(root) as url:
        apt_client.use_repository(url, (root / signing.KEYRING_NAME).read_bytes())
        rc, out = apt_client.sh("apt-get update 2>&1")
        print(out)
        assert rc != 0, out
        assert "BADSIG" in out or "signatures were invalid" in out, out
        rc, out = apt_client.sh("apt-get install -y testmod-modules-6.1.0-57-amd64 2>&1")
        assert rc != 0, out
