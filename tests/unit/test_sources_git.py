"""Git URL and tarball sources land in the work dir with what their origin says."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

import pytest

from builder.archive import TarLimits
from builder.detect import detect_layout
from builder.errors import InvalidInput
from builder.sources import describe_kind, fetch_source

ROOT = Path(__file__).resolve().parents[2]


def _git(cwd: Path, *args: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.org",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.org",
        "GIT_AUTHOR_DATE": "2026-01-02T03:04:05Z",
        "GIT_COMMITTER_DATE": "2026-01-02T03:04:05Z",
        "PATH": "/usr/bin:/bin",
    }
    return subprocess.run(
        ["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository holding hello at tag v1.0 and a later commit on main."""
    r = tmp_path / "hello.git"
    r.mkdir()
    _git(r, "init", "-q", "-b", "main")
    for f in ("hello.c", "Kbuild", "Makefile"):
        (r / f).write_bytes((ROOT / "examples/hello" / f).read_bytes())
    _git(r, "add", ".")
    _git(r, "commit", "-qm", "hello 1.0")
    _git(r, "tag", "v1.0")
    (r / "hello.c").write_text((r / "hello.c").read_text().replace('"1.0"', '"1.1"'))
    _git(r, "commit", "-qam", "hello 1.1")
    return r


def test_git_url_with_ref_checks_out_that_ref(repo: Path, tmp_path: Path) -> None:
    """A file:// git URL with --ref gives that ref's tree, no .git, dated by its commit."""
    fetched = fetch_source(f"file://{repo}", tmp_path / "w", TarLimits(), ref="v1.0")
    assert not (fetched.tree / ".git").exists()
    assert fetched.hint == "hello"
    assert fetched.date_epoch == 1767323045
    assert "git file://" in fetched.origin and " at " in fetched.origin
    assert detect_layout(fetched.tree, fetched.hint).upstream_version == "1.0"
    head = fetch_source(f"file://{repo}", tmp_path / "w2", TarLimits())
    assert detect_layout(head.tree, head.hint).upstream_version == "1.1"


def test_unknown_git_ref_is_named(repo: Path, tmp_path: Path) -> None:
    """A ref that does not exist fails with git's own words and leaves nothing behind."""
    with pytest.raises(InvalidInput, match="git checkout failed"):
        fetch_source(f"file://{repo}", tmp_path / "w", TarLimits(), ref="no-such-tag")
    assert not (tmp_path / "w").exists()


def test_ref_without_git_source_is_refused(tmp_path: Path) -> None:
    """--ref only means something for a git URL."""
    with pytest.raises(InvalidInput, match="--ref only applies"):
        fetch_source(str(ROOT / "examples/hello"), tmp_path / "w", TarLimits(), ref="main")


def test_tarball_top_directory_gives_name_and_version(tmp_path: Path) -> None:
    """The Intel layout's version comes only from the tarball's top directory name."""
    tarball = tmp_path / "vendornic-2.3.1.tar.xz"
    with tarfile.open(tarball, "w:xz") as tar:
        tar.add(ROOT / "examples/vendornic-2.3.1", arcname="vendornic-2.3.1")
    fetched = fetch_source(str(tarball), tmp_path / "w", TarLimits())
    layout = detect_layout(fetched.tree, fetched.hint)
    assert (layout.name, layout.upstream_version, layout.style) == ("vendornic", "2.3.1", "vendor")


@pytest.mark.parametrize(
    ("source", "kind"),
    [
        ("https://git.example.org/x/y.git", "git"),
        ("git@host.example.org:x/y", "git"),
        ("file:///srv/mod", "git"),
    ],
)
def test_git_urls_are_recognised(source: str, kind: str) -> None:
    """URLs and scp-style addresses are git sources."""
    assert describe_kind(source) == kind
