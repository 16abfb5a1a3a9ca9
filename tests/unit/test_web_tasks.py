"""The worker side of the service without Docker or a broker: the task functions in
builder.tasks driven with a fake pipeline, fake mkbmdeb and a recording queue."""

from __future__ import annotations

import hashlib
import io
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from builder import tasks
from builder.config import Settings, load_settings
from builder.errors import BuildFailed, PublishFailed, Transient
from builder.pipeline import KernelResult
from builder.store import (
    LEASE_SECONDS,
    Blob,
    Build,
    BuildEvent,
    KernelJob,
    celery_config,
    now,
    open_store,
    visibility_timeout,
)

DKMS_DEB = "hello-dkms_1.0-1_all.deb"


class Recorder:
    """What the tasks sent and published."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, list[Any]]] = []
        self.published: list[list[str]] = []
        self.pipeline_runs = 0
        self.kernel_runs: list[str] = []
        self.booted: list[str] = []


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Settings on a throwaway home, and fakes for everything that needs Docker."""
    settings = load_settings(env={"MODDEB_HOME": str(tmp_path / "home")})
    rec = Recorder()
    outcome = {
        "pipeline": "succeeded",
        "kernel": {},
        "image": None,
        "publish": None,
        "boot": {},
        "kind": "module",
    }

    class FakePipeline:
        def __init__(self, s: Settings, request: Any, progress=None, runner=None) -> None:
            self.request, self.progress, self.settings = request, progress, s

        def run(self) -> Any:
            rec.pipeline_runs += 1
            self.progress(f"[{self.request.job_id}] fetch ...")
            logs = self.settings.work_root / self.request.job_id / "logs"
            logs.mkdir(parents=True, exist_ok=True)
            (logs / "dkms-package.log").write_text("dpkg-buildpackage: building hello-dkms\n")
            out = Path(self.request.out_dir)
            out.mkdir(parents=True, exist_ok=True)
            status = outcome["pipeline"]
            report = SimpleNamespace(
                status="succeeded",
                error_code="",
                error="",
                name="hello",
                version="1.0-1",
                artifacts={},
                out_dir=str(out),
                layout={"modules": ["hello"]},
                kind=outcome["kind"],
            )
            if status == "succeeded":
                (out / DKMS_DEB).write_bytes(b"dkms deb")
                report.artifacts = {DKMS_DEB: hashlib.sha256(b"dkms deb").hexdigest()}
            else:
                report.status, report.error_code = "failed", status
                report.error = f"{status}: something broke"
            return report

    def fake_kernel_package(s, runner, deb, kernel, out_dir, log_dir, labels=None):
        rec.kernel_runs.append(kernel.kernel_release)
        assert deb.read_bytes() == b"dkms deb" and labels["moddeb.job"]
        log_dir.mkdir(parents=True, exist_ok=True)
        (log_dir / f"kernel-{kernel.kernel_release}.log").write_text("make -C ... modules\n")
        diagnosis = outcome["kernel"].get(kernel.kernel_release)
        result = KernelResult(kernel.kernel_release, duration=1.5)
        if diagnosis:
            result.status, result.diagnosis = "failed", diagnosis
        else:
            out_dir.mkdir(parents=True, exist_ok=True)
            name = f"hello-modules-{kernel.kernel_release}_1.0-1_amd64.deb"
            (out_dir / name).write_bytes(b"module deb " + kernel.kernel_release.encode())
            result.status, result.artifacts = "built", {name: "x"}
        return result

    def fake_image(s, runner, kver, suite=None):
        if outcome["image"]:
            raise Transient(outcome["image"])
        return f"moddeb/kernel:{kver}"

    def fake_publish(s, debs):
        if outcome["publish"]:
            raise outcome["publish"]
        rec.published.append(sorted(Path(d).name for d in debs))
        return sorted(Path(d).name for d in debs)

    def fake_boot(s, kernel, dkms_deb, out_dir, artifacts, log_dir):
        rec.booted.append(kernel.kernel_release)
        status, diagnosis = outcome["boot"].get(kernel.kernel_release, ("passed", "loaded hello"))
        return SimpleNamespace(status=status, diagnosis=diagnosis)

    monkeypatch.setattr(tasks, "_boot_test", fake_boot)
    monkeypatch.setattr("builder.pipeline.Pipeline", FakePipeline)
    monkeypatch.setattr("builder.mkbmdeb.build_kernel_package", fake_kernel_package)
    monkeypatch.setattr("builder.images.ensure_kernel_image", fake_image)
    monkeypatch.setattr("builder.runner.Runner", lambda *a, **k: SimpleNamespace(client=object()))
    monkeypatch.setattr(tasks, "send", lambda name, args: rec.sent.append((name, list(args))))
    monkeypatch.setattr(tasks, "publish_debs", fake_publish)
    return SimpleNamespace(settings=settings, rec=rec, outcome=outcome, store=open_store(settings))


