"""The kernel catalog trusts an archive index only through the suite's signed InRelease."""

from __future__ import annotations

import hashlib
import lzma
import subprocess
from pathlib import Path

import pytest

from builder.config import load_settings
from builder.errors import Transient
from builder.kernels import fetch_index, parse_index

PACKAGES = b"""Package: linux-headers-6.1.0-57-amd64
Version: 6.1.158-1

Package: linux-image-6.1.0-57-amd64
Version: 6.1.158-1
"""


@pytest.fixture
def archive(tmp_path: Path):
    """A file:// archive with one suite, its InRelease signed by a throwaway key."""
    gnupg = tmp_path / "gnupg"
    gnupg.mkdir(mode=0o700)
    gpg = [
        "gpg",
        "--batch",
        "--homedir",
        str(gnupg),
        "--pinentry-mode",
        "loopback",
        "--passphrase",
        "",
    ]
    subprocess.run(
        [*gpg, "--quick-gen-key", "Test Archive <archive@example.org>", "ed25519", "sign", "never"],
        check=True,
        capture_output=True,
    )
    keyring = tmp_path / "archive-keyring.gpg"
    keyring.write_bytes(subprocess.run([*gpg, "--export"], check=True, capture_output=True).stdout)
    dists = tmp_path / "mirror" / "dists" / "testing"
    (dists / "main/binary-amd64").mkdir(parents=True)
    packed = lzma.compress(PACKAGES)
    (dists / "main/binary-amd64/Packages.xz").write_bytes(packed)
    release = (
        "Suite: testing\nSHA256:\n"
        f" {hashlib.sha256(packed).hexdigest()} {len(packed)} main/binary-amd64/Packages.xz\n"
    )
    (dists / "Release").write_text(release)
    subprocess.run(
        [*gpg, "--clearsign", "-o", str(dists / "InRelease"), str(dists / "Release")],
        check=True,
        capture_output=True,
    )
    subprocess.run(["gpgconf", "--homedir", str(gnupg), "--kill", "gpg-agent"], capture_output=True)
    settings = load_settings(
        env={"MODDEB_HOME": str(tmp_path / "home"), "MODDEB_ARCHIVE_KEYRING": str(keyring)}
    )
    return settings, f"file://{tmp_path / 'mirror'}", dists


def test_signed_index_is_accepted(archive) -> None:
    """An index whose hash the signed InRelease lists is read into the catalog."""
    settings, mirror, _ = archive
    path = fetch_index(settings, mirror, "testing", "amd64")
    assert [k.kernel_release for k in parse_index(path, "testing")] == ["6.1.0-57-amd64"]


def test_tampered_index_is_refused(archive) -> None:
    """A Packages.xz that differs from what InRelease signs is refused, not cached."""
    settings, mirror, dists = archive
    (dists / "main/binary-amd64/Packages.xz").write_bytes(lzma.compress(PACKAGES + b"\n"))
    with pytest.raises(Transient, match="does not match the SHA256"):
        fetch_index(settings, mirror, "testing", "amd64")
    assert not (settings.cache_root / "indexes" / "testing_amd64_Packages").exists()


def test_forged_inrelease_is_refused(archive) -> None:
    """An InRelease edited after signing fails gpgv."""
    settings, mirror, dists = archive
    inrelease = dists / "InRelease"
    inrelease.write_text(inrelease.read_text().replace("Suite: testing", "Suite: forged"))
    with pytest.raises(Transient, match="signature does not verify"):
        fetch_index(settings, mirror, "testing", "amd64")
