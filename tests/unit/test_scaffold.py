"""Detection and the generated debian/ of each example layout, checked against golden files."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from debian import changelog, deb822

from builder.detect import detect_layout, find_modules, parse_shell_assignments
from builder.scaffold import write_debian_dir

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
GOLDEN = ROOT / "tests" / "golden"
EPOCH = 1767225600  # 2026-01-01T00:00:00Z, fixed so golden files are stable
MAINTAINER = "Golden Tester <golden@example.org>"

OWN_DKMS_CONF = """\
PACKAGE_NAME="Legacy_Mod"
PACKAGE_VERSION="4.2"
BUILT_MODULE_NAME[0]="legacy"
DEST_MODULE_LOCATION[0]="/kernel/drivers/misc"
AUTOINSTALL="yes"
"""


def _own_conf_tree(tmp_path: Path) -> Path:
    tree = tmp_path / "legacy"
    tree.mkdir()
    (tree / "Makefile").write_text("obj-m := legacy.o\n")
    (tree / "legacy.c").write_text('MODULE_LICENSE("Dual BSD/GPL");\n')
    (tree / "dkms.conf").write_text(OWN_DKMS_CONF)
    return tree


CASES = {
    "kbench": ("kbench", "0.1", "kbuild", "", ["kbench"]),
    "hello": ("hello", "1.0", "kbuild", "", ["hello"]),
    "vendornic-2.3.1": ("vendornic", "2.3.1", "vendor", "src", ["vendornic"]),
    "oldapi": ("oldapi", "0.3", "kbuild", "", ["oldapi"]),
    "failinit": ("failinit", "0.2", "kbuild", "", ["failinit"]),
}


@pytest.mark.parametrize("example", sorted(CASES))
def test_examples_are_detected(example: str) -> None:
    """Each example's name, version, layout and modules are worked out without flags."""
    name, version, style, build_dir, modules = CASES[example]
    layout = detect_layout(EXAMPLES / example, example)
    assert (layout.name, layout.upstream_version) == (name, version)
    assert (layout.style, layout.build_dir, layout.modules) == (style, build_dir, modules)


def test_flags_override_detection() -> None:
    """--name, --version and --module win over what the source says."""
    layout = detect_layout(
        EXAMPLES / "kbench", "kbench", name="kb", version="9.9", modules=["other"]
    )
    assert (layout.name, layout.upstream_version, layout.modules) == ("kb", "9.9", ["other"])


def test_version_missing_everywhere_names_the_flag(tmp_path: Path) -> None:
    """Without dkms.conf, NAME-VERSION or MODULE_VERSION the error says what to pass."""
    (tmp_path / "Makefile").write_text("obj-m += plain.o\n")
    (tmp_path / "plain.c").write_text("int x;\n")
    with pytest.raises(Exception, match="--version") as err:
        detect_layout(tmp_path, "plain")
    assert "MODULE_VERSION" in str(err.value) and "dkms.conf" in str(err.value)


def test_obj_m_with_make_variables() -> None:
    """obj-m lines that use $(VAR) are expanded from simple assignments."""
    text = "DRIVER_NAME := ice\nobj-m += $(DRIVER_NAME).o\nobj-$(CONFIG_X) += aux.o\n"
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"moddeb-objm-{os.getpid()}"
    tmp.mkdir(exist_ok=True)
    try:
        (tmp / "Kbuild").write_text(text)
        assert find_modules(tmp) == ["ice", "aux"]
    finally:
        shutil.rmtree(tmp)


def test_dkms_conf_parser_ignores_shell_evaluation() -> None:
    """dkms.conf is read as data: no command substitution is ever run."""
    values = parse_shell_assignments('PACKAGE_NAME="a"\nMAKE[0]="$(touch /tmp/x)"\nX=`id`\n')
    assert values["PACKAGE_NAME"] == "a"
    assert values["MAKE[0]"] == "$(touch /tmp/x)"


def _render(tree: Path, hint: str, templates: Path, dest: Path) -> Path:
    work = dest / tree.name
    shutil.copytree(tree, work)
    layout = detect_layout(work, hint)
    write_debian_dir(
        work,
        layout,
        templates=templates,
        maintainer=MAINTAINER,
        distribution="bookworm",
        revision="1",
        origin=f"directory {hint}",
        date_epoch=EPOCH,
    )
    return work / "debian"


def _compare(debian: Path, golden: Path) -> None:
    produced = {p.relative_to(debian): p.read_text() for p in debian.rglob("*") if p.is_file()}
    if os.environ.get("UPDATE_GOLDEN") == "1":
        shutil.rmtree(golden, ignore_errors=True)
        for rel, text in produced.items():
            (golden / rel).parent.mkdir(parents=True, exist_ok=True)
            (golden / rel).write_text(text)
    expected = {p.relative_to(golden): p.read_text() for p in golden.rglob("*") if p.is_file()}
    assert sorted(produced) == sorted(expected)
    for rel in produced:
        assert produced[rel] == expected[rel], f"{rel} differs from {golden / rel}"


@pytest.mark.parametrize("example", sorted(CASES))
def test_debian_dir_matches_golden(example: str, tmp_path: Path, settings) -> None:
    """The generated debian/ of each example layout is exactly the reviewed golden tree."""
    debian = _render(EXAMPLES / example, example, settings.templates_dir, tmp_path)
    _compare(debian, GOLDEN / example)


def test_own_dkms_conf_is_respected_golden(tmp_path: Path, settings) -> None:
    """A source's own dkms.conf is kept, only name and version pinned to the package's."""
    debian = _render(_own_conf_tree(tmp_path), "legacy", settings.templates_dir, tmp_path / "o")
    conf = (debian / "legacy-mod-dkms.dkms").read_text()
    assert 'DEST_MODULE_LOCATION[0]="/kernel/drivers/misc"' in conf
    assert 'PACKAGE_NAME="legacy-mod"' in conf and 'PACKAGE_VERSION="4.2"' in conf
    _compare(debian, GOLDEN / "own-dkms-conf")


def test_control_and_changelog_parse_back(tmp_path: Path, settings) -> None:
    """control and changelog are valid deb822 / changelog that python-debian reads back."""
    debian = _render(EXAMPLES / "kbench", "kbench", settings.templates_dir, tmp_path)
    paras = list(deb822.Deb822.iter_paragraphs((debian / "control").read_text()))
    assert paras[0]["Build-Depends"] == "debhelper-compat (= 13), dh-sequence-dkms"
    assert paras[1]["Package"] == "kbench-dkms" and paras[1]["Architecture"] == "all"
    log = changelog.Changelog((debian / "changelog").read_text())
    assert str(log.version) == "0.1-1" and log.package == "kbench"
    install = (debian / "kbench-dkms.install").read_text().splitlines()
    assert "Makefile usr/src/kbench-0.1/" in install and "kbench.c usr/src/kbench-0.1/" in install
    assert not [line for line in install if line.startswith(("debian", "dkms.conf"))]
