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
