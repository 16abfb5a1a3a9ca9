"""/metrics in Prometheus text format, and /healthz."""

from __future__ import annotations

import logging

from flask import Blueprint, Response, current_app
from sqlalchemy import case, func, select

from builder.store import BUILD_STATES, TASK_QUEUES, Build, KernelJob, count_builds_by_state
from web.common import MODDEB, settings, store

bp = Blueprint("metrics", __name__)
log = logging.getLogger(__name__)
# Upper bounds (seconds) of the build-duration histogram.
BUCKETS = (10, 30, 60, 120, 300, 600, 1200, 3600, 7200)


def queue_depths() -> dict[str, int | None]:
    """Messages waiting in each broker queue (None when the broker cannot say)."""
    probe = current_app.extensions[MODDEB].get("queue_depth")
    queues = sorted(set(TASK_QUEUES.values()))
    if probe is not None:
        return {q: probe(q) for q in queues}
    from kombu import Connection

    from builder.store import broker_url

    depths: dict[str, int | None] = dict.fromkeys(queues)
    try:
        with Connection(broker_url(settings()), connect_timeout=2) as conn:
            channel = conn.default_channel
            for q in queues:
                depths[q] = int(channel.queue_declare(q, passive=True).message_count)
    except Exception as exc:  # noqa: BLE001 - a metric gap beats a failed scrape
        log.warning("cannot read queue depths: %s", exc)
    return depths


def render_metrics() -> str:
    """All metrics as Prometheus exposition text."""
    lines = [
        "# HELP moddeb_queue_depth Tasks waiting in a broker queue.",
        "# TYPE moddeb_queue_depth gauge",
    ]
    for queue, depth in queue_depths().items():
        if depth is not None:
            lines.append(f'moddeb_queue_depth{{queue="{queue}"}} {depth}')
    duration = Build.finished_at - Build.started_at
    with store().session() as s:
        counts = count_builds_by_state(s)
        kernel_counts = dict(
            s.execute(select(KernelJob.state, func.count()).group_by(KernelJob.state)).all()
        )
        row = s.execute(
            select(
                func.count(),
                func.coalesce(func.sum(duration), 0.0),
                *[func.coalesce(func.sum(case((duration <= b, 1), else_=0)), 0) for b in BUCKETS],
            ).where(Build.started_at.is_not(None), Build.finished_at.is_not(None))
        ).one()
    lines += ["# HELP moddeb_builds Builds by state.", "# TYPE moddeb_builds gauge"]
    lines += [f'moddeb_builds{{state="{state}"}} {counts[state]}' for state in BUILD_STATES]
    lines += [
        "# HELP moddeb_kernel_jobs Per-kernel jobs by state.",
        "# TYPE moddeb_kernel_jobs gauge",
    ]
    for state in BUILD_STATES:
        lines.append(f'moddeb_kernel_jobs{{state="{state}"}} {kernel_counts.get(state, 0)}')
    lines += [
        "# HELP moddeb_build_duration_seconds Time from a build's start to its end.",
        "# TYPE moddeb_build_duration_seconds histogram",
    ]
    count, total, buckets = int(row[0]), float(row[1]), row[2:]
    for bound, n in zip(BUCKETS, buckets, strict=True):
        lines.append(f'moddeb_build_duration_seconds_bucket{{le="{bound}"}} {int(n)}')
    lines.append(f'moddeb_build_duration_seconds_bucket{{le="+Inf"}} {count}')
    lines.append(f"moddeb_build_duration_seconds_sum {total:.3f}")
    lines.append(f"moddeb_build_duration_seconds_count {count}")
    return "\n".join(lines) + "\n"


@bp.get("/metrics")
def metrics() -> Response:
    """Prometheus scrape endpoint."""
    return Response(render_metrics(), mimetype="text/plain; version=0.0.4")


@bp.get("/healthz")
def healthz() -> Response:
    """Liveness: the database answers."""
    with store().session() as s:
        s.execute(select(1))
    return Response("ok\n", mimetype="text/plain")
