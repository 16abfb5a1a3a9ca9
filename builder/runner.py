"""The only module that talks to Docker: run one step in a throwaway, limited container."""

from __future__ import annotations

import io
import logging
import tarfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors
import requests.exceptions

from builder.archive import extract_tar_stream
from builder.config import Settings
from builder.errors import BuildFailed, Transient

log = logging.getLogger(__name__)

LABEL = "moddeb"
# What an untrusted build keeps of root's powers: enough to write files it owns
# and for dpkg/dkms to set modes, nothing to touch the network or the host.
BUILD_CAPS = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "SETUID", "SETGID"]
# Steps that need no root (dpkg-buildpackage with Rules-Requires-Root: no, lintian) run as
# this uid, with no capabilities at all.
BUILD_UID = 1000


@dataclass
class StepResult:
    """What one container step did."""

    name: str
    exit_code: int
    duration: float
    log_path: Path
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        """True when the step exited 0 within its time limit."""
        return self.exit_code == 0 and not self.timed_out


@dataclass
class ImageInfo:
    """One image moddeb made."""

    id: str
    tags: list[str]
    labels: dict[str, str]
    size: int
    created: str


@dataclass
class Limits:
    """Resource limits for one container."""

    memory: str = "2g"
    pids: int = 512
    timeout: int = 1800


def limits_from(settings: Settings) -> Limits:
    """The container limits the settings ask for."""
    return Limits(settings.container_memory, settings.container_pids, settings.step_timeout)


def _tar_of(inputs: dict[str, Path], uid: int = 0) -> bytes:
    """Pack host directories into one tar whose members land at the given container paths.

    Everything, including the parent directories of each destination, belongs to uid in
    the container (root by default), whoever owns it here.
    """

    def owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = uid
        info.uname = info.gname = ""
        return info

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        parents: set[str] = set()
        for dest in sorted(inputs):
            parts = dest.strip("/").split("/")[:-1]
            parents.update("/".join(parts[: i + 1]) for i in range(len(parts)))
        for parent in sorted(parents):
            info = tarfile.TarInfo(parent)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(owned(info))
        for dest, src in sorted(inputs.items()):
            tar.add(str(src), arcname=dest.strip("/"), filter=owned)
    return buf.getvalue()


