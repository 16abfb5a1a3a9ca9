"""Accept a module source (directory, tarball, git URL) and bring it safely into a work dir."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from builder.archive import TarLimits, extract_tar_file
from builder.errors import InvalidInput, Transient

TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.xz", ".txz", ".tar.bz2", ".tbz2")
SAFE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
GIT_URL_RE = re.compile(r"^(?:https?|ssh|git|file)://|^[\w.-]+@[\w.-]+:")
# Directories that are never part of what gets packaged.
SKIPPED_DIRS = {".git", ".hg", ".svn", "debian"}


@dataclass
class FetchedSource:
    """A source tree inside the work directory, with what its origin tells us."""

    tree: Path
    hint: str | None  # NAME-VERSION-like name from the directory or tarball
    date_epoch: int  # newest timestamp in the source: the changelog date, for reproducibility
    origin: str  # human-readable description of where it came from


def describe_kind(source: str) -> str:
    """Classify SOURCE as 'git', 'tar' or 'dir', or explain why it is none of them."""
    if GIT_URL_RE.match(source) or (source.endswith(".git") and not Path(source).is_dir()):
        return "git"
    path = Path(source)
    if path.is_dir():
        return "dir"
    if path.is_file():
        if source.endswith(TAR_SUFFIXES):
            return "tar"
        raise InvalidInput(
            f"{source} is a file but not a tarball: expected one of {', '.join(TAR_SUFFIXES)}"
        )
    raise InvalidInput(f"source {source!r} is not a directory, a tarball or a git URL")


def _strip_tar_suffix(name: str) -> str:
    for suffix in sorted(TAR_SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _check_tree(root: Path, limits: TarLimits) -> int:
    """Refuse special files, escaping links and oversized trees; return the newest mtime."""
    count = total = newest = 0
    real_root = root.resolve()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in SKIPPED_DIRS or Path(dirpath) != root]
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            st = path.lstat()
            rel = path.relative_to(root)
            if stat.S_ISLNK(st.st_mode):
                target = path.resolve()
                if target != real_root and real_root not in target.parents:
                    raise InvalidInput(
                        f"source: refusing symlink {rel} -> {os.readlink(path)} that leaves the tree"
                    )
            elif not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                raise InvalidInput(f"source: refusing device or special file {rel}")
            count += 1
            total += st.st_size if stat.S_ISREG(st.st_mode) else 0
            newest = max(newest, int(st.st_mtime))
            if count > limits.max_files:
                raise InvalidInput(f"source: more than {limits.max_files} files (limit)")
            if total > limits.max_bytes:
                raise InvalidInput(f"source: more than {limits.max_bytes} bytes (limit)")
    return newest


def _copy_dir(src: Path, dest: Path) -> None:
    shutil.copytree(
        src,
        dest,
        symlinks=True,
        ignore=lambda d, names: [n for n in names if n in SKIPPED_DIRS and Path(d) == src],
    )


def _git(args: list[str], cwd: Path | None = None) -> str:
    env = {
        **os.environ,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ALLOW_PROTOCOL": "https:http:ssh:git:file",
        "GIT_CONFIG_NOSYSTEM": "1",
    }
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise InvalidInput(f"git {args[0]} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


def fetch_source(
    source: str, dest: Path, limits: TarLimits, ref: str | None = None
) -> FetchedSource:
    """Bring SOURCE into dest (which must not exist yet); on any error dest is removed."""
    kind = describe_kind(source)
    if ref and kind != "git":
        raise InvalidInput("--ref only applies to a git URL source")
    if dest.exists():
        raise InvalidInput(f"work directory {dest} already exists")
    try:
        return _fetch(kind, source, dest, limits, ref)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise


def _single_top(staging: Path) -> Path | None:
    entries = [p for p in staging.iterdir()]
    if len(entries) == 1 and entries[0].is_dir() and not entries[0].is_symlink():
        return entries[0]
    return None


def _fetch(kind: str, source: str, dest: Path, limits: TarLimits, ref: str | None) -> FetchedSource:
    dest.mkdir(parents=True)
    if kind == "dir":
        src = Path(source).resolve()
        newest = _check_tree(src, limits)
        tree = dest / src.name
        _copy_dir(src, tree)
        return FetchedSource(tree, src.name, newest, f"directory {src.name}")
    if kind == "tar":
        staging = dest / "unpacked"
        extract_tar_file(Path(source), staging, limits)
        top = _single_top(staging)
        tree = top or staging
        hint = top.name if top else _strip_tar_suffix(Path(source).name)
        for skipped in SKIPPED_DIRS:
            shutil.rmtree(tree / skipped, ignore_errors=True)
        newest = _check_tree(tree, limits)
        return FetchedSource(tree, hint, newest, f"tarball {Path(source).name}")
    # git
    if shutil.which("git") is None:
        raise Transient("git is not installed", hint="apt-get install git")
    clone = dest / "git"
    _git(["clone", "--quiet", "--no-checkout", "--", source, str(clone)])
    _git(["checkout", "--quiet", "--detach", ref or "HEAD"], cwd=clone)
    commit = _git(["rev-parse", "HEAD"], cwd=clone)
    epoch = int(_git(["log", "-1", "--format=%ct"], cwd=clone))
    shutil.rmtree(clone / ".git")
    _check_tree(clone, limits)
    base = source.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1]
    git_hint: str | None = base[:-4] if base.endswith(".git") else base
    if not git_hint or git_hint == "git" or not SAFE_NAME_RE.match(git_hint):
        git_hint = None  # the URL's last part is no usable NAME-VERSION hint or dir name
    tree = clone.rename(dest / git_hint) if git_hint else clone
    return FetchedSource(tree, git_hint, epoch, f"git {source} at {commit[:12]}")
