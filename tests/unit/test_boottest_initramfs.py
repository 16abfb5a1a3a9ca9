"""The boot-test initramfs: cpio layout, module extraction, dependency resolution (no QEMU)."""

from __future__ import annotations

import gzip
import lzma
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from builder.errors import BuildFailed, InvalidInput
from builder.initramfs import (
    LoadStep,
    ModInfo,
    ModuleTree,
    build_initramfs,
    check_static,
    extract_module_debs,
    module_bytes,
    module_name,
    newc_bytes,
    parse_softdep,
    read_modinfo,
    read_module_tree,
    read_newc,
    resolve_load_order,
    symlink_entry,
)
from tests.conftest import _require

INIT = (Path(__file__).resolve().parents[2] / "debian-templates/boottest/init").read_text()


def fake_ko(modinfo: dict[str, str]) -> bytes:
    """A minimal ELF relocatable with just a .modinfo section: enough for modinfo and depmod."""
    info = b"".join(f"{k}={v}".encode() + b"\0" for k, v in modinfo.items())
    shstr = b"\0.modinfo\0.shstrtab\0"
    shstr_off = 64 + len(info)
    sh_off = (shstr_off + len(shstr) + 7) & ~7
    ident = b"\x7fELF\x02\x01\x01" + b"\0" * 9
    ehdr = struct.pack("<16sHHIQQQIHHHHHH", ident, 1, 62, 1, 0, 0, sh_off, 0, 64, 0, 0, 64, 3, 2)
    sections = b"\0" * 64
    sections += struct.pack("<IIQQQQIIQQ", 1, 1, 2, 0, 64, len(info), 0, 0, 1, 0)
    sections += struct.pack("<IIQQQQIIQQ", 10, 3, 0, 0, shstr_off, len(shstr), 0, 0, 1, 0)
    body = ehdr + info + shstr
    return body + b"\0" * (sh_off - len(body)) + sections


def fake_busybox(path: Path, interp: bool = False) -> Path:
    """An ELF64 executable header with one program header: PT_INTERP (dynamic) or PT_LOAD."""
    ident = b"\x7fELF\x02\x01\x01" + b"\0" * 9
    ehdr = struct.pack("<16sHHIQQQIHHHHHH", ident, 2, 62, 1, 0, 64, 0, 0, 64, 56, 1, 64, 0, 0)
    phdr = struct.pack("<IIQQQQQQ", 3 if interp else 1, 4, 0, 0, 0, 0, 0, 0)
    path.write_bytes(ehdr + phdr)
    return path


def make_deb(tmp: Path, package: str, files: dict[str, bytes]) -> Path:
    """Build a small binary package with dpkg-deb holding the given files."""
    root = tmp / f"root-{package}"
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN/control").write_text(
        f"Package: {package}\nVersion: 1\nArchitecture: amd64\n"
        "Maintainer: Test <test@example.org>\nDescription: test\n"
    )
    deb = tmp / f"{package}.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-b", str(root), str(deb)],
        check=True,
        capture_output=True,
    )
    return deb


def test_newc_round_trip_keeps_modes_links_and_devices() -> None:
    """The cpio writer produces newc that reads back with the same names, modes and data."""
    from builder.initramfs import chardev_entry, dir_entry, file_entry

    entries = [
        dir_entry("bin"),
        file_entry("bin/busybox", b"\x7fELF...", executable=True),
        symlink_entry("bin/sh", "busybox"),
        chardev_entry("dev/console", 5, 1),
        file_entry("odd", b"abc"),  # lengths not a multiple of 4 exercise the padding
    ]
    data = newc_bytes(entries)
    assert len(data) % 512 == 0
    assert read_newc(data) == entries


def test_initramfs_holds_busybox_init_modules_and_smoke(tmp_path: Path) -> None:
    """/init, busybox (+ sh), /dev/console, decompressed modules, the load list and the smoke."""
    xz = tmp_path / "dep.ko.xz"
    xz.write_bytes(lzma.compress(b"DEP-ELF", check=lzma.CHECK_CRC32))
    plain = tmp_path / "kbench.ko"
    plain.write_bytes(b"KBENCH-ELF")
    steps = [LoadStep("dep", xz, "dep"), LoadStep("kbench", plain, "test")]
    out = build_initramfs(
        tmp_path / "initrd.gz",
        INIT,
        steps,
        smoke="cat /sys/kernel/kbench/run\n",
        smoke_timeout=42,
        busybox=fake_busybox(tmp_path / "busybox"),
    )
    assert out.read_bytes()[:2] == b"\x1f\x8b"
    files = {e.name: e for e in read_newc(out.read_bytes())}
    assert files["init"].mode == 0o100755 and files["init"].data.decode() == INIT
    assert files["bin/sh"].mode == 0o120777 and files["bin/sh"].data == b"busybox"
    assert files["dev/console"].rdev == (5, 1)
    assert files["moddeb/modules/dep.ko"].data == b"DEP-ELF"
    assert files["moddeb/modules/kbench.ko"].data == b"KBENCH-ELF"
    assert files["moddeb/load"].data == b"dep dep dep.ko\ntest kbench kbench.ko\n"
    assert files["moddeb/env"].data == b"SMOKE_TIMEOUT=42\n"
    assert files["moddeb/smoke.sh"].data == b"cat /sys/kernel/kbench/run\n"


