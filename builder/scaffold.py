"""Render debian/ for a module source from debian-templates/ (python-debian for deb822)."""

from __future__ import annotations

import email.utils
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

from debian import changelog, deb822

from builder.detect import Layout
from builder.errors import InvalidInput

PLACEHOLDER_RE = re.compile(r"@([a-z_]+)@")
CONTROL_CHARS_RE = re.compile(r"[\x00-\x1f\x7f]")
MAINTAINER_RE = re.compile(r"^[^<>@]+ <[^<>\s@]+@[^<>\s@]+>$")


def check_field(label: str, value: str) -> str:
    """Refuse a single-line field value that carries newlines or control characters."""
    if CONTROL_CHARS_RE.search(value):
        raise InvalidInput(f"{label} contains a newline or control character: {value!r}")
    if not value.strip():
        raise InvalidInput(f"{label} is empty")
    return value


def check_maintainer(value: str) -> str:
    """A Maintainer must be one 'Name <user@host>' on one line."""
    check_field("maintainer", value)
    if not MAINTAINER_RE.match(value):
        raise InvalidInput(f"maintainer {value!r} is not of the form 'Full Name <user@host>'")
    return value


def render(template: str, values: Mapping[str, str]) -> str:
    """Replace @key@ placeholders; an unknown key is a bug in the template, reported as such."""

    def one(m: re.Match[str]) -> str:
        if m.group(1) not in values:
            raise KeyError(f"template placeholder @{m.group(1)}@ has no value")
        return values[m.group(1)]

    return PLACEHOLDER_RE.sub(one, template)


def debian_version(layout: Layout, revision: str) -> str:
    """The Debian version of every package built from this source."""
    version = f"{layout.upstream_version}-{revision}"
    try:
        changelog.Version(version)
    except ValueError as exc:
        raise InvalidInput(f"version {version!r} is not a valid Debian version: {exc}") from None
    if not re.match(r"^[A-Za-z0-9.+~]+$", revision):
        raise InvalidInput(f"Debian revision {revision!r} is not valid")
    return version


def license_text(module_license: str) -> str:
    """The License field (short name and body) for what MODULE_LICENSE() declares."""
    if "GPL" in module_license:
        return (
            "GPL-2\n"
            f' The module declares MODULE_LICENSE("{module_license}").\n'
            " .\n"
            " On Debian systems, the complete text of the GNU General Public License\n"
            " version 2 can be found in '/usr/share/common-licenses/GPL-2'."
        )
    return f'other\n The module declares MODULE_LICENSE("{module_license}"); see the source.'


def dkms_conf(layout: Layout, templates: Path) -> str:
    """The source's own dkms.conf (name and version pinned) or one generated for its layout."""
    if layout.dkms_conf is not None:
        text = re.sub(r"(?m)^PACKAGE_NAME=.*$", f'PACKAGE_NAME="{layout.name}"', layout.dkms_conf)
        text = re.sub(
            r"(?m)^PACKAGE_VERSION=.*$", f'PACKAGE_VERSION="{layout.upstream_version}"', text
        )
        return text if text.endswith("\n") else text + "\n"
    loc = f"{layout.build_dir}/" if layout.build_dir else ""
    lines = []
    for i, module in enumerate(layout.modules):
        lines.append(f'BUILT_MODULE_NAME[{i}]="{module}"')
        if loc:
            lines.append(f'BUILT_MODULE_LOCATION[{i}]="{loc}"')
        lines.append(f'DEST_MODULE_LOCATION[{i}]="/updates/dkms"')
    if layout.style == "vendor":
        # Vendor Makefiles (Intel's i40e, ixgbe...) take the kernel as BUILD_KERNEL and build
        # nothing when KERNELRELEASE is set. dkms rewrites a MAKE line that starts with
        # `make` into `make KERNELRELEASE=...`; the quoted 'make' is left alone.
        lines.append(f"MAKE[0]=\"'make' -C {layout.build_dir}/ BUILD_KERNEL=${{kernelver}}\"")
        lines.append(f'CLEAN="make -C {layout.build_dir}/ clean"')
    elif loc:
        lines.append(
            'MAKE[0]="make -C ${kernel_source_dir} '
            f'M=${{dkms_tree}}/${{PACKAGE_NAME}}/${{PACKAGE_VERSION}}/build/{layout.build_dir} modules"'
        )
        lines.append(
            'CLEAN="make -C ${kernel_source_dir} '
            f'M=${{dkms_tree}}/${{PACKAGE_NAME}}/${{PACKAGE_VERSION}}/build/{layout.build_dir} clean"'
        )
    values = {"name": layout.name, "upstream_version": layout.upstream_version}
    return render(
        (templates / "dkms.conf.in").read_text(), {**values, "module_lines": "\n".join(lines)}
    )


