"""The `moddeb` command line."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from builder import repo_cli, service_cli
from builder.config import Settings, as_dict, load_settings
from builder.errors import ModdebError
from builder.pipeline import BuildReport, BuildRequest, Pipeline

Command = Callable[[argparse.Namespace, Settings], int]
COMMANDS: dict[str, Command] = {}


def command(name: str) -> Callable[[Command], Command]:
    """Register a subcommand handler."""

    def wrap(fn: Command) -> Command:
        COMMANDS[name] = fn
        return fn

    return wrap


def print_summary(report: BuildReport) -> None:
    """A human summary of a build: artifacts, then a table of kernels."""
    if report.error:
        print(f"moddeb: error [{report.error_code}]: {report.error}", file=sys.stderr)
    if report.name:
        print(f"{report.name} {report.version or report.upstream_version} ({report.origin})")
    for name in sorted(report.artifacts):
        print(f"  {Path(report.out_dir) / name}")
    for tags in report.lintian.values():
        for line in tags:
            print(f"  lintian: {line}")
    for check in report.bpf.get("checks", []):
        detail = f": {check['detail']}" if check.get("detail") else ""
        print(f"  check {check['name']} ({check['target']}): {check['status']}{detail}")
    if report.kernels:
        width = max(len(k.kernel_release) for k in report.kernels)
        print(f"\n  {'kernel'.ljust(width)}  status   time     boot     diagnosis")
        for k in report.kernels:
            boot = k.boot.get("status", "-")
            why = k.diagnosis or k.boot.get("diagnosis", "")
            print(
                f"  {k.kernel_release.ljust(width)}  {k.status:<7}  {k.duration:6.1f}s  "
                f"{boot:<7}  {why}"
            )
    print(f"report: {Path(report.out_dir) / 'report.json'}")


@command("build")
def cmd_build(args: argparse.Namespace, settings: Settings) -> int:
    """Build the -dkms package (and per-kernel packages) from SOURCE."""
    from builder.kernels import resolve_kernel_args

    kernels = resolve_kernel_args(settings, args.kernel, args.newest, args.all_in_suite)
    request = BuildRequest(
        source=args.source,
        ref=args.ref,
        name=args.name,
        version=args.version,
        modules=args.module or None,
        kernels=kernels,
        out_dir=Path(args.out) if args.out else None,
        boot_test=args.boot_test,
    )
    report = Pipeline(settings, request, progress=lambda m: print(m, file=sys.stderr)).run()
    if args.publish and report.artifacts:
        publish_report(report, settings, args.suite or settings.suite)
    if args.json:
        print(report.to_json(), end="")
    else:
        print_summary(report)
    return 0 if report.status == "succeeded" else 1


def publish_report(report: BuildReport, settings: Settings, suite: str) -> None:
    """Publish what a build produced (every kernel that built, even if others failed)."""
    from builder.repo import publish, repo_root

    per_kernel = {name for k in report.kernels for name in k.artifacts}
    names = [n for n in sorted(report.artifacts) if n not in per_kernel]
    for k in report.kernels:
        if k.status not in ("built", "cached"):
            continue
        if not k.publishable:
            print(
                f"moddeb: not publishing {k.kernel_release}: boot test {k.boot['status']}: "
                f"{k.boot.get('diagnosis', '')}",
                file=sys.stderr,
            )
            continue
        if settings.require_boot_test and k.boot.get("status") != "passed":
            print(
                f"moddeb: not publishing {k.kernel_release}: no passed boot test "
                "(add --boot-test, or set MODDEB_REQUIRE_BOOT_TEST=0)",
                file=sys.stderr,
            )
            continue
        names += sorted(k.artifacts)
    debs = [Path(report.out_dir) / name for name in names]
    result = publish(settings, suite, debs)
    print(
        f"published {len(result.added)} new, {len(result.unchanged)} unchanged into "
        f"{repo_root(settings)} ({suite})",
        file=sys.stderr,
    )


@command("config")
def cmd_config(args: argparse.Namespace, settings: Settings) -> int:
    """Print the effective settings."""
    print(json.dumps(as_dict(settings), indent=2, sort_keys=True))
    return 0


@command("kernels")
def cmd_kernels(args: argparse.Namespace, settings: Settings) -> int:
    """List the kernel ABIs the configured archive offers."""
    from builder.kernels import list_kernels

    rows = list_kernels(settings, suites=[args.suite] if args.suite else None)
    if args.json:
        print(json.dumps([r.__dict__ for r in rows], indent=2))
        return 0
    for r in rows:
        print(f"{r.kernel_release:<32} {r.flavour:<12} {r.suite:<20} {r.headers_version}")
    return 0


@command("images")
def cmd_images(args: argparse.Namespace, settings: Settings) -> int:
    """List moddeb's builder images, or prune them."""
    from builder.runner import Runner

    runner = Runner()
    rows = runner.list_images()
    if args.prune:
        removed = 0
        for row in rows:
            if args.prune == "all" or row.labels.get("moddeb.kind") == "kernel":
                for tag in row.tags or [row.id]:
                    runner.remove_image(tag)
                    removed += 1
        print(f"removed {removed} image tag(s)")
        return 0
    for row in rows:
        tags = ",".join(row.tags) or row.id
        kind = row.labels.get("moddeb.kind", "?")
        print(f"{tags:<60} {kind:<7} {row.size // (1 << 20):>6} MiB")
    return 0


