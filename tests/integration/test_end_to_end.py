"""Source to server: build kbench for two kernels, publish, apt-get install with signatures on."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder import repo

from .helpers import EXAMPLES, KERNEL_61, KERNEL_612, build
from .test_repo_apt import KEYRING, AptClient, serve

pytestmark = pytest.mark.docker


def test_fleet_installs_real_module_packages_and_follows_the_newest_abi(
    settings, runner, base_image, tmp_path: Path
) -> None:
    """apt installs NAME-modules-KVER (pulling linux-image-KVER) and NAME-modules-FLAVOUR."""
    out = tmp_path / "out"
    report = build(settings, runner, str(EXAMPLES / "kbench"), out, KERNEL_61, KERNEL_612)
    assert report.status == "succeeded", [(k.kernel_release, k.diagnosis) for k in report.kernels]
    repository = repo.open_repository(tmp_path / "repo", settings)
    repository.publish("bookworm", [out / name for name in sorted(report.artifacts)])
    keyring = (tmp_path / "repo" / "moddeb-archive-keyring.gpg").read_bytes()
    with serve(tmp_path / "repo") as url:
        client = AptClient(runner, base_image)
        try:
            client.put(KEYRING, keyring)
            client.put(
                "/etc/apt/sources.list.d/moddeb.sources",
                (
                    f"Types: deb\nURIs: {url}\nSuites: bookworm\nComponents: main\n"
                    f"Signed-By: {KEYRING}\n"
                ).encode(),
            )
            rc, log = client.sh("apt-get update 2>&1")
            assert rc == 0 and "NO_PUBKEY" not in log, log
            rc, log = client.sh(
                f"apt-get install -y --no-install-recommends kbench-modules-{KERNEL_61} 2>&1"
            )
            assert rc == 0, log[-3000:]
            assert f"linux-image-{KERNEL_61}" in log  # the Depends pulled the real kernel in
            rc, log = client.sh(
                f"modinfo -F vermagic /lib/modules/{KERNEL_61}/updates/dkms/kbench.ko; "
                f"grep -c updates/dkms/kbench.ko: /lib/modules/{KERNEL_61}/modules.dep"
            )
            assert rc == 0 and log.startswith(f"{KERNEL_61} SMP") and log.endswith("1\n"), log
            rc, log = client.sh(
                "apt-get install -y --no-install-recommends kbench-modules-amd64 2>&1"
            )
            assert rc == 0, log[-3000:]
            rc, log = client.sh(
                "dpkg-query -W -f='${Package}\\n' 'kbench-modules-*'; "
                f"ls /lib/modules/{KERNEL_612}/updates/dkms/"
            )
            assert f"kbench-modules-{KERNEL_612}\n" in log and "kbench.ko.xz" in log, log
        finally:
            client.container.remove(force=True)