def new_build(env: Any, kernels: tuple[str, ...] = ("6.1.0-57-amd64",), **fields: Any) -> int:
    """A queued build of an uploaded tarball."""
    with env.store.session() as s:
        b = Build(
            job_id=f"job-{time.monotonic_ns()}",
            source_kind="upload",
            source="hello-1.0.tar.gz",
            **fields,
        )
        s.add(b)
        s.flush()
        s.add(
            Blob(
                build_id=b.id,
                kind="source",
                filename="hello-1.0.tar.gz",
                sha256="-",
                size=3,
                data=b"tar",
            )
        )
        for k in kernels:
            s.add(KernelJob(build_id=b.id, kernel_release=k, flavour="amd64", suite="bookworm"))
        return b.id


def load(env: Any, build_id: int) -> Build:
    """A build with its kernels, blobs and events loaded."""
    with env.store.session() as s:
        b = s.get(Build, build_id)
        _ = (b.kernels, b.blobs, b.events, [x.data for x in b.blobs])
        return b


def events(env: Any, build_id: int, kind: str) -> list[str]:
    """Messages of one kind in a build's log."""
    with env.store.session() as s:
        return [e.message for e in s.query(BuildEvent).filter_by(build_id=build_id, kind=kind)]


# --- moddeb.build ------------------------------------------------------------------------------
def test_build_stores_the_dkms_package_and_fans_out_one_task_per_kernel(env: Any) -> None:
    """The -dkms stage's .deb goes into the database and each kernel gets its own task."""
    build_id = new_build(env, ("6.1.0-57-amd64", "6.12.117+deb12-amd64"))
    tasks.run_build(env.settings, build_id)
    b = load(env, build_id)
    assert (b.state, b.name, b.version, b.modules, b.dkms_done) == (
        "running",
        "hello",
        "1.0-1",
        ["hello"],
        1,
    )
    assert [(x.kind, x.filename, x.data) for x in b.blobs if x.kind == "dkms"] == [
        ("dkms", DKMS_DEB, b"dkms deb")
    ]
    assert "building hello-dkms" in b.log
    assert env.rec.sent == [
        ("moddeb.build_kernel", [build_id, "6.1.0-57-amd64"]),
        ("moddeb.build_kernel", [build_id, "6.12.117+deb12-amd64"]),
    ]
    assert any("fetch" in m for m in events(env, build_id, "stage"))
    assert not list(env.settings.work_root.iterdir())  # work dirs are cleaned up


def test_build_without_kernels_goes_straight_to_publish(env: Any) -> None:
    """A -dkms-only build is published as soon as its package exists."""
    build_id = new_build(env, ())
    tasks.run_build(env.settings, build_id)
    assert env.rec.sent == [("moddeb.publish", [build_id])]


@pytest.mark.parametrize("state", ["succeeded", "failed", "cancelled"])
def test_build_refuses_a_build_that_is_not_queued(env: Any, state: str) -> None:
    """A finished or cancelled build is never run again."""
    build_id = new_build(env, state=state)
    tasks.run_build(env.settings, build_id)
    assert env.rec.pipeline_runs == 0 and env.rec.sent == []
    tasks.run_build(env.settings, 999)  # and a missing one is a no-op
    assert env.rec.pipeline_runs == 0


