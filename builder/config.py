"""Settings: defaults, then an optional TOML file, then MODDEB_* environment variables."""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from debian import deb822

from builder.errors import InvalidInput

APT_SOURCES_DIR = Path("/etc/apt/sources.list.d")
APT_SOURCES_LIST = Path("/etc/apt/sources.list")


def default_home() -> Path:
    """Where moddeb keeps work dirs, caches, state and keys when MODDEB_HOME is unset."""
    if os.geteuid() == 0:
        return Path("/var/lib/moddeb")
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local/share")
    return Path(base) / "moddeb"


def read_apt_sources(
    sources_dir: Path = APT_SOURCES_DIR, sources_list: Path = APT_SOURCES_LIST
) -> list[tuple[str, list[str]]]:
    """Return (uri, suites) for every binary 'deb' entry the host's apt knows."""
    entries: list[tuple[str, list[str]]] = []
    for path in sorted(sources_dir.glob("*.sources")) if sources_dir.is_dir() else []:
        with open(path, encoding="utf-8") as fh:
            for stanza in deb822.Deb822.iter_paragraphs(fh):
                if stanza.get("Enabled", "yes").strip().lower() == "no":
                    continue
                if "deb" not in stanza.get("Types", "").split():
                    continue
                for uri in stanza.get("URIs", "").split():
                    entries.append((uri.rstrip("/"), stanza.get("Suites", "").split()))
    lists = [sources_list] + (sorted(sources_dir.glob("*.list")) if sources_dir.is_dir() else [])
    for path in lists:
        if not path.is_file():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            words = line.split("#", 1)[0].split()
            if not words or words[0] != "deb":
                continue
            words = [w for w in words[1:] if not w.startswith("[")]  # drop [options]
            if len(words) >= 2:
                entries.append((words[0].rstrip("/"), [words[1]]))
    return entries


def pick_mirrors(entries: list[tuple[str, list[str]]]) -> tuple[str, str]:
    """Choose the main archive URI and the security archive URI from apt's entries."""
    main = next((uri for uri, suites in entries if any("-security" not in s for s in suites)), "")
    security = next(
        (uri for uri, suites in entries if any(s.endswith("-security") for s in suites)), ""
    )
    return main, security


