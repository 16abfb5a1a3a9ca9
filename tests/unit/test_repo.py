"""The apt repository: indexes, Release, conflicts, retention, metapackages, recovery."""

from __future__ import annotations

import gzip
import hashlib
import json
import lzma
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from debian import deb822

from builder import metapackages, repo, signing
from builder.config import Settings
from builder.errors import InvalidInput, PublishFailed


def make_deb(
    out: Path,
    package: str,
    version: str = "1.0-1",
    arch: str = "amd64",
    *,
    payload: str = "",
    source: str | None = None,
    depends: str | None = None,
    files: dict[str, bytes] | None = None,
) -> Path:
    """Build a tiny real .deb with dpkg-deb; `payload` changes its content, not its identity."""
    tree = out / f"tree-{package}-{version}-{arch}-{hashlib.md5(payload.encode()).hexdigest()[:6]}"
    (tree / "DEBIAN").mkdir(parents=True)
    fields = {"Package": package, "Version": version, "Architecture": arch}
    if source:
        fields["Source"] = source
    if depends:
        fields["Depends"] = depends
    fields["Maintainer"] = "Test <test@example.org>"
    fields["Description"] = f"test package {package}\n payload {payload or 'none'}"
    (tree / "DEBIAN/control").write_text(deb822.Deb822(fields).dump(), encoding="utf-8")
    for rel, data in (files or {f"usr/share/doc/{package}/payload": payload.encode()}).items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_bytes(data)
    deb = out / f"{package}_{version}_{arch}-{tree.name[-6:]}.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(tree), str(deb)],
        check=True,
        capture_output=True,
    )
    shutil.rmtree(tree)
    return deb


@pytest.fixture
def rs(settings: Settings):
    """Settings for a repository in the test's home; its gpg-agent is stopped afterwards."""
    yield settings
    signing.stop_agent(settings)


@pytest.fixture
def debs(tmp_path: Path) -> Path:
    d = tmp_path / "debs"
    d.mkdir()
    return d


def live(settings: Settings, suite: str = "bookworm") -> Path:
    return repo.repo_root(settings) / "dists" / suite


def stanzas(settings: Settings, arch: str, suite: str = "bookworm") -> list[deb822.Packages]:
    text = (live(settings, suite) / f"main/binary-{arch}/Packages").read_text(encoding="utf-8")
    return list(deb822.Packages.iter_paragraphs(text, use_apt_pkg=False))


def names(settings: Settings, arch: str = "amd64", suite: str = "bookworm") -> set[str]:
    return {f"{p['Package']}={p['Version']}" for p in stanzas(settings, arch, suite)}


def test_index_stanzas_carry_control_fields_and_pool_hashes(rs: Settings, debs: Path) -> None:
    """Each Packages stanza is the .deb's control plus Filename, Size, MD5sum and SHA256."""
    deb = make_deb(debs, "libfoo1", "2:1.5-3", source="libfoo (1.5-3)", depends="libc6")
    repo.publish(rs, "bookworm", [deb])
    (para,) = [p for p in stanzas(rs, "amd64") if p["Package"] == "libfoo1"]
    assert para["Version"] == "2:1.5-3" and para["Depends"] == "libc6"
    assert para["Filename"] == "pool/main/libf/libfoo/libfoo1_1.5-3_amd64.deb"  # no epoch
    pooled = repo.repo_root(rs) / para["Filename"]
    data = pooled.read_bytes()
    assert data == deb.read_bytes()
    assert para["Size"] == str(len(data))
    assert para["MD5sum"] == hashlib.md5(data).hexdigest()
    assert para["SHA256"] == hashlib.sha256(data).hexdigest()


