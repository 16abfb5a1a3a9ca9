"""The repository signing key: made on first use, imported, exported, and used to sign Release.

The key lives in a GnuPG home of its own under settings.keys_root, which is never
mounted into a build container: only the publisher on the host signs (as Copr does).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from builder.config import Settings
from builder.errors import InvalidInput, PublishFailed

log = logging.getLogger(__name__)

KEYRING_NAME = "moddeb-archive-keyring.gpg"
FINGERPRINT_FILE = "repo-key.fpr"
# What apt on bookworm (gpgv) and its successors (sqv's policy) accept for an archive key.
KEY_ALGOS = ("ed25519", "rsa3072", "rsa4096")
# gpg-agent binds sockets inside the GnuPG home; AF_UNIX paths stop at 107 bytes.
_MAX_SOCKET_PATH = 100


def gnupg_home(settings: Settings) -> Path:
    """The GnuPG home that holds the repository key (created 0700 on first use)."""
    home = settings.keys_root / "gnupg"
    if not home.is_dir():
        home.mkdir(parents=True, exist_ok=True)
    os.chmod(settings.keys_root, 0o700)
    os.chmod(home, 0o700)
    return home


def _short_home(home: Path) -> Path:
    """A path to `home` short enough for gpg-agent's socket, via a private symlink if needed."""
    if len(str(home)) + len("/S.gpg-agent.browser") <= _MAX_SOCKET_PATH:
        return home
    digest = hashlib.sha256(str(home).encode()).hexdigest()[:16]
    link = Path(tempfile.gettempdir()) / f"moddeb-gnupg-{os.geteuid()}-{digest}"
    try:
        link.symlink_to(home)
    except FileExistsError:  # made earlier, or just now by a concurrent publisher
        st = link.lstat()
        if not (link.is_symlink() and st.st_uid == os.geteuid() and link.readlink() == home):
            raise PublishFailed(
                f"{link} exists and is not moddeb's link to {home}; remove it"
            ) from None
    return link


def _gpg(settings: Settings, *args: str, data: bytes | None = None) -> bytes:
    """Run gpg on the repository's GnuPG home; a failure is a PublishFailed with gpg's words."""
    home = _short_home(gnupg_home(settings))
    cmd = ["gpg", "--homedir", str(home), "--batch", "--no-tty", "--quiet", *args]
    proc = subprocess.run(cmd, input=data, capture_output=True, env={**os.environ, "LC_ALL": "C"})
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip()
        raise PublishFailed(f"gpg {args[0] if args else ''} failed: {err[-1500:]}")
    return proc.stdout


