"""Settings sources, apt-sources parsing, the kernel catalog and per-kernel packaging helpers."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.config import load_settings, pick_mirrors, read_apt_sources
from builder.dkms import first_error_line, parse_lintian
from builder.errors import InvalidInput
from builder.kernels import KernelInfo, find_kernel, newest_per_flavour, parse_index
from builder.mkbmdeb import compression_of, deb_filename, package_name

DEB822 = """\
Types: deb
URIs: http://mirror.invalid/debian
Suites: bookworm bookworm-updates
Components: main

Types: deb-src
URIs: http://src.invalid/debian
Suites: bookworm

Types: deb
URIs: http://security.invalid/debian-security/
Suites: bookworm-security
Components: main
"""


def test_apt_sources_give_main_and_security_mirrors(tmp_path: Path) -> None:
    """The default archive comes from the host's apt sources, deb-src entries ignored."""
    d = tmp_path / "sources.list.d"
    d.mkdir()
    (d / "debian.sources").write_text(DEB822)
    (tmp_path / "sources.list").write_text(
        "# nothing\ndeb [arch=amd64] http://old.invalid/d bookworm main\n"
    )
    entries = read_apt_sources(d, tmp_path / "sources.list")
    assert ("http://src.invalid/debian", ["bookworm"]) not in entries
    assert pick_mirrors(entries) == (
        "http://mirror.invalid/debian",
        "http://security.invalid/debian-security",
    )


def test_env_overrides_toml_which_overrides_defaults(tmp_path: Path) -> None:
    """MODDEB_* variables win over the TOML file, which wins over defaults."""
    (tmp_path / "moddeb.toml").write_text(
        'maintainer_name = "From Toml"\njobs = 7\nmirror = "http://m.invalid"\n'
    )
    s = load_settings(env={"MODDEB_HOME": str(tmp_path), "MODDEB_JOBS": "3"})
    assert (s.maintainer_name, s.jobs, s.home) == ("From Toml", 3, tmp_path)
    assert s.mirror == "http://m.invalid"


def test_unknown_or_bad_settings_are_named(tmp_path: Path) -> None:
    """A typo in the TOML file or a non-number where a number belongs is a clear error."""
    (tmp_path / "moddeb.toml").write_text("jbos = 2\n")
    with pytest.raises(InvalidInput, match="unknown settings: \\['jbos'\\]"):
        load_settings(env={"MODDEB_HOME": str(tmp_path)})
    with pytest.raises(InvalidInput, match="setting 'jobs'"):
        load_settings(env={"MODDEB_HOME": str(tmp_path / "x"), "MODDEB_JOBS": "many"})


PACKAGES = """\
Package: linux-headers-6.1.0-57-amd64
Version: 6.1.158-1

Package: linux-image-6.1.0-57-amd64
Version: 6.1.158-1

Package: linux-headers-6.1.0-57-common
Version: 6.1.158-1

Package: linux-headers-6.1.0-58-cloud-amd64
Version: 6.1.160-1

Package: linux-image-6.1.0-58-cloud-amd64-unsigned
Version: 6.1.160-1

Package: linux-headers-6.1.0-59-amd64
Version: 6.1.161-1

Package: linux-headers-amd64
Version: 6.1.158-1
"""


def test_catalog_keeps_abis_with_headers_and_image(tmp_path: Path) -> None:
    """Only linux-headers-KVER with a linux-image-KVER[-unsigned] count; common/meta are not ABIs."""
    index = tmp_path / "Packages"
    index.write_text(PACKAGES)
    rows = sorted(parse_index(index, "bookworm"), key=lambda k: k.kernel_release)
    assert [(k.kernel_release, k.flavour) for k in rows] == [
        ("6.1.0-57-amd64", "amd64"),
        ("6.1.0-58-cloud-amd64", "cloud-amd64"),
    ]


