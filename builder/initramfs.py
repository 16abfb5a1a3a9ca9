"""The boot-test initramfs: busybox, an /init, the modules under test and the kernel modules
they depend on, as a gzip'd newc cpio written by Python (so no root is needed for /dev nodes).
"""

from __future__ import annotations

import fnmatch
import gzip
import lzma
import re
import shlex
import shutil
import struct
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from builder.errors import BuildFailed, InvalidInput

MODULE_SUFFIXES = (".ko", ".ko.xz", ".ko.zst", ".ko.gz")
DEFAULT_BUSYBOX = Path("/bin/busybox")


@dataclass(frozen=True)
class CpioEntry:
    """One file, directory, symlink or device node in the archive."""

    name: str
    mode: int  # full st_mode, type bits included
    data: bytes = b""  # file contents, or the target of a symlink
    rdev: tuple[int, int] = (0, 0)


@dataclass(frozen=True)
class LoadStep:
    """One insmod the VM performs, in order: a dependency or a module under test."""

    name: str
    path: Path
    role: str  # "test" (from the packages under test), "dep" (needed), "soft" (softdep)


def dir_entry(name: str) -> CpioEntry:
    """A directory, mode 0755."""
    return CpioEntry(name, 0o040755)


def file_entry(name: str, data: bytes, executable: bool = False) -> CpioEntry:
    """A regular file, 0755 or 0644."""
    return CpioEntry(name, 0o100755 if executable else 0o100644, data)


def symlink_entry(name: str, target: str) -> CpioEntry:
    """A symbolic link."""
    return CpioEntry(name, 0o120777, target.encode())


def chardev_entry(name: str, major: int, minor: int) -> CpioEntry:
    """A character device node (the kernel needs /dev/console before devtmpfs is up)."""
    return CpioEntry(name, 0o020600, rdev=(major, minor))


def newc_bytes(entries: Iterable[CpioEntry]) -> bytes:
    """Serialise entries as a newc ('070701') cpio archive, owned by root, mtime 0."""
    out = bytearray()

    def pad4() -> None:
        out.extend(b"\0" * (-len(out) % 4))

    def one(ino: int, e: CpioEntry) -> None:
        name = e.name.encode() + b"\0"
        nlink = 2 if e.mode & 0o170000 == 0o040000 else 1
        fields = (ino, e.mode, 0, 0, nlink, 0, len(e.data), 0, 0, *e.rdev, len(name), 0)
        out.extend(b"070701" + b"".join(b"%08X" % f for f in fields))
        out.extend(name)
        pad4()
        out.extend(e.data)
        pad4()

    for ino, entry in enumerate(entries, start=1):
        one(ino, entry)
    one(0, CpioEntry("TRAILER!!!", 0))
    out.extend(b"\0" * (-len(out) % 512))
    return bytes(out)


def read_newc(data: bytes) -> list[CpioEntry]:
    """Parse a newc archive (gzip'd or not) back into entries; used to check what was built."""
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    entries: list[CpioEntry] = []
    pos = 0
    while True:
        if data[pos : pos + 6] != b"070701":
            raise ValueError(f"bad cpio header at offset {pos}")
        f = [int(data[pos + 6 + 8 * i : pos + 14 + 8 * i], 16) for i in range(13)]
        mode, size, rdev, namesize = f[1], f[6], (f[9], f[10]), f[11]
        pos += 110
        name = data[pos : pos + namesize - 1].decode()
        pos += namesize + (-(pos + namesize) % 4)
        body = data[pos : pos + size]
        pos += size + (-(pos + size) % 4)
        if name == "TRAILER!!!":
            return entries
        entries.append(CpioEntry(name, mode, body, rdev))


def module_name(path: Path) -> str:
    """The kernel's name for a module file: basename without .ko[.xz|.zst|.gz], '-' as '_'."""
    name = path.name
    for suffix in MODULE_SUFFIXES[::-1]:
        if name.endswith(suffix):
            return name.removesuffix(suffix).replace("-", "_")
    raise ValueError(f"{path} is not a kernel module")


