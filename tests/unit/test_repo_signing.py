"""The repository key: created once without prompts, imported, exported as a binary keyring."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from builder import signing
from builder.config import Settings, load_settings
from builder.errors import InvalidInput


@pytest.fixture
def ks(settings: Settings):
    """Settings whose gpg-agent is stopped after the test."""
    yield settings
    signing.stop_agent(settings)


def _listing(settings: Settings) -> str:
    home = signing._short_home(signing.gnupg_home(settings))
    return subprocess.run(
        ["gpg", "--homedir", str(home), "--batch", "--with-colons", "--list-secret-keys"],
        capture_output=True,
        text=True,
    ).stdout


def test_key_is_created_once_with_the_configured_algorithm(ks: Settings) -> None:
    """ensure_key makes one ed25519 key on first use and returns the same one afterwards."""
    fpr = signing.ensure_key(ks)
    assert len(fpr) == 40 and signing.ensure_key(ks) == fpr
    listing = _listing(ks)
    assert listing.count("\nsec:") + listing.startswith("sec:") == 1
    assert ":ed25519:" in listing
    mode = signing.gnupg_home(ks).stat().st_mode & 0o777
    assert mode == 0o700


def test_unsupported_algorithm_is_invalid_input(ks: Settings) -> None:
    """A key algorithm apt would not accept is refused before gpg runs."""
    ks.repo_key_algo = "dsa1024"
    with pytest.raises(InvalidInput, match="repo_key_algo"):
        signing.ensure_key(ks)


def test_exported_keyring_is_binary_and_verifies_signatures(ks: Settings, tmp_path: Path) -> None:
    """The exported public key is a binary keyring gpgv uses to verify InRelease."""
    fpr = signing.ensure_key(ks)
    keyring = tmp_path / "keyring.gpg"
    keyring.write_bytes(signing.export_public_key(ks))
    assert keyring.read_bytes()[0] & 0x80  # an OpenPGP packet, not ASCII armor
    assert signing.export_public_key(ks, armor=True).startswith(b"-----BEGIN PGP PUBLIC KEY")
    release = tmp_path / "Release"
    release.write_text("Origin: test\n")
    inrelease, detached = signing.sign_release(ks, release, fpr)
    assert signing.verify(keyring, inrelease)
    assert signing.verify(keyring, detached, release)
    release.write_text("Origin: tampered\n")
    assert not signing.verify(keyring, detached, release)


def test_an_existing_key_can_be_imported(ks: Settings, tmp_path: Path) -> None:
    """import_key takes a secret key exported elsewhere and makes it the repository key."""
    other = load_settings(env={"MODDEB_HOME": str(tmp_path / "other")})
    try:
        fpr = signing.ensure_key(other)
        home = signing._short_home(signing.gnupg_home(other))
        secret = subprocess.run(
            ["gpg", "--homedir", str(home), "--batch", "--armor", "--export-secret-keys", fpr],
            capture_output=True,
            check=True,
        ).stdout
    finally:
        signing.stop_agent(other)
    keyfile = tmp_path / "secret.asc"
    keyfile.write_bytes(secret)
    assert signing.import_key(ks, keyfile) == fpr
    assert signing.ensure_key(ks) == fpr


def test_importing_a_public_key_only_is_refused(ks: Settings, tmp_path: Path) -> None:
    """A file with no secret key cannot become the signing key."""
    public = tmp_path / "public.gpg"
    public.write_bytes(signing.export_public_key(ks))
    with pytest.raises(InvalidInput, match="no secret key"):
        signing.import_key(ks, public)


def test_a_passphrase_protected_key_is_refused(ks: Settings, tmp_path: Path) -> None:
    """moddeb signs unattended, so a key that needs a passphrase is refused at import."""
    home = tmp_path / "g"
    home.mkdir(mode=0o700)
    gpg = ["gpg", "--homedir", str(home), "--batch", "--pinentry-mode", "loopback"]
    try:
        subprocess.run(
            [*gpg, "--passphrase", "s3cret", "--quick-gen-key", "p <p@example.org>", "ed25519"],
            capture_output=True,
            check=True,
        )
        secret = subprocess.run(
            [*gpg, "--passphrase", "s3cret", "--export-secret-keys"],
            capture_output=True,
            check=True,
        ).stdout
    finally:
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"])
    keyfile = tmp_path / "protected.gpg"
    keyfile.write_bytes(secret)
    with pytest.raises(InvalidInput, match="passphrase"):
        signing.import_key(ks, keyfile)
    assert signing.key_fingerprint(ks) is None  # nothing unusable left behind
