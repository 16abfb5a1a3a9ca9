"""The NAME-dkms package: dpkg-buildpackage with dh-dkms in a container with no network."""

from __future__ import annotations

import hashlib
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from builder.errors import BuildFailed
from builder.runner import Limits, Runner

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
        r"^dpkg-checkbuilddeps: error: (.*)$",
        r"^dpkg-buildpackage: error: (.*)$",
        r"^(?:dh_\w+|dpkg-\w+): error: (.*)$",
        r"^Error! (.*)$",
        r"^make(?:\[\d+\])?: \*\*\* (.*)$",
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


def build_dkms_package(
    runner: Runner,
    image: str,
    pkg_tree: Path,
    out_dir: Path,
    log_path: Path,
    limits: Limits,
    job_labels: dict[str, str],
) -> PackageResult:
    """Build NAME-dkms_VER_all.deb from a scaffolded tree; lintian's verdict comes with it."""
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
