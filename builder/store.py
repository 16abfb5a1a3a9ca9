"""The build service's state (SQLAlchemy models and sessions) and the queue settings web and
workers share. Artifacts travel through this database, so a worker needs no shared disk."""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import (
    JSON,
    Float,
    ForeignKey,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    func,
    select,
    update,
)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import (
    DeclarativeBase,
    Mapped,
    Session,
    mapped_column,
    relationship,
    sessionmaker,
)

from builder.config import Settings
from builder.errors import Transient

log = logging.getLogger(__name__)

BUILD_STATES = ("queued", "running", "succeeded", "failed", "cancelled")
TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
# A worker holding a build or kernel job renews its lease every few seconds; a lease that
# runs out means the worker died, and whoever gets the job next may take it over.
LEASE_SECONDS = 30
LOG_LIMIT = 512 * 1024  # the tail of a log kept in the database

BUILD_QUEUE = "build"
PUBLISH_QUEUE = "publish"
TASK_QUEUES = {
    "moddeb.build": BUILD_QUEUE,
    "moddeb.build_kernel": BUILD_QUEUE,
    "moddeb.publish": PUBLISH_QUEUE,
}


def now() -> float:
    """Wall-clock seconds, the unit every timestamp in the database uses."""
    return time.time()


class Base(DeclarativeBase):
    """Declarative base of every moddeb table."""


class Project(Base):
    """A registered source: a git URL, its webhook secret and the kernels it builds for."""

    __tablename__ = "projects"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    source_url: Mapped[str] = mapped_column(String(1000))
    ref: Mapped[str] = mapped_column(String(250), default="")
    # Kept readable, not hashed: checking an HMAC signature needs the secret itself.
    secret: Mapped[str] = mapped_column(String(200))
    # {"kernels": [KernelInfo dicts], "newest": bool, "all_in_suite": str}
    default_kernels: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[float] = mapped_column(Float, default=now)


class Build(Base):
    """One build request: a source, its -dkms stage, and one KernelJob per kernel."""

    __tablename__ = "builds"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[str] = mapped_column(String(64), unique=True)
    state: Mapped[str] = mapped_column(String(16), default="queued", index=True)
    trigger: Mapped[str] = mapped_column(String(16), default="api")  # ui, api, github, ...
    requested_by: Mapped[str] = mapped_column(String(200), default="")
    source_kind: Mapped[str] = mapped_column(String(16))  # upload or git
    source: Mapped[str] = mapped_column(String(1000))  # upload file name or git URL
    ref: Mapped[str] = mapped_column(String(250), default="")
    project_id: Mapped[int | None] = mapped_column(ForeignKey("projects.id"), index=True)
    name: Mapped[str] = mapped_column(String(100), default="")
    version: Mapped[str] = mapped_column(String(100), default="")
    modules: Mapped[list[str]] = mapped_column(JSON, default=list)  # the .ko files it makes
    error_code: Mapped[str] = mapped_column(String(32), default="")
    error: Mapped[str] = mapped_column(Text, default="")
    log: Mapped[str] = mapped_column(Text, default="")  # the -dkms stage's log
    created_at: Mapped[float] = mapped_column(Float, default=now, index=True)
    started_at: Mapped[float | None] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float)
    enqueued_at: Mapped[float] = mapped_column(Float, default=now)
    lease_until: Mapped[float] = mapped_column(Float, default=0.0)
    dkms_done: Mapped[int] = mapped_column(Integer, default=0)
    published_at: Mapped[float | None] = mapped_column(Float)

    project: Mapped[Project | None] = relationship(lazy="joined")
    kernels: Mapped[list[KernelJob]] = relationship(
        back_populates="build", order_by="KernelJob.id", cascade="all, delete-orphan"
    )
    blobs: Mapped[list[Blob]] = relationship(
        back_populates="build", order_by="Blob.id", cascade="all, delete-orphan"
    )
    events: Mapped[list[BuildEvent]] = relationship(
        order_by="BuildEvent.id", cascade="all, delete-orphan"
    )

    @property
    def duration(self) -> float | None:
        """Seconds from start to finish, once finished."""
        if self.started_at and self.finished_at:
            return self.finished_at - self.started_at
        return None


