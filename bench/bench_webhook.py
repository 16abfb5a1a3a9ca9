"""The webhook accept path under load, and the idle memory of a web process and a worker.

    python bench/bench_webhook.py [--duration 15] [--connections 4] [--broker redis|embedded]

Starts, on loopback only: a private redis-server (unless --broker embedded), the web app
under gunicorn with 2 sync workers, and one idle `moddeb worker`. A project is registered
with a secret; then wrk (or, without wrk, a Python load generator in a second process)
sends signed GitHub push deliveries, each with its own X-GitHub-Delivery id, for the given
duration. It prints requests/s and latency percentiles, then checks that every accepted
delivery (202) has exactly one build in the database and exactly one message on the build
queue, and prints the resident memory of an idle web process and an idle worker.
Targets: >= 300 requests/s, p99 < 50 ms, < 150 MB each.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import http.client
import json
import multiprocessing
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from builder.config import load_settings  # noqa: E402
from builder.store import Build, Delivery, Project, open_store  # noqa: E402

PAYLOAD = ROOT / "tests" / "data" / "hooks" / "github-push.json"
SECRET = "bench-secret-0123456789abcdef0123456789"
KERNEL = {
    "kernel_release": "6.1.0-57-amd64",
    "flavour": "amd64",
    "suite": "bookworm-security",
    "headers_version": "6.1.158-1",
}
WRK_SCRIPT = """
-- Every request carries its own delivery id: thread number + counter.
local counter, thread_id = 0, 0
local threads = {}
statuses = {}  -- a global, so that done() can read each thread's copy
function setup(thread)
  thread:set("tid", #threads + 1)
  table.insert(threads, thread)
end
function init(args)
  thread_id = tid
end
function request()
  counter = counter + 1
  wrk.headers["X-GitHub-Delivery"] = string.format("%s-%d-%d", RUN, thread_id, counter)
  return wrk.format("POST", wrk.path, wrk.headers, wrk.body)
end
function response(status, headers, body)
  local key = tostring(status)
  statuses[key] = (statuses[key] or 0) + 1
end
function done(summary, latency, requests)
  local total = {}
  for _, thread in ipairs(threads) do
    local s = thread:get("statuses")
    for k, v in pairs(s) do total[k] = (total[k] or 0) + v end
  end
  local parts = {}
  for k, v in pairs(total) do table.insert(parts, string.format('"%s": %d', k, v)) end
  io.write(string.format('MODDEB {"requests": %d, "duration_us": %d, "p50_us": %d, ' ..
    '"p90_us": %d, "p99_us": %d, "max_us": %d, "errors": %d, "statuses": {%s}}\\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max,
    summary.errors.connect + summary.errors.read + summary.errors.write +
    summary.errors.timeout, table.concat(parts, ", ")))
end
"""


def free_port() -> int:
    """A loopback port nobody listens on."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mb(pid: int) -> float:
    """Resident memory of one process, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    """Direct child pids of a process."""
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def wait_http(url: str, timeout: float = 60) -> None:
    """Wait until a URL answers 200."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"{url} did not answer")


def start_redis(tmp: Path) -> tuple[subprocess.Popen[bytes], int]:
    """A private redis-server on a loopback port, persisting nothing."""
    port = free_port()
    proc = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp),
        ],
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    import redis

    for _ in range(100):
        try:
            if redis.Redis(port=port).ping():
                return proc, port
        except redis.ConnectionError:
            time.sleep(0.1)
    raise SystemExit("redis-server did not start")