def test_release_lists_every_index_with_matching_hashes(rs: Settings, debs: Path) -> None:
    """Release names Packages/.gz/.xz of every arch with sizes and hashes that match the files."""
    repo.publish(rs, "bookworm", [make_deb(debs, "foo"), make_deb(debs, "bar", arch="all")])
    d = live(rs)
    release = deb822.Release((d / "Release").read_text())
    assert release["Suite"] == release["Codename"] == "bookworm"
    assert release["Acquire-By-Hash"] == "yes"
    assert release["Architectures"].split() == ["all", "amd64"]
    assert release["Components"] == "main" and "Date" in release
    assert "Valid-Until" not in release
    listed = {item["name"]: item for item in release["SHA256"]}
    assert set(listed) == {
        f"main/binary-{a}/Packages{s}" for a in ("all", "amd64") for s in ("", ".gz", ".xz")
    }
    md5 = {item["name"]: item["md5sum"] for item in release["MD5Sum"]}
    for name, item in listed.items():
        data = (d / name).read_bytes()
        assert int(item["size"]) == len(data)
        assert item["sha256"] == hashlib.sha256(data).hexdigest()
        assert md5[name] == hashlib.md5(data).hexdigest()
        by_hash = (d / name).parent / "by-hash/SHA256" / item["sha256"]
        assert by_hash.read_bytes() == data
    plain = (d / "main/binary-amd64/Packages").read_bytes()
    assert gzip.decompress((d / "main/binary-amd64/Packages.gz").read_bytes()) == plain
    assert lzma.decompress((d / "main/binary-amd64/Packages.xz").read_bytes()) == plain
    assert repo.open_repository(rs).check(deep=True) == []


def test_release_is_signed_inline_and_detached_with_the_exported_key(
    rs: Settings, debs: Path
) -> None:
    """InRelease and Release.gpg verify against moddeb-archive-keyring.gpg, a binary keyring."""
    rs.repo_valid_days = 7
    repo.publish(rs, "bookworm", [make_deb(debs, "foo")])
    root, d = repo.repo_root(rs), live(rs)
    keyring = root / "moddeb-archive-keyring.gpg"
    assert not keyring.read_bytes().startswith(b"-----BEGIN")  # binary, for Signed-By
    assert signing.verify(keyring, d / "InRelease")
    assert signing.verify(keyring, d / "Release.gpg", d / "Release")
    assert (d / "Release.gpg").read_text().startswith("-----BEGIN PGP SIGNATURE-----")
    assert deb822.Release((d / "InRelease").read_text()) == deb822.Release(
        (d / "Release").read_text()
    )
    assert "Valid-Until" in deb822.Release((d / "Release").read_text())


def test_arch_all_packages_appear_in_every_binary_arch_index(rs: Settings, debs: Path) -> None:
    """An Architecture: all package is listed in binary-all and in each binary-ARCH index."""
    rs.repo_architectures = "amd64 arm64"
    repo.publish(rs, "bookworm", [make_deb(debs, "docs", arch="all"), make_deb(debs, "foo")])
    assert names(rs, "all") == {"docs=1.0-1"}
    assert names(rs, "amd64") == {"docs=1.0-1", "foo=1.0-1"}
    assert names(rs, "arm64") == {"docs=1.0-1"}
    release = deb822.Release((live(rs) / "Release").read_text())
    assert release["Architectures"].split() == ["all", "amd64", "arm64"]


def test_same_version_with_different_content_is_refused(rs: Settings, debs: Path) -> None:
    """Re-publishing name/version/arch with other bytes fails clearly and changes nothing."""
    repo.publish(rs, "bookworm", [make_deb(debs, "foo", payload="one")])
    before = os.readlink(live(rs))
    with pytest.raises(PublishFailed, match=r"foo 1.0-1 \(amd64\) is already in the repository"):
        repo.publish(rs, "bookworm", [make_deb(debs, "foo", payload="two"), make_deb(debs, "xx")])
    assert os.readlink(live(rs)) == before
    assert names(rs) == {"foo=1.0-1"}
    # The pool is shared, so another suite cannot take different bytes under that name either.
    with pytest.raises(PublishFailed, match="different content"):
        repo.publish(rs, "trixie", [make_deb(debs, "foo", payload="three")])


def test_same_package_twice_in_one_call_with_different_content_is_refused(
    rs: Settings, debs: Path
) -> None:
    """Two files claiming one name/version/arch in one publish are refused before any change."""
    a, b = make_deb(debs, "foo", payload="a"), make_deb(debs, "foo", payload="b")
    with pytest.raises(PublishFailed, match="given twice"):
        repo.publish(rs, "bookworm", [a, b])
    assert not live(rs).exists()