def is_module(path: Path) -> bool:
    """Whether a file name looks like a (possibly compressed) kernel module."""
    return path.name.endswith(MODULE_SUFFIXES)


@dataclass
class ModInfo:
    """What one module asks to be loaded around it."""

    depends: list[str] = field(default_factory=list)  # hard: must load first
    pre: list[str] = field(default_factory=list)  # softdep pre: (names or aliases)
    post: list[str] = field(default_factory=list)  # softdep post:


@dataclass
class ModuleTree:
    """A kernel's modules as depmod describes them (modules.dep, .alias, .softdep, .builtin)."""

    paths: dict[str, Path] = field(default_factory=dict)
    info: dict[str, ModInfo] = field(default_factory=dict)
    aliases: list[tuple[str, str]] = field(default_factory=list)  # (pattern, module)
    builtin: set[str] = field(default_factory=set)

    def resolve(self, wanted: str) -> list[str]:
        """Modules a softdep name stands for: itself, or every module whose alias matches."""
        name = wanted.replace("-", "_")
        if name in self.paths:
            return [name]
        if name in self.builtin:
            return []
        exact = [m for pattern, m in self.aliases if pattern == wanted]
        found = exact or [m for pattern, m in self.aliases if fnmatch.fnmatchcase(wanted, pattern)]
        return sorted({m for m in found if m in self.paths})


def parse_softdep(text: str) -> tuple[list[str], list[str]]:
    """'pre: a b post: c' -> (['a', 'b'], ['c']), as modinfo and modules.softdep write it."""
    pre: list[str] = []
    post: list[str] = []
    into = pre
    for word in text.split():
        if word == "pre:":
            into = pre
        elif word == "post:":
            into = post
        else:
            into.append(word)
    return pre, post


def read_module_tree(modules_dir: Path) -> ModuleTree:
    """Load a kernel's depmod output (made when the kernel was cached) into a ModuleTree."""
    tree = ModuleTree()
    for line in (modules_dir / "modules.dep").read_text().splitlines():
        target, _, deps = line.partition(":")
        name = module_name(Path(target))
        tree.paths[name] = modules_dir / target
        tree.info[name] = ModInfo(depends=[module_name(Path(d)) for d in deps.split()])
    for line in (modules_dir / "modules.alias").read_text().splitlines():
        words = line.split()
        if len(words) == 3 and words[0] == "alias":
            tree.aliases.append((words[1], words[2].replace("-", "_")))
    softdep = modules_dir / "modules.softdep"
    for line in softdep.read_text().splitlines() if softdep.exists() else []:
        words = line.split(None, 2)
        if len(words) == 3 and words[0] == "softdep" and words[1] in tree.info:
            pre, post = parse_softdep(words[2])
            tree.info[words[1]].pre += pre
            tree.info[words[1]].post += post
    builtin = modules_dir / "modules.builtin"
    for line in builtin.read_text().splitlines() if builtin.exists() else []:
        if line.strip():
            tree.builtin.add(module_name(Path(line.strip())))
    return tree


def host_tool(name: str) -> str:
    """A kmod tool's path: /usr/sbin is not on every user's PATH."""
    found = shutil.which(name)
    if found:
        return found
    return next(
        (str(p) for p in (Path("/usr/sbin") / name, Path("/sbin") / name) if p.exists()), name
    )


