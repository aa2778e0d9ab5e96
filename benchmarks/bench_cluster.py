"""Cluster mode against the single process, its scaling, and a model of it at scale.

Everything is measured from outside, through the cluster's public surface: real
``streamfilter run --config …`` processes, their ``/metrics`` and log lines, the PostgreSQL ledger,
``/proc`` and py-spy. No internal timer is needed, so the same code measures today's worker and
any rewrite of its internals.

Set-up: one broker (started like the tests start it, or ``KAFKA_BOOTSTRAP``), one PostgreSQL
server (``deploy/postgres/pg-up.sh`` on a free port, ``fsync`` on; or ``STREAMFILTER_PG_URL``, then
PostgreSQL's CPU is not measured), and one events topic of ``PARTITIONS`` partitions keyed by
``user_id``, filled once with ``n`` events over ``DAYS`` days, every user active every day
(``n / DAYS`` users a day, one event each, unless ``BENCH_CLUSTER_USERS_A_DAY`` gives fewer;
``SIZE_ENV`` also sets the pairs and rounds of a run that cannot fit). Every arm reads that topic from its start with a fresh consumer
group, a fresh releases topic and fresh state (a new SQLite file, or a new ledger schema).

``cluster_vs_single`` — the cost of cluster mode, paired: the single process
(``streamfilter run --until-end``, Kafka source, SQLite state) against one cluster worker with
PostgreSQL (``[cluster] enabled``, follow mode, stopped once every day is released); ``pairs``
pairs, the order alternating. Measured per arm:

* **CPU per event** of the process (user + system: the single process's ``wait4`` resource usage,
  plus the fold of the budget-log entries its run leaves to the next run's upkeep, timed right
  after it — deferred work counted; the worker's ``/proc/<pid>/stat`` just before it is stopped)
  and of **PostgreSQL**: every server process of our PostgreSQL (the postmaster, its live
  children, the finished children it reaped), ``/proc`` before and after the arm. Both include
  start-up. Ratios: (worker + PostgreSQL) ÷ single (target ≤ 1.25) and PostgreSQL ÷ worker
  (target ≤ 0.10), each the median over the pairs of the per-pair ratio.
* **µs per event per step**, from py-spy (``record --nonblocking --format raw``, idle samples
  excluded, so the samples are on-CPU time) attached to each arm's process: every sample goes to
  the first step of ``STEPS`` whose rule one of its frames meets (rules by function name and
  module; see ``STEPS``); a step's µs per event = its share of the samples × the process's CPU
  from the moment py-spy attached ÷ ``n``; the CPU before that moment is the step
  ``start-up``. Medians over the pairs.

``cluster_workers`` — 1, 2 and 4 workers on the same topic, ``rounds`` rounds, each running every
worker count once (the order rotating). Per arm: events/s (spawn → every day released, and after
every worker answers ``/readyz``), the CPU of all workers and of PostgreSQL per event, records
read (re-reads after rebalances: ``/metrics``), partition reassignments (log lines
``assigned partition(s)``), ledger commits and their seconds (``/metrics``), release latency (per day,
from the moment the ledger holds every partition's commit to the moment its releases are marked
sent, polled every 50 ms) and barrier skew (per day, first to last partition commit seen). The
speed-up of w workers is paired within a round. A 2-core machine bounds it by the cores.

**The model** (``project``; a model, not a measurement, under ``model`` keys): per-part costs taken
from these measurements (``ScaleInputs``) project N = 8, 64, 256 workers, one per core, on a day of
``SCENARIO_EVENTS`` events from ``SCENARIO_USER_DAYS`` user-days: efficiency, machines, PostgreSQL
load, day close, release latency and the cost of a rebalance. ``docs/performance.md``
("Scale-out") gives its equations. The result, arms and model, is also written to
``benchmarks/results/cluster_scaleout.json``.

Not run by the suite's ``--quick`` (a broker, a database and 30 worker processes do not fit its
minute); the smoke test is ``python -m benchmarks.bench_cluster --small`` (small input, one pair,
one round, ~2 min).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from kafka import KafkaAdminClient
from kafka.admin import NewTopic

from benchmarks.bench_kafka import BrokerUnavailable, broker, fill_topic
from benchmarks.common import entry, machine, skipped, upkeep_left
from streamfilter.policies import standing_monitoring

VS_NAME = "cluster_vs_single"
VS_BASELINE = "single process (streamfilter run --until-end), Kafka source, SQLite state"
NAME = "cluster_workers"
BASELINE = "1 worker, same topic and ledger"
PARTITIONS = 8
DAYS = 5
WORKERS = (1, 2, 4)
PROJECTED = (8, 64, 256)
#: the projected day: 10 billion events from 1 billion user-days
SCENARIO_EVENTS = 10_000_000_000
SCENARIO_USER_DAYS = 1_000_000_000
#: targets of the cluster's design
TARGET_TOTAL_RATIO = 1.25  # (worker + PostgreSQL) CPU per event ÷ the single process's
TARGET_PG_SHARE = 0.10  # PostgreSQL CPU ÷ the worker's
TARGET_EFFICIENCY = 0.8  # modelled speed-up ÷ N, up to 64 workers
SPY_RATE_HZ = 100
ROOT = Path(__file__).resolve().parents[1]
RESULT_FILE = ROOT / "benchmarks" / "results" / "cluster_scaleout.json"


@dataclass(frozen=True)
class Size:
    events: int
    pairs: int
    rounds: int
    #: users a day (each active every day); None: one event each, ``events / DAYS`` users
    users_a_day: int | None = None


FULL = Size(events=600_000, pairs=5, rounds=5)
SMALL = Size(events=24_000, pairs=1, rounds=1)
#: environment variables that shrink a full run when it cannot fit (the entries state the size)
SIZE_ENV = {
    "pairs": "BENCH_CLUSTER_PAIRS",
    "rounds": "BENCH_CLUSTER_ROUNDS",
    "users_a_day": "BENCH_CLUSTER_USERS_A_DAY",
}


def full_size() -> Size:
    """``FULL``, with what ``SIZE_ENV`` sets."""
    given = {k: int(os.environ[v]) for k, v in SIZE_ENV.items() if os.environ.get(v)}
    return dataclasses.replace(FULL, **given)


# ---------------------------------------------------------------------- steps (py-spy)

#: (step, function names, module path fragment or "" for any module); a sample belongs to the
#: first step one of whose rules a frame of its stack meets. Order matters: the relay inside a
#: day close is ``release``, a commit inside a close is ``commit``.
STEPS: tuple[tuple[str, frozenset[str], str], ...] = (
    # imports (also lazy ones) and building the daemon; the CPU before py-spy attached too
    ("start-up", frozenset({"_find_and_load", "build_daemon", "_build_worker"}), ""),
    # a worker's partitions' budgets rebuilt from their records on assignment
    ("rebuild", frozenset({"_ledger_of", "merge_monotone", "budget_records"}), "streamfilter/"),
    (
        "release",
        frozenset(
            {
                "_release_and_relay",
                "_relay_outbox",
                "_publish_lost",
                "_release",
                "relay",
                "publish_lost",
            }
        ),
        "streamfilter/",
    ),
    (
        "commit",
        frozenset({"commit_day", "commit_partitions", "compact"}),
        "streamfilter/runtime/store",
    ),
    ("commit", frozenset({"_compact_state"}), "streamfilter/"),
    (
        "partition check",
        frozenset(
            {
                "_screen_records",
                "_columns_pass",
                "partitions_of",
                "key_partition",
                "murmur2",
                "_pinned_count",
            }
        ),
        "",
    ),
    (
        "decode",
        frozenset({"parse_columns", "parse_records", "parse_events", "parse_record"}),
        "streamfilter/",
    ),
    ("fetch", frozenset({"poll_batches", "_poll", "poll_raw"}), "streamfilter/"),
    (
        "accumulate",
        frozenset({"_ingest_batches", "_ingest_batch", "ingest_batches", "ingest_batch"}),
        "streamfilter/",
    ),
    (
        "close",
        frozenset(
            {
                "_close_ready",
                "_close_through",
                "_close_day",
                "_commit_partitions",
                "prepare_day",
                "partial_day",
                "_freeze",
            }
        ),
        "streamfilter/",
    ),
)
#: steps whose work grows with events; with user-days (close, commit, release); per process
EVENT_STEPS = ("fetch", "decode", "partition check", "accumulate")
DAY_STEPS = ("close", "commit", "release", "rebuild")
START = "start-up"
#: samples of no step: a background thread (the Kafka clients' I/O and heartbeat threads, the
#: metrics server), or the main thread elsewhere (the loop's bookkeeping, unreadable stacks)
THREADS, OTHER = "client threads", "other"
ALL_STEPS = (*EVENT_STEPS, *DAY_STEPS, START, THREADS, OTHER)
_FRAME = re.compile(r"^(?P<fn>.*) \((?P<path>.*?)(?::\d+)?\)$")


def step_of(stack: str) -> str:
    """The step of one py-spy raw stack (``frame;frame;…``, root first)."""
    frames = []
    for frame in stack.split(";"):
        m = _FRAME.match(frame)
        # py-spy names methods ``Class.method``: the rules name the function
        frames.append((m["fn"].rsplit(".", 1)[-1], m["path"]) if m else (frame, ""))
    for step, names, module in STEPS:
        if any(fn in names and module in path for fn, path in frames):
            return step
    if frames and frames[0][0] == "_bootstrap" and "threading" in frames[0][1]:
        return THREADS
    return OTHER


def step_samples(raw: str) -> Counter[str]:
    """Samples per step of a py-spy ``--format raw`` profile."""
    out: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if count.isdigit():
            out[step_of(stack)] += int(count)
    return out


def other_top(raw: str, k: int = 6) -> list[tuple[str, int]]:
    """The ``other`` samples by their innermost frame of this package (what no step names)."""
    out: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if count.isdigit() and step_of(stack) == OTHER:
            frames = stack.split(";")
            ours = [f for f in frames if "streamfilter/" in f] or frames[-1:]
            out[re.sub(r":\d+\)$", ")", ours[-1])] += int(count)
    return out.most_common(k)


def step_us(samples: Counter[str], cpu_spied_s: float, cpu_before_s: float, n: int) -> dict:
    """µs per event per step: the step's share of the samples × the CPU while py-spy sampled."""
    total = sum(samples.values())
    out = {
        s: (samples[s] / total * cpu_spied_s / n * 1e6 if total else float("nan"))
        for s in ALL_STEPS
    }
    out[START] += cpu_before_s / n * 1e6
    return out