def test_identical_republish_changes_nothing(rs: Settings, debs: Path) -> None:
    """Publishing the same bytes again makes no new generation: Release is untouched."""
    deb = make_deb(debs, "foo")
    first = repo.publish(rs, "bookworm", [deb])
    release = (live(rs) / "InRelease").read_bytes()
    again = repo.publish(rs, "bookworm", [deb])
    assert first.changed and not again.changed
    assert again.unchanged == ["foo 1.0-1 (amd64)"] and again.added == []
    assert again.generation == first.generation
    assert (live(rs) / "InRelease").read_bytes() == release


def test_invalid_input_is_reported_as_such(rs: Settings, debs: Path) -> None:
    """A file that is not a .deb, or a bad suite name, is invalid input."""
    bogus = debs / "bogus.deb"
    bogus.write_bytes(b"not an ar archive")
    with pytest.raises(InvalidInput, match="not a readable .deb"):
        repo.publish(rs, "bookworm", [bogus])
    with pytest.raises(InvalidInput, match="invalid suite"):
        repo.publish(rs, "../etc", [make_deb(debs, "foo")])


def test_retention_keeps_newest_versions_and_removes_their_pool_files(
    rs: Settings, debs: Path
) -> None:
    """With repo_keep_versions=2 the oldest version leaves the index, then the pool."""
    rs.repo_keep_versions = 2
    root = repo.repo_root(rs)
    for v in ("1.0-1", "1.10-1", "1.9-1"):
        repo.publish(rs, "bookworm", [make_deb(debs, "foo", v)])
    assert names(rs) == {"foo=1.10-1", "foo=1.9-1"}  # Debian ordering, not string ordering
    assert not (root / "pool/main/f/foo/foo_1.0-1_amd64.deb").exists()
    assert (root / "pool/main/f/foo/foo_1.9-1_amd64.deb").is_file()
    result = repo.publish(rs, "bookworm", [make_deb(debs, "foo", "0.9-1")])
    assert result.removed == ["foo 0.9-1 (amd64)"] and result.added == []
    assert not (root / "pool/main/f/foo/foo_0.9-1_amd64.deb").exists()
    assert repo.open_repository(rs).check(deep=True) == []


def test_pool_files_shared_by_suites_stay_until_no_suite_lists_them(
    rs: Settings, debs: Path
) -> None:
    """A pool file dropped from one suite survives while another suite still lists it."""
    rs.repo_keep_versions = 1
    old = make_deb(debs, "foo", "1.0-1")
    repo.publish(rs, "bookworm", [old])
    repo.publish(rs, "trixie", [old])
    repo.publish(rs, "trixie", [make_deb(debs, "foo", "2.0-1")])
    pooled = repo.repo_root(rs) / "pool/main/f/foo/foo_1.0-1_amd64.deb"
    assert pooled.is_file() and names(rs, suite="bookworm") == {"foo=1.0-1"}
    repo.publish(rs, "bookworm", [make_deb(debs, "foo", "2.0-1")])
    assert not pooled.exists()
    assert repo.open_repository(rs).check(deep=True) == []


def test_old_generations_are_pruned_but_recent_by_hash_files_survive(
    rs: Settings, debs: Path
) -> None:
    """Only repo_keep_generations generation dirs remain; the last ones' by-hash files persist."""
    rs.repo_keep_generations = 2
    hashes = []
    for i in range(4):
        repo.publish(rs, "bookworm", [make_deb(debs, f"p{i}")])
        release = deb822.Release((live(rs) / "Release").read_text())
        hashes.append({x["sha256"] for x in release["SHA256"] if "amd64" in x["name"]})
    gens = live(rs).parent / ".generations/bookworm"
    assert sorted(p.name for p in gens.iterdir()) == ["000003", "000004"]
    by_hash = {p.name for p in (live(rs) / "main/binary-amd64/by-hash/SHA256").iterdir()}
    assert hashes[3] | hashes[2] <= by_hash
    assert not hashes[0] & by_hash