def read_modinfo(path: Path) -> ModInfo:
    """A module's depends= and softdep= fields (kmod's modinfo also reads .ko.xz)."""

    def field_of(name: str) -> str:
        proc = subprocess.run(
            [host_tool("modinfo"), "-F", name, str(path.resolve())], capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise BuildFailed(f"{path.name} is not a readable kernel module: {proc.stderr.strip()}")
        return proc.stdout.strip()

    depends = [d.replace("-", "_") for d in field_of("depends").split(",") if d]
    pre, post = parse_softdep(" ".join(field_of("softdep").splitlines()))
    return ModInfo(depends, pre, post)


def resolve_load_order(
    targets: list[Path],
    tree: ModuleTree,
    kernel_release: str,
    modinfo: Callable[[Path], ModInfo] | None = None,
) -> list[LoadStep]:
    """Each module once, after what it needs: hard deps ('dep'), softdeps ('soft', best effort),
    then the modules under test ('test')."""
    read = modinfo or read_modinfo
    own = {module_name(p): p for p in targets}
    order: list[LoadStep] = []
    placed: dict[str, int] = {}
    visiting: list[str] = []

    def info(name: str) -> ModInfo:
        return read(own[name]) if name in own else tree.info.get(name, ModInfo())

    def soft_targets(names: list[str]) -> list[str]:
        found: list[str] = []
        for soft in names:
            mod = soft.replace("-", "_")
            found += [mod] if mod in own else tree.resolve(soft)
        return found

    def visit(name: str, needed_by: str | None, role: str) -> None:
        if name in placed:
            step = order[placed[name]]
            if step.role == "soft" and role == "dep":  # a hard need overrides a soft one
                order[placed[name]] = LoadStep(step.name, step.path, "dep")
            return
        if name in visiting:
            cycle = " -> ".join([*visiting[visiting.index(name) :], name])
            raise BuildFailed(f"module dependency cycle: {cycle}")
        path = own.get(name) or tree.paths.get(name)
        if path is None:
            raise BuildFailed(f"{needed_by} needs module {name}, which {kernel_release} lacks")
        visiting.append(name)
        mi = info(name)
        inner = "soft" if role == "soft" else "dep"
        for dep in mi.depends:
            visit(dep, name, inner)
        for dep in soft_targets(mi.pre):
            if dep not in visiting:
                visit(dep, name, "soft")
        visiting.pop()
        placed[name] = len(order)
        order.append(LoadStep(name, path, "test" if name in own else role))
        for dep in soft_targets(mi.post):
            visit(dep, name, "soft")

    for name in sorted(own):
        visit(name, None, "test")
    return order


def module_bytes(path: Path) -> bytes:
    """A module's ELF image: busybox insmod cannot load .ko.xz/.zst/.gz, so unpack here."""
    data = path.read_bytes()
    name = path.name
    if name.endswith(".xz"):
        return lzma.decompress(data)
    if name.endswith(".gz"):
        return gzip.decompress(data)
    if name.endswith(".zst"):
        return subprocess.run(["zstd", "-dcq"], input=data, capture_output=True, check=True).stdout
    return data


def extract_module_debs(debs: list[Path], kernel_release: str, dest: Path) -> list[Path]:
    """Unpack NAME-modules-KVER packages and return their modules for this kernel."""
    found: list[Path] = []
    for i, deb in enumerate(debs):
        root = dest / f"deb{i}"
        root.mkdir(parents=True)
        proc = subprocess.run(
            ["dpkg-deb", "-x", str(deb), str(root)], capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise InvalidInput(f"cannot unpack {deb.name}: {proc.stderr.strip()}")
        modules = [
            p
            for base in ("lib/modules", "usr/lib/modules")
            for p in sorted((root / base / kernel_release).rglob("*"))
            if is_module(p)
        ]
        if not modules:
            raise InvalidInput(f"{deb.name} holds no module for {kernel_release}")
        found.extend(modules)
    names = [module_name(p) for p in found]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise InvalidInput(f"more than one package under test ships module {dupes[0]}")
    return found


def check_static(busybox: Path) -> None:
    """Refuse a dynamically linked busybox: the initramfs has no libc to run it with."""
    try:
        data = busybox.read_bytes()
    except OSError as exc:
        raise InvalidInput(
            f"no busybox at {busybox}: {exc.strerror}", hint="apt-get install busybox-static"
        ) from None
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise InvalidInput(f"{busybox} is not a 64-bit ELF executable")
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    for i in range(phnum):
        (p_type,) = struct.unpack_from("<I", data, phoff + i * phentsize)
        if p_type == 3:  # PT_INTERP: needs a dynamic loader
            raise InvalidInput(
                f"{busybox} is dynamically linked", hint="apt-get install busybox-static"
            )


def build_initramfs(
    out: Path,
    init_script: str,
    steps: list[LoadStep],
    smoke: str | None = None,
    smoke_timeout: int = 60,
    busybox: Path | None = None,
) -> Path:
    """Write the initramfs: /init, /bin/busybox (+ sh), /moddeb/{load,env,smoke.sh,modules/}."""
    entries = base_entries(init_script, busybox)
    entries.append(dir_entry("moddeb/modules"))
    lines = []
    for step in steps:
        file = f"{step.name}.ko"
        entries.append(file_entry(f"moddeb/modules/{file}", module_bytes(step.path)))
        lines.append(f"{step.role} {step.name} {file}\n")
    entries.append(file_entry("moddeb/load", "".join(lines).encode()))
    env = {"SMOKE_TIMEOUT": str(smoke_timeout)}
    entries.append(
        file_entry(
            "moddeb/env", "".join(f"{k}={shlex.quote(v)}\n" for k, v in env.items()).encode()
        )
    )
    if smoke is not None:
        entries.append(file_entry("moddeb/smoke.sh", smoke.encode(), executable=True))
    out.write_bytes(gzip.compress(newc_bytes(entries), compresslevel=1, mtime=0))
    return out


def base_entries(init_script: str, busybox: Path | None = None) -> list[CpioEntry]:
    """What every boot-test initramfs holds: the top directories, /dev nodes, busybox, /init."""
    busybox = busybox or DEFAULT_BUSYBOX
    check_static(busybox)
    entries = [dir_entry(d) for d in ("bin", "dev", "proc", "sys", "tmp", "moddeb")]
    return entries + [
        chardev_entry("dev/console", 5, 1),
        chardev_entry("dev/null", 1, 3),
        file_entry("bin/busybox", busybox.read_bytes(), executable=True),
        symlink_entry("bin/sh", "busybox"),
        file_entry("init", init_script.encode(), executable=True),
    ]


LDD_LINE = re.compile(r"^\s*(?:(?P<name>\S+)\s+=>\s+)?(?P<path>\S+)(?:\s+\(0x[0-9a-f]+\))?\s*$")


def shared_libraries(binary: Path) -> list[Path]:
    """The shared libraries and the dynamic loader a host binary needs, as ldd names them
    ([] for a static binary)."""
    proc = subprocess.run(["ldd", str(binary)], capture_output=True, text=True)
    if proc.returncode != 0:
        if "not a dynamic executable" in proc.stdout + proc.stderr:
            return []
        raise InvalidInput(f"ldd cannot read {binary}: {(proc.stderr or proc.stdout).strip()}")
    found: list[Path] = []
    for line in proc.stdout.splitlines():
        if "=> not found" in line:
            raise InvalidInput(f"{binary} needs {line.split()[0]}, which this host lacks")
        m = LDD_LINE.match(line)
        if m and m.group("path").startswith("/") and Path(m.group("path")) not in found:
            found.append(Path(m.group("path")))
    return found


def host_binary_entries(
    binary: Path, taken: Iterable[str] = (), dest: str | None = None
) -> list[CpioEntry]:
    """A host binary (at dest, else its own path) and every library it needs, resolved from
    symlinks, at the paths ldd gives; with the parent directories `taken` does not hold."""
    files = [(dest or str(binary), binary), *((str(p), p) for p in shared_libraries(binary))]
    have = set(taken)
    entries: list[CpioEntry] = []
    for where, path in files:
        name = where.lstrip("/")
        for parent in reversed(Path(name).parents[:-1]):  # outermost first; [-1] is "."
            if str(parent) not in have:
                have.add(str(parent))
                entries.append(dir_entry(str(parent)))
        if name not in have:
            have.add(name)
            entries.append(file_entry(name, path.resolve().read_bytes(), executable=True))
    return entries
