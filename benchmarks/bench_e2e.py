"""``e2e_file_days``: ``streamfilter run --until-end`` on a JSONL file ÷ single-threaded DuckDB.

The whole operation a user waits for, from a cold process to the last release, against the
strongest single-machine alternative a user would pick for the same file:

* the stream: ``n_users`` users over ``DAYS`` days, each user active on a day with probability
  0.6, one event per active user-day plus 2% repeated events (same ``event_id``); each event has
  ``active`` (1), ``minutes`` (a float, two decimals) and ``plan`` (one of 3 categories);
* streamfilter: ``streamfilter run --config … --until-end`` (a new process: imports, config,
  SQLite state, file source and sink), three standing queries — a sum (``minutes``), a
  3-category histogram (``plan``) and a linear query (``active``, ``minutes`` → 2 outputs) —
  with the privacy filter, noise, durable day commits and releases;
* baseline: DuckDB (``SET threads = 1``), a new process too, doing the same parse (typed
  ``read_json``), dedupe by (user, day, event id), per-user group, clip (L2, per query) and sum
  per day and query — without privacy accounting, noise or durable state.

Each arm runs in its own child process (``--child``), which reports its wall time and peak RSS
(``ru_maxrss`` of its own child); arms alternate which goes first, ≥ 5 pairs (``--quick``: 1).

Deferred work is counted: a ``--until-end`` run leaves its budget-log entries for the next run's
upkeep to fold into the budgets table (docs/design.md §5.1). In a steady state of one run after
another each run pays its predecessor's fold, as large as its own, so the headline streamfilter
time is the run plus the fold it leaves (timed right after it, on its state). ratio = median over
the pairs of ((streamfilter run + its fold) seconds ÷ DuckDB seconds); the ratio without the fold
and the peak-RSS ratio are reported beside it. Target: ≤ 2 for both.
"""

from __future__ import annotations

import json
import os
import random
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import entry, skipped

NAME = "e2e_file_days"
BASELINE = "DuckDB 1 thread: parse, dedupe, group, clip, sum"
DAYS = ["2026-03-01", "2026-03-02", "2026-03-03"]
TARGET = 2.0
QUERIES = [
    {"query_id": "minutes", "kind": "sum", "features": ["minutes"], "clip": 60.0},
    {
        "query_id": "plans",
        "kind": "histogram",
        "feature": "plan",
        "categories": ["free", "pro", "team"],
        "clip": 1.0,
    },
    {
        "query_id": "engagement",
        "kind": "linear",
        "weights": {"active": [1.0, 0.0], "minutes": [0.0, 0.1]},
        "clip": 5.0,
    },
]
CONFIG = """
[privacy]
b_norm = 6.0
rho = 0.4
mechanism = "gaussian"
exhaustion = "clip"

[source]
kind = "file"
path = "events.jsonl"

[queries]
kind = "file"
path = "queries.jsonl"

[sink]
kind = "file"
path = "releases.jsonl"

[state]
path = "state.db"
"""
# the same per-user vectors as the three queries, clipped in L2 as the filter clips them
DUCKDB_SQL = """
SET threads = 1;
CREATE TEMP TABLE out AS
WITH ev AS (
  SELECT * FROM read_json('{path}', format = 'newline_delimited', columns = {{
    user_id: 'VARCHAR', day: 'VARCHAR', event_id: 'VARCHAR',
    "values": 'STRUCT(active DOUBLE, minutes DOUBLE, plan VARCHAR)'}})
), dedup AS (
  SELECT DISTINCT ON (day, user_id, event_id) * FROM ev
), users AS (
  SELECT day, user_id,
    coalesce(sum("values".minutes), 0) AS minutes,
    coalesce(sum("values".active), 0) AS active,
    count(*) FILTER (WHERE "values".plan = 'free') AS free,
    count(*) FILTER (WHERE "values".plan = 'pro') AS pro,
    count(*) FILTER (WHERE "values".plan = 'team') AS team
  FROM dedup GROUP BY day, user_id
), clipped AS (
  SELECT day,
    greatest(-60.0, least(60.0, minutes)) AS m,
    1.0 / greatest(1.0, sqrt(free * free + pro * pro + team * team)) AS hs, free, pro, team,
    5.0 / greatest(5.0, sqrt(active * active + 0.01 * minutes * minutes)) AS ls, active, minutes
  FROM users
)
SELECT day, sum(m), sum(hs * free), sum(hs * pro), sum(hs * team),
  sum(ls * active), sum(ls * 0.1 * minutes)
FROM clipped GROUP BY day ORDER BY day;
"""