def test_abis_order_like_debian_versions() -> None:
    """6.12.117+deb12 > 6.12.9+deb12 > 6.1.0-57 > 6.1.0-9, and meta versions follow suit."""
    order = ["6.1.0-9", "6.1.0-57", "6.12.9+deb12", "6.12.117+deb12"]
    for older, newer in zip(order, order[1:], strict=False):
        assert metapackages.compare_abis(newer, older) > 0
        assert (
            metapackages.version_compare(
                metapackages.meta_version(newer), metapackages.meta_version(older)
            )
            > 0
        )
    assert metapackages.parse_module_package("kbench-modules-6.12.117+deb12-cloud-amd64") == (
        "kbench",
        "6.12.117+deb12",
        "cloud-amd64",
    )
    assert metapackages.parse_module_package("my-mod-modules-6.1.0-57-rt-amd64") == (
        "my-mod",
        "6.1.0-57",
        "rt-amd64",
    )
    assert metapackages.parse_module_package("kbench-modules-amd64") is None
    assert metapackages.parse_module_package("kbench-dkms") is None


def test_metapackage_plan_picks_the_newest_abi_per_module_and_flavour() -> None:
    """One NAME-modules-FLAVOUR per module, flavour and arch, depending on its newest ABI."""
    entries = [
        {"package": f"kbench-modules-{k}", "arch": "amd64"}
        for k in (
            "6.1.0-57-amd64",
            "6.12.9+deb12-amd64",
            "6.12.117+deb12-amd64",
            "6.1.0-58-cloud-amd64",
            "6.1.0-9-cloud-amd64",
        )
    ] + [
        {"package": "other-modules-6.1.0-57-amd64", "arch": "amd64"},
        {"package": "x", "arch": "all"},
    ]
    plans = {p.package: p for p in metapackages.plan_metapackages(entries)}
    assert set(plans) == {
        "kbench-modules-amd64",
        "kbench-modules-cloud-amd64",
        "other-modules-amd64",
    }
    assert plans["kbench-modules-amd64"].depends == "kbench-modules-6.12.117+deb12-amd64"
    assert plans["kbench-modules-amd64"].version == "6.12.117+deb12-1"
    assert plans["kbench-modules-cloud-amd64"].depends == "kbench-modules-6.1.0-58-cloud-amd64"
    assert plans["kbench-modules-cloud-amd64"].version == "6.1.0.58-1"


def test_metapackage_follows_newer_abis_as_they_are_published(rs: Settings, debs: Path) -> None:
    """kbench-modules-amd64 is made on first publish and replaced, with a higher version, by a newer ABI."""
    repo.publish(rs, "bookworm", [make_deb(debs, "kbench-modules-6.1.0-57-amd64", "0.2-1")])
    (meta,) = [p for p in stanzas(rs, "amd64") if p["Package"] == "kbench-modules-amd64"]
    assert meta["Depends"] == "kbench-modules-6.1.0-57-amd64"
    assert meta["Section"] == "kernel" and meta["Architecture"] == "amd64"
    # An older module version for a newer ABI still moves the metapackage forward.
    result = repo.publish(
        rs, "bookworm", [make_deb(debs, "kbench-modules-6.12.117+deb12-amd64", "0.1-1")]
    )
    assert result.metapackages == [
        "kbench-modules-amd64 6.12.117+deb12-1 -> kbench-modules-6.12.117+deb12-amd64"
    ]
    metas = [p for p in stanzas(rs, "amd64") if p["Package"] == "kbench-modules-amd64"]
    newest = max(metas, key=lambda p: metapackages.abi_version(p["Version"]))
    assert newest["Depends"] == "kbench-modules-6.12.117+deb12-amd64"
    # An older ABI published later changes nothing about the metapackage.
    late = repo.publish(rs, "bookworm", [make_deb(debs, "kbench-modules-6.1.0-9-amd64", "0.2-1")])
    assert late.metapackages == []
    assert repo.open_repository(rs).check(deep=True) == []


def test_metapackage_is_lintian_clean(rs: Settings, debs: Path) -> None:
    """The generated metapackage has copyright, changelog and description: no lintian errors."""
    if shutil.which("lintian") is None:
        pytest.skip("lintian is not installed")
    repo.publish(rs, "bookworm", [make_deb(debs, "kbench-modules-6.1.0-57-amd64", "0.2-1")])
    (deb,) = (repo.repo_root(rs) / "pool/main/k/kbench-modules-amd64").glob("*.deb")
    proc = subprocess.run(
        ["lintian", "--tag-display-limit", "0", str(deb)], capture_output=True, text=True
    )
    assert not [ln for ln in proc.stdout.splitlines() if ln.startswith("E:")], proc.stdout
    contents = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True).stdout
    assert "usr/share/doc/kbench-modules-amd64/copyright" in contents
    assert "usr/share/doc/kbench-modules-amd64/changelog.Debian.gz" in contents


