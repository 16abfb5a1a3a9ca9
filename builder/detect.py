"""Work out a module source's name, upstream version, build layout and .ko files."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from builder.errors import InvalidInput

PACKAGE_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")
UPSTREAM_VERSION_RE = re.compile(r"^[0-9][A-Za-z0-9.+~]*$")
NAME_VERSION_RE = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9_+.-]*?)[-_](?P<version>[0-9][A-Za-z0-9.+~]*)$"
)
MODULE_VERSION_RE = re.compile(r'MODULE_VERSION\s*\(\s*"([^"]+)"\s*\)')
MODULE_LICENSE_RE = re.compile(r'MODULE_LICENSE\s*\(\s*"([^"]+)"\s*\)')
OBJ_M_RE = re.compile(r"^\s*obj-(?:m|\$\([A-Za-z0-9_]+\))\s*[:+]?=\s*(.*)$")
ASSIGN_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?::=|\?=|=)\s*(.*?)\s*$")
KBUILD_FILES = ("Kbuild", "Makefile", "makefile", "GNUmakefile")


@dataclass
class Layout:
    """What moddeb found out about a module source tree."""

    name: str
    upstream_version: str
    style: str  # "kbuild", "vendor" (src/Makefile taking BUILD_KERNEL) or "dkms" (own dkms.conf)
    build_dir: str = ""  # relative directory where make runs ("" = top)
    modules: list[str] = field(default_factory=list)  # .ko basenames without suffix
    dkms_conf: str | None = None  # the source's own dkms.conf, respected as given
    license: str = "GPL"
    copyrights: list[str] = field(default_factory=list)  # notices found in the source

    @property
    def source_package(self) -> str:
        """The Debian source package name."""
        return self.name


def validate_name(name: str) -> str:
    """Refuse names that are not valid Debian package names (lower case, no '_')."""
    if not PACKAGE_NAME_RE.match(name) or len(name) > 60:
        raise InvalidInput(
            f"module name {name!r} is not a valid Debian package name "
            "(lower-case letters, digits, '+', '-', '.'; at least 2 characters; starts alphanumeric)",
            hint="pass --name",
        )
    return name


def validate_version(version: str) -> str:
    """Refuse upstream versions Debian cannot use (moddeb adds the Debian revision itself)."""
    if not UPSTREAM_VERSION_RE.match(version):
        raise InvalidInput(
            f"upstream version {version!r} is not valid: it must start with a digit and use only "
            "letters, digits, '.', '+' and '~'",
            hint="pass --version",
        )
    return version


def parse_shell_assignments(text: str) -> dict[str, str]:
    """Read NAME=value and NAME[i]=value lines of a dkms.conf (no evaluation)."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        m = re.match(r"^\s*([A-Za-z_][A-Za-z0-9_]*(?:\[\d+\])?)=(.*)$", line)
        if not m:
            continue
        try:
            words = shlex.split(m.group(2), comments=True)
        except ValueError:
            continue
        values[m.group(1)] = words[0] if words else ""
    return values


def _expand(value: str, variables: dict[str, str]) -> str:
    """Expand $(VAR) and ${VAR} references from simple make assignments."""
    for _ in range(5):
        new = re.sub(
            r"\$[({]([A-Za-z_][A-Za-z0-9_]*)[)}]", lambda m: variables.get(m.group(1), ""), value
        )
        if new == value:
            break
        value = new
    return value


def find_modules(build_dir: Path) -> list[str]:
    """The .ko names the obj-m lines of build_dir's Kbuild/Makefile produce."""
    modules: list[str] = []
    for fname in KBUILD_FILES:
        path = build_dir / fname
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace").replace("\\\n", " ")
        variables: dict[str, str] = {}
        for line in text.splitlines():
            m = ASSIGN_RE.match(line)
            if m and not m.group(1).startswith("obj"):
                variables.setdefault(m.group(1), m.group(2))
        for line in text.splitlines():
            m = OBJ_M_RE.match(line)
            if not m:
                continue
            for word in _expand(m.group(1), variables).split():
                if word.endswith(".o") and word[:-2] not in modules:
                    modules.append(word[:-2])
    return modules


def _makefile(d: Path) -> Path | None:
    return next((d / f for f in KBUILD_FILES if (d / f).is_file()), None)


def _module_versions(tree: Path) -> list[str]:
    found: list[str] = []
    for c_file in sorted(tree.rglob("*.c")) + sorted(tree.rglob("*.h")):
        for v in MODULE_VERSION_RE.findall(c_file.read_text(encoding="utf-8", errors="replace")):
            if v not in found:
                found.append(v)
    return found


COPYRIGHT_RE = re.compile(
    r"Copyright\s*(?:\([cC]\)|\u00a9)?\s*((?:\d{4}[-, \d]*)\s*[^*\n]*?)\s*(?:\*/)?$"
)


