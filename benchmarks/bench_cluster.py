"""``cluster_workers``: events/s of 1, 2 and 3 cluster workers on the same topic.

One broker (started like the tests start it, or ``KAFKA_BOOTSTRAP``) and one PostgreSQL server
(``deploy/postgres/pg-up.sh`` on a free port, ``fsync`` on, or ``STREAMFILTER_PG_URL``). The
events topic (6 partitions, keyed by ``user_id``) is filled once with ``n`` events over 4 days;
then, for each worker count in turn (the order rotates between rounds), a fresh ledger schema,
consumer group and releases topic, and that many real ``streamfilter run --config cluster.toml``
processes, each with its own ``/metrics``. Measured per arm:

* **events/s, whole run**: ``n`` ÷ the seconds from spawning the workers until every day's
  releases are published (process start-up, group join, every day close, the releaser, the
  outbox) — what an operator waits for; and **after start-up**: from the moment every worker
  answers ``/readyz`` 200;
* per worker: records read and seconds in PostgreSQL commits (its ``/metrics`` at the end; the
  commits also per 1M debited users), seconds in its partition day closes (its INFO log lines),
  and peak RSS (``VmHWM``);
* **release latency**: per day, from the moment the ledger holds every partition's commit of the
  day to the moment the day's releases are marked sent (polled every 50 ms).

Each round runs every worker count once (the order rotates between rounds, 5 rounds), so the
speed-up of w workers is paired within a round: ratio = median over the rounds of (events/s(w) ÷
events/s(1) of the same round). A 2-core machine bounds it by the cores. The detail adds a
*model*, not a measurement: Amdahl's law fitted to the paired 1- and 2-worker speed-up after
start-up (``s`` = the serial fraction: the releaser, the day barrier, PostgreSQL), with what it
predicts for 3 workers on ≥ 3 cores — an extrapolation from two points, labelled as such in the
entry (``model_*`` keys). Not run by ``--quick`` (a broker, a database and nine
worker processes do not fit the minute).
"""

from __future__ import annotations

import json
import os
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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from kafka import KafkaAdminClient
from kafka.admin import NewTopic

from benchmarks.bench_kafka import BrokerUnavailable, broker, fill_topic
from benchmarks.common import entry, skipped
from streamfilter.policies import standing_monitoring

NAME = "cluster_workers"
BASELINE = "1 worker, same topic and ledger"
PARTITIONS = 6
DAYS = 4
WORKERS = (1, 2, 3)
ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def postgres() -> Iterator[str]:
    """``STREAMFILTER_PG_URL``, or a throw-away server (fsync on) started and stopped here."""
    external = os.environ.get("STREAMFILTER_PG_URL", "").strip()
    if external:
        yield external
        return
    run_dir = tempfile.mkdtemp(prefix="streamfilter-bench-pg-")
    env = {**os.environ, "PG_PORT": str(_free_port()), "PG_RUN_DIR": run_dir, "PG_FSYNC": "on"}
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
        yield up.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run(
            ["bash", str(ROOT / "deploy/postgres/pg-down.sh")], env=env, capture_output=True
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(work: Path, bootstrap: str, topic: str, pg: str, schema: str) -> tuple[Path, str]:
    url = urlsplit(pg)
    bare = urlunsplit(url._replace(netloc=f"{url.username}@{url.hostname}:{url.port}"))
    releases = f"bench-cluster-releases-{uuid.uuid4().hex[:8]}"
    queries = work / "queries.jsonl"
    queries.write_text("".join(json.dumps(q) + "\n" for q in standing_monitoring([], "2026-01-01")))
    cfg = work / f"{schema}.toml"
    cfg.write_text(
        f"""
[privacy]
b_norm = 8.0
rho = 0.5
[window]
allowed_lateness = "0s"
idle_timeout = "1s"
poll_interval = "0.1s"
[cluster]
enabled = true
session_timeout = "10s"
heartbeat_interval = "1s"
[kafka]
bootstrap_servers = "{bootstrap}"
group_id = "bench-{schema}"
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
path = "{work / (schema + "-rejects.jsonl")}"
[state]
kind = "postgres"
url = "{bare}"
pg_schema = "{schema}"
password_env = "SF_BENCH_PG_PASSWORD"
[metrics]
enabled = true
port = 0
"""
    )
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(releases, 1, 1)])
    admin.close()
    return cfg, url.password or ""


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


