"""The BPF builder image: moddeb's base image plus clang, LLVM, libbpf's headers and bpftool."""

from __future__ import annotations

import hashlib
import logging

from builder import images
from builder.config import Settings
from builder.errors import Transient
from builder.runner import Runner, limits_from

log = logging.getLogger(__name__)

# Bump when what goes into the image changes, so an old image is not reused.
BPF_IMAGE_FORMAT = "1"
# clang/llvm compile and strip (-target bpf); libbpf-dev brings bpf_helpers.h and the
# static libbpf a skeleton-based loader links; bpftool makes skeletons and vmlinux.h;
# linux-libc-dev has the uapi linux/bpf.h; libelf-dev and zlib1g-dev let loaders and
# test programs link libbpf statically, so they run on hosts without libbpf1.
BPF_PACKAGES = [
    "clang",
    "llvm",
    "libbpf-dev",
    "bpftool",
    "linux-libc-dev",
    "libelf-dev",
    "zlib1g-dev",
]


def bpf_tag(base: str) -> str:
    """The tag of the BPF builder image made on top of a base image."""
    key = hashlib.sha256("\n".join([BPF_IMAGE_FORMAT, base, *BPF_PACKAGES]).encode()).hexdigest()[
        :12
    ]
    return f"moddeb/bpf:{key}"


def ensure_bpf_image(settings: Settings, runner: Runner) -> str:
    """Return the BPF builder image tag, making it from the base image on first use."""
    base = images.ensure_base(settings, runner)
    tag = bpf_tag(base)
    if runner.has_image(tag):
        return tag
    with images.image_lock(settings, tag):
        if not runner.has_image(tag):
            _make_bpf_image(settings, runner, base, tag)
    return tag


def _make_bpf_image(settings: Settings, runner: Runner, base: str, tag: str) -> None:
    script = (
        "export DEBIAN_FRONTEND=noninteractive\n"
        "apt-get update -qq\n"
        f"apt-get install -y -qq --no-install-recommends {' '.join(BPF_PACKAGES)}\n"
        "apt-get clean\n"
        "rm -rf /var/lib/apt/lists/*\n"
        # Fail here, not in a user's build, when a tool is missing from the image.
        "clang --version | head -n1\n"
        "bpftool version\n"
        "test -f /usr/include/bpf/bpf_helpers.h\n"
    )
    log_path = settings.cache_root / "image-logs" / "bpf.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.unlink(missing_ok=True)
    log.info("making BPF builder image %s from %s", tag, base)
    result = runner.commit_step(
        base,
        script,
        tag,
        {"moddeb.kind": "bpf", "moddeb.base": base},
        log_path,
        limits_from(settings),
    )
    if not result.ok:
        raise Transient(
            f"could not prepare the BPF builder image (installing {' '.join(BPF_PACKAGES)} failed)",
            hint=f"see {log_path}",
        )
