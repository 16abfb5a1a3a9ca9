"""The kernel catalog: which kernel ABIs the configured archive suites offer."""

from __future__ import annotations

import difflib
import hashlib
import json
import logging
import lzma
import re
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from functools import cmp_to_key
from pathlib import Path

from debian import deb822
from debian.debian_support import version_compare

from builder.config import Settings
from builder.errors import InvalidInput, Transient

log = logging.getLogger(__name__)

HEADERS_RE = re.compile(
    r"^linux-headers-(?P<kver>\d+\.\d+[.\d]*(?:-\d+|\+deb\d+)-(?P<flavour>[a-z0-9]+(?:-[a-z0-9]+)?))$"
)
NOT_FLAVOURS = {"common", "common-rt"}
INDEX_TTL = 3600


@dataclass
class KernelInfo:
    """One kernel ABI: its release string, flavour and the suite that carries its headers."""

    kernel_release: str
    flavour: str
    suite: str
    headers_version: str


def build_arch() -> str:
    """The Debian architecture of this machine."""
    try:
        return subprocess.run(
            ["dpkg", "--print-architecture"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "amd64"


def suites_for(settings: Settings) -> list[tuple[str, str]]:
    """(mirror, suite) pairs searched for kernels: the suite, -updates and -security."""
    pairs = [(settings.mirror, settings.suite), (settings.mirror, f"{settings.suite}-updates")]
    if settings.security_mirror:
        pairs.append((settings.security_mirror, f"{settings.suite}-security"))
    return pairs


def _download(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as resp:
        return bytes(resp.read())


def verified_release(settings: Settings, mirror: str, suite: str) -> deb822.Release:
    """The suite's InRelease, its signature checked with gpgv against the archive keyring."""
    data = _download(f"{mirror}/dists/{suite}/InRelease")
    keyring = Path(settings.archive_keyring) if settings.archive_keyring else None
    if keyring is None:
        log.warning("archive_keyring is empty: %s index signatures are NOT checked", suite)
    else:
        if not keyring.is_file():
            raise InvalidInput(
                f"archive keyring {keyring} does not exist",
                hint="apt-get install debian-archive-keyring, or set MODDEB_ARCHIVE_KEYRING",
            )
        with tempfile.TemporaryDirectory() as tmp:
            signed = Path(tmp) / "InRelease"
            signed.write_bytes(data)
            proc = subprocess.run(
                ["gpgv", "--keyring", str(keyring), str(signed)], capture_output=True, text=True
            )
        if proc.returncode != 0:
            raise Transient(
                f"the {suite} InRelease signature does not verify: {proc.stderr.strip()}"
            )
    text = data.decode("utf-8", errors="replace")
    body = text.split("\n\n", 1)[1] if text.startswith("-----BEGIN PGP SIGNED") else text
    body = body.split("\n-----BEGIN PGP SIGNATURE", 1)[0]
    return deb822.Release(body)


def fetch_index(settings: Settings, mirror: str, suite: str, arch: str) -> Path:
    """Download (or reuse a fresh cached copy of) a suite's Packages index, signature-checked.

    The index's SHA256 must match the one in the suite's signed InRelease.
    """
    cache = settings.cache_root / "indexes" / f"{suite}_{arch}_Packages"
    if cache.is_file() and time.time() - cache.stat().st_mtime < INDEX_TTL:
        return cache
    member = f"main/binary-{arch}/Packages.xz"
    try:
        release = verified_release(settings, mirror, suite)
        expected = {row["name"]: row["sha256"] for row in release.get("SHA256", [])}
        raw = _download(f"{mirror}/dists/{suite}/{member}")
        if member not in expected:
            raise Transient(f"the {suite} InRelease does not list {member}")
        if hashlib.sha256(raw).hexdigest() != expected[member]:
            raise Transient(f"{suite}/{member} does not match the SHA256 its InRelease signs")
        data = lzma.decompress(raw)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise InvalidInput(f"the archive has no suite {suite!r} for {arch}") from None
        raise Transient(f"cannot download the {suite} package index: {exc}") from None
    except (urllib.error.URLError, OSError, lzma.LZMAError) as exc:
        if cache.is_file():
            return cache  # a stale index beats no index when the archive is unreachable
        raise Transient(f"cannot download the {suite} package index: {exc}") from None
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.replace(cache)
    return cache


def parse_index(path: Path, suite: str) -> list[KernelInfo]:
    """Kernel ABIs in one Packages index, remembered beside it until the index changes."""
    memo = path.with_name(path.name + ".kernels.json")
    stamp = f"{path.stat().st_mtime_ns}:{path.stat().st_size}:{suite}"
    try:
        saved = json.loads(memo.read_text())
        if saved["stamp"] == stamp:
            return [KernelInfo(**row) for row in saved["kernels"]]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no memo yet, or an unreadable one: parse the index
    kernels = _parse_index(path, suite)
    tmp = memo.with_suffix(".tmp")
    tmp.write_text(json.dumps({"stamp": stamp, "kernels": [asdict(k) for k in kernels]}))
    tmp.replace(memo)
    return kernels


def _parse_index(path: Path, suite: str) -> list[KernelInfo]:
    """Kernel ABIs in one Packages index: linux-headers-KVER with a matching linux-image."""
    headers: dict[str, KernelInfo] = {}
    images: set[str] = set()
    with open(path, encoding="utf-8") as fh:
        for para in deb822.Packages.iter_paragraphs(fh, use_apt_pkg=False):
            name = para.get("Package", "")
            if name.startswith("linux-image-"):
                images.add(name.removeprefix("linux-image-").removesuffix("-unsigned"))
                continue
            m = HEADERS_RE.match(name)
            if not m or m.group("flavour") in NOT_FLAVOURS:
                continue
            kver = m.group("kver")
            info = KernelInfo(kver, m.group("flavour"), suite, para.get("Version", ""))
            old = headers.get(kver)
            if old is None or version_compare(info.headers_version, old.headers_version) > 0:
                headers[kver] = info
    return [info for kver, info in headers.items() if kver in images]


def _newer(a: KernelInfo, b: KernelInfo) -> int:
    return version_compare(a.headers_version, b.headers_version)


def list_kernels(settings: Settings, suites: list[str] | None = None) -> list[KernelInfo]:
    """Every kernel ABI in the configured suites (or only the given ones), oldest first."""
    arch = build_arch()
    found: dict[str, KernelInfo] = {}
    for mirror, suite in suites_for(settings):
        if suites and suite not in suites:
            continue
        for info in parse_index(fetch_index(settings, mirror, suite, arch), suite):
            found.setdefault(info.kernel_release, info)  # the first suite that has it wins
    if suites and not found:
        known = [s for _, s in suites_for(settings)]
        if not set(suites) & set(known):
            raise InvalidInput(f"unknown suite {suites[0]!r}: moddeb searches {known}")
    return sorted(found.values(), key=cmp_to_key(_newer))


def newest_per_flavour(kernels: list[KernelInfo]) -> list[KernelInfo]:
    """The newest ABI of each flavour."""
    best: dict[str, KernelInfo] = {}
    for k in kernels:
        if k.flavour not in best or _newer(k, best[k.flavour]) > 0:
            best[k.flavour] = k
    return sorted(best.values(), key=lambda k: k.flavour)


def find_kernel(kernels: list[KernelInfo], kernel_release: str) -> KernelInfo:
    """Look up one ABI; a miss names the closest ABIs the archive does have."""
    for k in kernels:
        if k.kernel_release == kernel_release:
            return k
    names = [k.kernel_release for k in kernels]
    close = difflib.get_close_matches(kernel_release, names, n=3, cutoff=0.5)
    hint = f"closest: {', '.join(close)}" if close else "see `moddeb kernels`"
    raise InvalidInput(f"the archive has no kernel {kernel_release!r}", hint=hint)


def resolve_kernel_args(
    settings: Settings, kernels: list[str], newest: bool, all_in_suite: str | None
) -> list[KernelInfo]:
    """Turn --kernel/--newest/--all-in-suite into a de-duplicated list of ABIs."""
    if not kernels and not newest and not all_in_suite:
        return []
    catalog = list_kernels(settings)
    chosen: list[KernelInfo] = [find_kernel(catalog, k) for k in kernels]
    if newest:
        chosen += newest_per_flavour(catalog)
    if all_in_suite:
        chosen += list_kernels(settings, suites=[all_in_suite])
    unique: dict[str, KernelInfo] = {}
    for k in chosen:
        unique.setdefault(k.kernel_release, k)
    return list(unique.values())