def _closes_seconds(log: str) -> float:
    """Seconds of a worker's partition day closes (filter, partial sums and the commit), from
    its INFO lines ``committed day D for partition(s) … in X s``."""
    total = 0.0
    for line in log.splitlines():
        if " committed day " in line and line.rstrip().endswith("s"):
            total += float(line.rsplit(" in ", 1)[1].rstrip().rstrip("s"))
    return total


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _arm(workers: int, bootstrap: str, topic: str, pg: str, n: int, users: int) -> dict:
    import psycopg

    schema = f"bench_{uuid.uuid4().hex[:10]}"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cfg, password = _config(work, bootstrap, topic, pg, schema)
        env = {**os.environ, "SF_BENCH_PG_PASSWORD": password}
        ports = [_free_port() for _ in range(workers)]
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
        ready_at: float | None = None
        committed_at: dict[str, float] = {}
        sent_at: dict[str, float] = {}
        try:
            with psycopg.connect(pg, autocommit=True) as db:
                while len(sent_at) < DAYS:
                    for p in procs:
                        if p.poll() is not None:
                            raise RuntimeError(
                                f"worker exited {p.returncode}: "
                                + (work / f"w{procs.index(p)}.log").read_text()[-2000:]
                            )
                    now = time.perf_counter()
                    if ready_at is None and all(
                        _get(f"http://127.0.0.1:{port}/readyz")[0] == 200 for port in ports
                    ):
                        ready_at = now
                    for day, done, unsent in _day_progress(db, schema):
                        if done:
                            committed_at.setdefault(day, now)
                        if done and unsent == 0 and day in _released(db, schema):
                            sent_at.setdefault(day, now)
                    time.sleep(0.05)
            done_at = time.perf_counter()
            metrics = [_get(f"http://127.0.0.1:{port}/metrics")[1] for port in ports]
            rss = [_peak_rss_mib(p.pid) for p in procs]
            cpu = [_cpu_seconds(p.pid) for p in procs]
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
    read = [_sample(m, "streamfilter_records_consumed_total") for m in metrics]
    close_s = [_closes_seconds(log) for log in logs]
    commit_s = [_sample(m, "streamfilter_state_store_commit_seconds_sum") for m in metrics]
    assert round(sum(read)) >= n, (read, n)  # a rebalance may re-read; never fewer
    latency = [sent_at[d] - committed_at[d] for d in sorted(sent_at)]
    return {
        "workers": workers,
        "events_per_s": n / (done_at - t0),
        "events_per_s_after_start": n / (done_at - (ready_at or t0)),
        "start_s": (ready_at or t0) - t0,
        "per_worker": [
            {
                "records": round(r),
                "day_close_s": round(c, 2),
                "commit_s": round(k, 2),
                "peak_rss_mib": round(m),
                "cpu_s": round(u, 2),
            }
            for r, c, k, m, u in zip(read, close_s, commit_s, rss, cpu, strict=True)
        ],
        "worker_cpu_s": sum(cpu),
        "commit_s_per_1m_users": sum(commit_s) / (users * DAYS) * 1e6,
        "release_latency_s": statistics.median(latency),
    }


def _day_progress(db, schema: str) -> list[tuple[str, bool, int]]:
    """(day, every pinned partition committed, releases of the day not yet sent); nothing
    before the first worker created the ledger."""
    exists = db.execute("SELECT to_regclass(%s)", (f"{schema}.cluster_days",)).fetchone()[0]
    if exists is None:
        return []
    rows = db.execute(
        f"SELECT d.day, d.partitions, "
        f"(SELECT count(*) FROM {schema}.cluster_commits c WHERE c.day = d.day), "
        f"(SELECT count(*) FROM {schema}.releases r WHERE r.day = d.day AND NOT r.sent) "
        f"FROM {schema}.cluster_days d"
    ).fetchall()
    return [(day, committed >= pinned, unsent) for day, pinned, committed, unsent in rows]


def _released(db, schema: str) -> set[str]:
    rows = db.execute(f"SELECT day FROM {schema}.cluster_days WHERE released").fetchall()
    return {day for (day,) in rows}


def _amdahl(speedup_2: float) -> float:
    """Serial fraction s of S(2) = 1 / (s + (1 − s)/2)."""
    return min(1.0, max(0.0, 2.0 / speedup_2 - 1.0))