def test_newest_per_flavour_and_closest_names() -> None:
    """--newest picks one ABI per flavour; an unknown ABI error names the closest ones."""
    rows = [
        KernelInfo("6.1.0-57-amd64", "amd64", "bookworm", "6.1.158-1"),
        KernelInfo("6.12.9+deb12-amd64", "amd64", "bookworm-security", "6.12.9-1~deb12u1"),
        KernelInfo("6.12.117+deb12-amd64", "amd64", "bookworm-security", "6.12.117-1~deb12u1"),
        KernelInfo("6.1.0-57-rt-amd64", "rt-amd64", "bookworm", "6.1.158-1"),
    ]
    assert [k.kernel_release for k in newest_per_flavour(rows)] == [
        "6.12.117+deb12-amd64",
        "6.1.0-57-rt-amd64",
    ]
    with pytest.raises(InvalidInput, match="no kernel '6.1.0-75-amd64'") as err:
        find_kernel(rows, "6.1.0-75-amd64")
    assert "6.1.0-57-amd64" in str(err.value)


def test_module_package_names() -> None:
    """NAME-modules-KVER_VER_ARCH.deb, lower-cased, epoch dropped from the file name."""
    assert package_name("kbench", "6.12.117+deb12-amd64") == "kbench-modules-6.12.117+deb12-amd64"
    assert deb_filename("kbench", "6.1.0-57-amd64", "1:0.1-1", "amd64") == (
        "kbench-modules-6.1.0-57-amd64_0.1-1_amd64.deb"
    )


def test_compression_follows_kernel_config() -> None:
    """Modules are compressed the way the kernel's config says its own are."""
    assert compression_of("CONFIG_MODULE_COMPRESS_XZ=y\n") == "xz"
    assert compression_of("CONFIG_MODULE_COMPRESS_ZSTD=y\n") == "zstd"
    assert compression_of("# CONFIG_MODULE_COMPRESS_XZ is not set\n") is None


@pytest.mark.parametrize(
    ("log", "expected"),
    [
        (
            "  CC [M]  /var/lib/dkms/oldapi/0.3/build/oldapi.c\n"
            "/var/lib/dkms/oldapi/0.3/build/oldapi.c:21:9: error: implicit declaration of "
            "function 'strlcpy'; did you mean 'strscpy'? [-Werror=implicit-function-declaration]\n"
            "make[2]: *** [scripts/Makefile.build:243: oldapi.o] Error 1\n",
            "implicit declaration of function 'strlcpy'; did you mean 'strscpy'? "
            "[-Werror=implicit-function-declaration] (oldapi.c:21)",
        ),
        (
            'ERROR: modpost: "missing_sym" [/build/x.ko] undefined!\n',
            '"missing_sym" [/build/x.ko] undefined!',
        ),
        (
            "Error! Bad return status for module build on kernel: 6.1.0-57-amd64 (x86_64)\n",
            "Bad return status for module build on kernel: 6.1.0-57-amd64 (x86_64)",
        ),
        ("", "no output"),
    ],
)
def test_first_error_line_diagnosis(log: str, expected: str) -> None:
    """The diagnosis is the first compiler or modpost error, with file:line when there is one."""
    assert first_error_line(log) == expected


def test_lintian_output_is_split() -> None:
    """Errors and warnings are told apart."""
    errors, warnings = parse_lintian("E: p: no-copyright-file\nW: p: x\nN: note\n")
    assert errors == ["E: p: no-copyright-file"] and warnings == ["W: p: x"]


def test_parsed_catalog_is_remembered_until_the_index_changes(tmp_path: Path) -> None:
    """A second read comes from the memo; a changed index is parsed again."""
    index = tmp_path / "Packages"
    index.write_text(PACKAGES)
    first = parse_index(index, "bookworm")
    assert (tmp_path / "Packages.kernels.json").is_file()
    assert parse_index(index, "bookworm") == first
    index.write_text(PACKAGES + "\nPackage: linux-image-6.1.0-59-amd64\nVersion: 6.1.161-1\n")
    releases = {k.kernel_release for k in parse_index(index, "bookworm")}
    assert releases == {"6.1.0-57-amd64", "6.1.0-58-cloud-amd64", "6.1.0-59-amd64"}