def python_load(
    run: str, url: str, body: bytes, headers: dict[str, str], seconds: float, conns: int
) -> dict:
    """Closed-loop load from a second process: `conns` keep-alive connections in threads."""
    import threading

    host, port = url.split("//")[1].split("/")[0].split(":")
    path = "/" + url.split("//")[1].split("/", 1)[1]
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def run(n: int) -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        i = 0
        mine: list[float] = []
        seen: dict[str, int] = {}
        while time.monotonic() < stop:
            i += 1
            h = dict(headers, **{"X-GitHub-Delivery": f"{run}-{n}-{i}"})
            t0 = time.perf_counter()
            conn.request("POST", path, body=body, headers=h)
            resp = conn.getresponse()
            resp.read()
            mine.append(time.perf_counter() - t0)
            seen[str(resp.status)] = seen.get(str(resp.status), 0) + 1
        with lock:
            latencies.extend(mine)
            for k, v in seen.items():
                statuses[k] = statuses.get(k, 0) + v

    started = time.monotonic()
    threads = [threading.Thread(target=run, args=(n,)) for n in range(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    latencies.sort()
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 100 else [max(latencies)] * 99
    return {
        "requests": len(latencies),
        "duration_us": int(elapsed * 1e6),
        "p50_us": int(q[49] * 1e6),
        "p90_us": int(q[89] * 1e6),
        "p99_us": int(q[98] * 1e6),
        "max_us": int(latencies[-1] * 1e6),
        "errors": 0,
        "statuses": statuses,
    }


def _python_load_entry(args: tuple, out: multiprocessing.Queue) -> None:
    out.put(python_load(*args))


def run_load(
    run: str, url: str, body: bytes, headers: dict[str, str], seconds: float, conns: int, tmp: Path
):
    """wrk with a Lua script for unique delivery ids (prefixed `run`), or the Python generator."""
    wrk = shutil.which("wrk")
    if wrk:
        script = tmp / f"{run}.lua"
        body_lua = json.dumps(body.decode())  # a JSON string is a valid Lua string literal here
        head = "".join(f'wrk.headers["{k}"] = "{v}"\n' for k, v in headers.items())
        script.write_text(
            f'RUN = "{run}"\nwrk.method = "POST"\nwrk.body = {body_lua}\n{head}{WRK_SCRIPT}'
        )
        proc = subprocess.run(
            [wrk, "-t2", f"-c{conns}", f"-d{int(seconds)}s", "--latency", "-s", str(script), url],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise SystemExit(f"wrk failed: {proc.stderr.strip()}")
        line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("MODDEB "))
        return "wrk", json.loads(line.removeprefix("MODDEB "))
    queue: multiprocessing.Queue = multiprocessing.Queue()
    p = multiprocessing.Process(
        target=_python_load_entry, args=((run, url, body, headers, seconds, conns), queue)
    )
    p.start()
    result = queue.get()
    p.join()
    return "python", result


def main() -> int:
    """Run the benchmark and print its figures; exit 1 if the delivery check fails."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=15)
    ap.add_argument("--connections", type=int, default=4)
    ap.add_argument("--broker", choices=["redis", "embedded"], default="redis")
    ap.add_argument(
        "--threads", type=int, default=0, help="gthread workers with this many threads (0: sync)"
    )
    ap.add_argument("--keep", action="store_true", help="keep the temporary home")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="moddeb-bench-webhook-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MODDEB_")}
        env["MODDEB_HOME"] = str(tmp / "home")
        redis_port = None
        if args.broker == "redis":
            redis_proc, redis_port = start_redis(tmp)
            procs.append(redis_proc)
            env["MODDEB_BROKER_URL"] = f"redis://127.0.0.1:{redis_port}/0"
        settings = load_settings(env=env)
        store = open_store(settings)
        with store.session() as s:
            s.add(
                Project(
                    name="bench",
                    source_url="https://git.example.org/bench/hello.git",
                    ref="main",
                    secret=SECRET,
                    default_kernels={"kernels": [KERNEL], "newest": False, "all_in_suite": ""},
                )
            )
        port = free_port()
        web = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "--workers",
                "2",
                "--bind",
                f"127.0.0.1:{port}",
                "--log-level",
                "warning",
                "--no-control-socket",
                *(
                    ["--worker-class", "gthread", "--threads", str(args.threads)]
                    if args.threads
                    else []
                ),
                "web:create_app()",
            ],
            env=env,
            cwd=ROOT,
            start_new_session=True,
        )
        procs.append(web)
        worker = subprocess.Popen(
            [sys.executable, "-m", "builder.service_cli", "worker", "--queues", "build"],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        procs.append(worker)
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/healthz")
        time.sleep(3)  # let the worker settle
        web_pids = children(web.pid)
        # Idle: after start-up, before any load. A web worker has served /healthz at most.
        idle_web = max(rss_mb(p) for p in web_pids)
        idle_master = rss_mb(web.pid)
        idle_worker = rss_mb(worker.pid)
        # Builds must stay queued for the count below: the worker only had to be measured.
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=60)

        body = PAYLOAD.read_bytes()
        signature = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
        headers = {
            "Content-Type": "application/json",
            "X-GitHub-Event": "push",
            "X-Hub-Signature-256": signature,
        }
        url = f"{base}/hooks/github/bench"
        run_load("warmup", url, body, headers, 2, args.connections, tmp)  # not counted
        cpu_before = sum(cpu_seconds(p) for p in web_pids)
        tool, r = run_load("bench", url, body, headers, args.duration, args.connections, tmp)
        web_cpu_ms = (sum(cpu_seconds(p) for p in web_pids) - cpu_before) * 1000
        seconds = r["duration_us"] / 1e6
        accepted = r["statuses"].get("202", 0)
        time.sleep(1)  # requests in flight when the load tool stopped still complete

        with store.session() as s:
            recorded = s.query(Delivery).filter(Delivery.delivery_id.like("github:bench-%")).count()
            deliveries = s.query(Delivery).count()
            distinct_builds = s.query(Delivery.build_id).distinct().count()
            builds = s.query(Build).count()
            queued = s.query(Build).filter(Build.state == "queued").count()
            orphans = (
                s.query(Build)
                .outerjoin(Delivery, Delivery.build_id == Build.id)
                .filter(Delivery.delivery_id.is_(None))
                .count()
            )
        if redis_port:
            import redis

            messages = int(redis.Redis(port=redis_port).llen("build"))
        else:
            from builder.store import make_celery

            with make_celery(settings).connection_for_write() as conn:
                messages = conn.default_channel.queue_declare("build", passive=True).message_count

        p99_ms = r["p99_us"] / 1000
        rps = r["requests"] / seconds
        print(
            f"broker: {args.broker}; load: {tool}, {args.connections} connections, "
            f"{seconds:.1f}s; gunicorn: 2 "
            + (f"gthread workers x {args.threads} threads" if args.threads else "sync workers")
            + " on 127.0.0.1"
        )
        print(f"requests/s: {rps:.0f}   (target >= 300)")
        print(
            f"latency ms: p50 {r['p50_us'] / 1000:.1f}  p90 {r['p90_us'] / 1000:.1f}  "
            f"p99 {p99_ms:.1f}  max {r['max_us'] / 1000:.1f}   (target p99 < 50)"
        )
        print(
            f"web CPU per request: {web_cpu_ms / max(1, r['requests']):.2f} ms "
            f"(both gunicorn workers; machine load average {os.getloadavg()[0]:.2f})"
        )
        print(f"answers: {r['statuses']}  socket errors: {r['errors']}")
        print(
            f"accepted deliveries (202): {accepted}; recorded: {recorded} (the load tool "
            f"stops with up to {args.connections} requests in flight; they still complete)"
        )
        print(
            f"all runs: deliveries {deliveries}, builds {builds}, distinct builds of "
            f"deliveries {distinct_builds}, builds without a delivery {orphans}, "
            f"queued {queued}, messages on the build queue {messages}"
        )
        print(
            f"idle RSS MB: web worker {idle_web:.0f}, gunicorn master {idle_master:.0f}, "
            f"moddeb worker {idle_worker:.0f}   (target < 150 each)"
        )
        ok = (
            accepted <= recorded <= accepted + args.connections
            and deliveries == builds == distinct_builds == queued == messages
            and orphans == 0
            and set(r["statuses"]) == {"202"}
            and r["errors"] == 0
        )
        print(
            "delivery check:",
            "OK: every accepted delivery has exactly one queued build" if ok else "FAILED",
        )
        return 0 if ok else 1
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
