"""Base and per-kernel builder images, made from the Debian archive and cached by content."""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from builder.config import Settings
from builder.errors import InvalidInput, Transient
from builder.runner import Runner, limits_from

log = logging.getLogger(__name__)

# Bump when what goes into an image changes, so old caches are not reused.
IMAGE_FORMAT = "3"
BASE_PACKAGES = [
    "build-essential",
    "debhelper",
    "dh-dkms",
    "dkms",
    "fakeroot",
    "kmod",
    "xz-utils",
    "zstd",
    "ca-certificates",
    "lintian",
]


@contextmanager
def image_lock(settings: Settings, tag: str) -> Iterator[None]:
    """Serialise the making of one image across threads and processes on this host."""
    lock_dir = settings.cache_root / "locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / (tag.replace("/", "_").replace(":", "_") + ".lock"), "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def archive_sources(settings: Settings) -> list[str]:
    """One-line apt sources for the image, from the configured (or host's) mirrors."""
    if not settings.mirror:
        raise InvalidInput(
            "no Debian archive is configured and none was found in the host's apt sources",
            hint="set MODDEB_MIRROR",
        )
    suite = settings.suite
    lines = [f"deb {settings.mirror} {suite} main", f"deb {settings.mirror} {suite}-updates main"]
    if settings.security_mirror:
        lines.append(f"deb {settings.security_mirror} {suite}-security main")
    return lines


def base_tag(settings: Settings) -> str:
    """The tag of the base builder image for these settings (a pulled image when configured)."""
    if settings.base_image:
        return settings.base_image
    key = hashlib.sha256(
        "\n".join([IMAGE_FORMAT, *archive_sources(settings), *BASE_PACKAGES]).encode()
    ).hexdigest()[:12]
    return f"moddeb/base:{settings.suite}-{key}"


def ensure_base(settings: Settings, runner: Runner) -> str:
    """Return the base image tag, making it with mmdebstrap + docker import on first use."""
    tag = base_tag(settings)
    if runner.has_image(tag):
        return tag
    with image_lock(settings, tag):
        if not runner.has_image(tag):
            _make_base(settings, runner, tag)
    return tag


def _make_base(settings: Settings, runner: Runner, tag: str) -> None:
    if settings.base_image:
        runner.pull(tag)
        return
    if shutil.which("mmdebstrap") is None:
        raise Transient("mmdebstrap is not installed", hint="apt-get install mmdebstrap")
    settings.cache_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=settings.cache_root) as tmp:
        rootfs = Path(tmp) / "rootfs.tar"
        cmd = [
            "mmdebstrap",
            "--variant=minbase",
            "--quiet",
            '--aptopt=APT::Install-Recommends "false"',
            f"--include={','.join(BASE_PACKAGES)}",
            settings.suite,
            str(rootfs),
            *archive_sources(settings),
        ]
        log.info("making base image %s with mmdebstrap", tag)
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"}
        )
        if proc.returncode != 0:
            raise Transient(f"mmdebstrap failed making {tag}: {proc.stderr.strip()[-2000:]}")
        runner.import_rootfs(rootfs, tag, {"moddeb.kind": "base", "moddeb.suite": settings.suite})


def kernel_tag(settings: Settings, kernel_release: str, base: str) -> str:
    """The tag of the builder image for one kernel ABI on top of a base image."""
    key = hashlib.sha256(f"{IMAGE_FORMAT}\n{base}".encode()).hexdigest()[:8]
    # Docker tags allow [A-Za-z0-9_.-] only; ABIs like 6.12.117+deb12-amd64 carry a "+".
    return f"moddeb/kernel:{kernel_release.replace('+', '_')}-{key}"


def ensure_kernel_image(
    settings: Settings, runner: Runner, kernel_release: str, suite: str | None = None
) -> str:
    """Return the per-kernel builder image (base + linux-headers-KVER), making it once."""
    base = ensure_base(settings, runner)
    tag = kernel_tag(settings, kernel_release, base)
    if runner.has_image(tag):
        return tag
    with image_lock(settings, tag):
        if not runner.has_image(tag):
            _make_kernel_image(settings, runner, kernel_release, suite, base, tag)
    return tag


def _make_kernel_image(
    settings: Settings, runner: Runner, kernel_release: str, suite: str | None, base: str, tag: str
) -> None:
    extra = ""
    if suite and not any(f" {suite} " in line for line in archive_sources(settings)):
        # A kernel from a suite the base image does not list (backports, say).
        extra = (
            f"echo 'deb {settings.mirror} {suite} main' > /etc/apt/sources.list.d/{suite}.list\n"
        )
    script = (
        "export DEBIAN_FRONTEND=noninteractive\n" + extra + "apt-get update -qq\n"
        f"apt-get install -y -qq --no-install-recommends linux-headers-{kernel_release}\n"
        "apt-get clean\n"
        "rm -rf /var/lib/apt/lists/*\n"
    )
    log_path = settings.cache_root / "image-logs" / f"{kernel_release}.log"
    log_path.unlink(missing_ok=True)
    result = runner.commit_step(
        base,
        script,
        tag,
        {"moddeb.kind": "kernel", "moddeb.kernel": kernel_release, "moddeb.base": base},
        log_path,
        limits_from(settings),
    )
    if not result.ok:
        raise Transient(
            f"could not prepare the builder image for {kernel_release} "
            f"(installing linux-headers-{kernel_release} failed)",
            hint=f"see {log_path}",
        )
