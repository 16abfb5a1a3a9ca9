"""`moddeb serve`, `moddeb worker`, `moddeb token create NAME`, `moddeb user create NAME`.

builder/cli.py adds these with add_service_parsers(sub) and dispatches through
SERVICE_COMMANDS; `python -m builder.service_cli ...` runs them on their own.
"""

from __future__ import annotations

import argparse
import ctypes
import getpass
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from builder.config import Settings, load_settings
from builder.errors import InvalidInput, ModdebError

log = logging.getLogger(__name__)
Handler = Callable[[argparse.Namespace, Settings], int]
RECOVER_EVERY = 60.0  # seconds between sweeps for work a dead worker left behind
PR_SET_PDEATHSIG = 1


def add_service_parsers(sub: Any) -> None:
    """Add serve, worker, token and user to the `moddeb` subcommand parsers."""
    s = sub.add_parser("serve", help="run the web service (and, by default, its workers)")
    s.add_argument("--listen", metavar="HOST:PORT", help="address to listen on")
    s.add_argument("--web-workers", type=int, help="web processes (default: setting web_workers)")
    s.add_argument(
        "--build-worker",
        choices=["auto", "yes", "no"],
        default="auto",
        help="also run a build worker (auto: only when no broker is configured)",
    )
    w = sub.add_parser("worker", help="run a build worker (Celery)")
    w.add_argument("--queues", help="queues to consume (default: the build queue)")
    w.add_argument("--concurrency", type=int, help="tasks at once (default: setting jobs)")
    w.add_argument("--pool", default="threads", choices=["threads", "prefork", "solo"])
    w.add_argument("--recover", action="store_true", help="also re-queue work whose worker died")
    t = sub.add_parser("token", help="manage API tokens")
    t_sub = t.add_subparsers(dest="token_action", required=True)
    tc = t_sub.add_parser("create", help="create an API token and print it")
    tc.add_argument("name", help="who or what uses the token, e.g. ci-main")
    u = sub.add_parser("user", help="manage operator accounts")
    u_sub = u.add_subparsers(dest="user_action", required=True)
    uc = u_sub.add_parser("create", help="add an operator (or set their password)")
    uc.add_argument("name")
    uc.add_argument("--password-stdin", action="store_true", help="read the password from stdin")


def cmd_token(args: argparse.Namespace, settings: Settings) -> int:
    """`moddeb token create NAME`: print a new API token (stored only as a hash)."""
    from builder.store import open_store  # sqlalchemy: loaded by these commands only
    from web.auth import create_token

    name = args.name.strip()
    if not name or len(name) > 100:
        raise InvalidInput("a token name is 1 to 100 characters")
    print(create_token(open_store(settings), name))
    return 0


def cmd_user(args: argparse.Namespace, settings: Settings) -> int:
    """`moddeb user create NAME`: add an operator with a password (prompted or from stdin)."""
    from builder.store import open_store  # sqlalchemy: loaded by these commands only
    from web.auth import create_user

    name = args.name.strip()
    if not name or len(name) > 100:
        raise InvalidInput("a user name is 1 to 100 characters")
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = getpass.getpass(f"password for {name}: ")
        if getpass.getpass("again: ") != password:
            raise InvalidInput("the passwords differ")
    if len(password) < 8:
        raise InvalidInput("a password has at least 8 characters")
    create_user(open_store(settings), name, password)
    print(f"user {name} can log in")
    return 0


def cmd_worker(args: argparse.Namespace, settings: Settings) -> int:
    """`moddeb worker`: consume build tasks (or the publish queue) until stopped."""
    from builder import tasks
    from builder.store import (  # sqlalchemy: loaded by these commands only
        BUILD_QUEUE,
        PUBLISH_QUEUE,
        open_store,
    )

    app = tasks.configure(settings)
    open_store(settings)
    queues = [q for q in (args.queues or BUILD_QUEUE).split(",") if q]
    unknown = set(queues) - {BUILD_QUEUE, PUBLISH_QUEUE}
    if not queues or unknown:
        raise InvalidInput(
            f"unknown queue(s) {sorted(unknown)}: use {BUILD_QUEUE}, {PUBLISH_QUEUE}"
        )
    # Publishing is serialized: one task at a time, however the worker was started.
    solo = args.pool == "solo" or PUBLISH_QUEUE in queues
    concurrency = 1 if solo else max(1, args.concurrency or settings.jobs)
    # A worker is a daemon: its task lines belong in its log whatever `-v` said.
    for name in ("celery", "builder"):
        if logging.getLogger(name).getEffectiveLevel() > logging.INFO:
            logging.getLogger(name).setLevel(logging.INFO)
    if args.recover:
        threading.Thread(target=_recover_loop, args=(settings,), daemon=True).start()
    argv = [
        "worker",
        f"--queues={','.join(queues)}",
        f"--pool={'solo' if solo else args.pool}",
        f"--concurrency={concurrency}",
        f"--hostname={'-'.join(queues)}.{os.getpid()}@%h",
        "--loglevel=INFO",
        "--without-gossip",
        "--without-mingle",
    ]
    app.worker_main(argv)
    return 0


