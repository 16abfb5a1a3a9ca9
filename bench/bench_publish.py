"""Publishing one package into a 10,000-package repository: moddeb vs reprepro, side by side.

Both repositories hold the same 10,000 synthetic packages, produce Packages, .gz and
.xz, and sign with the same ed25519 key (reprepro via GNUPGHOME + SignWith). Each
round publishes one new package into each, alternating which goes first, and the
medians are compared. The full reindex of 10,000 packages is timed too.

    python bench/bench_publish.py [--packages 10000] [--rounds 5] [--keep]

The synthetic .debs are cached under /var/tmp/moddeb-bench so reruns start fast.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from builder import repo, signing  # noqa: E402
from builder.config import load_settings  # noqa: E402

CACHE = Path("/var/tmp/moddeb-bench")
FORMAT = "1"  # bump when the synthetic packages change
SUITE = "bookworm"
PUBLISH_ONE = """
import sys
from builder import repo
from builder.config import load_settings
repo.publish(load_settings(), sys.argv[1], sys.argv[2:])
"""


def _tar_gz(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, compresslevel=6) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.GNU_FORMAT) as tar:
            dirs = sorted({str(Path(n).parent) for n in members if "/" in n})
            for d in dirs:
                info = tarfile.TarInfo(f"./{d}/")
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            for name, data in members.items():
                info = tarfile.TarInfo(f"./{name}")
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _ar(members: list[tuple[str, bytes]]) -> bytes:
    out = [b"!<arch>\n"]
    for name, data in members:
        header = f"{name:<16}{0:<12}{0:<6}{0:<6}{'100644':<8}{len(data):<10}`\n"
        out += [header.encode(), data, b"\n" if len(data) % 2 else b""]
    return b"".join(out)


def synthetic_deb(package: str, version: str = "1.0-1", arch: str = "amd64") -> bytes:
    """A small, valid .deb written directly (dpkg-deb is too slow for 10,000 of them)."""
    readme = f"{package} is a synthetic package for moddeb's publish benchmark.\n".encode()
    doc = f"usr/share/doc/{package}/README"
    control = (
        f"Package: {package}\nVersion: {version}\nArchitecture: {arch}\n"
        f"Maintainer: moddeb bench <bench@example.org>\nInstalled-Size: 1\n"
        f"Section: misc\nPriority: optional\n"
        f"Description: synthetic package {package}\n"
        f" A synthetic package used to measure publishing into a large repository.\n"
    ).encode()
    md5sums = f"{hashlib.md5(readme).hexdigest()}  {doc}\n".encode()
    return _ar(
        [
            ("debian-binary", b"2.0\n"),
            ("control.tar.gz", _tar_gz({"control": control, "md5sums": md5sums})),
            ("data.tar.gz", _tar_gz({doc: readme})),
        ]
    )


def corpus(count: int) -> list[Path]:
    """`count` synthetic .debs, generated once and cached."""
    where = CACHE / f"debs-v{FORMAT}-{count}"
    done = where / ".complete"
    if not done.is_file():
        shutil.rmtree(where, ignore_errors=True)
        where.mkdir(parents=True)
        started = time.monotonic()
        for i in range(count):
            name = f"bench{i:05d}"
            (where / f"{name}_1.0-1_amd64.deb").write_bytes(synthetic_deb(name))
        check = subprocess.run(
            ["dpkg-deb", "--info", str(where / "bench00000_1.0-1_amd64.deb")],
            capture_output=True,
            text=True,
        )
        if check.returncode != 0:
            sys.exit(f"generated .deb is not valid: {check.stderr}")
        done.touch()
        print(f"generated {count} .debs in {time.monotonic() - started:.1f}s ({where})")
    return sorted(where.glob("*.deb"))


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def run(cmd: list[str], env: dict[str, str] | None = None) -> None:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd[:4])}... failed:\n{proc.stderr[-2000:]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--packages", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--keep", action="store_true", help="keep the repositories afterwards")
    args = ap.parse_args()

    debs = corpus(args.packages)
    work = Path(tempfile.mkdtemp(prefix="run-", dir=CACHE))
    home = work / "home"
    settings = load_settings(env={"MODDEB_HOME": str(home)})
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MODDEB_")},
        "MODDEB_HOME": str(home),
        "PYTHONPATH": str(ROOT),
    }
    try:
        fpr = signing.ensure_key(settings)
        gnupg = str(signing._short_home(signing.gnupg_home(settings)))
        moddeb_root = repo.repo_root(settings)
        rr = work / "reprepro"
        (rr / "conf").mkdir(parents=True)
        (rr / "conf/distributions").write_text(
            f"Origin: moddeb\nLabel: moddeb\nCodename: {SUITE}\nArchitectures: amd64\n"
            f"Components: main\nDebIndices: Packages Release . .gz .xz\nSignWith: {fpr}\n"
        )
        rr_env = {**env, "GNUPGHOME": gnupg}
        reprepro = ["reprepro", "--silent", "-b", str(rr)]

        print(f"repositories in {work}; {len(debs)} packages; key {fpr} (ed25519)")
        t_moddeb_full = timed(lambda: repo.publish(settings, SUITE, debs))
        t_reprepro_full = timed(
            lambda: run([*reprepro, "includedeb", SUITE, *map(str, debs)], rr_env)
        )
        print(
            f"initial import of {len(debs)} packages: moddeb {t_moddeb_full:.2f}s, "
            f"reprepro includedeb {t_reprepro_full:.2f}s"
        )

        one_moddeb, one_reprepro, api_moddeb = [], [], []
        extra = work / "extra"
        extra.mkdir()
        for i in range(args.rounds):
            a = extra / f"extra{i:03d}a_1.0-1_amd64.deb"
            b = extra / f"extra{i:03d}b_1.0-1_amd64.deb"
            c = extra / f"extra{i:03d}c_1.0-1_amd64.deb"
            for path in (a, b, c):
                path.write_bytes(synthetic_deb(path.name.split("_")[0]))
            steps = [
                (
                    one_moddeb,
                    lambda a=a: run([sys.executable, "-c", PUBLISH_ONE, SUITE, str(a)], env),
                ),
                (one_reprepro, lambda b=b: run([*reprepro, "includedeb", SUITE, str(b)], rr_env)),
            ]
            for bucket, fn in steps if i % 2 == 0 else reversed(steps):
                bucket.append(timed(fn))
            api_moddeb.append(timed(lambda c=c: repo.publish(settings, SUITE, [c])))
        m, r = statistics.median(one_moddeb), statistics.median(one_reprepro)
        print(
            f"\npublish ONE package into {len(debs)} (signed, Packages+.gz+.xz), "
            f"median of {args.rounds}:"
        )
        print(f"  moddeb   (new python process) {m:7.3f}s   runs {_fmt(one_moddeb)}")
        print(
            f"  moddeb   (in-process API)     {statistics.median(api_moddeb):7.3f}s   "
            f"runs {_fmt(api_moddeb)}"
        )
        print(f"  reprepro includedeb           {r:7.3f}s   runs {_fmt(one_reprepro)}")
        print(f"  ratio moddeb/reprepro: {m / r:.2f} ({'faster' if m < r else 'SLOWER'})")

        t_reindex = timed(lambda: repo.open_repository(settings).reindex())
        t_refresh = timed(lambda: repo.publish(settings, SUITE, [], refresh=True))
        t_export = timed(lambda: run([*reprepro, "export", SUITE], rr_env))
        total = len(debs) + 3 * args.rounds
        print(f"\nfull reindex of {total} packages:")
        print(
            f"  moddeb repo reindex (re-reads every pool .deb, rebuilds, signs) {t_reindex:6.2f}s"
        )
        print(
            f"  moddeb publish --refresh (rebuilds indexes from its state)      {t_refresh:6.2f}s"
        )
        print(f"  reprepro export (rewrites indexes from its database)            {t_export:6.2f}s")
        problems = repo.open_repository(settings).check()
        print(f"\nmoddeb repository check: {len(problems)} problem(s)")
        xz = moddeb_root / f"dists/{SUITE}/main/binary-amd64/Packages.xz"
        print(
            f"Packages.xz: moddeb {xz.stat().st_size} bytes, reprepro "
            f"{(rr / f'dists/{SUITE}/main/binary-amd64/Packages.xz').stat().st_size} bytes"
        )
        return 1 if problems else 0
    finally:
        signing.stop_agent(settings)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def _fmt(xs: list[float]) -> str:
    return " ".join(f"{x:.3f}" for x in xs)


if __name__ == "__main__":
    sys.exit(main())
