"""Untrusted build steps: no network, resource limits, a time limit, and nothing left behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.runner import BUILD_UID, Limits

pytestmark = pytest.mark.docker


def _run(runner, image, script: str, tmp_path: Path, **limits) -> tuple[object, str]:
    log = tmp_path / "step.log"
    result = runner.run_step(
        "probe",
        image,
        ["/bin/sh", "-c", script],
        log_path=log,
        limits=Limits(**limits),
        inputs={"/build/in": tmp_path / "in"},
        outputs={"/build/out": tmp_path / "out"},
    )
    return result, log.read_text()


@pytest.fixture
def inbox(tmp_path: Path) -> Path:
    """A small input directory pushed into the container."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "hello.txt").write_text("hi\n")
    return tmp_path


def test_step_has_no_network_no_socket_and_limits(runner, base_image, inbox: Path) -> None:
    """Only loopback, no Docker socket, the pid and memory limits in force, caps dropped."""
    script = r"""
ls /sys/class/net
test -e /var/run/docker.sock && echo SOCKET || echo no-socket
cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max
cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max
grep CapEff /proc/self/status
mkdir -p /build/out && cp /build/in/hello.txt /build/out/copied.txt
"""
    result, log = _run(runner, base_image, script, inbox, memory="256m", pids=64)
    assert result.ok, log
    assert log.split()[0] == "lo" and "eth0" not in log
    assert "no-socket" in log and "\n64\n" in log and str(256 * 1024 * 1024) in log
    cap_eff = int(log.split("CapEff:")[1].split()[0], 16)
    assert cap_eff & (1 << 21) == 0  # no CAP_SYS_ADMIN
    assert cap_eff & (1 << 12) == 0  # no CAP_NET_ADMIN
    assert (inbox / "out" / "copied.txt").read_text() == "hi\n"


def test_step_over_its_time_limit_is_killed_and_removed(runner, base_image, inbox: Path) -> None:
    """A step that runs too long is stopped, says so in its log, and its container is gone."""
    result, log = _run(runner, base_image, "echo started; sleep 60", inbox, timeout=3)
    assert result.timed_out and not result.ok
    assert "started" in log and "exceeded its 3s limit" in log
    leftovers = runner.client.containers.list(
        all=True, filters={"label": f"moddeb.owner={runner.owner}"}
    )
    assert not [c for c in leftovers if c.labels.get("moddeb.step") == "probe"]


def test_failed_step_keeps_its_log_and_removes_its_container(runner, base_image, inbox: Path):
    """A failing step's output is in its log; nothing is pulled; the container is removed."""
    result, log = _run(runner, base_image, "echo oops >&2; exit 3", inbox)
    assert result.exit_code == 3 and "oops" in log
    assert not (inbox / "out").exists()
    leftovers = runner.client.containers.list(
        all=True, filters={"label": f"moddeb.owner={runner.owner}"}
    )
    assert not [c for c in leftovers if c.labels.get("moddeb.step") == "probe"]


def test_unprivileged_step_runs_as_its_uid_with_no_capabilities(runner, base_image, tmp_path):
    """A uid step (the -dkms package build) is not root, has no capabilities, owns /build."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "f").write_text("x")
    log = tmp_path / "step.log"
    result = runner.run_step(
        "probe",
        base_image,
        [
            "/bin/sh",
            "-c",
            "id -u; grep CapEff /proc/self/status; stat -c %u /build /build/in/f;"
            " touch /build/new && echo wrote",
        ],
        log_path=log,
        limits=Limits(),
        inputs={"/build/in": tmp_path / "in"},
        uid=BUILD_UID,
    )
    text = log.read_text()
    assert result.ok, text
    assert text.splitlines()[0] == str(BUILD_UID)
    assert int(text.split("CapEff:")[1].split()[0], 16) == 0
    assert text.splitlines()[2:5] == [str(BUILD_UID), str(BUILD_UID), "wrote"]