class Runner:
    """Create, feed, run, drain and remove containers for build steps."""

    def __init__(self, owner: str = LABEL, client: docker.DockerClient | None = None) -> None:
        self.owner = owner
        self._client = client

    @property
    def client(self) -> docker.DockerClient:
        """The engine connection, opened on first use with a clear error when none answers."""
        if self._client is None:
            try:
                self._client = docker.from_env(timeout=120)
                self._client.ping()
            except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
                raise Transient(
                    f"no Docker engine answers: {exc}",
                    hint="start one (see README) or set DOCKER_HOST",
                ) from None
        return self._client

    def labels(self, **extra: str) -> dict[str, str]:
        """Labels every container and image moddeb makes carries."""
        return {LABEL: "1", f"{LABEL}.owner": self.owner, **extra}

    # images -----------------------------------------------------------------
    def _image_changes(self, labels: dict[str, str]) -> list[str]:
        """Dockerfile-style changes giving an image moddeb's labels and a shell."""
        merged = {**self.labels(), **labels}
        return [*(f'LABEL {k}="{v}"' for k, v in merged.items()), 'CMD ["/bin/bash"]']

    def has_image(self, tag: str) -> bool:
        """True when the engine holds an image with this tag."""
        try:
            self.client.images.get(tag)
            return True
        except docker.errors.ImageNotFound:
            return False

    def image_id(self, tag: str) -> str:
        """The content id of a local image (changes whenever the image is rebuilt)."""
        return str(self.client.images.get(tag).id)

    def import_rootfs(self, rootfs_tar: Path, tag: str, labels: dict[str, str]) -> None:
        """Make an image from a root filesystem tarball (no registry needed)."""
        repo, _, version = tag.partition(":")
        changes = self._image_changes(labels)
        # import_image_from_stream sends a chunked body that dockerd 20.10 rejects
        # ("header line too long"); a file object gets a Content-Length and streams.
        with open(rootfs_tar, "rb") as fh:
            self.client.api.import_image_from_data(
                fh, repository=repo, tag=version or "latest", changes=changes
            )

    def pull(self, ref: str) -> None:
        """Pull an image from a registry, as a transient error when it cannot."""
        try:
            self.client.images.pull(ref)
        except docker.errors.APIError as exc:
            raise Transient(f"cannot pull image {ref}: {exc.explanation or exc}") from None

    def commit_step(
        self,
        image: str,
        script: str,
        tag: str | None,
        labels: dict[str, str],
        log_path: Path,
        limits: Limits,
        inputs: dict[str, Path] | None = None,
        outputs: dict[str, Path] | None = None,
    ) -> StepResult:
        """Run a trusted script with network; save the result as `tag` unless it is None."""
        return self._run(
            "prepare",
            image,
            ["/bin/sh", "-ec", script],
            log_path=log_path,
            limits=limits,
            network=True,
            inputs=inputs,
            outputs=outputs,
            commit=(tag, labels) if tag else None,
        )

    def list_images(self) -> list[ImageInfo]:
        """Every image moddeb made, with tags, labels, size and creation time."""
        return [
            ImageInfo(
                img.short_id,
                list(img.tags),
                dict(img.labels or {}),
                int(img.attrs.get("Size", 0)),
                str(img.attrs.get("Created", "")),
            )
            for img in self.client.images.list(filters={"label": f"{LABEL}=1"})
        ]

    def remove_image(self, tag: str) -> None:
        """Delete one image (refuses images a container still uses)."""
        self.client.images.remove(tag, noprune=False)

    # steps ------------------------------------------------------------------
    def run_step(
        self,
        name: str,
        image: str,
        command: list[str],
        *,
        log_path: Path,
        limits: Limits,
        inputs: dict[str, Path] | None = None,
        outputs: dict[str, Path] | None = None,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        labels: dict[str, str] | None = None,
        uid: int = 0,
    ) -> StepResult:
        """Run an untrusted step with no network; push `inputs`, pull `outputs` after it ends.

        uid 0 keeps the few capabilities dkms needs; any other uid runs with none.
        """
        return self._run(
            name,
            image,
            command,
            log_path=log_path,
            limits=limits,
            network=False,
            inputs=inputs,
            outputs=outputs,
            env=env,
            workdir=workdir,
            labels=labels,
            uid=uid,
        )

    def _run(
        self,
        name: str,
        image: str,
        command: list[str],
        *,
        log_path: Path,
        limits: Limits,
        network: bool,
        inputs: dict[str, Path] | None = None,
        outputs: dict[str, Path] | None = None,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        labels: dict[str, str] | None = None,
        commit: tuple[str, dict[str, str]] | None = None,
        uid: int = 0,
    ) -> StepResult:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        container = None
        try:
            container = self.client.containers.create(
                image,
                command,
                detach=True,
                environment=env or {},
                working_dir=workdir,
                labels=self.labels(**{f"{LABEL}.step": name}, **(labels or {})),
                network_mode="host" if network else "none",
                mem_limit=limits.memory,
                memswap_limit=limits.memory,
                pids_limit=limits.pids,
                # Preparation steps are moddeb's own trusted scripts (apt needs its
                # usual powers); everything else is untrusted and gets the minimum.
                cap_drop=None if network else ["ALL"],
                cap_add=None if network or uid else BUILD_CAPS,
                security_opt=None if network else ["no-new-privileges"],
                user=f"{uid}:{uid}" if uid else None,
            )
            if inputs:
                container.put_archive("/", _tar_of(inputs, uid))
            container.start()
            pump = threading.Thread(target=_pump_logs, args=(container, log_path), daemon=True)
            pump.start()
            timed_out = False
            try:
                exit_code = int(container.wait(timeout=limits.timeout)["StatusCode"])
            except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
                timed_out, exit_code = True, -1
                container.kill()
            pump.join(timeout=10)
            duration = time.monotonic() - started
            if timed_out:
                with open(log_path, "a", encoding="utf-8") as fh:
                    fh.write(f"\nmoddeb: step {name} exceeded its {limits.timeout}s limit\n")
            result = StepResult(name, exit_code, duration, log_path, timed_out)
            if result.ok and outputs:
                for src, dest in outputs.items():
                    self._pull(container, src, dest)
            if result.ok and commit:
                tag, commit_labels = commit
                repo, _, version = tag.partition(":")
                changes = self._image_changes(commit_labels)
                container.commit(repository=repo, tag=version or "latest", changes=changes)
            log.info("step %s in %s: exit %s after %.1fs", name, image, exit_code, duration)
            return result
        except docker.errors.ImageNotFound as exc:
            raise BuildFailed(f"step {name}: image {image} is missing: {exc.explanation}") from None
        except (docker.errors.APIError, requests.exceptions.RequestException) as exc:
            raise Transient(f"step {name}: Docker engine error: {exc}") from None
        finally:
            if container is not None:
                try:
                    container.remove(force=True)
                except docker.errors.APIError:
                    log.warning("could not remove container %s", container.id)

    def _pull(self, container: object, src: str, dest: Path) -> None:
        """Copy a directory out of a stopped container, refusing anything unsafe in it."""
        stream, _ = container.get_archive(src)  # type: ignore[attr-defined]
        dest.mkdir(parents=True, exist_ok=True)
        extract_tar_stream(_ChunkReader(stream), dest, strip_first=True)  # type: ignore[arg-type]

    def remove_containers(self, owner: str | None = None) -> int:
        """Remove every container moddeb made (or only one owner's); return how many."""
        flt = f"{LABEL}.owner={owner}" if owner else f"{LABEL}=1"
        found = self.client.containers.list(all=True, filters={"label": flt})
        for c in found:
            try:
                c.remove(force=True)
            except docker.errors.NotFound:
                pass  # already gone
            except docker.errors.APIError as exc:
                if exc.status_code != 409:  # 409: a removal is already in progress
                    raise
        return len(found)


def _pump_logs(container: object, log_path: Path) -> None:
    """Stream a container's output to its log file as it is produced."""
    with open(log_path, "ab") as fh:
        for chunk in container.logs(stream=True, follow=True):  # type: ignore[attr-defined]
            fh.write(chunk)
            fh.flush()


class _ChunkReader(io.RawIOBase):
    """A file object over the chunk iterator docker's get_archive returns."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._buf = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray) -> int:  # type: ignore[override]
        while not self._buf:
            try:
                self._buf = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n