def test_build_failure_is_recorded_with_its_code_and_nothing_is_queued(env: Any) -> None:
    """A failed -dkms stage fails the build with the stage's error code; kernels are cancelled."""
    env.outcome["pipeline"] = "build-failed"
    build_id = new_build(env)
    tasks.run_build(env.settings, build_id)
    b = load(env, build_id)
    assert (b.state, b.error_code) == ("failed", "build-failed")
    assert b.kernels[0].state == "cancelled" and env.rec.sent == []
    assert b.finished_at is not None


def test_a_transient_failure_is_retried_and_the_retry_can_take_the_job(env: Any) -> None:
    """A transient error raises Transient (Celery retries it) and gives the lease back."""
    env.outcome["pipeline"] = "transient"
    build_id = new_build(env)
    with pytest.raises(Transient):
        tasks.run_build(env.settings, build_id)
    b = load(env, build_id)
    assert (b.state, b.lease_until) == ("running", 0.0)
    env.outcome["pipeline"] = "succeeded"
    tasks.run_build(env.settings, build_id)
    assert load(env, build_id).dkms_done == 1


def test_a_build_held_by_a_live_worker_is_left_to_it(env: Any) -> None:
    """A duplicate delivery while another worker holds the lease waits (JobBusy, a Transient)."""
    build_id = new_build(env, state="running", lease_until=now() + LEASE_SECONDS)
    with pytest.raises(tasks.JobBusy):
        tasks.run_build(env.settings, build_id)
    assert env.rec.pipeline_runs == 0


def test_a_build_whose_worker_died_is_taken_over(env: Any) -> None:
    """A running build whose lease ran out (its worker was killed) is run again."""
    build_id = new_build(env, state="running", lease_until=now() - 1)
    tasks.run_build(env.settings, build_id)
    assert env.rec.pipeline_runs == 1 and load(env, build_id).dkms_done == 1


def test_a_redelivered_build_after_its_dkms_stage_only_fans_out(env: Any) -> None:
    """If the -dkms package is already stored, a re-delivery re-queues unfinished kernels only."""
    build_id = new_build(env, ("6.1.0-57-amd64", "6.1.0-56-amd64"), state="running", dkms_done=1)
    with env.store.session() as s:
        s.get(Build, build_id).kernels[0].state = "succeeded"
    tasks.run_build(env.settings, build_id)
    assert env.rec.pipeline_runs == 0
    assert env.rec.sent == [("moddeb.build_kernel", [build_id, "6.1.0-56-amd64"])]


def test_a_build_cancelled_during_its_dkms_stage_drops_the_result(env: Any, monkeypatch) -> None:
    """Cancelling while the -dkms stage runs keeps the build cancelled and queues nothing."""
    build_id = new_build(env)
    real_run = tasks.Heartbeat.__exit__

    def cancel_then_exit(self, *exc):
        with env.store.session() as s:
            s.get(Build, build_id).state = "cancelled"
        return real_run(self, *exc)

    monkeypatch.setattr(tasks.Heartbeat, "__exit__", cancel_then_exit)
    tasks.run_build(env.settings, build_id)
    b = load(env, build_id)
    assert b.state == "cancelled" and not b.dkms_done and env.rec.sent == []


# --- moddeb.build_kernel -------------------------------------------------------------------------
def built(env: Any, kernels=("6.1.0-57-amd64",)) -> int:
    """A build whose -dkms stage is done."""
    build_id = new_build(env, kernels)
    tasks.run_build(env.settings, build_id)
    env.rec.sent.clear()
    return build_id