def test_initramfs_without_smoke_has_no_smoke_script(tmp_path: Path) -> None:
    """With no smoke command /init only loads modules: no /moddeb/smoke.sh is written."""
    out = build_initramfs(tmp_path / "i.gz", INIT, [], busybox=fake_busybox(tmp_path / "bb"))
    assert "moddeb/smoke.sh" not in {e.name for e in read_newc(out.read_bytes())}


def test_dynamic_or_missing_busybox_is_refused_with_the_package_to_install(tmp_path: Path) -> None:
    """A dynamically linked busybox cannot run in the initramfs: say to install busybox-static."""
    with pytest.raises(InvalidInput, match="dynamically linked") as exc:
        check_static(fake_busybox(tmp_path / "bb", interp=True))
    assert exc.value.hint == "apt-get install busybox-static"
    with pytest.raises(InvalidInput, match="no busybox"):
        check_static(tmp_path / "missing")
    check_static(fake_busybox(tmp_path / "static"))


def test_module_names_drop_compression_suffixes_and_use_underscores() -> None:
    """Module file names map to the names the kernel and modinfo use."""
    assert module_name(Path("a/crc32c-intel.ko.xz")) == "crc32c_intel"
    assert module_name(Path("kbench.ko")) == "kbench"
    assert module_name(Path("x.ko.zst")) == "x"
    with pytest.raises(ValueError):
        module_name(Path("README"))


def test_modules_are_decompressed_for_busybox_insmod(tmp_path: Path) -> None:
    """.ko.xz and .ko.gz modules go into the initramfs as plain ELF."""
    (tmp_path / "a.ko.xz").write_bytes(lzma.compress(b"ELF-A"))
    (tmp_path / "b.ko.gz").write_bytes(gzip.compress(b"ELF-B"))
    assert module_bytes(tmp_path / "a.ko.xz") == b"ELF-A"
    assert module_bytes(tmp_path / "b.ko.gz") == b"ELF-B"


def tree(**deps: list[str]) -> ModuleTree:
    """A ModuleTree whose modules have the given hard dependencies."""
    t = ModuleTree()
    for name, needs in deps.items():
        t.paths[name] = Path(f"/k/{name}.ko")
        t.info[name] = ModInfo(depends=needs)
    return t


def test_dependencies_load_first_once_each() -> None:
    """Hard dependencies come before what needs them, each loaded only once."""
    t = tree(nf_conntrack=["libcrc32c", "nf_defrag_ipv4"], libcrc32c=[], nf_defrag_ipv4=[])
    target = Path("/deb/kbench.ko")
    steps = resolve_load_order(
        [target], t, "6.1.0-57-amd64", modinfo=lambda p: ModInfo(["nf_conntrack", "libcrc32c"])
    )
    assert [(s.name, s.role) for s in steps] == [
        ("libcrc32c", "dep"),
        ("nf_defrag_ipv4", "dep"),
        ("nf_conntrack", "dep"),
        ("kbench", "test"),
    ]
    assert steps[-1].path == target


def test_modules_of_one_package_may_depend_on_each_other() -> None:
    """A package's second module that needs its first loads after it; both are under test."""
    infos = {"core": ModInfo(), "extra": ModInfo(["core"])}
    steps = resolve_load_order(
        [Path("/d/extra.ko"), Path("/d/core.ko")],
        tree(),
        "k",
        modinfo=lambda p: infos[module_name(p)],
    )
    assert [(s.name, s.role) for s in steps] == [("core", "test"), ("extra", "test")]


def test_a_dependency_the_kernel_lacks_is_a_failure_naming_it() -> None:
    """A module needing something this kernel does not ship fails before any VM starts."""
    with pytest.raises(BuildFailed, match="kbench needs module nosuch, which 6.12.1 lacks"):
        resolve_load_order(
            [Path("/d/kbench.ko")], tree(), "6.12.1", modinfo=lambda p: ModInfo(["nosuch"])
        )


def test_a_dependency_cycle_is_reported() -> None:
    """Cyclic depends= cannot be loaded; the cycle is named."""
    with pytest.raises(BuildFailed, match="cycle: a -> b -> a"):
        resolve_load_order([Path("/d/x.ko")], tree(a=["b"], b=["a"]), "k", lambda p: ModInfo(["a"]))


