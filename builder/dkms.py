"""The NAME-dkms package: dpkg-buildpackage with dh-dkms in a container with no network."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from builder.errors import BuildFailed
from builder.runner import BUILD_UID, Limits, Runner

# dpkg-buildpackage writes results beside the tree; move them where moddeb pulls from.
BUILD_SCRIPT = """\
cd /build/{tree}
dpkg-checkbuilddeps
dpkg-buildpackage -b -us -uc
mkdir -p /build/out
cp ../*.deb ../*.buildinfo ../*.changes /build/out/
lintian --tag-display-limit 0 --suppress-tags {suppressed} ../*.changes > /build/out/lintian.txt 2>&1 || true
"""
# Tags about this package being built and checked outside the Debian archive itself.
SUPPRESSED_LINTIAN = ["initial-upload-closes-no-bugs", "no-manual-page"]


@dataclass
class PackageResult:
    """What a packaging step produced."""

    debs: list[Path] = field(default_factory=list)
    lintian_errors: list[str] = field(default_factory=list)
    lintian_warnings: list[str] = field(default_factory=list)
    log_path: Path | None = None
    duration: float = 0.0
    cached: bool = False


def sha256_file(path: Path) -> str:
    """The sha256 of a file, streamed."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def parse_lintian(text: str) -> tuple[list[str], list[str]]:
    """Split lintian output into error and warning lines."""
    errors = [ln for ln in text.splitlines() if re.match(r"^E: ", ln)]
    warnings = [ln for ln in text.splitlines() if re.match(r"^W: ", ln)]
    return errors, warnings


def first_error_line(log_text: str) -> str:
    """The line of a build log that best says why it failed."""
    patterns = [
        r"^(?:\S+/)?([^/\s:]+\.[ch]):(\d+):\d+: (?:fatal )?error: (.*)$",
        r"^ERROR: modpost: (.*)$",
        r"^make(?:\[\d+\])?: \*\*\* (.*)$",
        r"^dpkg-checkbuilddeps: error: (.*)$",
        r"^dpkg-buildpackage: error: (.*)$",
        r"^(?:dh_\w+|dpkg-\w+): error: (.*)$",
        r"^Error! (.*)$",
    ]
    lines = log_text.splitlines()
    for pat in patterns:
        for ln in lines:
            m = re.match(pat, ln.strip())
            if m:
                if len(m.groups()) == 3:
                    return f"{m.group(3)} ({m.group(1)}:{m.group(2)})"
                return m.group(1)
    tail = [ln for ln in lines if ln.strip()]
    return tail[-1][:300] if tail else "no output"


# Bump when the -dkms build changes, so cached packages are rebuilt.
DKMS_FORMAT = "1"


def tree_digest(root: Path) -> str:
    """A digest of a tree's paths, modes, symlink targets and contents, in a stable order."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames + [d for d in dirnames if os.path.islink(Path(dirpath) / d)]):
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            st = path.lstat()
            h.update(f"{rel}\0{st.st_mode:o}\0".encode())
            if path.is_symlink():
                h.update(os.readlink(path).encode())
            else:
                h.update(sha256_file(path).encode())
            h.update(b"\0")
    return h.hexdigest()


def build_dkms_package(
    runner: Runner,
    image: str,
    pkg_tree: Path,
    out_dir: Path,
    log_path: Path,
    limits: Limits,
    job_labels: dict[str, str],
    cache_root: Path | None = None,
) -> PackageResult:
    """Build NAME-dkms_VER_all.deb from a scaffolded tree; lintian's verdict comes with it.

    An unchanged tree on an unchanged image is a cache hit: no container starts.
    """
    cached = None
    if cache_root is not None:
        key = hashlib.sha256(
            f"{DKMS_FORMAT}\n{runner.image_id(image)}\n{tree_digest(pkg_tree)}".encode()
        ).hexdigest()
        cached = cache_root / "dkms" / key
        if (cached / "meta.json").is_file():
            return _restore(cached, out_dir)
    result = _build(runner, image, pkg_tree, out_dir, log_path, limits, job_labels)
    if cached is not None:
        _store(cached, result)
    return result


def _store(cached: Path, result: PackageResult) -> None:
    tmp = cached.with_name(cached.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for deb in result.debs:
        shutil.copyfile(deb, tmp / deb.name)
    meta = {
        "debs": {d.name: sha256_file(d) for d in result.debs},
        "lintian_errors": result.lintian_errors,
        "lintian_warnings": result.lintian_warnings,
    }
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
    shutil.rmtree(cached, ignore_errors=True)
    tmp.rename(cached)


def _restore(cached: Path, out_dir: Path) -> PackageResult:
    meta = json.loads((cached / "meta.json").read_text())
    out_dir.mkdir(parents=True, exist_ok=True)
    debs = []
    for name, digest in sorted(meta["debs"].items()):
        if sha256_file(cached / name) != digest:
            raise BuildFailed(f"cached package {name} is corrupt; remove {cached}")
        shutil.copyfile(cached / name, out_dir / name)
        debs.append(out_dir / name)
    return PackageResult(debs, meta["lintian_errors"], meta["lintian_warnings"], cached=True)


def _build(
    runner: Runner,
    image: str,
    pkg_tree: Path,
    out_dir: Path,
    log_path: Path,
    limits: Limits,
    job_labels: dict[str, str],
) -> PackageResult:
    staging = out_dir.parent / "dkms-out"
    shutil.rmtree(staging, ignore_errors=True)
    script = BUILD_SCRIPT.format(tree=pkg_tree.name, suppressed=",".join(SUPPRESSED_LINTIAN))
    result = runner.run_step(
        "dkms-package",
        image,
        ["/bin/sh", "-ec", script],
        log_path=log_path,
        limits=limits,
        inputs={f"/build/{pkg_tree.name}": pkg_tree},
        outputs={"/build/out": staging},
        env={"LC_ALL": "C.UTF-8", "HOME": "/build"},
        labels=job_labels,
        uid=BUILD_UID,  # Rules-Requires-Root: no, so no root and no capabilities at all
    )
    if not result.ok:
        text = log_path.read_text(encoding="utf-8", errors="replace")
        why = "timed out" if result.timed_out else first_error_line(text)
        raise BuildFailed(f"the -dkms package failed to build: {why}", hint=f"log: {log_path}")
    out_dir.mkdir(parents=True, exist_ok=True)
    debs = []
    for deb in sorted(staging.glob("*.deb")):
        target = out_dir / deb.name
        shutil.copyfile(deb, target)
        debs.append(target)
    lintian = (staging / "lintian.txt").read_text(encoding="utf-8", errors="replace")
    (log_path.parent / "lintian-dkms.txt").write_text(lintian)
    errors, warnings = parse_lintian(lintian)
    return PackageResult(debs, errors, warnings, log_path, result.duration)