def test_kernel_task_stores_the_package_status_and_log_then_publishes_when_last(env: Any) -> None:
    """Each kernel's .deb, state and log land in the database; the last one queues publish."""
    build_id = built(env, ("6.1.0-57-amd64", "6.1.0-56-amd64"))
    tasks.run_build_kernel(env.settings, build_id, "6.1.0-57-amd64")
    assert env.rec.sent == []  # one kernel still to go
    tasks.run_build_kernel(env.settings, build_id, "6.1.0-56-amd64")
    assert env.rec.sent == [("moddeb.publish", [build_id])]
    b = load(env, build_id)
    assert [k.state for k in b.kernels] == ["succeeded", "succeeded"]
    assert "make -C" in b.kernels[0].log and b.kernels[0].duration == 1.5
    modules = sorted((x.kernel_release, x.filename) for x in b.blobs if x.kind == "module")
    assert modules == [
        ("6.1.0-56-amd64", "hello-modules-6.1.0-56-amd64_1.0-1_amd64.deb"),
        ("6.1.0-57-amd64", "hello-modules-6.1.0-57-amd64_1.0-1_amd64.deb"),
    ]


def test_kernel_failure_keeps_its_diagnosis(env: Any) -> None:
    """A kernel that fails to build records the diagnosis line; publish still follows."""
    build_id = built(env)
    env.outcome["kernel"]["6.1.0-57-amd64"] = "implicit declaration of 'strlcpy' (hello.c:42)"
    tasks.run_build_kernel(env.settings, build_id, "6.1.0-57-amd64")
    k = load(env, build_id).kernels[0]
    assert (k.state, k.diagnosis) == ("failed", "implicit declaration of 'strlcpy' (hello.c:42)")
    assert env.rec.sent == [("moddeb.publish", [build_id])]


def test_kernel_image_outage_is_transient_and_releases_the_job(env: Any) -> None:
    """An archive or engine problem preparing the kernel image is retried, not a diagnosis."""
    build_id = built(env)
    env.outcome["image"] = "could not prepare the builder image"
    with pytest.raises(Transient):
        tasks.run_build_kernel(env.settings, build_id, "6.1.0-57-amd64")
    k = load(env, build_id).kernels[0]
    assert (k.state, k.lease_until, k.diagnosis) == ("running", 0.0, "")
    env.outcome["image"] = None
    tasks.run_build_kernel(env.settings, build_id, "6.1.0-57-amd64")
    assert load(env, build_id).kernels[0].state == "succeeded"


def test_a_finished_kernel_is_never_built_twice(env: Any) -> None:
    """A duplicate kernel task finds the kernel done, builds nothing and re-checks publish."""
    build_id = built(env)
    tasks.run_build_kernel(env.settings, build_id, "6.1.0-57-amd64")
    tasks.run_build_kernel(env.settings, build_id, "6.1.0-57-amd64")
    assert env.rec.kernel_runs == ["6.1.0-57-amd64"]
    assert env.rec.sent == [("moddeb.publish", [build_id])] * 2
    tasks.run_build_kernel(env.settings, build_id, "9.9-nope")  # unknown kernel: no-op


def test_a_kernel_held_by_a_live_worker_waits(env: Any) -> None:
    """A kernel under a live lease makes a duplicate task wait (JobBusy)."""
    build_id = built(env)
    with env.store.session() as s:
        k = s.get(Build, build_id).kernels[0]
        k.state, k.lease_until = "running", now() + LEASE_SECONDS
    with pytest.raises(tasks.JobBusy):
        tasks.run_build_kernel(env.settings, build_id, "6.1.0-57-amd64")


def test_a_cancelled_build_builds_no_kernels(env: Any) -> None:
    """Kernel tasks of a cancelled build do nothing."""
    build_id = built(env)
    with env.store.session() as s:
        s.get(Build, build_id).state = "cancelled"
    tasks.run_build_kernel(env.settings, build_id, "6.1.0-57-amd64")
    assert env.rec.kernel_runs == [] and env.rec.sent == []


def test_kernel_without_a_dkms_package_fails_with_a_diagnosis(env: Any) -> None:
    """A kernel task for a build whose -dkms blob is gone fails clearly."""
    build_id = new_build(env, state="running", dkms_done=1)
    tasks.run_build_kernel(env.settings, build_id, "6.1.0-57-amd64")
    k = load(env, build_id).kernels[0]
    assert k.state == "failed" and "-dkms package of this build is missing" in k.diagnosis


