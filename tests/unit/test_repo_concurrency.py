"""Publishers at the same time, publishers killed part-way, readers during a publish."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from debian import deb822

from builder import repo, signing
from builder.config import Settings
from tests.unit.test_repo import make_deb, names

ROOT = Path(__file__).resolve().parents[2]
CHECKPOINTS = [
    "locked",
    "pool-written",
    "indexes-written",
    "signed",
    "state-written",
    "switched",
    "pending-deleted",
]
PUBLISHER = """
import sys
from builder import repo
from builder.config import load_settings
repo.publish(load_settings(), sys.argv[1], sys.argv[2:])
"""


@pytest.fixture
def rs(settings: Settings):
    """Settings for a repository in the test's home; its gpg-agent is stopped afterwards."""
    signing.ensure_key(settings)  # made once here, not raced for by every worker
    yield settings
    signing.stop_agent(settings)


def _env(settings: Settings, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODDEB_")}
    env.update(
        MODDEB_HOME=str(settings.home),
        MODDEB_REPO_KEEP_VERSIONS=str(settings.repo_keep_versions),
        PYTHONPATH=str(ROOT),
        **extra,
    )
    return env


def _spawn(settings: Settings, suite: str, debs: list[Path], **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", PUBLISHER, suite, *map(str, debs)],
        env=_env(settings, **env),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _assert_consistent(settings: Settings) -> None:
    """Every live index matches its signed Release and every pool file it names exists."""
    r = repo.open_repository(settings)
    assert r.check(deep=True) == []


def _pool_matches_state(settings: Settings) -> None:
    """No orphaned or missing pool files: the pool on disk is exactly what the state lists."""
    root = repo.repo_root(settings)
    on_disk = {str(p.relative_to(root)) for p in (root / "pool").rglob("*") if p.is_file()}
    state = repo.open_repository(settings)._load_state()
    assert on_disk == set(state["pool"])


def _publish_worker(settings: Settings, suite: str, debs: list[Path]) -> None:
    repo.publish(settings, suite, debs)


def test_concurrent_publishers_all_land(rs: Settings, tmp_path: Path) -> None:
    """Six processes publishing into two suites at once: every package ends up published."""
    ctx = multiprocessing.get_context("fork")
    jobs = []
    for i in range(6):
        suite = "bookworm" if i % 3 else "trixie"
        debs = [make_deb(tmp_path, f"pkg{i}a"), make_deb(tmp_path, f"pkg{i}b", arch="all")]
        jobs.append((suite, debs))
    procs = [ctx.Process(target=_publish_worker, args=(rs, s, d)) for s, d in jobs]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    for suite in ("bookworm", "trixie"):
        want = {f"pkg{i}{x}=1.0-1" for i, (s, _) in enumerate(jobs) if s == suite for x in "ab"}
        assert names(rs, suite=suite) == want
    _assert_consistent(rs)
    _pool_matches_state(rs)


@pytest.mark.parametrize("step", CHECKPOINTS)
def test_publisher_killed_at_each_step_leaves_a_usable_repository(
    rs: Settings, tmp_path: Path, step: str
) -> None:
    """SIGKILL at any step: the live suite is the old or the new one, whole; the next publish works."""
    rs.repo_keep_versions = 1  # so the killed publish also prunes and deletes a pool file
    repo.publish(rs, "bookworm", [make_deb(tmp_path, "foo", "1.0-1"), make_deb(tmp_path, "bar")])
    old = {"foo=1.0-1", "bar=1.0-1"}
    new = {"foo=2.0-1", "bar=1.0-1", "baz=1.0-1"}
    proc = _spawn(
        rs,
        "bookworm",
        [make_deb(tmp_path, "foo", "2.0-1"), make_deb(tmp_path, "baz")],
        MODDEB_REPO_FAULT=step,
    )
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, err.decode()
    _assert_consistent(rs)
    assert names(rs) in (old, new)
    after = repo.publish(rs, "bookworm", [make_deb(tmp_path, "qux")])
    assert after.changed
    got = names(rs)
    assert got in ({*old, "qux=1.0-1"}, {*new, "qux=1.0-1"})
    if step in ("state-written", "switched", "pending-deleted"):
        assert got == {*new, "qux=1.0-1"}  # the state was saved: the publish counts
    _assert_consistent(rs)
    _pool_matches_state(rs)


def test_publisher_killed_at_random_moments_never_breaks_the_repository(
    rs: Settings, tmp_path: Path
) -> None:
    """Slowed publishers killed at random times: after each kill the repository verifies."""
    seed = int(os.environ.get("MODDEB_TEST_SEED", time.time()))
    rng = random.Random(seed)
    rs.repo_keep_versions = 2
    repo.publish(rs, "bookworm", [make_deb(tmp_path, "foo", "1-1")])
    for i in range(2, 10):
        debs = [make_deb(tmp_path, "foo", f"{i}-1"), make_deb(tmp_path, f"new{i}", arch="all")]
        proc = _spawn(rs, "bookworm", debs, MODDEB_REPO_PAUSE="0.03")
        time.sleep(rng.uniform(0.0, 0.8))
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
        problems = repo.open_repository(rs).check(deep=True)
        assert problems == [], f"seed {seed}, round {i}: {problems}"
    result = repo.publish(rs, "bookworm", [make_deb(tmp_path, "last")])
    assert "last 1.0-1 (amd64)" in result.added, f"seed {seed}"
    _assert_consistent(rs)
    _pool_matches_state(rs)


def test_a_reader_always_finds_the_indexes_its_inrelease_names(
    rs: Settings, tmp_path: Path
) -> None:
    """While publishes switch generations, every by-hash file a fetched InRelease names exists."""
    repo.publish(rs, "bookworm", [make_deb(tmp_path, "seed")])
    debs = [make_deb(tmp_path, f"r{i}") for i in range(12)]
    live = repo.repo_root(rs) / "dists/bookworm"
    writer = _spawn(rs, "bookworm", debs[:1])
    writer.wait(60)
    checked = 0
    procs = [_spawn(rs, "bookworm", [d]) for d in debs[1:]]
    while any(p.poll() is None for p in procs):
        release = deb822.Release((live / "InRelease").read_text())
        for item in release["SHA256"]:
            by_hash = live / Path(item["name"]).parent / "by-hash/SHA256" / item["sha256"]
            assert by_hash.stat().st_size == int(item["size"]), item["name"]
            checked += 1
    assert all(p.returncode == 0 for p in procs)
    assert checked > 0
    assert names(rs) == {"seed=1.0-1", *(f"r{i}=1.0-1" for i in range(12))}