class KernelJob(Base):
    """One kernel ABI of a build: its state, diagnosis line and log."""

    __tablename__ = "kernel_jobs"
    __table_args__ = (UniqueConstraint("build_id", "kernel_release"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    build_id: Mapped[int] = mapped_column(ForeignKey("builds.id"), index=True)
    kernel_release: Mapped[str] = mapped_column(String(100))
    flavour: Mapped[str] = mapped_column(String(50), default="")
    suite: Mapped[str] = mapped_column(String(100), default="")
    headers_version: Mapped[str] = mapped_column(String(100), default="")
    state: Mapped[str] = mapped_column(String(16), default="queued")
    diagnosis: Mapped[str] = mapped_column(Text, default="")
    log: Mapped[str] = mapped_column(Text, default="")
    duration: Mapped[float] = mapped_column(Float, default=0.0)
    enqueued_at: Mapped[float] = mapped_column(Float, default=now)
    lease_until: Mapped[float] = mapped_column(Float, default=0.0)
    build: Mapped[Build] = relationship(back_populates="kernels")

    def kernel_info(self) -> dict[str, str]:
        """The fields of builder.kernels.KernelInfo."""
        return {
            "kernel_release": self.kernel_release,
            "flavour": self.flavour,
            "suite": self.suite,
            "headers_version": self.headers_version,
        }


class Blob(Base):
    """A file that travels between web, workers and publisher: a source or a .deb."""

    __tablename__ = "blobs"
    __table_args__ = (UniqueConstraint("build_id", "kind", "filename"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    build_id: Mapped[int] = mapped_column(ForeignKey("builds.id"), index=True)
    kind: Mapped[str] = mapped_column(String(16))  # source, dkms, module
    kernel_release: Mapped[str] = mapped_column(String(100), default="")
    filename: Mapped[str] = mapped_column(String(250))
    sha256: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(Integer)
    data: Mapped[bytes] = mapped_column(LargeBinary, deferred=True)
    build: Mapped[Build] = relationship(back_populates="blobs")


class BuildEvent(Base):
    """One line of a build's progress, shown as its live log."""

    __tablename__ = "build_events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    build_id: Mapped[int] = mapped_column(ForeignKey("builds.id"), index=True)
    at: Mapped[float] = mapped_column(Float, default=now)
    kind: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text)


class Delivery(Base):
    """A webhook delivery already accepted; its id may never queue a second build."""

    __tablename__ = "deliveries"
    delivery_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    build_id: Mapped[int | None] = mapped_column(ForeignKey("builds.id"))
    received_at: Mapped[float] = mapped_column(Float, default=now)
    build: Mapped[Build | None] = relationship()


class ApiToken(Base):
    """A machine's API token, stored as its SHA-256 (tokens are random, so no salt is needed)."""

    __tablename__ = "api_tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(100))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[float] = mapped_column(Float, default=now)


class User(Base):
    """An operator who logs in to the web UI."""

    __tablename__ = "users"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    password_hash: Mapped[str] = mapped_column(String(300))
    created_at: Mapped[float] = mapped_column(Float, default=now)


# --- locations ----------------------------------------------------------------------------
def database_url(settings: Settings) -> str:
    """The SQLAlchemy URL of the state database (default: SQLite under <home>/state)."""
    return settings.database_url or f"sqlite:///{settings.state_root.absolute()}/moddeb.sqlite"


def broker_url(settings: Settings) -> str:
    """The Celery broker URL (default: kombu's SQLAlchemy transport on a SQLite file)."""
    return settings.broker_url or f"sqla+sqlite:///{settings.state_root.absolute()}/broker.sqlite"


def is_embedded(settings: Settings) -> bool:
    """True when no broker is configured: `moddeb serve` then runs the build worker itself."""
    return not settings.broker_url


def visibility_timeout(settings: Settings) -> int:
    """Seconds before a broker re-delivers unacknowledged work: longer than any one task.

    The longest task runs three container steps at most (base image, kernel image, build),
    each bounded by step_timeout; ten minutes on top covers uploads and bookkeeping.
    """
    return settings.visibility_timeout or 3 * settings.step_timeout + 600


def celery_config(settings: Settings) -> dict[str, Any]:
    """Celery settings shared by the web side (which only sends) and the workers."""
    vt = visibility_timeout(settings)
    url = broker_url(settings)
    if url.startswith("sqla+"):
        use_sqlite_pragmas()
        # kombu hands these to SQLAlchemy's create_engine: wait out SQLite's write lock.
        transport: dict[str, Any] = {"connect_args": {"timeout": 30}}
    else:
        transport = {
            "visibility_timeout": vt,
            # Look for abandoned messages often enough to honour a short timeout too.
            "unacked_restore_interval": max(1, min(10, vt // 4)),
            "unacked_restore_throttle": 1,
        }
    return {
        "broker_url": url,
        "broker_transport_options": transport,
        "broker_connection_retry_on_startup": True,
        "task_routes": {name: {"queue": queue} for name, queue in TASK_QUEUES.items()},
        "task_default_queue": BUILD_QUEUE,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_ignore_result": True,
        "task_serializer": "json",
        "accept_content": ["json"],
        "worker_prefetch_multiplier": 1,
        "worker_hijack_root_logger": False,
        "worker_send_task_events": False,
    }


def make_celery(settings: Settings, name: str = "moddeb") -> Any:
    """A Celery app with moddeb's queue settings and no tasks (the web side sends by name)."""
    from celery import Celery

    app = Celery(name, set_as_current=False)
    app.conf.update(celery_config(settings))
    return app


# --- sessions -----------------------------------------------------------------------------
def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    """WAL lets the web read while a worker writes; busy_timeout waits out short locks."""
    if not isinstance(dbapi_connection, sqlite3.Connection):
        return
    cur = dbapi_connection.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def make_engine(url: str) -> Engine:
    """An Engine for the state database; SQLite files get their directory and pragmas."""
    if url.startswith("sqlite:///") and not url.startswith("sqlite:///:memory:"):
        path = url.removeprefix("sqlite:///")
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    use_sqlite_pragmas()
    return create_engine(url, pool_pre_ping=not url.startswith("sqlite"))


def use_sqlite_pragmas() -> None:
    """Tune every SQLite connection of this process, kombu's broker file included (kombu
    makes that engine itself): without WAL each enqueue waits for an fsync."""
    if not event.contains(Engine, "connect", _sqlite_pragmas):
        event.listen(Engine, "connect", _sqlite_pragmas)


class Store:
    """The state database of one process: an engine and a session factory."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    def create_schema(self) -> None:
        """Create missing tables (idempotent)."""
        try:
            Base.metadata.create_all(self.engine)
        except OperationalError as exc:
            if "already exists" not in str(exc):  # another process won the race
                raise Transient(f"cannot reach the state database: {exc.orig}") from None

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session committed on success and rolled back on error."""
        session = self._sessions()
        try:
            yield session
            session.commit()
        except OperationalError as exc:
            session.rollback()
            raise Transient(f"the state database is unavailable: {exc.orig}") from None
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()


_stores: dict[tuple[int, str], Store] = {}
_stores_lock = threading.Lock()


def open_store(settings: Settings) -> Store:
    """This process's Store for the configured database, schema created on first use."""
    url = database_url(settings)
    key = (os.getpid(), url)  # engines must not cross a fork
    with _stores_lock:
        store = _stores.get(key)
        if store is None:
            store = Store(url)
            store.create_schema()
            _stores[key] = store
    return store


# --- small queries shared by web and workers ----------------------------------------------
def add_event(session: Session, build_id: int, kind: str, message: str) -> None:
    """Append a line to a build's progress log."""
    session.add(BuildEvent(build_id=build_id, kind=kind, message=message))


def claim(session: Session, model: type[Build] | type[KernelJob], row_id: int) -> bool:
    """Take a queued job, or one whose worker's lease ran out; False if someone else holds it."""
    t = now()
    result = session.execute(
        update(model)
        .where(model.id == row_id)
        .where(
            (model.state == "queued")
            | ((model.state == "running") & (model.lease_until < t))  # its worker died
        )
        .values(state="running", lease_until=t + LEASE_SECONDS)
        .execution_options(synchronize_session=False)
    )
    return bool(getattr(result, "rowcount", 0) == 1)


def renew_lease(session: Session, model: type[Build] | type[KernelJob], row_id: int) -> None:
    """Extend a held lease (the heartbeat of a working worker)."""
    session.execute(
        update(model)
        .where(model.id == row_id, model.state == "running")
        .values(lease_until=now() + LEASE_SECONDS)
        .execution_options(synchronize_session=False)
    )


def tail(text: str, limit: int = LOG_LIMIT) -> str:
    """The last `limit` characters of a log, marked as cut when it was longer."""
    if len(text) <= limit:
        return text
    return "[... earlier output cut ...]\n" + text[-limit:]


def count_builds_by_state(session: Session) -> dict[str, int]:
    """How many builds are in each state."""
    rows = session.execute(select(Build.state, func.count()).group_by(Build.state)).all()
    counts = dict.fromkeys(BUILD_STATES, 0)
    counts.update({state: int(n) for state, n in rows})
    return counts
