"""The scale-out model of ``benchmarks/bench_cluster.py`` on fixed inputs: its arithmetic
properties (efficiency at most 1, falling with N, exactly 1 without overheads; the fits recover
the curves they fit; the machines it sizes are the fewest that keep up), and the py-spy step
rules on stacks as py-spy writes them. No measurement runs here."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest

from benchmarks.bench_cluster import (
    OTHER,
    START,
    THREADS,
    ScaleInputs,
    Scenario,
    _growth,
    _power_law,
    _skew_sigma,
    machines_needed,
    project,
    project_busy,
    step_of,
    step_samples,
)

#: inputs of the size a 2-core machine measures (µs, s): CPU growing with N, skew, a releaser
MEASURED = ScaleInputs(
    worker_cpu_us_per_record={1: 20.0, 2: 22.0, 4: 25.0},
    pg_cpu_s_by_users={120_000.0: 1.2, 60_000.0: 0.6, 30_000.0: 0.3},
    event_steps_us=12.0,
    day_steps_us_per_user_day=6.0,
    releaser_s_per_day=0.05,
    barrier_skew_s={1: 0.0, 2: 0.3, 4: 0.5},
    commit_s_by_users={120_000.0: 6.0, 60_000.0: 2.5, 30_000.0: 1.1},
    reread_per_reassignment=0.4,
    settle_s=3.0,
    startup_cpu_s=2.0,
)
#: no overhead at all: flat CPU per record, no skew, no releaser, no commit wait
IDEAL = dataclasses.replace(
    MEASURED,
    worker_cpu_us_per_record={1: 20.0, 2: 20.0, 4: 20.0},
    barrier_skew_s={1: 0.0, 2: 0.0, 4: 0.0},
    releaser_s_per_day=0.0,
    commit_s_by_users={},
)
WORKERS = (1, 2, 4, 8, 16, 64, 256, 1024)


def test_efficiency_is_at_most_one_and_falls_as_workers_are_added() -> None:
    rows = [project(MEASURED, w) for w in WORKERS]
    assert rows[0]["efficiency"] == pytest.approx(1.0)
    for row in rows:
        assert 0.0 < row["efficiency"] <= 1.0 + 1e-12
        assert row["speedup"] == pytest.approx(row["efficiency"] * row["workers"])
    effs = [r["efficiency"] for r in rows]
    assert all(a >= b - 1e-12 for a, b in itertools.pairwise(effs))
    # and strictly below 1 once there is growth and skew to pay for
    assert effs[-1] < 1.0


def test_without_overheads_the_model_scales_perfectly() -> None:
    for w in WORKERS:
        row = project(IDEAL, w)
        assert row["efficiency"] == pytest.approx(1.0)
        assert row["release_latency_s"] == pytest.approx(0.0)


def test_every_overhead_lowers_efficiency() -> None:
    base = project(MEASURED, 64)["efficiency"]
    slower = [
        dataclasses.replace(MEASURED, releaser_s_per_day=500.0),
        dataclasses.replace(MEASURED, barrier_skew_s={1: 0.0, 2: 300.0, 4: 500.0}),
        dataclasses.replace(MEASURED, worker_cpu_us_per_record={1: 20.0, 2: 30.0, 4: 40.0}),
    ]
    # commits that cost more per user than the day's CPU saves do not lift efficiency above 1
    quadratic = dataclasses.replace(MEASURED, commit_s_by_users={1e4: 1.0, 2e4: 4.0, 4e4: 16.0})
    assert all(project(quadratic, w)["efficiency"] <= 1.0 + 1e-12 for w in WORKERS)
    for inputs in slower:
        assert project(inputs, 64)["efficiency"] < base


def test_loads_grow_with_the_day_and_the_worker_share_shrinks_with_workers() -> None:
    day = Scenario()
    double = dataclasses.replace(
        day, events_per_day=2 * day.events_per_day, user_days_per_day=2 * day.user_days_per_day
    )
    one, two = project(MEASURED, 64, day), project(MEASURED, 64, double)
    assert two["worker_cpu_s_per_day"] == pytest.approx(2 * one["worker_cpu_s_per_day"])
    assert two["pg_cpu_s_per_day"] == pytest.approx(2 * one["pg_cpu_s_per_day"])
    assert two["rebalance_worker_cpu_s"] == pytest.approx(2 * one["rebalance_worker_cpu_s"])
    busy = [project(MEASURED, w)["worker_busy_fraction"] for w in WORKERS]
    assert all(a > b for a, b in itertools.pairwise(busy))
    closes = [project(MEASURED, w)["day_close_s"] for w in WORKERS]
    assert all(a > b for a, b in itertools.pairwise(closes))


def test_the_machines_it_sizes_are_the_fewest_that_keep_up() -> None:
    scenario = Scenario()
    n = machines_needed(MEASURED, scenario)
    assert n is not None and n > 1
    assert project_busy(MEASURED, n, scenario) <= scenario.planned_busy
    assert project_busy(MEASURED, n - 1, scenario) > scenario.planned_busy
    # CPU per record growing faster with N: more machines for the same day
    costlier = dataclasses.replace(MEASURED, worker_cpu_us_per_record={1: 20.0, 2: 40.0, 4: 60.0})
    more = machines_needed(costlier, scenario)
    assert more is not None and more > n
    assert machines_needed(costlier, scenario, limit=more // 4) is None


def test_the_fits_recover_the_curves_they_fit() -> None:
    gamma, base = 0.07, 18.0
    points = {w: base * (1 + gamma * math.log2(w)) for w in (1, 2, 4)}
    assert _growth(points) == pytest.approx(gamma)
    assert _growth({1: 10.0, 2: 9.0, 4: 8.0}) == 0.0  # never a speed-up from more workers
    a, alpha = 3e-9, 1.8
    assert _power_law({u: a * u**alpha for u in (5e3, 2e4, 8e4)}) == pytest.approx((a, alpha))
    assert _power_law({1e4: 2.0}) == pytest.approx((2.0 / 1e4, 1.0))  # one point: linear
    sigma = 0.2
    skews = {w: sigma * math.sqrt(2 * math.log(w)) if w > 1 else 0.0 for w in (1, 2, 4)}
    assert _skew_sigma(skews) == pytest.approx(sigma)


def _stack(*frames: str) -> str:
    return ";".join(frames)


MAIN = "_run_module_as_main (<frozen runpy>:198);main (streamfilter/cli/main.py:239)"


@pytest.mark.parametrize(
    ("stack", "step"),
    [
        (
            _stack(
                MAIN,
                "Daemon._run (streamfilter/runtime/daemon.py:264)",
                "KafkaSource.poll_batches (streamfilter/runtime/io/kafka.py:228)",
                "Fetcher.fetch_records (kafka/consumer/fetcher.py:300)",
            ),
            "fetch",
        ),
        (
            _stack(
                MAIN,
                "Daemon._ingest_batch (streamfilter/runtime/daemon.py:455)",
                "Engine.parse_columns (streamfilter/engine/engine.py:200)",
            ),
            "decode",
        ),
        (
            _stack(
                MAIN,
                "Daemon._ingest_batch (streamfilter/runtime/daemon.py:455)",
                "ClusterDaemon._screen_records (streamfilter/runtime/cluster_worker.py:225)",
                "murmur2 (kafka/partitioner/default.py:83)",
            ),
            "partition check",
        ),
        (
            _stack(
                MAIN,
                "Daemon._ingest_batch (streamfilter/runtime/daemon.py:460)",
                "DayAccumulator.add_columns (streamfilter/engine/records.py:300)",
            ),
            "accumulate",
        ),
        (
            _stack(
                MAIN,
                "Daemon._close_day (streamfilter/runtime/daemon.py:690)",
                "Engine.prepare_day (streamfilter/engine/engine.py:230)",
            ),
            "close",
        ),
        (
            _stack(
                MAIN,
                "Daemon._close_day (streamfilter/runtime/daemon.py:700)",
                "SQLiteStateStore.commit_day (streamfilter/runtime/store/sqlite.py:300)",
            ),
            "commit",
        ),
        (  # the engine applying a committed day in memory is part of the close
            _stack(
                MAIN,
                "Daemon._close_day (streamfilter/runtime/daemon.py:720)",
                "Engine.commit_day (streamfilter/engine/engine.py:260)",
            ),
            "close",
        ),
        (
            _stack(
                MAIN,
                "Daemon._close_day (streamfilter/runtime/daemon.py:730)",
                "Daemon._relay_outbox (streamfilter/runtime/daemon.py:740)",
                "KafkaSink.publish (streamfilter/runtime/io/kafka.py:500)",
            ),
            "release",
        ),
        (
            _stack(
                "<module> (streamfilter/__main__.py:3)",
                "_find_and_load (<frozen importlib._bootstrap>:1176)",
            ),
            START,
        ),
        (
            _stack(
                "Thread._bootstrap (threading.py:1002)",
                "Sender.run (kafka/producer/sender.py:113)",
            ),
            THREADS,
        ),
        (_stack(MAIN, "Daemon._note_new_partitions (streamfilter/runtime/daemon.py:220)"), OTHER),
        ("", OTHER),
    ],
)
def test_a_sample_goes_to_the_step_its_frames_name(stack: str, step: str) -> None:
    assert step_of(stack) == step


def test_samples_are_counted_per_step() -> None:
    raw = "\n".join(
        [
            MAIN + ";Daemon._ingest_batch (streamfilter/runtime/daemon.py:455) 7",
            MAIN + ";Daemon._close_day (streamfilter/runtime/daemon.py:690) 3",
            " 2",
        ]
    )
    assert step_samples(raw) == {"accumulate": 7, "close": 3, OTHER: 2}
