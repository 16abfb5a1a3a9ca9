"""Safe tar extraction: every member is checked before anything is written."""

from __future__ import annotations

import posixpath
import tarfile
from pathlib import Path
from typing import IO

from builder.errors import InvalidInput


class TarLimits:
    """Size and file-count ceilings for one archive."""

    def __init__(self, max_bytes: int = 1 << 40, max_files: int = 1 << 30) -> None:
        self.max_bytes = max_bytes
        self.max_files = max_files


def _member_path(name: str, what: str) -> str:
    """Normalise a member name, refusing absolute paths and '..' components."""
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise InvalidInput(f"{what}: refusing absolute path {name!r}")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise InvalidInput(f"{what}: refusing path with '..' component {name!r}")
    return "/".join(parts)


def check_member(info: tarfile.TarInfo, what: str) -> str:
    """Refuse members that could write outside the tree; return the safe relative path."""
    rel = _member_path(info.name, what)
    if info.ischr() or info.isblk() or info.isfifo() or info.isdev():
        raise InvalidInput(f"{what}: refusing device or special file {info.name!r}")
    if not (info.isreg() or info.isdir() or info.issym() or info.islnk()):
        raise InvalidInput(f"{what}: refusing unsupported member type of {info.name!r}")
    if info.issym():
        target = info.linkname
        if target.startswith("/"):
            raise InvalidInput(
                f"{what}: refusing symlink {info.name!r} to absolute path {target!r}"
            )
        joined = posixpath.normpath(posixpath.join(posixpath.dirname(rel), target))
        if joined == ".." or joined.startswith("../"):
            raise InvalidInput(
                f"{what}: refusing symlink {info.name!r} -> {target!r} that leaves the tree"
            )
    if info.islnk():
        _member_path(info.linkname, what)
    return rel


def _strip(rel: str, strip_first: bool) -> str:
    if not strip_first:
        return rel
    _, _, rest = rel.partition("/")
    return rest


def extract_tar_stream(
    fileobj: IO[bytes],
    dest: Path,
    *,
    strip_first: bool = False,
    limits: TarLimits | None = None,
    what: str = "archive",
) -> list[str]:
    """Extract a tar stream into dest after checking each member; return top-level names."""
    limits = limits or TarLimits()
    dest.mkdir(parents=True, exist_ok=True)
    total = count = 0
    tops: list[str] = []
    with tarfile.open(fileobj=fileobj, mode="r|*") as tar:
        for info in tar:
            rel = check_member(info, what)
            count += 1
            total += max(info.size, 0)
            if count > limits.max_files:
                raise InvalidInput(f"{what}: more than {limits.max_files} files (limit)")
            if total > limits.max_bytes:
                raise InvalidInput(f"{what}: unpacks to more than {limits.max_bytes} bytes (limit)")
            top = rel.split("/", 1)[0]
            if top and top not in tops:
                tops.append(top)
            target = _strip(rel, strip_first)
            if not target:
                continue
            info.name = target
            if info.islnk():
                info.linkname = _strip(_member_path(info.linkname, what), strip_first)
            if hasattr(tarfile, "data_filter"):  # PEP 706, as a second line of defence
                tar.extract(info, dest, filter="data")
            else:
                tar.extract(info, dest)
    return tops


def extract_tar_file(path: Path, dest: Path, limits: TarLimits) -> list[str]:
    """Extract a (possibly compressed) tarball safely; return its top-level names."""
    what = f"archive {path.name}"
    try:
        with open(path, "rb") as fh:
            return extract_tar_stream(fh, dest, limits=limits, what=what)
    except tarfile.TarError as exc:
        raise InvalidInput(f"{what} is not a readable tar archive: {exc}") from None