def _control(templates: Path, values: Mapping[str, str]) -> str:
    paragraphs = []
    with open(templates / "control.in", encoding="utf-8") as fh:
        for para in deb822.Deb822.iter_paragraphs(fh):
            filled = deb822.Deb822()
            for key, value in para.items():
                filled[key] = render(value, values)
            paragraphs.append(filled.dump())
    return "\n".join(paragraphs)


def _changelog(
    layout: Layout,
    version: str,
    values: Mapping[str, str],
    date_epoch: int,
    distribution: str,
    entry: str,
) -> str:
    log = changelog.Changelog()
    log.new_block(
        package=layout.source_package,
        version=version,
        distributions=distribution,
        urgency="medium",
        author=values["maintainer"],
        date=email.utils.format_datetime(datetime.fromtimestamp(date_epoch, UTC)),
    )
    log.add_change("")
    log.add_change(f"  * {entry}")
    log.add_change("")
    return str(log)


def write_debian_dir(
    tree: Path,
    layout: Layout,
    *,
    templates: Path,
    maintainer: str,
    distribution: str,
    revision: str,
    origin: str,
    date_epoch: int,
) -> str:
    """Write tree/debian/ for a -dkms package; return the Debian version."""
    check_maintainer(maintainer)
    check_field("distribution", distribution)
    check_field("origin", origin)
    if not re.match(r"^[a-z0-9][a-z0-9.+-]*$", distribution):
        raise InvalidInput(f"distribution {distribution!r} is not a valid suite name")
    version = debian_version(layout, revision)
    values = {
        "name": layout.name,
        "source_package": layout.source_package,
        "upstream_version": layout.upstream_version,
        "maintainer": maintainer,
        "origin": origin,
        "license": license_text(layout.license),
        "copyright": "\n ".join(layout.copyrights) or f"the {layout.name} upstream authors",
        "version": version,
    }
    debian = tree / "debian"
    (debian / "source").mkdir(parents=True, exist_ok=True)
    (debian / "control").write_text(_control(templates, values), encoding="utf-8")
    entry = render((templates / "changelog-entry.in").read_text(), values).strip()
    (debian / "changelog").write_text(
        _changelog(layout, version, values, date_epoch, distribution, entry), encoding="utf-8"
    )
    rules = debian / "rules"
    rules.write_text(render((templates / "rules").read_text(), values), encoding="utf-8")
    rules.chmod(0o755)
    (debian / "source" / "format").write_text((templates / "source" / "format").read_text())
    (debian / "copyright").write_text(render((templates / "copyright.in").read_text(), values))
    (debian / f"{layout.name}-dkms.dkms").write_text(dkms_conf(layout, templates))
    dest = f"usr/src/{layout.name}-{layout.upstream_version}/"
    entries = sorted(p.name for p in tree.iterdir() if p.name not in ("debian", "dkms.conf"))
    for name in entries:
        if not re.match(r"^[A-Za-z0-9_.+-]+$", name):
            raise InvalidInput(f"source entry {name!r} has characters moddeb cannot install")
    (debian / f"{layout.name}-dkms.install").write_text("".join(f"{e} {dest}\n" for e in entries))
    return version