# --- moddeb.publish ------------------------------------------------------------------------------
def test_publish_happens_exactly_once(env: Any) -> None:
    """Publish puts the -dkms and module packages in the repository once; repeats are no-ops."""
    build_id = built(env)
    tasks.run_build_kernel(env.settings, build_id, "6.1.0-57-amd64")
    tasks.run_publish(env.settings, build_id)
    tasks.run_publish(env.settings, build_id)
    assert env.rec.published == [[DKMS_DEB, "hello-modules-6.1.0-57-amd64_1.0-1_amd64.deb"]]
    b = load(env, build_id)
    assert b.state == "succeeded" and b.published_at and b.finished_at
    assert len(events(env, build_id, "published")) == 1


def test_publish_waits_for_every_kernel(env: Any) -> None:
    """An early publish (some kernel unfinished) does nothing."""
    build_id = built(env, ("6.1.0-57-amd64", "6.1.0-56-amd64"))
    tasks.run_build_kernel(env.settings, build_id, "6.1.0-57-amd64")
    tasks.run_publish(env.settings, build_id)
    assert env.rec.published == [] and load(env, build_id).state == "running"


def test_partial_failure_publishes_what_built_and_fails_the_build(env: Any) -> None:
    """Packages that built are published; the build is failed with the first diagnosis."""
    build_id = built(env, ("6.1.0-57-amd64", "6.12.117+deb12-amd64"))
    env.outcome["kernel"]["6.12.117+deb12-amd64"] = "implicit declaration of 'strlcpy'"
    for k in ("6.1.0-57-amd64", "6.12.117+deb12-amd64"):
        tasks.run_build_kernel(env.settings, build_id, k)
    tasks.run_publish(env.settings, build_id)
    assert env.rec.published == [[DKMS_DEB, "hello-modules-6.1.0-57-amd64_1.0-1_amd64.deb"]]
    b = load(env, build_id)
    assert (b.state, b.error_code) == ("failed", "build-failed")
    assert (
        b.error
        == "hello 1.0-1 failed to build for 6.12.117+deb12-amd64: implicit declaration of 'strlcpy'"
    )


def test_nothing_is_published_when_every_kernel_failed(env: Any) -> None:
    """With no kernel built, not even the -dkms package is published."""
    build_id = built(env)
    env.outcome["kernel"]["6.1.0-57-amd64"] = "boom"
    tasks.run_build_kernel(env.settings, build_id, "6.1.0-57-amd64")
    tasks.run_publish(env.settings, build_id)
    assert env.rec.published == [] and load(env, build_id).state == "failed"


def test_publish_refusal_fails_the_build_with_its_code(env: Any) -> None:
    """A repository refusal marks the build failed with code publish-failed."""
    build_id = built(env, ())
    env.outcome["publish"] = PublishFailed("the repository refused hello-dkms")
    tasks.run_publish(env.settings, build_id)
    b = load(env, build_id)
    assert (b.state, b.error_code, b.published_at) == ("failed", "publish-failed", None)


def test_publish_outage_is_retried(env: Any) -> None:
    """A transient repository error propagates so that Celery retries it."""
    build_id = built(env, ())
    env.outcome["publish"] = Transient("disk busy")
    with pytest.raises(Transient):
        tasks.run_publish(env.settings, build_id)
    assert load(env, build_id).state == "running"


def test_publish_of_a_cancelled_build_does_nothing(env: Any) -> None:
    """A build cancelled before publishing is never published."""
    build_id = built(env, ())
    with env.store.session() as s:
        s.get(Build, build_id).state = "cancelled"
    tasks.run_publish(env.settings, build_id)
    assert env.rec.published == []


# --- failures, recovery, heartbeat ---------------------------------------------------------------
def test_a_task_that_gives_up_records_its_error_code(env: Any) -> None:
    """When retries run out (or a bug strikes) the job is failed with a code, not left running."""
    build_id = new_build(env, ("6.1.0-57-amd64", "6.1.0-56-amd64"))
    tasks.record_failure(env.settings, "moddeb.build", [build_id], Transient("engine gone"))
    b = load(env, build_id)
    assert (b.state, b.error_code, b.error) == ("failed", "transient", "engine gone")
    other = built(env)
    tasks.record_failure(
        env.settings, "moddeb.build_kernel", [other, "6.1.0-57-amd64"], KeyError("x")
    )
    k = load(env, other).kernels[0]
    assert k.state == "failed" and k.diagnosis.startswith("[internal-error]")
    assert env.rec.sent == [("moddeb.publish", [other])]
    third = new_build(env)
    tasks.record_failure(env.settings, "moddeb.build", [third], tasks.JobBusy("held"))
    assert load(env, third).state == "queued"  # its holder finishes it