@contextmanager
def _key_lock(settings: Settings) -> Iterator[None]:
    """Serialise key creation and import between publishers sharing keys_root."""
    settings.keys_root.mkdir(parents=True, exist_ok=True)
    with open(settings.keys_root / ".lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _secret_signing_keys(listing: bytes) -> list[str]:
    """Fingerprints of usable primary keys able to sign, from `--with-colons` output."""
    found: list[str] = []
    pending = False
    for line in listing.decode(errors="replace").splitlines():
        cols = line.split(":")
        if cols[0] == "sec":
            # Uppercase S: the key or one of its subkeys signs; r/e: revoked or expired.
            pending = len(cols) > 11 and "S" in cols[11] and cols[1] not in ("r", "e")
        elif cols[0] == "fpr" and pending:
            found.append(cols[9])
            pending = False
        else:
            pending = False
    return found


def key_fingerprint(settings: Settings) -> str | None:
    """The repository key's fingerprint, or None when no key exists yet."""
    recorded = settings.keys_root / FINGERPRINT_FILE
    keys = _secret_signing_keys(_gpg(settings, "--with-colons", "--list-secret-keys"))
    if recorded.is_file():
        fpr = recorded.read_text(encoding="ascii").strip()
        if fpr in keys:
            return fpr
        log.warning("recorded repository key %s is gone from %s", fpr, gnupg_home(settings))
    return keys[0] if len(keys) == 1 else None


def _record(settings: Settings, fpr: str) -> None:
    path = settings.keys_root / FINGERPRINT_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(fpr + "\n", encoding="ascii")
    tmp.replace(path)


def ensure_key(settings: Settings) -> str:
    """Return the repository key's fingerprint, generating the key (no prompts) on first use."""
    with _key_lock(settings):
        fpr = key_fingerprint(settings)
        if fpr:
            return fpr
        algo = settings.repo_key_algo
        if algo not in KEY_ALGOS:
            raise InvalidInput(
                f"repo_key_algo {algo!r} is not one apt accepts for an archive key",
                hint=f"use one of {', '.join(KEY_ALGOS)}",
            )
        before = _secret_signing_keys(_gpg(settings, "--with-colons", "--list-secret-keys"))
        uid = f"{settings.repo_origin} archive signing key <{settings.maintainer_email}>"
        log.info("creating the repository key (%s) in %s", algo, gnupg_home(settings))
        _gpg(
            settings,
            "--pinentry-mode",
            "loopback",
            "--passphrase",
            "",
            "--quick-gen-key",
            uid,
            algo,
            "sign",
            "never",
        )
        after = _secret_signing_keys(_gpg(settings, "--with-colons", "--list-secret-keys"))
        new = [k for k in after if k not in before]
        if len(new) != 1:
            raise PublishFailed(f"gpg reported success but made {len(new)} signing keys")
        _record(settings, new[0])
        return new[0]


def import_key(settings: Settings, path: Path) -> str:
    """Import a secret signing key from `path`, make it the repository key, return its fingerprint."""
    if not path.is_file():
        raise InvalidInput(f"no such key file: {path}")
    shown = _gpg(settings, "--with-colons", "--import-options", "show-only", "--import", str(path))
    keys = _secret_signing_keys(shown)
    if not keys:
        raise InvalidInput(
            f"{path} holds no secret key that can sign",
            hint="export it with `gpg --export-secret-keys KEYID`",
        )
    if len(keys) > 1:
        raise InvalidInput(f"{path} holds {len(keys)} secret keys; give moddeb exactly one")
    with _key_lock(settings):
        had = keys[0] in _secret_signing_keys(_gpg(settings, "--with-colons", "--list-secret-keys"))
        _gpg(settings, "--import", str(path))
        # Mark it ultimately trusted so gpg signs without trust-db warnings.
        _gpg(settings, "--import-ownertrust", data=f"{keys[0]}:6:\n".encode())
        try:
            _gpg(
                settings,
                "--pinentry-mode",
                "error",
                "--local-user",
                keys[0],
                "--detach-sign",
                data=b"moddeb key check",
            )
        except PublishFailed:
            if not had:  # leave no unusable key behind for ensure_key to pick up
                _gpg(settings, "--yes", "--delete-secret-and-public-key", keys[0])
            raise InvalidInput(
                f"the key in {path} cannot sign without a passphrase",
                hint="moddeb signs unattended; import a key without a passphrase",
            ) from None
        _record(settings, keys[0])
    log.info("repository key is now %s", keys[0])
    return keys[0]


def export_public_key(settings: Settings, armor: bool = False) -> bytes:
    """The repository key's public half: a binary keyring for Signed-By (or armored text)."""
    fpr = ensure_key(settings)
    return _gpg(settings, *(["--armor"] if armor else []), "--export", fpr)


def sign_release(settings: Settings, release: Path, fingerprint: str) -> tuple[Path, Path]:
    """Write InRelease (clearsigned) and Release.gpg (detached, armored) beside `release`."""
    inrelease = release.with_name("InRelease")
    detached = release.with_name("Release.gpg")
    common = ["--local-user", fingerprint, "--digest-algo", "SHA512", "--yes"]
    _gpg(settings, *common, "--clearsign", "--output", str(inrelease), str(release))
    _gpg(settings, *common, "--armor", "--detach-sign", "--output", str(detached), str(release))
    return inrelease, detached


def verify(keyring: Path, signed: Path, data: Path | None = None) -> bool:
    """True when gpgv accepts `signed` (clearsigned, or a detached signature of `data`)."""
    cmd = ["gpgv", "--keyring", str(keyring), str(signed)] + ([str(data)] if data else [])
    return subprocess.run(cmd, capture_output=True).returncode == 0


def stop_agent(settings: Settings) -> None:
    """Stop the gpg-agent serving the repository key's GnuPG home (tests, key rotation)."""
    home = settings.keys_root / "gnupg"
    if not home.is_dir():
        return
    short = _short_home(home)
    subprocess.run(["gpgconf", "--homedir", str(short), "--kill", "gpg-agent"], capture_output=True)
    if short != home:
        short.unlink(missing_ok=True)
