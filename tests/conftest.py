"""Shared fixtures: settings in a throwaway home, and the real Docker engine for integration."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from builder.config import Settings, load_settings

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
# Per test session: a session only ever removes its own containers, never a parallel run's.
TEST_OWNER = f"moddeb-test-{os.getpid()}"


def _require(what: str, why: str) -> None:
    """Skip (printing why) on a developer machine; fail in CI, where every suite must run."""
    if os.environ.get("MODDEB_REQUIRE_ALL") == "1":
        pytest.fail(f"{what} is required in CI: {why}")
    pytest.skip(f"{what} unavailable: {why}")


@pytest.fixture(scope="session")
def shared_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One MODDEB_HOME per test session, so archive indexes are downloaded once."""
    return tmp_path_factory.mktemp("moddeb-home")


def settings_sharing_cache(home: Path, shared_home: Path) -> Settings:
    """Settings on a home of their own whose cache is the test session's shared one."""
    s = load_settings(env={"MODDEB_HOME": str(home)})
    home.mkdir(parents=True, exist_ok=True)
    (home / "cache").symlink_to(shared_home)
    return s


def require_vm() -> None:
    """Skip (or fail in CI) unless QEMU and a static busybox are there to boot test kernels."""
    import shutil

    from builder.errors import ModdebError
    from builder.initramfs import DEFAULT_BUSYBOX, check_static

    if not shutil.which("qemu-system-x86_64"):
        _require("qemu-system-x86_64", "apt-get install qemu-system-x86")
    try:
        check_static(DEFAULT_BUSYBOX)
    except ModdebError as exc:
        _require("a static busybox", str(exc))


@pytest.fixture
def settings(tmp_path: Path, shared_home: Path) -> Iterator[Settings]:
    """Settings with work dirs in tmp_path and caches shared across the session."""
    from builder.signing import stop_agent

    s = settings_sharing_cache(tmp_path / "home", shared_home)
    yield s
    stop_agent(s)  # a publish starts a gpg-agent for the repository key: leave none behind


@pytest.fixture(scope="session")
def runner():
    """A Runner on the real engine whose containers are labelled and removed after the run."""
    from builder.runner import Runner

    r = Runner(owner=TEST_OWNER)
    try:
        r.client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure means no engine
        _require("a Docker engine", str(exc))
    yield r
    r.remove_containers(owner=TEST_OWNER)


@pytest.fixture(scope="session")
def base_image(runner, shared_home: Path) -> str:
    """moddeb's base builder image, made with mmdebstrap on first use."""
    from builder import images

    s = load_settings(env={"MODDEB_HOME": str(shared_home)})
    return images.ensure_base(s, runner)