@dataclass
class Settings:
    """Everything configurable in moddeb; see README 'Configuration'."""

    home: Path = field(default_factory=default_home)
    maintainer_name: str = "moddeb build service"
    maintainer_email: str = "moddeb@example.org"
    distribution: str = "bookworm"
    suite: str = "bookworm"
    mirror: str = ""
    security_mirror: str = ""
    base_image: str = ""
    # Checks the archive's InRelease before moddeb trusts its Packages indexes.
    archive_keyring: str = "/usr/share/keyrings/debian-archive-keyring.gpg"
    debian_revision: str = "1"
    max_archive_bytes: int = 512 * 1024 * 1024
    max_archive_files: int = 20000
    container_memory: str = "2g"
    container_pids: int = 512
    step_timeout: int = 1800
    jobs: int = 2
    templates_dir: Path = field(
        default_factory=lambda: Path(__file__).resolve().parent.parent / "debian-templates"
    )
    # The apt repository (builder/repo.py). repo_dir "" means <home>/repo.
    repo_dir: str = ""
    repo_keep_versions: int = 3
    repo_keep_generations: int = 3
    repo_architectures: str = "amd64"
    repo_valid_days: int = 0
    repo_origin: str = "moddeb"
    repo_label: str = "moddeb"
    repo_key_algo: str = "ed25519"
    # The build service (web/, builder/tasks.py, builder/store.py). An empty URL means the
    # embedded default: SQLite files under <home>/state, no server needed.
    database_url: str = ""
    broker_url: str = ""
    secret_key: str = ""  # "" means a random key kept in <home>/state/secret_key
    listen_address: str = "127.0.0.1"
    listen_port: int = 8080
    public_url: str = ""  # how apt clients reach /apt/; "" means the URL a request came in on
    web_workers: int = 2
    max_upload_bytes: int = 64 * 1024 * 1024
    visibility_timeout: int = 0  # seconds; 0 means derived from step_timeout (see store.py)
    # Boot tests (builder/boottest.py): each module package loaded in its own kernel under QEMU.
    boot_accel: str = "auto"  # auto (KVM when it works here, else software emulation), kvm, tcg
    boot_timeout: int = 120  # seconds per boot, enforced by killing qemu
    boot_smoke_timeout: int = 60  # seconds the source's smoke command may run inside the VM
    boot_memory: str = "512M"  # qemu -m
    require_boot_test: int = 1  # 1: publish only packages whose boot test passed; 0: warn only
    service_boot_test: int = 1  # the service boot-tests every kernel it builds (0: never)
    # eBPF helper packages (builder/bpf.py). bpf_vmlinux_btf "" means the vmlinux.h the
    # source carries; a kernel BTF, vmlinux or vmlinuz file (e.g. /sys/kernel/btf/vmlinux)
    # or linux-image-KVER (from the archive) means generate vmlinux.h from that BTF.
    # bpf_verify: "auto" loads objects into the host kernel when it can (root, bpftool)
    # and says why not otherwise, "host" requires it, "off" skips it.
    bpf_vmlinux_btf: str = ""
    bpf_verify: str = "auto"

    @property
    def work_root(self) -> Path:
        """Per-job work directories."""
        return self.home / "work"

    @property
    def cache_root(self) -> Path:
        """Caches: base rootfs tarballs, per-kernel build results."""
        return self.home / "cache"

    @property
    def state_root(self) -> Path:
        """Persistent state (database, locks)."""
        return self.home / "state"

    @property
    def keys_root(self) -> Path:
        """Signing keys; never mounted into a build container."""
        return self.home / "keys"

    @property
    def maintainer(self) -> str:
        """The Maintainer field as 'Name <email>'."""
        return f"{self.maintainer_name} <{self.maintainer_email}>"


def _coerce(name: str, kind: Any, raw: Any) -> Any:
    """Turn a TOML or environment value into the field's type, naming the setting on error."""
    try:
        if kind in (int, "int"):
            return int(raw)
        if kind in (Path, "Path"):
            return Path(raw).expanduser()
        return str(raw)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"setting {name!r} has an invalid value {raw!r}: {exc}") from None


def load_settings(env: dict[str, str] | None = None, **overrides: Any) -> Settings:
    """Build Settings from defaults, $MODDEB_CONFIG (TOML), MODDEB_* variables and overrides."""
    env = dict(os.environ if env is None else env)
    settings = Settings()
    if "MODDEB_HOME" in env:
        settings.home = Path(env["MODDEB_HOME"]).expanduser()
    known = {f.name: f.type for f in fields(Settings)}
    config_path = Path(env.get("MODDEB_CONFIG", settings.home / "moddeb.toml"))
    values: dict[str, Any] = {}
    if config_path.is_file():
        try:
            values.update(tomllib.loads(config_path.read_text(encoding="utf-8")))
        except tomllib.TOMLDecodeError as exc:
            raise InvalidInput(
                f"configuration file {config_path} is not valid TOML: {exc}"
            ) from None
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise InvalidInput(f"configuration file {config_path} has unknown settings: {unknown}")
    for name in known:
        key = f"MODDEB_{name.upper()}"
        if key in env:
            values[name] = env[key]
    values.update({k: v for k, v in overrides.items() if v is not None})
    for name, raw in values.items():
        setattr(settings, name, _coerce(name, known[name], raw))
    if not settings.mirror or not settings.security_mirror:
        main, security = pick_mirrors(read_apt_sources())
        settings.mirror = settings.mirror or main
        settings.security_mirror = settings.security_mirror or security
    return settings


def as_dict(settings: Settings) -> dict[str, Any]:
    """Settings as plain values (for `moddeb config` and job records)."""
    return {
        k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(settings).items()
    }