def test_softdeps_resolve_through_aliases_and_are_best_effort() -> None:
    """'softdep pre: crc32c' loads every module aliased crc32c, marked soft, before the module."""
    t = tree(libcrc32c=[], crc32c_generic=[], crc32c_intel=[])
    t.info["libcrc32c"].pre = ["crc32c"]
    t.aliases = [("crc32c", "crc32c_generic"), ("crc32c", "crc32c_intel"), ("crypto-*", "x")]
    steps = resolve_load_order([Path("/d/m.ko")], t, "k", lambda p: ModInfo(["libcrc32c"]))
    assert [(s.name, s.role) for s in steps] == [
        ("crc32c_generic", "soft"),
        ("crc32c_intel", "soft"),
        ("libcrc32c", "dep"),
        ("m", "test"),
    ]


def test_a_hard_need_upgrades_an_earlier_softdep() -> None:
    """A module first pulled in as a softdep and later needed outright is loaded as a dep."""
    t = tree(a=[], b=[])
    t.info["a"].pre = ["b"]
    steps = resolve_load_order([Path("/d/m.ko")], t, "k", lambda p: ModInfo(["a", "b"]))
    assert [(s.name, s.role) for s in steps] == [("b", "dep"), ("a", "dep"), ("m", "test")]


def test_softdeps_on_builtins_or_unknown_names_are_skipped() -> None:
    """A softdep the kernel has built in (or nothing provides) adds no step."""
    t = tree()
    t.builtin = {"crc32c_generic"}
    steps = resolve_load_order(
        [Path("/d/m.ko")], t, "k", lambda p: ModInfo(pre=["crc32c-generic", "nothing"])
    )
    assert [s.name for s in steps] == ["m"]


def test_softdep_syntax() -> None:
    """modinfo's 'pre: a b post: c' splits into pre and post lists."""
    assert parse_softdep("pre: a b post: c") == (["a", "b"], ["c"])
    assert parse_softdep("post: z") == ([], ["z"])


def test_module_tree_reads_depmod_output(tmp_path: Path) -> None:
    """modules.dep, .alias, .softdep and .builtin become paths, deps, aliases and builtins."""
    (tmp_path / "modules.dep").write_text(
        "kernel/net/nf_nat.ko.xz: kernel/net/nf_conntrack.ko.xz kernel/lib/libcrc32c.ko.xz\n"
        "kernel/lib/libcrc32c.ko.xz:\nkernel/net/nf_conntrack.ko.xz: kernel/lib/libcrc32c.ko.xz\n"
    )
    (tmp_path / "modules.alias").write_text("# x\nalias crc32c crc32c_generic\n")
    (tmp_path / "modules.softdep").write_text("# y\nsoftdep libcrc32c pre: crc32c\n")
    (tmp_path / "modules.builtin").write_text("kernel/crypto/crc32c-generic.ko\n")
    t = read_module_tree(tmp_path)
    assert t.paths["nf_nat"] == tmp_path / "kernel/net/nf_nat.ko.xz"
    assert t.info["nf_nat"].depends == ["nf_conntrack", "libcrc32c"]
    assert t.info["libcrc32c"].pre == ["crc32c"]
    assert t.builtin == {"crc32c_generic"}
    assert t.resolve("crc32c") == []  # built in: nothing to load


def test_modinfo_reads_depends_and_softdep_even_from_ko_xz(tmp_path: Path) -> None:
    """The host's modinfo gives a module's depends= and softdep=, compressed or not."""
    if not shutil.which("modinfo") and not Path("/usr/sbin/modinfo").exists():
        _require("modinfo (kmod)", "not installed")
    ko = fake_ko({"name": "m", "depends": "a,b-c", "softdep": "pre: crc32c"})
    (tmp_path / "m.ko").write_bytes(ko)
    (tmp_path / "n.ko.xz").write_bytes(lzma.compress(ko, check=lzma.CHECK_CRC32))
    for path in (tmp_path / "m.ko", tmp_path / "n.ko.xz"):
        assert read_modinfo(path) == ModInfo(["a", "b_c"], ["crc32c"], [])
    (tmp_path / "junk.ko").write_bytes(b"not an ELF")
    with pytest.raises(BuildFailed, match="not a readable kernel module"):
        read_modinfo(tmp_path / "junk.ko")


def test_module_packages_give_their_modules_for_the_kernel(tmp_path: Path) -> None:
    """dpkg-deb unpacks NAME-modules-KVER; modules for KVER are found, others refused."""
    deb = make_deb(
        tmp_path,
        "kbench-modules-6.1.0-57-amd64",
        {"lib/modules/6.1.0-57-amd64/updates/dkms/kbench.ko.xz": b"x"},
    )
    found = extract_module_debs([deb], "6.1.0-57-amd64", tmp_path / "x")
    assert [p.name for p in found] == ["kbench.ko.xz"]
    with pytest.raises(InvalidInput, match="holds no module for 6.12.117"):
        extract_module_debs([deb], "6.12.117+deb12-amd64", tmp_path / "y")
    with pytest.raises(InvalidInput, match="more than one package under test ships module kbench"):
        extract_module_debs([deb, deb], "6.1.0-57-amd64", tmp_path / "z")