def test_celery_failure_hook_records_on_the_job(env: Any) -> None:
    """The tasks' on_failure hook calls record_failure with the task's arguments."""
    build_id = new_build(env)
    tasks.configure(env.settings)
    tasks.build.on_failure(BuildFailed("broken"), "tid", [build_id], {}, None)
    assert load(env, build_id).error_code == "build-failed"


def test_recovery_requeues_only_work_whose_worker_is_gone(env: Any) -> None:
    """Expired leases and long-lost queued jobs are re-sent; live and fresh ones are not."""
    vt = visibility_timeout(env.settings)
    long_ago = now() - tasks.RESEND_AFTER - 1
    dead = new_build(env, state="running", lease_until=now() - 5, enqueued_at=long_ago)
    just_died = new_build(env, state="running", lease_until=now() - 5)  # re-sent later
    live = new_build(env, state="running", lease_until=now() + 20, enqueued_at=long_ago)
    lost = new_build(env, enqueued_at=now() - vt - 1)
    fresh = new_build(env)
    kernels = new_build(env, ("a1", "a2", "a3"), state="running", dkms_done=1, enqueued_at=now())
    with env.store.session() as s:
        k1, k2, k3 = s.get(Build, kernels).kernels
        k1.state, k1.lease_until, k1.enqueued_at = "running", now() - 1, long_ago
        k2.state, k2.lease_until, k2.enqueued_at = "running", now() + 20, long_ago
        k3.enqueued_at = now() - vt - 1
    unpublished = new_build(env, (), state="running", dkms_done=1, enqueued_at=now() - vt - 1)
    assert tasks.recover_stalled(env.settings) == 5
    assert sorted(env.rec.sent) == sorted(
        [
            ("moddeb.build", [dead]),
            ("moddeb.build", [lost]),
            ("moddeb.build_kernel", [kernels, "a1"]),
            ("moddeb.build_kernel", [kernels, "a3"]),
            ("moddeb.publish", [unpublished]),
        ]
    )
    assert live and fresh and just_died
    env.rec.sent.clear()
    assert tasks.recover_stalled(env.settings) == 0  # not again until RESEND_AFTER has passed


def test_heartbeat_renews_the_lease_and_copies_the_log(env: Any, tmp_path: Path) -> None:
    """While a job runs its lease stays fresh and its log reaches the database."""
    build_id = new_build(env, state="running", lease_until=now() + 1)
    log_file = tmp_path / "logs" / "x.log"
    log_file.parent.mkdir()
    log_file.write_text("line 1\n")
    with tasks.Heartbeat(env.store, Build, build_id, tasks._read_logs(log_file.parent), every=0.05):
        time.sleep(0.2)
        log_file.write_text("line 1\nline 2\n")
        time.sleep(0.2)
    b = load(env, build_id)
    assert b.lease_until > now() + LEASE_SECONDS - 5 and b.log == "line 1\nline 2\n"


def test_queue_settings_make_work_survive_a_dead_worker(env: Any) -> None:
    """acks_late, reject on worker loss, prefetch 1, publish on its own queue, long visibility."""
    conf = celery_config(env.settings)
    assert conf["task_acks_late"] and conf["task_reject_on_worker_lost"]
    assert conf["worker_prefetch_multiplier"] == 1
    assert conf["task_routes"]["moddeb.publish"] == {"queue": "publish"}
    assert conf["task_routes"]["moddeb.build_kernel"] == {"queue": "build"}
    assert conf["broker_url"].startswith("sqla+sqlite:///") and conf["broker_url"].endswith(
        "/state/broker.sqlite"
    )
    env.settings.broker_url = "redis://127.0.0.1:6399/0"
    conf = celery_config(env.settings)
    assert conf["broker_transport_options"]["visibility_timeout"] > 3 * env.settings.step_timeout
    for name in ("moddeb.build", "moddeb.build_kernel", "moddeb.publish"):
        task = tasks.app.tasks[name]
        assert task.autoretry_for == (Transient,)