def test_publishing_nothing_creates_an_empty_signed_suite(rs: Settings) -> None:
    """A suite with no packages still has valid, signed, empty indexes for apt-get update."""
    result = repo.publish(rs, "bookworm", [])
    assert result.changed
    assert (live(rs) / "main/binary-amd64/Packages").read_bytes() == b""
    assert repo.open_repository(rs).check() == []


def test_refresh_resigns_with_a_new_date(rs: Settings, debs: Path) -> None:
    """refresh=True writes a new generation (for Valid-Until) with the same packages."""
    repo.publish(rs, "bookworm", [make_deb(debs, "foo")])
    first = os.readlink(live(rs))
    result = repo.publish(rs, "bookworm", [], refresh=True)
    assert result.changed and os.readlink(live(rs)) != first
    assert names(rs) == {"foo=1.0-1"}


def test_check_reports_a_tampered_index(rs: Settings, debs: Path) -> None:
    """check() notices an index that no longer matches Release."""
    repo.publish(rs, "bookworm", [make_deb(debs, "foo")])
    packages = live(rs) / "main/binary-amd64/Packages"
    data = packages.read_bytes()
    packages.unlink()  # the by-hash copy is a hard link; keep it intact
    packages.write_bytes(data.replace(b"foo", b"fop"))
    assert any("does not match Release" in p for p in repo.open_repository(rs).check())


def test_missing_state_is_refused_and_reindex_adopts_the_pool(rs: Settings, debs: Path) -> None:
    """Without state.json a publish refuses to shadow the live suite; reindex --adopt rebuilds it."""
    repo.publish(rs, "bookworm", [make_deb(debs, "foo"), make_deb(debs, "bar", arch="all")])
    root = repo.repo_root(rs)
    (root / ".moddeb/state.json").unlink()
    with pytest.raises(PublishFailed, match="state.json is missing"):
        repo.publish(rs, "bookworm", [make_deb(debs, "baz")])
    counts = repo.open_repository(rs).reindex(adopt_suite="bookworm")
    assert counts == {"bookworm": 2}
    assert names(rs) == {"foo=1.0-1", "bar=1.0-1"}
    assert repo.open_repository(rs).check(deep=True) == []


def test_reindex_drops_entries_whose_pool_file_vanished(rs: Settings, debs: Path) -> None:
    """reindex re-reads the pool; a deleted pool file leaves the index instead of breaking it."""
    repo.publish(rs, "bookworm", [make_deb(debs, "foo"), make_deb(debs, "bar")])
    (repo.repo_root(rs) / "pool/main/b/bar/bar_1.0-1_amd64.deb").unlink()
    assert repo.open_repository(rs).reindex() == {"bookworm": 1}
    assert names(rs) == {"foo=1.0-1"}
    assert repo.open_repository(rs).check(deep=True) == []


def test_state_records_published_packages_for_fast_publishes(rs: Settings, debs: Path) -> None:
    """The state file lists what each suite publishes and which generation is live."""
    repo.publish(rs, "bookworm", [make_deb(debs, "foo")])
    state = json.loads((repo.repo_root(rs) / ".moddeb/state.json").read_text())
    assert state["suites"]["bookworm"]["packages"] == ["pool/main/f/foo/foo_1.0-1_amd64.deb"]
    assert state["suites"]["bookworm"]["generation"] == os.readlink(live(rs)).split("/")[-1]
    assert repo.open_repository(rs).packages("bookworm")[0]["package"] == "foo"


def test_unchanged_indexes_are_linked_not_recompressed(rs: Settings, debs: Path) -> None:
    """Publishing an amd64 package leaves binary-all's files the very same inodes."""
    repo.publish(rs, "bookworm", [make_deb(debs, "docs", arch="all")])
    before = (live(rs) / "main/binary-all/Packages.xz").resolve()
    repo.publish(rs, "bookworm", [make_deb(debs, "foo")])
    after = (live(rs) / "main/binary-all/Packages.xz").resolve()
    assert before != after and before.stat().st_ino == after.stat().st_ino
    assert repo.open_repository(rs).check() == []