def run(quick: bool = False) -> list[dict[str, object]]:
    if quick:
        return [
            skipped(
                NAME,
                "events/s",
                BASELINE,
                "not in --quick: a broker, PostgreSQL and nine worker processes (make bench)",
            )
        ]
    n, rounds = 240_000, 5
    with broker() as bootstrap, postgres() as pg:
        topic = f"bench-cluster-events-{uuid.uuid4().hex[:8]}"
        users = fill_topic(bootstrap, topic, n, DAYS, PARTITIONS)
        arms: dict[int, list[dict]] = {w: [] for w in WORKERS}
        for i in range(rounds):
            order = WORKERS[i % len(WORKERS) :] + WORKERS[: i % len(WORKERS)]
            for w in order:
                arms[w].append(_arm(w, bootstrap, topic, pg, n, users))
    return [_entry(arms, n, users, rounds)]


def _median(arms: list[dict], key: str) -> float:
    return statistics.median(a[key] for a in arms)


def _entry(arms: dict[int, list[dict]], n: int, users: int, rounds: int) -> dict[str, object]:
    rate = {w: _median(a, "events_per_s") for w, a in arms.items()}
    after = {w: _median(a, "events_per_s_after_start") for w, a in arms.items()}
    # paired within each round: every worker count ran once per round, in rotating order
    per_round = {
        w: [a["events_per_s"] / b["events_per_s"] for a, b in zip(arms[w], arms[1], strict=True)]
        for w in WORKERS
    }
    speedup = {w: statistics.median(per_round[w]) for w in WORKERS}
    speedup_2_after = statistics.median(
        a["events_per_s_after_start"] / b["events_per_s_after_start"]
        for a, b in zip(arms[2], arms[1], strict=True)
    )
    s = _amdahl(speedup_2_after)
    cores = os.cpu_count() or 1
    predicted_3_here = 1 / (s + (1 - s) / min(3, cores))
    predicted_3 = 1 / (s + (1 - s) / 3)
    # CPU per event of all workers together: flat in w means the group adds little work, so
    # with a free core per worker the rate would grow with w up to the partitions
    cpu_us = {w: _median(a, "worker_cpu_s") / n * 1e6 for w, a in arms.items()}
    parts = []
    for w in WORKERS:
        last = arms[w][-1]
        per = "; ".join(
            f"w{i}: {p['records']:,} records, close {p['day_close_s']} s, "
            f"commit {p['commit_s']} s, CPU {p['cpu_s']} s, {p['peak_rss_mib']} MiB"
            for i, p in enumerate(last["per_worker"])
        )
        parts.append(
            f"{w} worker{'s' if w > 1 else ''}: {rate[w]:,.0f} events/s whole run, "
            f"{after[w]:,.0f} after start-up ({_median(arms[w], 'start_s'):.1f} s), "
            f"release latency {_median(arms[w], 'release_latency_s'):.2f} s, PostgreSQL "
            f"commits {_median(arms[w], 'commit_s_per_1m_users'):.1f} s per 1M debited users "
            f"[{per}]"
        )
    model = (
        "measured speed-ups per round: "
        + "; ".join(
            f"{w} workers {', '.join(f'{r:.2f}' for r in per_round[w])}" for w in WORKERS[1:]
        )
        + f"; MODEL, not measured (Amdahl's law fitted to one point, the paired 2-worker "
        f"speed-up after start-up {speedup_2_after:.2f}): serial fraction s = {s:.2f}, "
        f"predicting {predicted_3_here:.2f}x for 3 workers here ({cores} cores) and "
        f"{predicted_3:.2f}x on >= 3 cores; at most {PARTITIONS} workers (partitions) share work; "
        f"worker CPU per event (all workers): "
        + ", ".join(f"{w} worker{'s' if w > 1 else ''} {cpu_us[w]:.0f} µs" for w in WORKERS)
        + f" (the broker and PostgreSQL share the same {cores} cores)"
    )
    return entry(
        NAME,
        value=round(rate[3]),
        unit="events/s",
        baseline=BASELINE,
        baseline_value=round(rate[1]),
        ratio=round(speedup[3], 3),
        ratio_definition="median over rounds of 3 workers ÷ 1 worker (same round), whole run",
        runs=rounds,
        size=f"{n:,} events, {users:,} users a day, {DAYS} days, {PARTITIONS} partitions",
        detail="; ".join(parts) + "; " + model,
        speedup_2=round(speedup[2], 3),
        speedup_3=round(speedup[3], 3),
        model_serial_fraction=round(s, 3),
        model_predicted_speedup_3_here=round(predicted_3_here, 3),
        model_predicted_speedup_3_on_3_cores=round(predicted_3, 3),
        worker_cpu_us_per_event={str(w): round(cpu_us[w], 1) for w in WORKERS},
        arms={str(w): arms[w] for w in WORKERS},
    )