def test_tasks_can_be_sent_by_name_to_the_embedded_broker(env: Any, monkeypatch) -> None:
    """The web side's client puts a message on the SQLite broker with no worker running."""
    from builder.store import make_celery

    app = make_celery(env.settings)
    app.send_task("moddeb.build", args=[1])
    app.send_task("moddeb.publish", args=[1])
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        assert channel.queue_declare("build", passive=True).message_count == 1
        assert channel.queue_declare("publish", passive=True).message_count == 1
    _ = (io, json)


def test_a_busy_job_is_looked_at_again_when_its_lease_would_end(env: Any) -> None:
    """A duplicate of a held job retries after one lease period, without using up retries."""
    build_id = new_build(env, state="running", lease_until=now() + LEASE_SECONDS)
    calls = []

    class FakeTask:
        def retry(self, exc=None, countdown=None, max_retries="unset"):
            calls.append((type(exc), countdown, max_retries))
            return RuntimeError("retry raised")

    tasks.configure(env.settings)
    with pytest.raises(RuntimeError, match="retry raised"):
        tasks._run(FakeTask(), tasks.run_build, build_id)
    assert calls == [(tasks.JobBusy, LEASE_SECONDS, None)]


def test_the_package_name_falls_back_to_the_dkms_package(env: Any, monkeypatch) -> None:
    """Should the report lack the name, the -dkms package's file name supplies it."""
    build_id = new_build(env, ())
    import builder.pipeline

    pipeline_cls = builder.pipeline.Pipeline

    class Nameless(pipeline_cls):  # type: ignore[misc, valid-type]
        def run(self):
            report = super().run()
            report.name = ""
            return report

    monkeypatch.setattr("builder.pipeline.Pipeline", Nameless)
    tasks.run_build(env.settings, build_id)
    assert load(env, build_id).name == "hello"


def test_a_kernel_whose_boot_test_fails_is_not_published(env: Any) -> None:
    """The service boot-tests every kernel; a module that does not load is kept out."""
    env.outcome["boot"] = {
        "6.12.117+deb12-amd64": ("failed", "insmod hello failed: No such device (-19)")
    }
    build_id = new_build(env, kernels=("6.1.0-57-amd64", "6.12.117+deb12-amd64"))
    tasks.run_build(env.settings, build_id)
    for kver in ("6.1.0-57-amd64", "6.12.117+deb12-amd64"):
        tasks.run_build_kernel(env.settings, build_id, kver)
    tasks.run_publish(env.settings, build_id)
    assert sorted(env.rec.booted) == ["6.1.0-57-amd64", "6.12.117+deb12-amd64"]
    with env.store.session() as s:
        b = s.get(Build, build_id)
        states = {k.kernel_release: (k.state, k.diagnosis) for k in b.kernels}
        assert b.state == "failed"
    assert states["6.1.0-57-amd64"] == ("succeeded", "boot test passed: loaded hello")
    assert states["6.12.117+deb12-amd64"][0] == "failed"
    assert "boot test failed: insmod hello failed" in states["6.12.117+deb12-amd64"][1]
    assert env.rec.published == [[DKMS_DEB, "hello-modules-6.1.0-57-amd64_1.0-1_amd64.deb"]]


def test_a_bpf_build_needs_no_kernel_task(env: Any) -> None:
    """A BPF source's packages serve every kernel: no per-kernel build, straight to publish."""
    env.outcome["kind"] = "bpf"
    build_id = new_build(env)
    tasks.run_build(env.settings, build_id)
    assert env.rec.kernel_runs == []
    assert ("moddeb.publish", [build_id]) in env.rec.sent
    tasks.run_publish(env.settings, build_id)
    with env.store.session() as s:
        assert s.get(Build, build_id).state == "succeeded"
