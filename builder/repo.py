"""The apt repository: add .debs to the pool, index, sign, and switch a suite in atomically.

The repository is a static tree any web server can serve:

    moddeb-archive-keyring.gpg             the public key (binary) for Signed-By
    pool/main/<prefix>/<source>/*.deb      package files, never rewritten in place
    dists/SUITE -> .generations/SUITE/N    a symlink, replaced by rename(2)
    dists/.generations/SUITE/N/            Release, InRelease, Release.gpg, main/binary-*/
    .moddeb/state.json, .moddeb/lock       what is published; the publishers' lock

A publish holds the lock throughout. New .debs go into the pool first (tmp file +
rename); then a complete new generation directory is built and signed; then the state
is written naming that generation; last a new symlink is renamed over dists/SUITE. A
reader resolves either the old symlink or the new one and so always sees a Release
whose indexes match. By-hash files of the last few generations are linked into each
new one, so a client that fetched the previous InRelease still finds what it names.
A publisher killed anywhere leaves the old generation live; the next publish notices
a state ahead of the live tree and rebuilds it before doing anything else.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import email.utils
import fcntl
import gzip
import hashlib
import json
import logging
import lzma
import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cmp_to_key
from lzma import LZMAError
from pathlib import Path
from tarfile import TarError
from typing import Any

from debian import deb822
from debian.debfile import ArError, DebError, DebFile
from debian.debian_support import version_compare

from builder import signing
from builder.config import Settings, load_settings
from builder.errors import InvalidInput, PublishFailed
from builder.metapackages import (
    build_metapackage,
    plan_metapackages,
)

log = logging.getLogger(__name__)

COMPONENT = "main"
STATE_FORMAT = 1
SUITE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")
VERSION_RE = re.compile(r"^(?:\d+:)?[0-9][A-Za-z0-9.+~-]*(?::[A-Za-z0-9.+~-]*)?$")
ARCH_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")
_LIBC = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
# Compression of the changed indexes dominates a publish into a big repository (at
# 10,000 packages xz -6 takes ~1.5 s, all while holding the lock, for a file ~20%
# smaller than xz -1's ~0.3 s). Publishing often beats saving clients a few hundred KB.
XZ_PRESET = 1
GZIP_LEVEL = 6
PARALLEL_INSPECT = 64  # below this many .debs a process pool costs more than it saves


@dataclass
class PublishResult:
    """What one publish changed in a suite."""

    suite: str
    added: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    metapackages: list[str] = field(default_factory=list)
    generation: str = ""
    changed: bool = False


# --- fault injection for the crash tests ----------------------------------------------
def _checkpoint(step: str) -> None:
    """Named points where the crash tests kill the publisher (MODDEB_REPO_FAULT=step)."""
    if os.environ.get("MODDEB_REPO_FAULT") == step:
        os.kill(os.getpid(), signal.SIGKILL)
    pause = os.environ.get("MODDEB_REPO_PAUSE")
    if pause:
        time.sleep(float(pause))


# --- small file helpers ------------------------------------------------------------------
def _write(path: Path, data: bytes, *, sync: bool = True) -> None:
    """Write a new file; with sync, push it to disk before returning."""
    with open(path, "wb") as fh:
        fh.write(data)
        if sync:
            fh.flush()
            os.fsync(fh.fileno())


def _sync_filesystem(path: Path) -> None:
    """Flush everything written to path's filesystem: one syncfs(2) instead of an fsync per file."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if _LIBC.syncfs(fd) != 0:
            os.sync()
    finally:
        os.close(fd)


