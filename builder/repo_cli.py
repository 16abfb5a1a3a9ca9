"""`moddeb publish` and `moddeb repo ...`: the command line over builder/repo.py.

Wiring (builder/cli.py): call add_publish_parser(sub) and add_repo_parser(sub) in
make_parser, and COMMANDS.update(repo_cli.COMMANDS).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from builder import repo, signing
from builder.config import Settings


def _repository(args: argparse.Namespace, settings: Settings) -> repo.Repository:
    return repo.open_repository(Path(args.repo) if args.repo else settings, settings)


def _add_repo_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--repo", metavar="DIR", help="repository directory (default: settings.repo_dir)"
    )


def add_publish_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add `moddeb publish --repo DIR --suite SUITE DEB...`."""
    p = subparsers.add_parser(
        "publish", help="add .deb files to the signed apt repository, atomically"
    )
    _add_repo_option(p)
    p.add_argument("--suite", help="suite (dists/SUITE) to publish into (default: settings.suite)")
    p.add_argument(
        "--refresh", action="store_true", help="re-sign even if nothing changed (Valid-Until)"
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("debs", nargs="*", metavar="DEB", help=".deb files to add")
    return p


def add_repo_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add `moddeb repo {import-key,export-key,reindex,check,list}`."""
    p = subparsers.add_parser("repo", help="manage the apt repository and its signing key")
    sub = p.add_subparsers(dest="repo_command", required=True)
    imp = sub.add_parser("import-key", help="make a secret key from FILE the repository key")
    imp.add_argument("file", help="an exported secret key (armored or binary), no passphrase")
    exp = sub.add_parser("export-key", help="print or write the repository's public key")
    exp.add_argument("--armor", action="store_true", help="ASCII armor instead of a binary keyring")
    exp.add_argument("-o", "--output", help="write to this file instead of standard output")
    rei = sub.add_parser("reindex", help="re-read every pool .deb and rebuild every suite")
    _add_repo_option(rei)
    rei.add_argument("--adopt", metavar="SUITE", help="add pool files no suite lists to SUITE")
    chk = sub.add_parser("check", help="verify signatures, index hashes and by-hash files")
    _add_repo_option(chk)
    chk.add_argument("--suite", help="only this suite")
    chk.add_argument("--deep", action="store_true", help="also hash every pool file")
    lst = sub.add_parser("list", help="list the packages a suite publishes")
    _add_repo_option(lst)
    lst.add_argument("--suite", help="suite (default: settings.suite)")
    lst.add_argument("--json", action="store_true")
    return p


def cmd_publish(args: argparse.Namespace, settings: Settings) -> int:
    """Publish DEBs into SUITE and print what changed."""
    if not args.debs and not args.refresh:
        print("moddeb publish: give .deb files (or --refresh to re-sign)", file=sys.stderr)
        return 2
    suite = args.suite or settings.suite
    result = _repository(args, settings).publish(suite, args.debs, refresh=args.refresh)
    if args.json:
        print(json.dumps(dataclasses.asdict(result), indent=2))
        return 0
    for what, rows in (
        ("added", result.added),
        ("unchanged", result.unchanged),
        ("removed", result.removed),
        ("metapackage", result.metapackages),
    ):
        for row in rows:
            print(f"  {what:<11} {row}")
    state = f"generation {result.generation}" if result.changed else "nothing changed"
    print(f"{suite}: {state}")
    return 0


def cmd_repo(args: argparse.Namespace, settings: Settings) -> int:
    """Run one `moddeb repo` subcommand."""
    if args.repo_command == "import-key":
        print(f"repository key: {signing.import_key(settings, Path(args.file))}")
        print("publish again (or `moddeb publish --refresh`) to re-sign and export the keyring")
        return 0
    if args.repo_command == "export-key":
        data = signing.export_public_key(settings, armor=args.armor)
        if args.output:
            Path(args.output).write_bytes(data)
        else:
            sys.stdout.buffer.write(data)
        return 0
    repository = _repository(args, settings)
    if args.repo_command == "reindex":
        for suite, count in sorted(repository.reindex(adopt_suite=args.adopt).items()):
            print(f"{suite}: {count} packages")
        return 0
    if args.repo_command == "check":
        problems = repository.check(args.suite, deep=args.deep)
        for line in problems:
            print(line)
        print(f"{len(problems)} problem(s) in {repository.root}")
        return 1 if problems else 0
    rows = repository.packages(args.suite or settings.suite)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for row in rows:
            print(f"{row['package']:<40} {row['version']:<24} {row['arch']}")
    return 0


COMMANDS = {"publish": cmd_publish, "repo": cmd_repo}
