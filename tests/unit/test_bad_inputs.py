"""Every kind of bad input is refused with a clear message and nothing escapes the work dir."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from builder.archive import TarLimits
from builder.detect import detect_layout
from builder.errors import InvalidInput
from builder.scaffold import write_debian_dir
from builder.sources import fetch_source

KBUILD = b"obj-m += demo.o\n"
DEMO_C = b'#include <linux/module.h>\nMODULE_LICENSE("GPL");\nMODULE_VERSION("1.0");\n'


def _tar(
    path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]], mode: str = "w:gz"
) -> Path:
    with tarfile.open(path, mode) as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return path


def _file(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, None


def _device(name: str) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 3
    return info, None


def _good(prefix: str = "demo-1.0/") -> list[tuple[tarfile.TarInfo, bytes | None]]:
    return [_file(prefix + "Makefile", KBUILD), _file(prefix + "demo.c", DEMO_C)]


ARCHIVES: dict[str, tuple[Callable[[], list], str]] = {
    "path traversal": (
        lambda: _good() + [_file("demo-1.0/../../evil", b"pwned")],
        "'..' component",
    ),
    "absolute path": (lambda: _good() + [_file("/tmp/moddeb-evil", b"pwned")], "absolute path"),
    "escaping symlink": (
        lambda: _good() + [_link("demo-1.0/out", "../../../etc")],
        "leaves the tree",
    ),
    "absolute symlink": (
        lambda: _good() + [_link("demo-1.0/passwd", "/etc/passwd")],
        "absolute path",
    ),
    "hard link outside": (lambda: _good() + [_link("demo-1.0/h", "../x", tarfile.LNKTYPE)], "'..'"),
    "device file": (lambda: _good() + [_device("demo-1.0/null")], "device or special file"),
}


@pytest.mark.parametrize("case", sorted(ARCHIVES))
def test_malicious_archive_is_refused_and_writes_nothing_outside(case: str, tmp_path: Path) -> None:
    """Archives with traversal, absolute paths, escaping links or devices are refused whole."""
    members, message = ARCHIVES[case]
    archive = _tar(tmp_path / "demo-1.0.tar.gz", members())
    work = tmp_path / "work" / "job"
    before = set(tmp_path.rglob("*"))
    with pytest.raises(InvalidInput, match=message):
        fetch_source(str(archive), work / "source", TarLimits())
    assert not (work / "source").exists(), "a refused source must leave no partial tree"
    created = set(tmp_path.rglob("*")) - before
    assert all(p == work or work in p.parents or p in work.parents for p in created), created
    assert not Path("/tmp/moddeb-evil").exists()


def test_oversized_archive_is_refused(tmp_path: Path) -> None:
    """An archive that unpacks past the byte limit is refused before it fills the disk."""
    archive = _tar(
        tmp_path / "big-1.0.tar.xz",
        _good("big-1.0/") + [_file("big-1.0/blob", b"\0" * 50_000)],
        "w:xz",
    )
    with pytest.raises(InvalidInput, match="more than 10000 bytes"):
        fetch_source(str(archive), tmp_path / "w", TarLimits(max_bytes=10_000))
    assert not (tmp_path / "w").exists()


def test_archive_with_too_many_files_is_refused(tmp_path: Path) -> None:
    """The file-count limit stops archives made of many tiny files."""
    members = _good() + [_file(f"demo-1.0/f{i}") for i in range(20)]
    archive = _tar(tmp_path / "demo-1.0.tar.bz2", members, "w:bz2")
    with pytest.raises(InvalidInput, match="more than 10 files"):
        fetch_source(str(archive), tmp_path / "w", TarLimits(max_files=10))


def test_directory_with_escaping_symlink_is_refused(tmp_path: Path) -> None:
    """A source directory whose symlink points outside it is refused before copying."""
    src = tmp_path / "demo-1.0"
    src.mkdir()
    (src / "Makefile").write_bytes(KBUILD)
    os.symlink("/etc/shadow", src / "shadow")
    with pytest.raises(InvalidInput, match="leaves the tree"):
        fetch_source(str(src), tmp_path / "w", TarLimits())


def test_directory_with_fifo_is_refused(tmp_path: Path) -> None:
    """Special files in a source directory are refused."""
    src = tmp_path / "demo-1.0"
    src.mkdir()
    (src / "Makefile").write_bytes(KBUILD)
    os.mkfifo(src / "pipe")
    with pytest.raises(InvalidInput, match="device or special file"):
        fetch_source(str(src), tmp_path / "w", TarLimits())


def test_not_a_tarball_is_named(tmp_path: Path) -> None:
    """A plain file that is not a tarball gets an error listing accepted suffixes."""
    f = tmp_path / "module.zip"
    f.write_bytes(b"PK")
    with pytest.raises(InvalidInput, match="not a tarball"):
        fetch_source(str(f), tmp_path / "w", TarLimits())


def test_corrupt_tarball_is_named(tmp_path: Path) -> None:
    """A file with a tarball name but garbage content is reported as unreadable."""
    f = tmp_path / "demo-1.0.tar.gz"
    f.write_bytes(b"not really gzip")
    with pytest.raises(InvalidInput, match="not a readable tar archive"):
        fetch_source(str(f), tmp_path / "w", TarLimits())


def test_missing_source_is_named(tmp_path: Path) -> None:
    """A path that does not exist is neither directory, tarball nor git URL."""
    with pytest.raises(InvalidInput, match="not a directory, a tarball or a git URL"):
        fetch_source(str(tmp_path / "nope"), tmp_path / "w", TarLimits())


def test_no_makefile_at_all(tmp_path: Path) -> None:
    """A tree without Makefile or Kbuild is refused with what was looked for."""
    (tmp_path / "demo.c").write_bytes(DEMO_C)
    with pytest.raises(InvalidInput, match="no Makefile or Kbuild found"):
        detect_layout(tmp_path, "demo-1.0")


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("name", "Bad_Name", "not a valid Debian package name"),
        ("name", "x", "not a valid Debian package name"),
        ("name", "evil\nPackage: x", "not a valid Debian package name"),
        ("version", "1.0-beta", "upstream version '1.0-beta' is not valid"),
        ("version", "v1.0", "upstream version 'v1.0' is not valid"),
        ("version", "1.0\nX: y", "is not valid"),
    ],
)
def test_invalid_name_or_version_is_refused(
    tmp_path: Path, flag: str, value: str, message: str
) -> None:
    """Names and versions that Debian cannot use are refused, naming the flag that fixes it."""
    (tmp_path / "Makefile").write_bytes(KBUILD)
    (tmp_path / "demo.c").write_bytes(DEMO_C)
    with pytest.raises(InvalidInput, match=message) as err:
        detect_layout(tmp_path, None, **{flag: value})
    assert f"--{flag}" in str(err.value)


@pytest.mark.parametrize(
    "maintainer",
    ["Evil <e@x.org>\nPackage: pwned", "No Email", "Tab\tName <a@b.org>", "<a@b.org>"],
)
def test_bad_maintainer_is_refused(tmp_path: Path, maintainer: str, settings) -> None:
    """A maintainer with a newline, control character or no address never reaches debian/."""
    (tmp_path / "Makefile").write_bytes(KBUILD)
    (tmp_path / "demo.c").write_bytes(DEMO_C)
    layout = detect_layout(tmp_path, "demo-1.0")
    with pytest.raises(InvalidInput, match="maintainer"):
        write_debian_dir(
            tmp_path,
            layout,
            templates=settings.templates_dir,
            maintainer=maintainer,
            distribution="bookworm",
            revision="1",
            origin="test",
            date_epoch=0,
        )
    assert not (tmp_path / "debian").exists()