def write_stream(path: Path, n_users: int, seed: int = 0) -> int:
    """The JSONL stream (day by day, users shuffled within a day); returns the event count."""
    rng = random.Random(seed)
    plans = ["free", "pro", "team"]
    n = 0
    with path.open("w") as f:
        for d, day in enumerate(DAYS):
            users = [u for u in range(n_users) if rng.random() < 0.6]
            rng.shuffle(users)
            lines = []
            for u in users:
                line = json.dumps(
                    {
                        "user_id": f"user-{u}",
                        "day": day,
                        "event_id": f"e{u}-{d}",
                        "values": {
                            "active": 1,
                            "minutes": round(rng.expovariate(1 / 20), 2),
                            "plan": plans[u % 3],
                        },
                    }
                )
                lines.append(line)
                if rng.random() < 0.02:  # a redelivered event: counted once
                    lines.append(line)
            f.write("\n".join(lines) + "\n")
            n += len(lines)
    return n


_CLOSED = re.compile(r"closed day \S+: \d+ releases in ([0-9.]+)s")


def _child(argv: list[str]) -> None:
    """Run one arm; print its wall and CPU seconds, peak RSS (MiB) and, from the daemon's log, the
    seconds its day closes took (records, filter, noise, durable commit, publish) as JSON."""
    t0 = time.perf_counter()
    done = subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    closes = _CLOSED.findall(done.stderr.decode(errors="replace"))
    close_s = sum(map(float, closes))
    print(
        json.dumps(
            {
                "seconds": wall,
                "cpu_seconds": usage.ru_utime + usage.ru_stime,
                "peak_rss_mib": usage.ru_maxrss / 1024,
                "close_seconds": close_s,
            }
        )
    )


ROOT = Path(__file__).resolve().parent.parent
#: the arms' environment: no PYTHONPATH, so that each checkout's interpreter imports its own package
_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
#: the upkeep measured by the arm's own package (``compare_commits``: another checkout's)
_UPKEEP = (
    "import json, sys, time; from pathlib import Path; from benchmarks.common import upkeep_left; "
    "t = time.process_time(); entries, seconds = upkeep_left(Path(sys.argv[1])); "
    "print(json.dumps([entries, seconds, time.process_time() - t]))"
)


def _arm(argv: list[str], cwd: Path) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_e2e", "--child", *argv],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
        env={**_ENV, "E2E_CWD": str(cwd)},
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def streamfilter_arm(
    work: Path, run_dir: Path, python: str = sys.executable, root: Path = ROOT
) -> dict[str, float]:
    """One streamfilter arm: the ``streamfilter`` next to ``python`` (another checkout's, with
    its ``root``, for ``compare_commits``), then the fold it leaves, timed by that package."""
    run_dir.mkdir()
    (run_dir / "events.jsonl").symlink_to(work / "events.jsonl")
    (run_dir / "queries.jsonl").write_text(
        "".join(json.dumps({**q, "from_day": DAYS[0]}) + "\n" for q in QUERIES)
    )
    (run_dir / "config.toml").write_text(CONFIG)
    exe = str(Path(python).with_name("streamfilter"))
    argv = [exe, "run", "--config", str(run_dir / "config.toml"), "--until-end"]
    result = _arm(["--cwd", str(run_dir), *argv], run_dir)
    upkeep = subprocess.run(
        [python, "-c", _UPKEEP, str(run_dir / "state.db")],
        cwd=root,
        env=_ENV,
        check=True,
        capture_output=True,
        text=True,
    )
    entries, seconds, cpu_seconds = json.loads(upkeep.stdout)
    result.update(upkeep_entries=entries, upkeep_seconds=seconds, upkeep_cpu_seconds=cpu_seconds)
    return result


def duckdb_arm(work: Path) -> dict[str, float]:
    sql = DUCKDB_SQL.format(path=work / "events.jsonl")
    code = f"import duckdb; duckdb.connect().execute({sql!r})"
    return _arm([sys.executable, "-c", code], work)