@contextmanager
def spied(pid: int, out: Path) -> Iterator[dict[str, float]]:
    """py-spy attached to ``pid`` until the block ends (or the process exits); yields
    ``{"cpu_at_attach_s": …}`` (the process's CPU when sampling began)."""
    info: dict[str, float] = {}
    spy = None
    for _ in range(40):  # attaching fails until the interpreter is up
        try:
            info["cpu_at_attach_s"] = _cpu_seconds(pid)
        except OSError:
            info["cpu_at_attach_s"] = 0.0
        spy = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "py-spy"),
                "record",
                "--nonblocking",
                "--rate",
                str(SPY_RATE_HZ),
                "--format",
                "raw",
                "-o",
                str(out),
                "--pid",
                str(pid),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            spy.wait(timeout=0.7)
        except subprocess.TimeoutExpired:
            break  # sampling
        spy = None
        time.sleep(0.2)
    if spy is None:
        raise RuntimeError(f"py-spy could not attach to {pid}")
    try:
        yield info
    finally:
        try:
            spy.wait(timeout=30)  # it writes the profile once the process exits
        except subprocess.TimeoutExpired:
            spy.send_signal(signal.SIGINT)
            spy.wait(timeout=30)


# ---------------------------------------------------------------------- processes and /proc


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _stat(pid: str) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def pg_cpu_seconds(postmaster: int) -> float:
    """CPU seconds of a PostgreSQL server so far: the postmaster's own and its reaped children's
    (backends that exited), plus every live child's (backends, checkpointer, WAL writer, …)."""
    tick = os.sysconf("SC_CLK_TCK")
    own = _stat(str(postmaster))
    if own is None:
        raise RuntimeError(f"PostgreSQL's postmaster {postmaster} is gone")
    total = sum(int(own[i]) for i in (11, 12, 13, 14))
    for entry_ in os.scandir("/proc"):
        if entry_.name.isdigit():
            fields = _stat(entry_.name)
            if fields is not None and fields[1] == str(postmaster):
                total += int(fields[11]) + int(fields[12])
    return total / tick


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Postgres:
    url: str  # with the password
    postmaster: int | None  # None: an external server (its CPU is not measured)