def find_copyrights(tree: Path, limit: int = 8) -> list[str]:
    """Copyright notices ("Copyright (C) 2024 Jane Doe") found in sources and docs."""
    found: list[str] = []
    files = sorted(tree.rglob("*.[ch]")) + [
        p for p in (tree / "COPYING", tree / "README") if p.is_file()
    ]
    for path in files:
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines()[:60]:
            m = COPYRIGHT_RE.search(line)
            if m and m.group(1).strip() and m.group(1).strip() not in found:
                found.append(m.group(1).strip())
                if len(found) >= limit:
                    return found
    return found


def _license(tree: Path) -> str:
    for c_file in sorted(tree.rglob("*.c")):
        m = MODULE_LICENSE_RE.search(c_file.read_text(encoding="utf-8", errors="replace"))
        if m:
            return m.group(1)
    return "GPL"


def detect_layout(
    tree: Path,
    hint: str | None = None,
    *,
    name: str | None = None,
    version: str | None = None,
    modules: list[str] | None = None,
) -> Layout:
    """Inspect a source tree; flags (name, version, modules) override what is found."""
    conf_text = None
    conf: dict[str, str] = {}
    if (tree / "dkms.conf").is_file():
        conf_text = (tree / "dkms.conf").read_text(encoding="utf-8", errors="replace")
        conf = parse_shell_assignments(conf_text)
    hint_match = NAME_VERSION_RE.match(hint or "")

    style, build_dir = _detect_build(tree, conf)
    found_modules = modules or _conf_modules(conf) or find_modules(tree / build_dir)
    if not found_modules:
        raise InvalidInput(
            f"found no kernel module to build: no obj-m line in {build_dir or '.'}/Kbuild or "
            f"Makefile names a .o file",
            hint="pass --module NAME (repeatable)",
        )

    conf_name = conf.get("PACKAGE_NAME", "")
    conf_name = conf_name if "$" not in conf_name and "#" not in conf_name else ""
    candidate = name or conf_name or (hint_match.group("name") if hint_match else "")
    if not candidate and len(found_modules) == 1:
        candidate = found_modules[0]
    if not candidate:
        raise InvalidInput(
            "could not work out the module name: looked for PACKAGE_NAME in dkms.conf, a "
            "NAME-VERSION directory or tarball name, and a single obj-m module",
            hint="pass --name",
        )
    # A name the user typed is taken as given; detected ones (module names such as
    # "my_mod") are made into Debian package names.
    final_name = validate_name(name if name else candidate.lower().replace("_", "-"))

    conf_version = conf.get("PACKAGE_VERSION", "")
    conf_version = conf_version if "$" not in conf_version and "#" not in conf_version else ""
    versions = _module_versions(tree)
    candidate = (
        version
        or conf_version
        or (hint_match.group("version") if hint_match else "")
        or (versions[0] if len(versions) == 1 else "")
    )
    if not candidate:
        seen = f" (found several: {versions})" if versions else ""
        raise InvalidInput(
            "could not work out the upstream version: looked for PACKAGE_VERSION in dkms.conf, "
            f'a NAME-VERSION directory or tarball name, and MODULE_VERSION("...") in the source{seen}',
            hint="pass --version",
        )
    return Layout(
        name=final_name,
        upstream_version=validate_version(candidate),
        style="dkms" if conf_text is not None else style,
        build_dir=build_dir,
        modules=found_modules,
        dkms_conf=conf_text,
        license=_license(tree),
        copyrights=find_copyrights(tree),
    )


def _conf_modules(conf: dict[str, str]) -> list[str]:
    return [v for k, v in sorted(conf.items()) if k.startswith("BUILT_MODULE_NAME") and v]


def _detect_build(tree: Path, conf: dict[str, str]) -> tuple[str, str]:
    """Return (style, build_dir): Kbuild/Makefile at the top, or a vendor src/Makefile."""
    location = conf.get("BUILT_MODULE_LOCATION[0]", "").strip("/")
    if location and (tree / location).is_dir():
        return "kbuild", location
    top = _makefile(tree)
    if top is not None and (find_modules(tree) or (tree / "Kbuild").is_file()):
        return "kbuild", ""
    src = _makefile(tree / "src")
    if src is not None:
        text = src.read_text(encoding="utf-8", errors="replace")
        return ("vendor" if "BUILD_KERNEL" in text else "kbuild"), "src"
    if top is not None:
        return "kbuild", ""
    raise InvalidInput(
        "no Makefile or Kbuild found at the top of the source or in src/: this does not look "
        "like kernel module source",
        hint="point moddeb at the directory that holds the module's Makefile",
    )
