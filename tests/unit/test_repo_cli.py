"""`moddeb publish` and `moddeb repo ...` handlers, driven through their own argparse parsers."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from builder import repo, repo_cli, signing
from builder.config import Settings
from tests.unit.test_repo import make_deb


@pytest.fixture
def rs(settings: Settings):
    yield settings
    signing.stop_agent(settings)


def moddeb(settings: Settings, *argv: str) -> int:
    """Parse argv as cli.py will (after wiring) and run the handler."""
    parser = argparse.ArgumentParser(prog="moddeb")
    sub = parser.add_subparsers(dest="command", required=True)
    repo_cli.add_publish_parser(sub)
    repo_cli.add_repo_parser(sub)
    args = parser.parse_args(list(argv))
    return repo_cli.COMMANDS[args.command](args, settings)


def test_publish_prints_what_changed(rs: Settings, tmp_path: Path, capsys) -> None:
    """`moddeb publish` adds the .debs, names the metapackage it made, and says nothing changed next time."""
    deb = make_deb(tmp_path, "kbench-modules-6.1.0-57-amd64", "0.1-1")
    assert moddeb(rs, "publish", "--suite", "bookworm", str(deb)) == 0
    out = capsys.readouterr().out
    assert "added       kbench-modules-6.1.0-57-amd64 0.1-1 (amd64)" in out
    assert "metapackage kbench-modules-amd64 6.1.0.57-1" in out
    assert moddeb(rs, "publish", str(deb)) == 0  # suite defaults to settings.suite
    assert "bookworm: nothing changed" in capsys.readouterr().out


def test_publish_into_an_explicit_repo_dir_as_json(rs: Settings, tmp_path: Path, capsys) -> None:
    """--repo DIR publishes there instead of settings.repo_dir; --json prints the result."""
    target = tmp_path / "elsewhere"
    deb = make_deb(tmp_path, "foo")
    assert moddeb(rs, "publish", "--repo", str(target), "--json", str(deb)) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["added"] == ["foo 1.0-1 (amd64)"] and result["changed"]
    assert (target / "dists/bookworm/InRelease").is_file()
    assert not repo.repo_root(rs).exists()


def test_publish_without_debs_is_a_usage_error(rs: Settings, capsys) -> None:
    """Nothing to publish and no --refresh: exit 2 with a hint."""
    assert moddeb(rs, "publish") == 2
    assert "--refresh" in capsys.readouterr().err


def test_repo_check_list_and_export_key(rs: Settings, tmp_path: Path, capsys) -> None:
    """check exits 0 on a healthy repository and 1 on a broken one; list and export-key work."""
    moddeb(rs, "publish", str(make_deb(tmp_path, "foo")))
    assert moddeb(rs, "repo", "check", "--deep") == 0
    assert moddeb(rs, "repo", "list") == 0
    assert "foo" in capsys.readouterr().out
    key = tmp_path / "key.asc"
    assert moddeb(rs, "repo", "export-key", "--armor", "-o", str(key)) == 0
    assert key.read_text().startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----")
    pooled = repo.repo_root(rs) / "pool/main/f/foo/foo_1.0-1_amd64.deb"
    pooled.write_bytes(b"corrupt")
    assert moddeb(rs, "repo", "check", "--deep") == 1
    assert "does not match its SHA256" in capsys.readouterr().out


def test_repo_reindex_reports_counts(rs: Settings, tmp_path: Path, capsys) -> None:
    """`moddeb repo reindex` rebuilds every suite and prints its package count."""
    moddeb(rs, "publish", "--suite", "trixie", str(make_deb(tmp_path, "foo")))
    capsys.readouterr()
    assert moddeb(rs, "repo", "reindex") == 0
    assert capsys.readouterr().out.strip() == "trixie: 1 packages"
