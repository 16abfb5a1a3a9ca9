"""Assemble a binary .deb from a laid-out tree, reproducibly (one recipe for every package)."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

from builder.errors import BuildFailed


def installed_size_kib(root: Path) -> int:
    """Installed-Size: the files' sizes in KiB, rounded up one by one (as dpkg-gencontrol)."""
    return sum((p.stat().st_size + 1023) // 1024 for p in root.rglob("*") if p.is_file())


def pack_deb(
    root: Path, target: Path, *, control: str, epoch: int, scripts: dict[str, str] | None = None
) -> Path:
    """Write DEBIAN/ (control, maintainer scripts, md5sums) and build target with dpkg-deb.

    Modes are normalised (directories and scripts 0755, files 0644), every mtime is
    clamped to epoch, ownership is root, so the same tree always gives the same bytes.
    """
    debian_dir = root / "DEBIAN"
    debian_dir.mkdir(exist_ok=True)
    payload = sorted(p for p in root.rglob("*") if p.is_file() and debian_dir not in p.parents)
    (debian_dir / "control").write_text(control, encoding="utf-8")
    executable = set()
    for name, text in (scripts or {}).items():
        (debian_dir / name).write_text(text, encoding="utf-8")
        executable.add(debian_dir / name)
    sums = [
        f"{hashlib.md5(p.read_bytes()).hexdigest()}  {p.relative_to(root)}\n"  # noqa: S324 - dpkg's format
        for p in payload
    ]
    (debian_dir / "md5sums").write_text("".join(sums), encoding="utf-8")
    for path in [root, *root.rglob("*")]:
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() or path in executable else 0o644)
        os.utime(path, (epoch, epoch), follow_symlinks=False)
    proc = subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(root), str(target)],
        capture_output=True,
        text=True,
        env={**os.environ, "SOURCE_DATE_EPOCH": str(epoch), "LC_ALL": "C"},
    )
    if proc.returncode != 0:
        raise BuildFailed(f"dpkg-deb failed for {target.name}: {proc.stderr.strip()}")
    return target