def _recover_loop(settings: Settings) -> None:
    from builder import tasks

    while True:
        try:
            tasks.recover_stalled(settings)
        except Exception:  # noqa: BLE001 - keep sweeping
            log.exception("recovery sweep failed")
        time.sleep(RECOVER_EVERY)


def _die_with_parent() -> None:
    """In a child: get SIGTERM when `moddeb serve` dies, however it dies."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


class _Children:
    """The worker processes `moddeb serve` runs beside the web app, restarted if they die."""

    def __init__(self, commands: list[list[str]]) -> None:
        self.commands = commands
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * len(commands)
        self.stopping = threading.Event()

    def start(self) -> None:
        for i in range(len(self.commands)):
            self._spawn(i)
        threading.Thread(target=self._watch, daemon=True).start()

    def _spawn(self, i: int) -> None:
        self.procs[i] = subprocess.Popen(self.commands[i], preexec_fn=_die_with_parent)  # noqa: PLW1509

    def _watch(self) -> None:
        while not self.stopping.wait(2.0):
            for i, proc in enumerate(self.procs):
                if proc is not None and proc.poll() is not None and not self.stopping.is_set():
                    log.warning(
                        "worker %s exited with %s; restarting", self.commands[i], proc.returncode
                    )
                    self._spawn(i)

    def stop(self) -> None:
        self.stopping.set()
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            if proc is not None:
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()


def _listen(args: argparse.Namespace, settings: Settings) -> tuple[str, int]:
    if not args.listen:
        return settings.listen_address, settings.listen_port
    host, sep, port = args.listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidInput(f"--listen wants HOST:PORT, not {args.listen!r}")
    return host.strip("[]") or settings.listen_address, int(port)


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    """`moddeb serve`: the web app under gunicorn, the publisher and (embedded) a build worker."""
    from gunicorn.app.base import BaseApplication

    from builder.store import (  # sqlalchemy: loaded by these commands only
        BUILD_QUEUE,
        PUBLISH_QUEUE,
        is_embedded,
        open_store,
    )

    host, port = _listen(args, settings)
    open_store(settings)
    me = [sys.executable, "-m", "builder.service_cli"]
    commands = [me + ["worker", "--queues", PUBLISH_QUEUE, "--pool", "solo", "--recover"]]
    if args.build_worker == "yes" or (args.build_worker == "auto" and is_embedded(settings)):
        commands.append(me + ["worker", "--queues", BUILD_QUEUE])
    children = _Children(commands)

    class Server(BaseApplication):  # type: ignore[misc]
        def load_config(self) -> None:
            self.cfg.set("bind", f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
            self.cfg.set("workers", max(1, args.web_workers or settings.web_workers))
            self.cfg.set("timeout", 120)
            self.cfg.set("accesslog", "-")
            self.cfg.set("proc_name", "moddeb-web")
            self.cfg.set("control_socket_disable", True)
            self.cfg.set("when_ready", lambda _arbiter: _announce(host, port, settings))

        def load(self) -> Any:
            from web import create_app

            return create_app()

    children.start()
    try:
        Server().run()
    finally:
        children.stop()
    return 0


def _announce(host: str, port: int, settings: Settings) -> None:
    from builder.store import is_embedded  # sqlalchemy: loaded by these commands only

    shown = f"[{host}]" if ":" in host else host
    url = (
        settings.public_url or f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else shown}:{port}"
    )
    embedded = " (embedded queue and database)" if is_embedded(settings) else ""
    print(f"moddeb: serving on {url.rstrip('/')}/{embedded}", flush=True)
    print(f"moddeb: apt repository at {url.rstrip('/')}/apt/", flush=True)


SERVICE_COMMANDS: dict[str, Handler] = {
    "serve": cmd_serve,
    "worker": cmd_worker,
    "token": cmd_token,
    "user": cmd_user,
}


def main(argv: list[str] | None = None) -> int:
    """Run one service command on its own (used by `moddeb serve` for its children)."""
    parser = argparse.ArgumentParser(prog="moddeb")
    add_service_parsers(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return SERVICE_COMMANDS[args.command](args, load_settings())
    except ModdebError as exc:
        print(f"moddeb: error [{exc.code}]: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