def _replace(path: Path, data: bytes) -> None:
    """Replace a file so a reader (or a crash) sees the old content or the new, never half."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    _write(tmp, data)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _hashes(data: bytes) -> list[Any]:
    return [len(data), hashlib.md5(data).hexdigest(), hashlib.sha256(data).hexdigest()]


# --- reading packages --------------------------------------------------------------------
def pool_path(source: str, package: str, version: str, arch: str) -> str:
    """Where a package lives in the pool, relative to the repository root."""
    prefix = source[:4] if source.startswith("lib") and len(source) > 3 else source[0]
    upstream = version.split(":", 1)[1] if ":" in version else version
    return f"pool/{COMPONENT}/{prefix}/{source}/{package}_{upstream}_{arch}.deb"


def inspect_deb(path: Path) -> dict[str, Any]:
    """Hashes, identity and the Packages stanza of one .deb (from its control file)."""
    md5, sha, size = hashlib.md5(), hashlib.sha256(), 0
    try:
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 20):
                md5.update(chunk)
                sha.update(chunk)
                size += len(chunk)
        with DebFile(str(path)) as deb:
            control = deb.debcontrol()
    except (OSError, DebError, ArError, KeyError, EOFError, ValueError, TarError, LZMAError) as exc:
        raise InvalidInput(f"{path} is not a readable .deb: {exc}") from None
    package = control.get("Package", "")
    version = control.get("Version", "")
    arch = control.get("Architecture", "")
    source_field = (control.get("Source") or package).split()
    source = source_field[0] if source_field else ""  # "Source: name (version)" happens
    if not (NAME_RE.match(package) and NAME_RE.match(source)):
        raise InvalidInput(f"{path}: invalid Package or Source name {package!r}/{source!r}")
    if not VERSION_RE.match(version):
        raise InvalidInput(f"{path}: invalid Version {version!r}")
    if not ARCH_RE.match(arch) or arch == "any":
        raise InvalidInput(f"{path}: invalid Architecture {arch!r}")
    filename = pool_path(source, package, version, arch)
    stanza = deb822.Packages(control)
    stanza["Filename"] = filename
    stanza["Size"] = str(size)
    stanza["MD5sum"] = md5.hexdigest()
    stanza["SHA256"] = sha.hexdigest()
    return {
        "filename": filename,
        "package": package,
        "version": version,
        "arch": arch,
        "source": source,
        "size": size,
        "md5": md5.hexdigest(),
        "sha256": sha.hexdigest(),
        "stanza": stanza.dump(),
        "path": str(path),
    }


def inspect_debs(paths: list[Path]) -> list[dict[str, Any]]:
    """inspect_deb over many files, on every core when there are enough to be worth it."""
    if len(paths) < PARALLEL_INSPECT:
        return [inspect_deb(p) for p in paths]
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return list(pool.map(inspect_deb, paths, chunksize=64))


def _label(entry: dict[str, Any]) -> str:
    return f"{entry['package']} {entry['version']} ({entry['arch']})"


# --- the repository ----------------------------------------------------------------------------
def repo_root(settings: Settings) -> Path:
    """The configured repository directory (settings.repo_dir, default <home>/repo)."""
    return Path(settings.repo_dir).expanduser() if settings.repo_dir else settings.home / "repo"


def _empty_state() -> dict[str, Any]:
    return {"format": STATE_FORMAT, "key": "", "pool": {}, "suites": {}, "pending_deletes": []}


class Repository:
    """One repository tree on disk, published with one Settings' key and policies."""

    def __init__(self, root: Path, settings: Settings) -> None:
        self.root = Path(root).absolute()
        self.settings = settings
        self.dists = self.root / "dists"
        self.control_dir = self.root / ".moddeb"
        self.state_path = self.control_dir / "state.json"
        self.keyring = self.root / signing.KEYRING_NAME

    # locking and state ------------------------------------------------------------------
    @contextmanager
    def _lock(self) -> Iterator[None]:
        """Hold the repository's exclusive lock (released by the kernel if we die)."""
        self.control_dir.mkdir(parents=True, exist_ok=True)
        with open(self.control_dir / "lock", "a") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log.info("waiting for another publisher of %s", self.root)
                fcntl.flock(fh, fcntl.LOCK_EX)
            yield

    def _load_state(self) -> dict[str, Any]:
        if not self.state_path.is_file():
            if self.suites():
                raise PublishFailed(
                    f"{self.state_path} is missing but {self.dists} has published suites",
                    hint="run `moddeb repo reindex --adopt SUITE` to rebuild it from the pool",
                )
            return _empty_state()
        try:
            state: dict[str, Any] = json.loads(self.state_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise PublishFailed(f"cannot read {self.state_path}: {exc}") from None
        if state.get("format") != STATE_FORMAT:
            raise PublishFailed(f"{self.state_path} has unknown format {state.get('format')!r}")
        return state

    def _save_state(self, state: dict[str, Any]) -> None:
        state["pending_deletes"] = sorted(set(state["pending_deletes"]) - set(state["pool"]))
        _replace(self.state_path, json.dumps(state, separators=(",", ":")).encode())

    def _live(self, suite: str) -> str | None:
        """The generation dists/SUITE points at, or None."""
        link = self.dists / suite
        return Path(os.readlink(link)).name if link.is_symlink() else None

    # public operations --------------------------------------------------------------------
    def publish(
        self, suite: str, debs: Iterable[Path | str], *, refresh: bool = False
    ) -> PublishResult:
        """Add .debs to `suite`, apply retention, update metapackages, sign and switch."""
        if not SUITE_RE.match(suite):
            raise InvalidInput(f"invalid suite name {suite!r}")
        incoming = inspect_debs([Path(d) for d in debs])
        seen: dict[str, dict[str, Any]] = {}
        for deb in incoming:
            other = seen.setdefault(deb["filename"], deb)
            if other["sha256"] != deb["sha256"]:
                raise PublishFailed(
                    f"{_label(deb)} is given twice with different content: "
                    f"{other['path']} and {deb['path']}"
                )
        fpr = signing.ensure_key(self.settings)
        with self._lock():
            _checkpoint("locked")
            state = self._load_state()
            self._recover(state, fpr)
            with tempfile.TemporaryDirectory(dir=self.control_dir, prefix="tmp-") as tmp:
                return self._publish_locked(
                    state, suite, list(seen.values()), fpr, refresh, Path(tmp)
                )

    def _publish_locked(
        self,
        state: dict[str, Any],
        suite: str,
        incoming: list[dict[str, Any]],
        fpr: str,
        refresh: bool,
        tmp: Path,
    ) -> PublishResult:
        pool: dict[str, Any] = state["pool"]
        entry = state["suites"].setdefault(
            suite, {"generation": "", "packages": [], "files": {}, "by_hash": []}
        )
        before = set(entry["packages"])
        members = set(before)
        result = PublishResult(suite=suite)
        fresh: dict[str, dict[str, Any]] = {}
        for deb in incoming:
            known = pool.get(deb["filename"])
            if known and known["sha256"] != deb["sha256"]:
                raise PublishFailed(
                    f"{_label(deb)} is already in the repository with different content "
                    f"(sha256 {known['sha256'][:16]}..., {deb['path']} has {deb['sha256'][:16]}...)",
                    hint="a changed package needs a new version",
                )
            if deb["filename"] in members:
                result.unchanged.append(_label(deb))
                continue
            if not known:
                fresh[deb["filename"]] = deb
            members.add(deb["filename"])
            result.added.append(_label(deb))

        def lookup(name: str) -> dict[str, Any]:
            return fresh.get(name) or pool[name]

        members = self._retain(members, lookup)
        for plan in plan_metapackages(lookup(f) for f in members):
            meta = pool_path(plan.package, plan.package, plan.version, plan.arch)
            if meta in members:
                continue
            if meta not in pool and meta not in fresh:
                fresh[meta] = inspect_deb(build_metapackage(self.settings, plan, suite, tmp))
            members.add(meta)
            result.metapackages.append(f"{plan.package} {plan.version} -> {plan.depends}")
        members = self._retain(members, lookup)
        kept_labels = {_label(lookup(f)) for f in members}
        result.added = [a for a in result.added if a in kept_labels]
        result.removed = sorted(_label(lookup(f)) for f in (before | set(fresh)) - members)

        if members == before and not refresh and self._live(suite) == entry["generation"]:
            result.generation = entry["generation"]
            return result
        adding = sorted(set(fresh) & members)
        if adding:  # so a publisher killed before saving the state leaves no orphans
            _replace(self.control_dir / "intent.json", json.dumps(adding).encode())
        for name in adding:
            self._add_to_pool(name, Path(fresh[name]["path"]), fresh[name]["sha256"])
            pool[name] = {k: v for k, v in fresh[name].items() if k != "path"}
            _checkpoint("pool-written")
        entry["packages"] = sorted(members)
        referenced = {f for s in state["suites"].values() for f in s["packages"]}
        for name in sorted(set(pool) - referenced):
            del pool[name]
            state["pending_deletes"].append(name)
        self._commit(state, [suite], fpr)
        result.generation, result.changed = entry["generation"], True
        log.info(
            "published %s: +%d -%d, generation %s",
            suite,
            len(result.added),
            len(result.removed),
            result.generation,
        )
        return result

    def _retain(self, members: set[str], lookup: Callable[[str], dict[str, Any]]) -> set[str]:
        """Keep the newest repo_keep_versions versions of each package and arch (0: all)."""
        keep = self.settings.repo_keep_versions
        groups: dict[tuple[str, str], list[str]] = {}
        for name in members:
            e = lookup(name)
            groups.setdefault((e["package"], e["arch"]), []).append(name)
        kept: set[str] = set()
        for names in groups.values():
            if keep > 0 and len(names) > keep:

                def newer(a: str, b: str) -> int:
                    return version_compare(lookup(a)["version"], lookup(b)["version"])

                names = sorted(names, key=cmp_to_key(newer), reverse=True)[:keep]
            kept.update(names)
        return kept

    def _add_to_pool(self, name: str, src: Path, sha256: str) -> None:
        """Copy a .deb into the pool under a temporary name, check it, then rename it in."""
        dest = self.root / name
        if dest.is_file():  # left by a publisher killed before it saved the state
            digest = hashlib.sha256()
            with open(dest, "rb") as fh:
                while chunk := fh.read(1 << 20):
                    digest.update(chunk)
            if digest.hexdigest() == sha256:
                return
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
        digest = hashlib.sha256()
        with open(src, "rb") as fin, open(tmp, "wb") as fout:
            while chunk := fin.read(1 << 20):
                digest.update(chunk)
                fout.write(chunk)
        if digest.hexdigest() != sha256:
            tmp.unlink()
            raise PublishFailed(f"{src} changed while it was being published")
        os.replace(tmp, dest)  # made durable by _commit's syncfs before anything names it

    def _recover(self, state: dict[str, Any], fpr: str) -> None:
        """Rebuild suites whose live tree lags the state (a publisher died), then clean up."""
        for stale in self.dists.glob(".*.switch") if self.dists.is_dir() else []:
            stale.unlink()  # a symlink a killed publisher made but never renamed
        intent = self.control_dir / "intent.json"
        if intent.is_file():  # pool files a killed publisher wrote but never recorded
            for name in json.loads(intent.read_text(encoding="utf-8")):
                path = self.root / name
                for tmp in path.parent.glob(f".{path.name}.*.tmp"):
                    tmp.unlink()
                if name not in state["pool"]:
                    path.unlink(missing_ok=True)
            intent.unlink()
        behind = [s for s, e in state["suites"].items() if self._live(s) != e["generation"]]
        if behind:
            log.warning(
                "repository %s: rebuilding %s after an interrupted publish",
                self.root,
                ", ".join(behind),
            )
            self._commit(state, behind, fpr)
        self._delete_pending(state)

    def _commit(self, state: dict[str, Any], suites: list[str], fpr: str) -> None:
        """Build and sign new generations, save the state, switch them in, then clean up."""
        self._ensure_keyring(state, fpr)
        for suite in suites:
            self._build_generation(state, suite, fpr)
        # New pool files and generation trees reach the disk before the state names them.
        _sync_filesystem(self.root)
        self._save_state(state)
        (self.control_dir / "intent.json").unlink(missing_ok=True)
        _checkpoint("state-written")
        for suite in suites:
            self._switch(suite, state["suites"][suite]["generation"])
        _checkpoint("switched")
        self._delete_pending(state)
        for suite in suites:
            self._clean_generations(suite)

    def _ensure_keyring(self, state: dict[str, Any], fpr: str) -> None:
        """Export the public key at the root whenever it is missing or the key changed."""
        if state.get("key") == fpr and self.keyring.is_file():
            return
        self.root.mkdir(parents=True, exist_ok=True)
        _replace(self.keyring, signing.export_public_key(self.settings))
        os.chmod(self.keyring, 0o644)
        state["key"] = fpr

    def _build_generation(self, state: dict[str, Any], suite: str, fpr: str) -> None:
        """Write a complete, signed dists tree for `suite` into a new generation directory."""
        entry, pool = state["suites"][suite], state["pool"]
        gens = self.dists / ".generations" / suite
        gens.mkdir(parents=True, exist_ok=True)
        number = max(_generation_numbers(gens), default=0) + 1
        gen = gens / f"{number:06d}"
        live_name = self._live(suite)
        live = gens / live_name if live_name else None
        # Indexes whose text is unchanged are hard-linked from the live generation, when
        # the state describes it, instead of compressed again.
        reuse_from = live if live and live_name == entry["generation"] else None

        members = sorted(entry["packages"], key=lambda f: (pool[f]["package"], pool[f]["version"]))
        archs = set(self.settings.repo_architectures.replace(",", " ").split())
        archs |= {pool[f]["arch"] for f in members} - {"all"}
        files: dict[str, list[Any]] = {}
        jobs: list[tuple[str, bytes]] = []
        for arch in [*sorted(archs), "all"]:
            wanted = (arch,) if arch == "all" else (arch, "all")
            text = "\n".join(pool[f]["stanza"] for f in members if pool[f]["arch"] in wanted)
            data = text.encode()
            rel = f"{COMPONENT}/binary-{arch}/Packages"
            (gen / rel).parent.mkdir(parents=True, exist_ok=True)
            variants = [rel, rel + ".gz", rel + ".xz"]
            old = entry["files"].get(rel)
            if (
                reuse_from is not None
                and old
                and old[2] == hashlib.sha256(data).hexdigest()
                and all((reuse_from / v).is_file() and v in entry["files"] for v in variants)
            ):
                for v in variants:
                    os.link(reuse_from / v, gen / v)
                    files[v] = entry["files"][v]
            else:
                jobs += [(v, data) for v in variants]
        with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1)) as ex:
            for rel, blob in zip([j[0] for j in jobs], ex.map(_compress, jobs), strict=True):
                _write(gen / rel, blob, sync=False)
                files[rel] = _hashes(blob)

        own = set()
        for rel, (_, _, sha) in files.items():
            by_hash = f"{os.path.dirname(rel)}/by-hash/SHA256/{sha}"
            (gen / by_hash).parent.mkdir(parents=True, exist_ok=True)
            if not (gen / by_hash).exists():
                os.link(gen / rel, gen / by_hash)
            own.add(by_hash)
        history = entry["by_hash"][: max(0, self.settings.repo_keep_generations - 1)]
        for by_hash in {p for h in history for p in h} - own:
            if live and (live / by_hash).is_file():
                (gen / by_hash).parent.mkdir(parents=True, exist_ok=True)
                os.link(live / by_hash, gen / by_hash)
        _checkpoint("indexes-written")

        release = self._release(suite, archs, files)
        _write(gen / "Release", release.dump().encode(), sync=False)
        signing.sign_release(self.settings, gen / "Release", fpr)
        _checkpoint("signed")
        entry["generation"] = gen.name
        entry["files"] = files
        entry["by_hash"] = [sorted(own), *history]

    def _release(self, suite: str, archs: set[str], files: dict[str, list[Any]]) -> deb822.Release:
        s = self.settings
        now = datetime.now(UTC).replace(microsecond=0)
        release = deb822.Release()
        release["Origin"] = s.repo_origin
        release["Label"] = s.repo_label
        release["Suite"] = suite
        release["Codename"] = suite
        release["Date"] = email.utils.format_datetime(now, usegmt=True)
        if s.repo_valid_days > 0:
            until = now + timedelta(days=s.repo_valid_days)
            release["Valid-Until"] = email.utils.format_datetime(until, usegmt=True)
        release["Acquire-By-Hash"] = "yes"
        # Arch-all packages are in every binary-ARCH index, so apt need not fetch binary-all.
        release["No-Support-for-Architecture-all"] = "Packages"
        release["Architectures"] = " ".join(["all", *sorted(archs)])
        release["Components"] = COMPONENT
        release["Description"] = f"{s.repo_label} kernel module packages for {suite}"
        names = sorted(files)
        # deb822.Release formats these multivalued fields as " hash size name" lines.
        release["MD5Sum"] = [  # type: ignore[assignment]
            {"md5sum": files[n][1], "size": str(files[n][0]), "name": n} for n in names
        ]
        release["SHA256"] = [  # type: ignore[assignment]
            {"sha256": files[n][2], "size": str(files[n][0]), "name": n} for n in names
        ]
        return release

    def _switch(self, suite: str, generation: str) -> None:
        """Point dists/SUITE at a generation with one rename(2): readers see old or new."""
        link = self.dists / suite
        if link.exists() and not link.is_symlink():
            raise PublishFailed(f"{link} is a directory, not moddeb's symlink; move it away")
        tmp = self.dists / f".{suite}.{os.getpid()}.switch"
        tmp.unlink(missing_ok=True)
        os.symlink(f".generations/{suite}/{generation}", tmp)
        os.replace(tmp, link)
        _fsync_dir(self.dists)

    def _delete_pending(self, state: dict[str, Any]) -> None:
        """Remove pool files no live index names any more (only once every suite is live)."""
        if not state["pending_deletes"]:
            return
        if any(self._live(s) != e["generation"] for s, e in state["suites"].items()):
            return
        for name in state["pending_deletes"]:
            path = self.root / name
            path.unlink(missing_ok=True)
            for parent in (path.parent, path.parent.parent):
                try:
                    parent.rmdir()
                except OSError:
                    break
        _checkpoint("pending-deleted")
        state["pending_deletes"] = []

    def _clean_generations(self, suite: str) -> None:
        """Keep the live generation and the few before it; drop the rest and crash leftovers."""
        live = self._live(suite)
        gens = self.dists / ".generations" / suite
        if not live or not gens.is_dir():
            return
        current = int(live)
        numbers = _generation_numbers(gens)
        older = sorted((n for n in numbers if n < current), reverse=True)
        keep = max(0, self.settings.repo_keep_generations - 1)
        for n in older[keep:] + [n for n in numbers if n > current]:
            shutil.rmtree(gens / f"{n:06d}", ignore_errors=True)

    # maintenance -----------------------------------------------------------------------------
    def reindex(self, *, adopt_suite: str | None = None) -> dict[str, int]:
        """Re-read every .deb in the pool, refresh the state from them, rebuild every suite.

        With adopt_suite, pool files no suite lists are added to that suite (recovery
        after the state file was lost). Returns the package count of each suite.
        """
        if adopt_suite and not SUITE_RE.match(adopt_suite):
            raise InvalidInput(f"invalid suite name {adopt_suite!r}")
        fpr = signing.ensure_key(self.settings)
        with self._lock():
            pool_dir = self.root / "pool"
            for stale in pool_dir.rglob(".*.tmp") if pool_dir.is_dir() else []:
                stale.unlink()
            found = sorted(pool_dir.rglob("*.deb")) if pool_dir.is_dir() else []
            infos = inspect_debs(found)
            state = self._load_state() if self.state_path.is_file() else _empty_state()
            pool: dict[str, Any] = {}
            for info in infos:
                actual = str(Path(info["path"]).relative_to(self.root))
                if actual != info["filename"]:
                    log.warning("%s belongs at %s; leaving it out", actual, info["filename"])
                    continue
                pool[actual] = {k: v for k, v in info.items() if k != "path"}
            for suite, entry in state["suites"].items():
                missing = [f for f in entry["packages"] if f not in pool]
                if missing:
                    log.warning(
                        "%s: %d listed packages are gone from the pool, e.g. %s",
                        suite,
                        len(missing),
                        missing[0],
                    )
                entry["packages"] = [f for f in entry["packages"] if f in pool]
            if adopt_suite:
                entry = state["suites"].setdefault(
                    adopt_suite, {"generation": "", "packages": [], "files": {}, "by_hash": []}
                )
                listed = {f for e in state["suites"].values() for f in e["packages"]}
                entry["packages"] = sorted(set(entry["packages"]) | (set(pool) - listed))
            listed = {f for e in state["suites"].values() for f in e["packages"]}
            state["pool"] = {k: v for k, v in pool.items() if k in listed}
            for suite in state["suites"]:
                state["suites"][suite]["files"] = {}  # rehash everything
            self._commit(state, sorted(state["suites"]), fpr)
            return {s: len(e["packages"]) for s, e in state["suites"].items()}

    def packages(self, suite: str) -> list[dict[str, Any]]:
        """The packages a suite publishes (package, version, arch, filename, sha256)."""
        state = self._load_state()
        entry = state["suites"].get(suite)
        if entry is None:
            raise InvalidInput(f"the repository has no suite {suite!r}")
        keys = ("package", "version", "arch", "filename", "sha256")
        return [{k: state["pool"][f][k] for k in keys} for f in entry["packages"]]

    def suites(self) -> list[str]:
        """Suites published in this repository."""
        if not self.dists.is_dir():
            return []
        return sorted(
            p.name for p in self.dists.iterdir() if p.is_symlink() and not p.name.startswith(".")
        )

    def check(self, suite: str | None = None, *, deep: bool = False) -> list[str]:
        """Problems a client would hit: bad signatures, hashes, by-hash or pool files."""
        problems: list[str] = []
        for name in [suite] if suite else self.suites():
            live = self.dists / name
            inrelease = live / "InRelease"
            if not inrelease.is_file():
                problems.append(f"{name}: no InRelease")
                continue
            if not signing.verify(self.keyring, inrelease):
                problems.append(f"{name}: InRelease signature does not verify")
            if not signing.verify(self.keyring, live / "Release.gpg", live / "Release"):
                problems.append(f"{name}: Release.gpg does not verify Release")
            with open(inrelease, encoding="utf-8") as fh:
                signed = deb822.Release(fh)
            with open(live / "Release", encoding="utf-8") as fh:
                if deb822.Release(fh) != signed:
                    problems.append(f"{name}: Release and InRelease differ")
            for item in signed.get("SHA256", []):
                path = live / item["name"]
                if not path.is_file():
                    problems.append(f"{name}: {item['name']} is missing")
                    continue
                data = path.read_bytes()
                if len(data) != int(item["size"]) or _hashes(data)[2] != item["sha256"]:
                    problems.append(f"{name}: {item['name']} does not match Release")
                by_hash = path.parent / "by-hash/SHA256" / item["sha256"]
                if not by_hash.is_file():
                    problems.append(f"{name}: by-hash file for {item['name']} is missing")
                if deep and item["name"].endswith("/Packages"):
                    problems += self._check_pool(name, data)
        return problems

    def _check_pool(self, suite: str, packages: bytes) -> list[str]:
        problems = []
        for para in deb822.Packages.iter_paragraphs(packages.decode(), use_apt_pkg=False):
            path = self.root / para["Filename"]
            if not path.is_file():
                problems.append(f"{suite}: {para['Filename']} is missing from the pool")
            elif hashlib.sha256(path.read_bytes()).hexdigest() != para["SHA256"]:
                problems.append(f"{suite}: {para['Filename']} does not match its SHA256")
        return problems


def _generation_numbers(gens: Path) -> list[int]:
    return [int(p.name) for p in gens.iterdir() if p.name.isdigit()]


def _compress(job: tuple[str, bytes]) -> bytes:
    name, data = job
    if name.endswith(".gz"):
        return gzip.compress(data, compresslevel=GZIP_LEVEL, mtime=0)
    if name.endswith(".xz"):
        return lzma.compress(data, preset=XZ_PRESET)
    return data


def open_repository(target: Settings | Path | str, settings: Settings | None = None) -> Repository:
    """A Repository for a Settings (its repo_dir) or a directory (with settings for the key)."""
    if isinstance(target, Settings):
        return Repository(repo_root(target), target)
    return Repository(Path(target), settings or load_settings())


def publish(
    target: Settings | Path | str,
    suite: str,
    debs: Iterable[Path | str],
    *,
    settings: Settings | None = None,
    refresh: bool = False,
) -> PublishResult:
    """Publish .debs into `suite` of the configured repository or of a given directory."""
    return open_repository(target, settings).publish(suite, debs, refresh=refresh)
