"""`moddeb token create` and `moddeb user create` (the service's command-line handlers)."""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import pytest

from builder.config import load_settings
from builder.errors import InvalidInput
from builder.service_cli import SERVICE_COMMANDS, add_service_parsers, main
from builder.store import ApiToken, User, open_store
from web.auth import hash_token


def parse(*argv: str) -> argparse.Namespace:
    """Parse a service command line the way builder/cli.py will."""
    parser = argparse.ArgumentParser(prog="moddeb")
    add_service_parsers(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


@pytest.fixture
def settings(tmp_path: Path):
    """Settings on a throwaway home."""
    return load_settings(env={"MODDEB_HOME": str(tmp_path / "home")})


def test_token_create_prints_a_token_stored_only_as_its_hash(settings, capsys) -> None:
    """The printed token is what the API accepts; the database holds its hash."""
    args = parse("token", "create", "ci-main")
    assert SERVICE_COMMANDS[args.command](args, settings) == 0
    token = capsys.readouterr().out.strip()
    assert token.startswith("moddeb_") and len(token) > 40
    with open_store(settings).session() as s:
        (row,) = s.query(ApiToken).all()
        assert (row.name, row.token_hash) == ("ci-main", hash_token(token))


def test_user_create_reads_the_password_from_stdin(settings, monkeypatch, capsys) -> None:
    """--password-stdin takes one line; running it again changes the password."""
    from werkzeug.security import check_password_hash

    for password in ("first password", "second password"):
        monkeypatch.setattr("sys.stdin", io.StringIO(password + "\n"))
        args = parse("user", "create", "alice", "--password-stdin")
        assert SERVICE_COMMANDS[args.command](args, settings) == 0
    assert "alice can log in" in capsys.readouterr().out
    with open_store(settings).session() as s:
        (user,) = s.query(User).all()
        assert check_password_hash(user.password_hash, "second password")
        assert "second password" not in user.password_hash


def test_user_create_prompts_twice_and_refuses_a_mismatch(settings, monkeypatch) -> None:
    """Without --password-stdin the password is asked twice and must match."""
    answers = iter(["long enough 1", "long enough 2"])
    monkeypatch.setattr("getpass.getpass", lambda prompt="": next(answers))
    args = parse("user", "create", "bob")
    with pytest.raises(InvalidInput, match="differ"):
        SERVICE_COMMANDS["user"](args, settings)


def test_user_create_refuses_a_short_password(settings, monkeypatch) -> None:
    """A password under 8 characters is refused."""
    monkeypatch.setattr("sys.stdin", io.StringIO("short\n"))
    with pytest.raises(InvalidInput, match="at least 8"):
        SERVICE_COMMANDS["user"](parse("user", "create", "bob", "--password-stdin"), settings)


def test_worker_refuses_unknown_queues(settings) -> None:
    """`moddeb worker --queues` accepts only the service's queues."""
    with pytest.raises(InvalidInput, match="unknown queue"):
        SERVICE_COMMANDS["worker"](parse("worker", "--queues", "bogus"), settings)


def test_serve_refuses_a_bad_listen_address(settings) -> None:
    """--listen wants HOST:PORT."""
    for bad in ("nope", "127.0.0.1:99999", "127.0.0.1:x"):
        with pytest.raises(InvalidInput, match="HOST:PORT"):
            SERVICE_COMMANDS["serve"](parse("serve", "--listen", bad), settings)


def test_module_entry_point_reports_errors_with_their_code(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """`python -m builder.service_cli` prints an error's code and exits 2."""
    monkeypatch.setenv("MODDEB_HOME", str(tmp_path / "home"))
    monkeypatch.setattr("sys.stdin", io.StringIO("short\n"))
    assert main(["user", "create", "x", "--password-stdin"]) == 2
    assert "error [invalid-input]" in capsys.readouterr().err


class FakeChildren:
    """Stands in for serve's child processes."""

    made: list[list[list[str]]] = []

    def __init__(self, commands: list[list[str]]) -> None:
        FakeChildren.made.append(commands)

    def start(self) -> None:
        """Nothing to start."""

    def stop(self) -> None:
        """Nothing to stop."""


@pytest.mark.parametrize(
    ("broker", "flag", "build_worker"),
    [("", "auto", True), ("redis://127.0.0.1:6399/0", "auto", False), ("redis://x/0", "yes", True)],
)
def test_serve_runs_the_publisher_and_a_build_worker_only_when_embedded(
    tmp_path: Path, monkeypatch, capsys, broker: str, flag: str, build_worker: bool
) -> None:
    """serve always runs the one-at-a-time publisher; a build worker only without a broker."""
    import gunicorn.app.base

    settings = load_settings(
        env={"MODDEB_HOME": str(tmp_path / "home"), "MODDEB_BROKER_URL": broker}
    )
    FakeChildren.made = []
    monkeypatch.setattr("builder.service_cli._Children", FakeChildren)
    ran = []

    def fake_run(self):
        self.load_config()
        ran.append((self.cfg.bind, self.cfg.workers))
        self.cfg.when_ready(None)

    monkeypatch.setattr(gunicorn.app.base.BaseApplication, "run", fake_run)
    args = parse("serve", "--listen", "127.0.0.1:8099", "--build-worker", flag)
    assert SERVICE_COMMANDS["serve"](args, settings) == 0
    (commands,) = FakeChildren.made
    tails = [c[c.index("worker") :] for c in commands]
    assert tails[0] == ["worker", "--queues", "publish", "--pool", "solo", "--recover"]
    assert (["worker", "--queues", "build"] in tails) == build_worker
    assert len(tails) == (2 if build_worker else 1)
    assert ran == [(["127.0.0.1:8099"], 2)]
    out = capsys.readouterr().out
    assert "moddeb: serving on http://127.0.0.1:8099/" in out
    assert ("embedded" in out) == (not broker)


def test_worker_starts_celery_on_the_build_queue(settings, monkeypatch) -> None:
    """`moddeb worker` consumes the build queue with `jobs` threads; publish is forced solo."""
    from builder import tasks

    calls = []
    monkeypatch.setattr(tasks.app, "worker_main", lambda argv: calls.append(argv))
    SERVICE_COMMANDS["worker"](parse("worker"), settings)
    SERVICE_COMMANDS["worker"](
        parse("worker", "--queues", "publish", "--pool", "threads"), settings
    )
    build, publish = calls
    assert "--queues=build" in build and "--pool=threads" in build
    assert f"--concurrency={settings.jobs}" in build
    assert "--pool=solo" in publish and "--concurrency=1" in publish