@contextmanager
def postgres() -> Iterator[Postgres]:
    """``STREAMFILTER_PG_URL``, or a throw-away server (fsync on) started and stopped here."""
    external = os.environ.get("STREAMFILTER_PG_URL", "").strip()
    if external:
        yield Postgres(external, None)
        return
    run_dir = Path(tempfile.mkdtemp(prefix="streamfilter-bench-pg-"))
    env = {**os.environ, "PG_PORT": str(_free_port()), "PG_RUN_DIR": str(run_dir), "PG_FSYNC": "on"}
    up = subprocess.run(
        ["bash", str(ROOT / "deploy/postgres/pg-up.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    if up.returncode != 0:
        raise BrokerUnavailable(f"no PostgreSQL ({up.stderr.strip()[-200:]})")
    try:
        printed = up.stdout.strip().splitlines()[-1]  # no password: it is in the run directory
        password = (run_dir / "password").read_text().strip()
        url = printed.replace("@", f":{password}@", 1)
        postmaster = int((run_dir / "data" / "postmaster.pid").read_text().split()[0])
        yield Postgres(url, postmaster)
    finally:
        subprocess.run(
            ["bash", str(ROOT / "deploy/postgres/pg-down.sh")], env=env, capture_output=True
        )


def _pg_cpu(pg: Postgres) -> float:
    return pg_cpu_seconds(pg.postmaster) if pg.postmaster is not None else float("nan")


# ---------------------------------------------------------------------- configurations

_COMMON = """
[privacy]
b_norm = 8.0
rho = 0.5
[window]
allowed_lateness = "0s"
idle_timeout = "1s"
poll_interval = "0.1s"
[kafka]
bootstrap_servers = "{bootstrap}"
group_id = "bench-{name}"
[source]
kind = "kafka"
topic = "{topic}"
[queries]
kind = "file"
path = "{queries}"
[sink]
kind = "kafka"
topic = "{releases}"
[rejects]
kind = "file"
path = "{rejects}"
[metrics]
enabled = true
port = 0
"""


def _new_topic(bootstrap: str) -> str:
    name = f"bench-cluster-releases-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(name, 1, 1)])
    admin.close()
    return name


def _config(work: Path, bootstrap: str, topic: str, name: str, state: str) -> Path:
    queries = work / "queries.jsonl"
    queries.write_text("".join(json.dumps(q) + "\n" for q in standing_monitoring([], "2026-01-01")))
    cfg = work / f"{name}.toml"
    common = _COMMON.format(
        bootstrap=bootstrap,
        name=name,
        topic=topic,
        queries=queries,
        releases=_new_topic(bootstrap),
        rejects=work / f"{name}-rejects.jsonl",
    )
    cfg.write_text(common + state)
    return cfg


def _cluster_state(pg: Postgres, schema: str) -> tuple[str, str]:
    """The ``[cluster]`` and ``[state]`` sections of a worker, and the password to export."""
    url = urlsplit(pg.url)
    bare = urlunsplit(url._replace(netloc=f"{url.username}@{url.hostname}:{url.port}"))
    text = f"""
[cluster]
enabled = true
session_timeout = "10s"
heartbeat_interval = "1s"
[state]
kind = "postgres"
url = "{bare}"
pg_schema = "{schema}"
password_env = "SF_BENCH_PG_PASSWORD"
"""
    return text, url.password or ""


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, ""
    except OSError:
        return 0, ""


def _sample(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name)] in " {"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _assigned(log: str) -> int:
    """Partition assignments a worker's log reports (``assigned partition(s) 0 (epoch 1), …``)."""
    return sum(
        line.split("assigned partition(s)", 1)[1].count("(epoch")
        for line in log.splitlines()
        if "assigned partition(s)" in line
    )


# ---------------------------------------------------------------------- the arms


def single_arm(bootstrap: str, topic: str, pg: Postgres, n: int, spy: bool) -> dict[str, Any]:
    """One ``streamfilter run --until-end`` over the topic, SQLite state."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        state = work / "state.db"
        cfg = _config(
            work, bootstrap, topic, f"single-{uuid.uuid4().hex[:8]}", f'[state]\npath = "{state}"\n'
        )
        env = {**os.environ, "STREAMFILTER_METRICS__PORT": str(_free_port())}
        pg0 = _pg_cpu(pg)
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamfilter", "run", "--config", str(cfg), "--until-end"],
            env=env,
            cwd=work,
            stdout=subprocess.DEVNULL,
            stderr=open(work / "single.log", "wb"),  # noqa: SIM115 - closed with the dir
        )
        profile = work / "single.raw"
        attach = {"cpu_at_attach_s": 0.0}
        try:
            if spy:
                with spied(proc.pid, profile) as attach:
                    _, status, usage = os.wait4(proc.pid, 0)
            else:
                _, status, usage = os.wait4(proc.pid, 0)
        finally:
            if proc.returncode is None and _stat(str(proc.pid)) is not None:
                proc.kill()
        proc.returncode = os.waitstatus_to_exitcode(status)
        elapsed = time.perf_counter() - t0
        pg_cpu = _pg_cpu(pg) - pg0
        if proc.returncode != 0:
            raise RuntimeError(
                f"single process exited {proc.returncode}: "
                + (work / "single.log").read_text()[-2000:]
            )
        cpu = usage.ru_utime + usage.ru_stime
        # deferred work counted: the budget-log entries this run leaves to the next run's upkeep
        c0 = resource.getrusage(resource.RUSAGE_SELF)
        entries, _ = upkeep_left(state)
        c1 = resource.getrusage(resource.RUSAGE_SELF)
        fold_cpu = (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)
        raw = profile.read_text() if spy else ""
        samples = step_samples(raw)
    steps = step_us(samples, cpu - attach["cpu_at_attach_s"], attach["cpu_at_attach_s"], n)
    steps["commit"] += fold_cpu / n * 1e6  # the fold is the rest of the commits' work
    return {
        "events_per_s": n / elapsed,
        "cpu_s": cpu + fold_cpu,
        "fold_cpu_s": fold_cpu,
        "fold_entries": entries,
        "pg_cpu_s": pg_cpu,
        "peak_rss_mib": usage.ru_maxrss / 1024,
        "steps_us": steps,
        "samples": sum(samples.values()),
        "other_top": other_top(raw),
    }


def cluster_arm(
    workers: int, bootstrap: str, topic: str, pg: Postgres, n: int, spy: bool = False
) -> dict[str, Any]:
    """``workers`` cluster workers over the topic until every day is released."""
    import psycopg

    schema = f"bench_{uuid.uuid4().hex[:10]}"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        state, password = _cluster_state(pg, schema)
        cfg = _config(work, bootstrap, topic, schema, state)
        env = {**os.environ, "SF_BENCH_PG_PASSWORD": password}
        ports = [_free_port() for _ in range(workers)]
        pg0 = _pg_cpu(pg)
        t0 = time.perf_counter()
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "streamfilter", "run", "--config", str(cfg)],
                env={**env, "STREAMFILTER_METRICS__PORT": str(port)},
                cwd=work,
                stdout=subprocess.DEVNULL,
                stderr=open(work / f"w{i}.log", "wb"),  # noqa: SIM115 - closed with the dir
            )
            for i, port in enumerate(ports)
        ]
        profile = work / "w0.raw"
        ready_at: float | None = None
        asked = 0.0
        committed_at: dict[str, float] = {}
        sent_at: dict[str, float] = {}
        seen: dict[tuple[str, int], float] = {}  # (day, partition) -> first seen committed
        with contextlib_spied(spy, procs[0].pid, profile) as attach:
            try:
                with psycopg.connect(pg.url, autocommit=True) as db:
                    while len(sent_at) < DAYS:
                        for i, p in enumerate(procs):
                            if p.poll() is not None:
                                raise RuntimeError(
                                    f"worker exited {p.returncode}: "
                                    + (work / f"w{i}.log").read_text()[-2000:]
                                )
                        now = time.perf_counter()
                        # /readyz costs the worker CPU: asked every 0.25 s, until it says ready
                        if ready_at is None and now >= asked + 0.25:
                            asked = now
                            if all(
                                _get(f"http://127.0.0.1:{port}/readyz")[0] == 200 for port in ports
                            ):
                                ready_at = now
                        for day, partition in _commits(db, schema):
                            seen.setdefault((day, partition), now)
                        for day, pinned, unsent, released in _days(db, schema):
                            done = sum(1 for d, _ in seen if d == day) >= pinned
                            if done:
                                committed_at.setdefault(day, now)
                            if done and released and unsent == 0:
                                sent_at.setdefault(day, now)
                        time.sleep(0.05)
                done_at = time.perf_counter()
                cpu = [_cpu_seconds(p.pid) for p in procs]  # before /metrics is asked
                pg_cpu = _pg_cpu(pg) - pg0
                rss = [_peak_rss_mib(p.pid) for p in procs]
                metrics = [_get(f"http://127.0.0.1:{port}/metrics")[1] for port in ports]
            finally:
                for p in procs:
                    if p.poll() is None:
                        p.send_signal(signal.SIGTERM)
                for p in procs:
                    try:
                        p.wait(timeout=60)
                    except subprocess.TimeoutExpired:
                        p.kill()
        logs = [(work / f"w{i}.log").read_text() for i in range(workers)]
        raw = profile.read_text() if spy else ""
        samples = step_samples(raw)
    read = [_sample(m, "streamfilter_records_consumed_total") for m in metrics]
    commit_s = [_sample(m, "streamfilter_state_store_commit_seconds_sum") for m in metrics]
    commits = [_sample(m, "streamfilter_state_store_commit_seconds_count") for m in metrics]
    assert round(sum(read)) >= n, (read, n)  # a rebalance may re-read; never fewer
    assigned = sum(_assigned(log) for log in logs)
    latency = [sent_at[d] - committed_at[d] for d in sorted(sent_at)]
    skew = []
    for day in sorted(sent_at):
        times = [t for (d, _), t in seen.items() if d == day]
        skew.append(max(times) - min(times))
    cpu0_spied = cpu[0] - attach["cpu_at_attach_s"]
    return {
        "workers": workers,
        "events_per_s": n / (done_at - t0),
        "events_per_s_after_start": n / (done_at - (ready_at or t0)),
        "start_s": (ready_at or t0) - t0,
        "cpu_s": sum(cpu),
        "pg_cpu_s": pg_cpu,
        "records_read": round(sum(read)),
        "reassignments": max(0, assigned - PARTITIONS),
        "commit_s": sum(commit_s),
        "commits": round(sum(commits)),
        "release_latency_s": statistics.median(latency),
        "barrier_skew_s": statistics.median(skew),
        "per_worker": [
            {
                "records": round(r),
                "commit_s": round(k, 2),
                "peak_rss_mib": round(m),
                "cpu_s": round(u, 2),
            }
            for r, k, m, u in zip(read, commit_s, rss, cpu, strict=True)
        ],
        "steps_us": step_us(samples, cpu0_spied, attach["cpu_at_attach_s"], n) if spy else {},
        "samples": sum(samples.values()),
        "other_top": other_top(raw),
    }


@contextmanager
def contextlib_spied(on: bool, pid: int, out: Path) -> Iterator[dict[str, float]]:
    if not on:
        yield {"cpu_at_attach_s": 0.0}
        return
    with spied(pid, out) as info:
        yield info


def _commits(db: Any, schema: str) -> list[tuple[str, int]]:
    """(day, partition) of every partition-day commit in the ledger (none before it exists)."""
    if db.execute("SELECT to_regclass(%s)", (f"{schema}.cluster_commits",)).fetchone()[0] is None:
        return []
    return db.execute(f"SELECT day, partition FROM {schema}.cluster_commits").fetchall()


def _days(db: Any, schema: str) -> list[tuple[str, int, int, bool]]:
    """(day, pinned partitions, releases not yet sent, released) of every day in the ledger."""
    if db.execute("SELECT to_regclass(%s)", (f"{schema}.cluster_days",)).fetchone()[0] is None:
        return []
    return db.execute(
        f"SELECT d.day, d.partitions, "
        f"(SELECT count(*) FROM {schema}.releases r WHERE r.day = d.day AND NOT r.sent), "
        f"d.released FROM {schema}.cluster_days d"
    ).fetchall()


# ---------------------------------------------------------------------- the model


@dataclass(frozen=True)
class ScaleInputs:
    """Measured per-part costs the model is built from (all from this benchmark's runs)."""

    #: all workers' CPU per record read (µs), their start-up left out, at each measured worker
    #: count (re-reads after rebalances are in the records, and in ``reread_per_reassignment``)
    worker_cpu_us_per_record: dict[int, float]
    #: PostgreSQL's CPU seconds per ledger commit by the users it debits (one point per measured
    #: worker count; all its CPU of the arm, polling and leases too), for the fit ``b · users^β``
    pg_cpu_s_by_users: dict[float, float]
    #: one worker's CPU per event in the event steps (fetch … accumulate) and per user-day in
    #: the day steps (close, commit, release), at one worker (py-spy); the rest of its CPU but
    #: start-up (client threads, other) is spread over both in the same proportion
    event_steps_us: float
    day_steps_us_per_user_day: float
    #: commit-complete → releases sent, per day (s), at one worker
    releaser_s_per_day: float
    #: first → last partition commit of a day (s), at each measured worker count
    barrier_skew_s: dict[int, float]
    #: ledger commit seconds per commit by the users it debits (one point per measured worker
    #: count: a worker commits its partitions' day at once), for the fit ``a · users^α``
    commit_s_by_users: dict[float, float]
    #: partition-days read again per partition reassignment (None: none seen); the model takes
    #: at most 1 (in a steady state only the open day is not committed), 1 when none was seen
    reread_per_reassignment: float | None
    #: one worker process's start-up CPU (s): imports, building the daemon
    startup_cpu_s: float
    #: spawn → every worker ready (s), at the largest measured worker count
    settle_s: float


@dataclass(frozen=True)
class Scenario:
    events_per_day: float = SCENARIO_EVENTS
    user_days_per_day: float = SCENARIO_USER_DAYS
    partitions_per_worker: int = 1
    #: busy fraction a worker machine is planned at (2x headroom for peaks)
    planned_busy: float = 0.5
    #: PostgreSQL cores a single server offers (one large machine)
    pg_max_cores: float = 64.0
    extra: dict[str, float] = field(default_factory=dict)


def _growth(points: dict[int, float]) -> float:
    """γ of v(N) = v(1)·(1 + γ·log2 N), least squares through the measured points, γ ≥ 0."""
    base = points[1]
    xs = [(math.log2(w), points[w] / base - 1.0) for w in points if w > 1]
    den = sum(x * x for x, _ in xs)
    return max(0.0, sum(x * y for x, y in xs) / den) if den else 0.0


def _power_law(points: dict[float, float]) -> tuple[float, float]:
    """``(a, α)`` of t = a · u^α, least squares on logarithms, α ≥ 0 (α = 1 from one point)."""
    pts = [(math.log(u), math.log(t)) for u, t in points.items() if u > 0 and t > 0]
    if not pts:
        return 0.0, 1.0
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    var = sum((x - mx) ** 2 for x, _ in pts)
    alpha = max(0.0, sum((x - mx) * (y - my) for x, y in pts) / var) if var > 0 else 1.0
    return math.exp(my - alpha * mx), alpha


def _skew_sigma(points: dict[int, float]) -> float:
    """σ of skew(N) = σ·√(2 ln N) (the expected spread of N finishing times), least squares."""
    zs = [(math.sqrt(2 * math.log(w)), s) for w, s in points.items() if w > 1]
    den = sum(z * z for z, _ in zs)
    return max(0.0, sum(z * s for z, s in zs) / den) if den else 0.0


def project(inputs: ScaleInputs, workers: int, scenario: Scenario = Scenario()) -> dict[str, Any]:
    """The model at ``workers`` workers (one per core) for ``scenario``'s day (docs/performance.md,
    "Scale-out", gives the equations). Efficiency = T(1) ÷ (N · T(N)) ≤ 1, where T(N) is the wall
    time N workers need for the whole day's work: the worker CPU split N ways, the commits' wall
    time, the barrier skew and the releaser."""
    e, u = scenario.events_per_day, scenario.user_days_per_day
    n_part = workers * scenario.partitions_per_worker
    gamma_w = _growth(inputs.worker_cpu_us_per_record)
    sigma = _skew_sigma(inputs.barrier_skew_s)

    def growth(gamma: float, w: int) -> float:
        return 1.0 + gamma * math.log2(w)

    def skew(w: int) -> float:
        return sigma * math.sqrt(2 * math.log(w)) if w > 1 else 0.0

    # worker CPU of the day at w workers (seconds): per event and per user-day parts
    measured_1 = inputs.worker_cpu_us_per_record[1]
    split = inputs.event_steps_us + inputs.day_steps_us_per_user_day
    per_event_us = measured_1 * inputs.event_steps_us / split
    per_user_day_us = measured_1 * inputs.day_steps_us_per_user_day / split

    def worker_cpu_s(w: int) -> float:
        return (e * per_event_us + u * per_user_day_us) * growth(gamma_w, w) / 1e6

    # the day's commits: one per partition-day, a · (U/P)^α each (fitted; its client CPU is also
    # in the worker CPU above); the same P partitions whatever the worker count, so one worker
    # pays every commit in turn and N workers share them
    a, alpha = _power_law(inputs.commit_s_by_users)
    commits_s = n_part * a * (u / n_part) ** alpha

    def day_time_s(w: int) -> float:
        return (worker_cpu_s(w) + commits_s) / w + skew(w) + inputs.releaser_s_per_day

    speedup = day_time_s(1) / day_time_s(workers)
    cpu_day = worker_cpu_s(workers)
    busy = cpu_day / (workers * 86_400)
    b, beta = _power_law(inputs.pg_cpu_s_by_users)
    pg_cpu_day = n_part * b * (u / n_part) ** beta  # one commit per partition-day
    # the day close: every worker filters its users, commits, then the barrier and the releaser
    close_s = (
        (u / workers) * per_user_day_us * growth(gamma_w, workers) / 1e6
        + commits_s / workers
        + skew(workers)
        + inputs.releaser_s_per_day
    )
    measured_reread = inputs.reread_per_reassignment
    reread = 1.0 if measured_reread is None else min(1.0, measured_reread)
    # one worker leaves: its partitions move, each new owner rebuilds (today: reads the open day
    # again, ``reread`` of a partition-day) in parallel, after the group settles
    moved_events = reread * e / n_part * scenario.partitions_per_worker
    per_event_now_us = (per_event_us + per_user_day_us * u / e) * growth(gamma_w, workers)
    rebalance_cpu_s = moved_events * per_event_now_us / 1e6
    return {
        "workers": workers,
        "partitions": n_part,
        "speedup": speedup,
        "efficiency": speedup / workers,
        "worker_cpu_us_per_event": per_event_now_us,
        "worker_cpu_s_per_day": cpu_day,
        "worker_busy_fraction": busy,
        "keeps_up": busy <= 1.0,
        "pg_cpu_s_per_day": pg_cpu_day,
        "pg_cores_average": pg_cpu_day / 86_400,
        "pg_cores_during_close": pg_cpu_day / close_s if close_s > 0 else float("inf"),
        "pg_bound": pg_cpu_day / close_s > scenario.pg_max_cores if close_s > 0 else True,
        "day_close_s": close_s,
        "release_latency_s": skew(workers) + inputs.releaser_s_per_day,
        "barrier_skew_s": skew(workers),
        "rebalance_s": rebalance_cpu_s + inputs.settle_s,
        "rebalance_worker_cpu_s": rebalance_cpu_s,
    }


def machines_needed(
    inputs: ScaleInputs, scenario: Scenario = Scenario(), limit: int = 1 << 20
) -> int | None:
    """The fewest workers (one per machine core) that keep up with the scenario's day at the
    planned busy fraction; None if none up to ``limit`` does (CPU per event grows with N)."""
    w = 1
    while w <= limit:
        if project_busy(inputs, w, scenario) <= scenario.planned_busy:
            lo, hi = max(1, w // 2), w
            while lo < hi:
                mid = (lo + hi) // 2
                if project_busy(inputs, mid, scenario) <= scenario.planned_busy:
                    hi = mid
                else:
                    lo = mid + 1
            return lo
        w *= 2
    return None


def project_busy(inputs: ScaleInputs, workers: int, scenario: Scenario = Scenario()) -> float:
    """Busy fraction of each of ``workers`` workers on the scenario's day."""
    measured_1 = inputs.worker_cpu_us_per_record[1]
    split = inputs.event_steps_us + inputs.day_steps_us_per_user_day
    per_day_us = (
        measured_1
        * (
            scenario.events_per_day * inputs.event_steps_us
            + scenario.user_days_per_day * inputs.day_steps_us_per_user_day
        )
        / split
    )
    growth = 1.0 + _growth(inputs.worker_cpu_us_per_record) * math.log2(workers)
    return per_day_us * growth / 1e6 / (workers * 86_400)


def model_inputs(
    pairs: list[dict[str, dict[str, Any]]],
    arms: dict[int, list[dict[str, Any]]],
    n: int,
    users: int,
) -> ScaleInputs:
    """The model's inputs from the measured arms (medians)."""
    user_days = users * DAYS

    def med(rows: list[dict[str, Any]], key: str) -> float:
        return statistics.median(r[key] for r in rows)

    steps = {s: statistics.median(p["cluster"]["steps_us"][s] for p in pairs) for s in ALL_STEPS}
    startup_s = steps[START] * n / 1e6
    reassigned = sum(a["reassignments"] for rows in arms.values() for a in rows)
    reread = sum(a["records_read"] - n for rows in arms.values() for a in rows)
    per_partition_day = n / (DAYS * PARTITIONS)
    return ScaleInputs(
        worker_cpu_us_per_record={
            w: statistics.median((a["cpu_s"] - w * startup_s) / a["records_read"] for a in rows)
            * 1e6
            for w, rows in arms.items()
        },
        pg_cpu_s_by_users={
            user_days / med(rows, "commits"): med(rows, "pg_cpu_s") / med(rows, "commits")
            for rows in arms.values()
            if med(rows, "commits") > 0
        },
        event_steps_us=sum(steps[s] for s in EVENT_STEPS),
        day_steps_us_per_user_day=sum(steps[s] for s in DAY_STEPS) * n / user_days,
        releaser_s_per_day=med(arms[1], "release_latency_s"),
        barrier_skew_s={w: med(rows, "barrier_skew_s") for w, rows in arms.items()},
        commit_s_by_users={
            user_days / med(rows, "commits"): med(rows, "commit_s") / med(rows, "commits")
            for rows in arms.values()
            if med(rows, "commits") > 0
        },
        reread_per_reassignment=(reread / reassigned / per_partition_day if reassigned else None),
        settle_s=med(arms[max(arms)], "start_s"),
        startup_cpu_s=startup_s,
    )


def model(inputs: ScaleInputs, scenario: Scenario = Scenario()) -> dict[str, Any]:
    """The model's figures at ``PROJECTED`` worker counts, with the inputs they came from."""
    rows = [project(inputs, w, scenario) for w in PROJECTED]
    upto_64 = [r["efficiency"] for r in rows if r["workers"] <= 64]
    return {
        "inputs": asdict(inputs),
        "scenario": {k: v for k, v in asdict(scenario).items() if k != "extra"},
        "growth_worker_cpu_per_doubling": _growth(inputs.worker_cpu_us_per_record),
        "pg_b_s": _power_law(inputs.pg_cpu_s_by_users)[0],
        "pg_beta": _power_law(inputs.pg_cpu_s_by_users)[1],
        "skew_sigma_s": _skew_sigma(inputs.barrier_skew_s),
        "commit_a_s": _power_law(inputs.commit_s_by_users)[0],
        "commit_alpha": _power_law(inputs.commit_s_by_users)[1],
        "machines_needed": machines_needed(inputs, scenario),
        "projected": rows,
        "efficiency_target_met": min(upto_64) >= TARGET_EFFICIENCY,
        # planning needs both: the day's work shared well, and each day closed within a day
        "target_met": min(upto_64) >= TARGET_EFFICIENCY
        and all(r["day_close_s"] <= 86_400 and r["keeps_up"] for r in rows if r["workers"] == 64),
    }


def _med(values: list[float]) -> float:
    return statistics.median(values)


def _vs_entry(
    pairs: list[dict[str, dict[str, Any]]], n: int, users: int, loads: list[float]
) -> dict:
    single = [p["single"]["cpu_s"] / n * 1e6 for p in pairs]
    worker = [p["cluster"]["cpu_s"] / n * 1e6 for p in pairs]
    pg = [p["cluster"]["pg_cpu_s"] / n * 1e6 for p in pairs]
    pg_idle = [p["single"]["pg_cpu_s"] / n * 1e6 for p in pairs]
    total_ratio = [(w + g) / s for w, g, s in zip(worker, pg, single, strict=True)]
    pg_share = [g / w for g, w in zip(pg, worker, strict=True)]
    steps = {
        arm: {s: round(_med([p[arm]["steps_us"][s] for p in pairs]), 2) for s in ALL_STEPS}
        for arm in ("single", "cluster")
    }
    ratio, share = _med(total_ratio), _med(pg_share)
    met = ratio <= TARGET_TOTAL_RATIO and share <= TARGET_PG_SHARE
    rate = {arm: _med([p[arm]["events_per_s"] for p in pairs]) for arm in ("single", "cluster")}
    step_text = "; ".join(
        f"{s}: single {steps['single'][s]:.2f}, worker {steps['cluster'][s]:.2f}" for s in ALL_STEPS
    )
    return entry(
        VS_NAME,
        value=round(_med(worker) + _med(pg), 2),
        unit="µs CPU per event",
        baseline=VS_BASELINE,
        baseline_value=round(_med(single), 2),
        ratio=round(ratio, 3),
        ratio_definition="median over pairs of (worker + PostgreSQL CPU) ÷ single-process CPU",
        target=f"≤ {TARGET_TOTAL_RATIO} and PostgreSQL ≤ {TARGET_PG_SHARE:.0%} of the worker",
        target_met=met,
        runs=len(pairs),
        size=f"{n:,} events, {users:,} users a day, {DAYS} days, {PARTITIONS} partitions",
        detail=(
            f"one cluster worker + PostgreSQL (fsync on) vs the single process on the same topic, "
            f"{len(pairs)} pairs, order alternating; CPU per event: single {_med(single):.2f} µs "
            f"(incl. the fold of the budget-log entries it leaves, "
            f"{_med([p['single']['fold_cpu_s'] for p in pairs]):.2f} s), worker "
            f"{_med(worker):.2f} µs, PostgreSQL {_med(pg):.2f} µs (PostgreSQL's background "
            f"during the single arm: {_med(pg_idle):.2f} µs); ratios per pair "
            f"{', '.join(f'{r:.2f}' for r in total_ratio)}; PostgreSQL ÷ worker "
            f"{share:.2f} ({', '.join(f'{r:.2f}' for r in pg_share)}); events/s: single "
            f"{rate['single']:,.0f}, worker {rate['cluster']:,.0f}; µs per event per step "
            f"(py-spy at {SPY_RATE_HZ} Hz; steps by function, see STEPS): {step_text}; "
            f"1-min load average during the pairs {min(loads):.1f}–{max(loads):.1f}"
        ),
        single_cpu_us_per_event=round(_med(single), 2),
        worker_cpu_us_per_event=round(_med(worker), 2),
        pg_cpu_us_per_event=round(_med(pg), 2),
        pg_background_us_per_event_single_arm=round(_med(pg_idle), 2),
        pg_share_of_worker=round(share, 3),
        ratio_per_pair=[round(r, 3) for r in total_ratio],
        steps_us_per_event=steps,
        events_per_s={k: round(v) for k, v in rate.items()},
        load_average_1min=[round(x, 2) for x in loads],
    )


def _scale_entry(
    arms: dict[int, list[dict[str, Any]]], n: int, users: int, the_model: dict, loads: list[float]
) -> dict:
    rounds = len(arms[1])
    rate = {w: _med([a["events_per_s"] for a in rows]) for w, rows in arms.items()}
    after = {w: _med([a["events_per_s_after_start"] for a in rows]) for w, rows in arms.items()}
    speedup = {
        w: _med(
            [a["events_per_s"] / b["events_per_s"] for a, b in zip(arms[w], arms[1], strict=True)]
        )
        for w in WORKERS
    }
    cpu = {w: _med([a["cpu_s"] for a in rows]) / n * 1e6 for w, rows in arms.items()}
    pg = {w: _med([a["pg_cpu_s"] for a in rows]) / n * 1e6 for w, rows in arms.items()}
    top = max(WORKERS)
    parts = [
        f"{w} worker{'s' if w > 1 else ''}: {rate[w]:,.0f} events/s whole run, {after[w]:,.0f} "
        f"after start-up ({_med([a['start_s'] for a in arms[w]]):.1f} s), CPU per event worker(s) "
        f"{cpu[w]:.1f} µs + PostgreSQL {pg[w]:.1f} µs, release latency "
        f"{_med([a['release_latency_s'] for a in arms[w]]):.2f} s, barrier skew "
        f"{_med([a['barrier_skew_s'] for a in arms[w]]):.2f} s, records read "
        f"{_med([a['records_read'] for a in arms[w]]) / n:.3f}× the input, reassignments "
        f"{_med([a['reassignments'] for a in arms[w]]):.0f}"
        for w in WORKERS
    ]
    rows = {r["workers"]: r for r in the_model["projected"]}
    model_text = (
        "MODEL, not measured (docs/performance.md, Scale-out): "
        + "; ".join(
            f"{w} workers: efficiency {r['efficiency']:.2f}, worker CPU {r['worker_cpu_us_per_event']:.1f} "
            f"µs/event, PostgreSQL {r['pg_cores_average']:.1f} cores average "
            f"({r['pg_cores_during_close']:.0f} during the close), day close {r['day_close_s']:,.0f} s, "
            f"release latency {r['release_latency_s']:.2f} s, rebalance {r['rebalance_s']:,.0f} s"
            for w, r in rows.items()
        )
        + (
            f"; machines to keep up at {Scenario().planned_busy:.0%} busy: "
            f"{the_model['machines_needed']}"
        )
    )
    eff_64 = min(r["efficiency"] for w, r in rows.items() if w <= 64)
    return entry(
        NAME,
        value=round(rate[top]),
        unit="events/s",
        baseline=BASELINE,
        baseline_value=round(rate[1]),
        ratio=round(speedup[top], 3),
        ratio_definition=f"median over rounds of {top} workers ÷ 1 worker (same round), whole run",
        target=(
            f"modelled efficiency ≥ {TARGET_EFFICIENCY} up to 64 workers, and at 64 workers the "
            "projected day keeps up and closes within a day"
        ),
        target_met=the_model["target_met"],
        runs=rounds,
        size=f"{n:,} events, {users:,} users a day, {DAYS} days, {PARTITIONS} partitions",
        detail="; ".join(parts)
        + f"; the broker and PostgreSQL share the machine's {os.cpu_count()} cores; 1-min load "
        f"average {min(loads):.1f}–{max(loads):.1f}; " + model_text,
        speedup={str(w): round(s, 3) for w, s in speedup.items()},
        worker_cpu_us_per_event={str(w): round(c, 2) for w, c in cpu.items()},
        pg_cpu_us_per_event={str(w): round(c, 2) for w, c in pg.items()},
        arms_summary={
            str(w): {
                "events_per_s": _med([a["events_per_s"] for a in arms[w]]),
                "events_per_s_after_start": _med([a["events_per_s_after_start"] for a in arms[w]]),
                "release_latency_s": _med([a["release_latency_s"] for a in arms[w]]),
                "barrier_skew_s": _med([a["barrier_skew_s"] for a in arms[w]]),
                "records_read_ratio": _med([a["records_read"] for a in arms[w]]) / n,
                "reassignments": _med([a["reassignments"] for a in arms[w]]),
                "start_s": _med([a["start_s"] for a in arms[w]]),
            }
            for w in WORKERS
        },
        model_efficiency_up_to_64=round(eff_64, 3),
        model=the_model,
        load_average_1min=[round(x, 2) for x in loads],
    )


def measure(size: Size) -> dict[str, Any]:
    """Every arm of both entries (a broker and PostgreSQL started here unless given)."""
    started = time.perf_counter()
    n = size.events
    with broker() as bootstrap, postgres() as pg:
        topic = f"bench-cluster-events-{uuid.uuid4().hex[:8]}"
        users = fill_topic(bootstrap, topic, n, DAYS, PARTITIONS, size.users_a_day)
        pairs: list[dict[str, dict[str, Any]]] = []
        vs_loads: list[float] = []
        for i in range(size.pairs):
            pair: dict[str, dict[str, Any]] = {}
            for who in ("single", "cluster") if i % 2 == 0 else ("cluster", "single"):
                if who == "single":
                    pair[who] = single_arm(bootstrap, topic, pg, n, spy=True)
                else:
                    pair[who] = cluster_arm(1, bootstrap, topic, pg, n, spy=True)
                vs_loads.append(os.getloadavg()[0])
            pairs.append(pair)
        arms: dict[int, list[dict[str, Any]]] = {w: [] for w in WORKERS}
        scale_loads: list[float] = []
        for i in range(size.rounds):
            order = WORKERS[i % len(WORKERS) :] + WORKERS[: i % len(WORKERS)]
            for w in order:
                arms[w].append(cluster_arm(w, bootstrap, topic, pg, n))
                scale_loads.append(os.getloadavg()[0])
    return {
        "events": n,
        "users_a_day": users,
        "pairs": pairs,
        "arms": arms,
        "vs_loads": vs_loads,
        "scale_loads": scale_loads,
        "wall_s": round(time.perf_counter() - started, 1),
        "machine": machine(),
        "size": asdict(size),
    }


def entries_of(measured: dict[str, Any]) -> list[dict[str, Any]]:
    """Both entries, the model in the second, from ``measure``'s arms (also as read back from
    ``RESULT_FILE``: ``--recompute``)."""
    n, users = measured["events"], measured["users_a_day"]
    arms = {int(w): rows for w, rows in measured["arms"].items()}
    pairs = measured["pairs"]
    the_model = model(model_inputs(pairs, arms, n, users))
    entries = [
        _vs_entry(pairs, n, users, measured["vs_loads"]),
        _scale_entry(arms, n, users, the_model, measured["scale_loads"]),
    ]
    for e in entries:
        e["wall_s_of_both_entries"] = measured["wall_s"]
    return entries


def _write(measured: dict[str, Any], entries: list[dict[str, Any]]) -> None:
    RESULT_FILE.write_text(json.dumps({"entries": entries, "measured": measured}, indent=2) + "\n")


def run(quick: bool = False) -> list[dict[str, Any]]:
    if quick:
        reason = (
            "not in --quick: a broker, PostgreSQL and 30 worker processes (smoke: "
            "python -m benchmarks.bench_cluster --small)"
        )
        return [
            skipped(VS_NAME, "µs CPU per event", VS_BASELINE, reason),
            skipped(NAME, "events/s", BASELINE, reason),
        ]
    measured = measure(full_size())
    _write(measured, [])  # the arms first: an error in the figures does not lose them
    entries = entries_of(measured)
    _write(measured, entries)
    return entries


def markdown(entries: list[dict[str, Any]]) -> str:
    """The figures of docs/performance.md's "Scale-out" section, from the two entries."""
    vs, scale = entries
    steps = vs["steps_us_per_event"]
    out = [
        "| CPU per event | single process | one worker | PostgreSQL | (worker + PostgreSQL) "
        "÷ single | PostgreSQL ÷ worker |",
        "|---|---|---|---|---|---|",
        f"| median of {vs['runs']} pairs | {vs['single_cpu_us_per_event']:.1f} µs | "
        f"{vs['worker_cpu_us_per_event']:.1f} µs | {vs['pg_cpu_us_per_event']:.1f} µs | "
        f"**{vs['ratio']:.2f}** (pairs {', '.join(f'{r:.2f}' for r in vs['ratio_per_pair'])}; "
        f"target ≤ {TARGET_TOTAL_RATIO}) | **{vs['pg_share_of_worker']:.2f}** (target ≤ "
        f"{TARGET_PG_SHARE}) |",
        "",
        "| step (µs per event) | single process | one worker |",
        "|---|---|---|",
        *(f"| {s} | {steps['single'][s]:.2f} | {steps['cluster'][s]:.2f} |" for s in ALL_STEPS),
        f"| **total** | {sum(steps['single'].values()):.2f} | "
        f"{sum(steps['cluster'].values()):.2f} |",
        "",
        "| workers | events/s | after start-up | speed-up (paired) | worker CPU per event | "
        "PostgreSQL CPU per event | release latency | barrier skew | records read ÷ input |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    arms = scale["arms_summary"]
    for w in WORKERS:
        a = arms[str(w)]
        out.append(
            f"| {w} | {a['events_per_s']:,.0f} | {a['events_per_s_after_start']:,.0f} | "
            f"{scale['speedup'][str(w)]:.2f} | {scale['worker_cpu_us_per_event'][str(w)]:.1f} µs | "
            f"{scale['pg_cpu_us_per_event'][str(w)]:.1f} µs | {a['release_latency_s']:.2f} s | "
            f"{a['barrier_skew_s']:.2f} s | {a['records_read_ratio']:.2f} |"
        )
    m = scale["model"]
    i = m["inputs"]
    out += [
        "",
        "| model input (measured here) | value |",
        "|---|---|",
        "| worker CPU per record read, start-up left out, 1 / 2 / 4 workers | "
        + " / ".join(f"{v:.1f}" for v in i["worker_cpu_us_per_record"].values())
        + f" µs (growth γ = {m['growth_worker_cpu_per_doubling']:.3f} per doubling) |",
        f"| of which per event (fetch … accumulate) : per user-day (close, commit, release) | "
        f"{i['event_steps_us']:.2f} : {i['day_steps_us_per_user_day']:.2f} |",
        "| PostgreSQL CPU per ledger commit by users debited | "
        + "; ".join(f"{float(k):,.0f} users: {v:.2f} s" for k, v in i["pg_cpu_s_by_users"].items())
        + f" (fit b·u^β: β = {m['pg_beta']:.2f}) |",
        f"| releaser, per day (all partitions committed → releases sent) | "
        f"{i['releaser_s_per_day']:.2f} s |",
        "| barrier skew (first → last partition commit of a day), 1 / 2 / 4 workers | "
        + " / ".join(f"{v:.2f}" for v in i["barrier_skew_s"].values())
        + f" s (σ = {m['skew_sigma_s']:.2f} s) |",
        "| ledger commit by users debited (one point per worker count) | "
        + "; ".join(f"{float(k):,.0f} users: {v:.2f} s" for k, v in i["commit_s_by_users"].items())
        + f" (fit a·u^α: α = {m['commit_alpha']:.2f}) |",
        "| rebuild on assignment: partition-days read again per reassignment | "
        + (
            "none seen"
            if i["reread_per_reassignment"] is None
            else f"{i['reread_per_reassignment']:.2f}"
        )
        + " |",
        f"| group settle (spawn → every worker ready), {max(WORKERS)} workers | "
        f"{i['settle_s']:.1f} s |",
        f"| a worker's start-up CPU | {i['startup_cpu_s']:.1f} s |",
        "",
        f"| projected ({SCENARIO_EVENTS:,} events, {SCENARIO_USER_DAYS:,} user-days a day) "
        "| " + " | ".join(f"{r['workers']} workers" for r in m["projected"]) + " |",
        "|---" * (1 + len(m["projected"])) + "|",
    ]
    rows = [
        ("efficiency (speed-up ÷ N; target ≥ 0.8 to 64)", "efficiency", "{:.2f}"),
        ("worker CPU per event", "worker_cpu_us_per_event", "{:.1f} µs"),
        ("worker busy (share of a day)", "worker_busy_fraction", "{:.2f}"),
        ("PostgreSQL cores, day average", "pg_cores_average", "{:,.1f}"),
        ("PostgreSQL cores during the day close", "pg_cores_during_close", "{:,.0f}"),
        ("day close (midnight → released)", "day_close_s", "{:,.0f} s"),
        ("release latency (first commit → released)", "release_latency_s", "{:.2f} s"),
        ("rebalance (one worker leaves)", "rebalance_s", "{:,.0f} s"),
    ]
    for label, key, fmt in rows:
        out.append(f"| {label} | " + " | ".join(fmt.format(r[key]) for r in m["projected"]) + " |")
    out.append(
        f"\nMachines (one worker core each) to keep up at {Scenario().planned_busy:.0%} busy: "
        f"{m['machines_needed']}."
    )
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", action="store_true", help="smoke test: small input, 1 pair")
    parser.add_argument(
        "--markdown",
        action="store_true",
        help=f"print the Scale-out section's tables from {RESULT_FILE.name}",
    )
    parser.add_argument(
        "--recompute",
        action="store_true",
        help=f"recompute the entries and the model from the arms in {RESULT_FILE.name}",
    )
    args = parser.parse_args()
    if args.small:
        print(json.dumps(entries_of(measure(SMALL)), indent=2))
    elif args.markdown:
        print(markdown(json.loads(RESULT_FILE.read_text())["entries"]))
    elif args.recompute:
        measured = json.loads(RESULT_FILE.read_text())["measured"]
        entries = entries_of(measured)
        _write(measured, entries)
        print(json.dumps(entries, indent=2))
    else:
        print(json.dumps(run(), indent=2))


if __name__ == "__main__":
    main()