def make_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    p = argparse.ArgumentParser(prog="moddeb", description=__doc__)
    p.add_argument("-v", "--verbose", action="store_true", help="log every step")
    sub = p.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build", help="build -dkms and per-kernel module packages from a source")
    b.add_argument("source", help="a directory, a .tar[.gz|.xz|.bz2] tarball or a git URL")
    b.add_argument("--ref", help="git ref (branch, tag or commit) for a git URL source")
    b.add_argument("--name", help="module (source package) name, overriding detection")
    b.add_argument("--version", help="upstream version, overriding detection")
    b.add_argument("--module", action="append", help="a .ko name to package (repeatable)")
    b.add_argument(
        "--kernel",
        action="append",
        default=[],
        metavar="KVER",
        help="kernel ABI to build for, e.g. 6.1.0-57-amd64 (repeatable)",
    )
    b.add_argument(
        "--newest",
        action="store_true",
        help="build for the newest ABI of each flavour in the suite",
    )
    b.add_argument(
        "--all-in-suite", metavar="SUITE", help="build for every ABI the archive suite offers"
    )
    b.add_argument("--out", help="output directory (default: the job's work directory)")
    b.add_argument("--json", action="store_true", help="print report.json instead of a table")
    b.add_argument(
        "--publish",
        action="store_true",
        help="publish the packages into the configured apt repository",
    )
    b.add_argument("--suite", help="repository suite for --publish (default: settings.suite)")
    b.add_argument(
        "--boot-test",
        action="store_true",
        help="boot each kernel under QEMU and load the module before publishing",
    )

    sub.add_parser("config", help="print the effective settings")
    k = sub.add_parser("kernels", help="list kernel ABIs in the configured archive")
    k.add_argument("--suite", help="only this suite (e.g. bookworm-security)")
    k.add_argument("--json", action="store_true")
    i = sub.add_parser("images", help="list or prune builder images")
    i.add_argument(
        "--prune",
        nargs="?",
        const="kernel",
        choices=["kernel", "all"],
        help="remove per-kernel images (or all moddeb images)",
    )
    repo_cli.add_publish_parser(sub)
    repo_cli.add_repo_parser(sub)
    service_cli.add_service_parsers(sub)
    return p


COMMANDS.update(repo_cli.COMMANDS)
COMMANDS.update(service_cli.SERVICE_COMMANDS)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `moddeb` command."""
    args = make_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        settings = load_settings()
        return COMMANDS[args.command](args, settings)
    except ModdebError as exc:
        print(f"moddeb: error [{exc.code}]: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