def run(quick: bool = False, runs: int | None = None, n_users: int | None = None) -> list[dict]:
    try:
        import duckdb  # noqa: F401
    except ImportError:
        return [skipped(NAME, "s", BASELINE, "duckdb not installed (pip install -e '.[bench]')")]
    n_users = n_users or (10_000 if quick else 1_000_000)
    runs = runs or (1 if quick else 5)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        n_events = write_stream(work / "events.jsonl", n_users)
        size_mib = (work / "events.jsonl").stat().st_size / 2**20
        pairs = []
        for i in range(runs):
            arms = ["streamfilter", "duckdb"] if i % 2 == 0 else ["duckdb", "streamfilter"]
            pair = {}
            for who in arms:
                if who == "duckdb":
                    pair[who] = duckdb_arm(work)
                else:
                    pair[who] = streamfilter_arm(work, work / f"run{i}")
            pairs.append(pair)
    for p in pairs:
        sf = p["streamfilter"]
        sf["steady_seconds"] = sf["seconds"] + sf["upkeep_seconds"]
    ratios = [p["streamfilter"]["steady_seconds"] / p["duckdb"]["seconds"] for p in pairs]
    without_upkeep = statistics.median(
        p["streamfilter"]["seconds"] / p["duckdb"]["seconds"] for p in pairs
    )
    upkeep_entries = int(pairs[0]["streamfilter"]["upkeep_entries"])
    upkeep_s = statistics.median(p["streamfilter"]["upkeep_seconds"] for p in pairs)
    ratio = statistics.median(ratios)
    rss_ratio = statistics.median(
        p["streamfilter"]["peak_rss_mib"] / p["duckdb"]["peak_rss_mib"] for p in pairs
    )
    sf_s = statistics.median(p["streamfilter"]["steady_seconds"] for p in pairs)
    sf_run_s = statistics.median(p["streamfilter"]["seconds"] for p in pairs)
    db_s = statistics.median(p["duckdb"]["seconds"] for p in pairs)
    sf_close = statistics.median(p["streamfilter"]["close_seconds"] for p in pairs)
    sf_rss = statistics.median(p["streamfilter"]["peak_rss_mib"] for p in pairs)
    db_rss = statistics.median(p["duckdb"]["peak_rss_mib"] for p in pairs)
    load = os.getloadavg()[0]
    return [
        entry(
            NAME,
            value=round(sf_s, 2),
            unit="s",
            baseline=BASELINE,
            baseline_value=round(db_s, 2),
            ratio=round(ratio, 2),
            ratio_definition=(
                "median of (streamfilter run + the budget-log fold it defers) s ÷ DuckDB s, "
                "paired runs (lower is better)"
            ),
            target=f"≤ {TARGET:g}× time and RSS",
            target_met=ratio <= TARGET and rss_ratio <= TARGET,
            runs=runs,
            size=f"{n_users:,} users × {len(DAYS)} days, {n_events:,} events ({size_mib:.0f} MiB)",
            detail=(
                f"`streamfilter run --until-end` (new process, SQLite state, 3 queries: sum, "
                f"3-category histogram, linear d=2) vs DuckDB {_duckdb_version()} with 1 thread "
                f"(typed read_json, DISTINCT ON event id, group by user, L2 clip, sums); wall "
                f"ratios {', '.join(f'{r:.2f}' for r in ratios)}; "
                f"streamfilter's {sf_s:.2f} s are the run ({sf_run_s:.2f} s: the {len(DAYS)} day "
                f"closes — records, filter, noise, durable commit, publish — take "
                f"{sf_close:.2f} s, start-up plus ingest the rest) and the fold of the "
                f"{upkeep_entries:,} budget-log entries it leaves to the next run's upkeep "
                f"({upkeep_s:.2f} s, timed right after it); without the fold the ratio is "
                f"{without_upkeep:.2f}; "
                f"peak RSS {sf_rss:.0f} MiB vs {db_rss:.0f} MiB (ratio {rss_ratio:.2f}); "
                f"1-min load average at the end: {load:.1f}"
            ),
            close_seconds=round(sf_close, 2),
            peak_rss_mib=round(sf_rss),
            baseline_peak_rss_mib=round(db_rss),
            rss_ratio=round(rss_ratio, 2),
            ratio_without_upkeep=round(without_upkeep, 2),
            run_seconds=round(sf_run_s, 2),
            upkeep_seconds=round(upkeep_s, 2),
            upkeep_left_entries=upkeep_entries,
            load_average=round(load, 1),
        )
    ]


def _duckdb_version() -> str:
    import duckdb

    return str(duckdb.__version__)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        args = sys.argv[2:]
        if args[:1] == ["--cwd"]:
            os.chdir(args[1])
            args = args[2:]
        _child(args)
    else:
        users = int(sys.argv[sys.argv.index("--users") + 1]) if "--users" in sys.argv else None
        print(json.dumps(run(quick="--quick" in sys.argv, n_users=users), indent=2))
