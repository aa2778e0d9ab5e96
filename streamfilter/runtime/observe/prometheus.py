"""Prometheus metrics, ``/healthz`` and ``/readyz`` for the daemon (docs/design.md §6 items 9-10).

:class:`PrometheusObserver` implements the :class:`~streamfilter.runtime.observe.observer.DaemonObserver`
hooks on an injected ``CollectorRegistry`` (tests build a fresh one and read values back with
``registry.get_sample_value``). :class:`MetricsServer` serves that registry over HTTP from a
daemon thread. :func:`metrics_endpoint` builds both from ``[metrics]``; ``build_daemon`` wires it. The HTTP side lives in ``streamfilter.runtime.observe.http``.

Which metric is which
---------------------

*Operational* metrics are exported by default. They describe the process and the input stream
as the operator already sees it (broker offsets, the state file on disk, published releases);
none carries a user id, a raw value or a pre-noise sum. They are **trusted-operator data, not
differentially private** — input volume, rejects and the state's size are exact counts that move
when users send data — so the scrape endpoint belongs to operators (bind it to a private
interface; see ``docs/observability.md``; docs/design.md §6.9). The exact counts of the input
stream say so in their HELP text (``OPERATOR DATA``).

=====================================================  =======  ===================================
metric                                                 type     meaning
=====================================================  =======  ===================================
``streamfilter_records_consumed_total{partition}``     counter  input records read (incl. rejects)
``streamfilter_rejects_total{reason}``                 counter  records refused, by reason code
``streamfilter_rejects_dropped_total``                 counter  reject records the sink refused
``streamfilter_day_closes_total``                      counter  days committed
``streamfilter_source_partitions``                     gauge    input partitions read
``streamfilter_start_time_seconds``                    gauge    process start (restarts: changes)
``streamfilter_outbox_pending_releases``               gauge    releases committed, not acked
``streamfilter_outbox_pending_since_timestamp_seconds`` gauge   outbox non-empty since (0: empty)
``streamfilter_source_offsets_skipped_total``          counter  records deleted before read
``streamfilter_source_partitions_added_total``         counter  partitions added while running
``streamfilter_releases_published_total``              counter  releases acknowledged by the sink
``streamfilter_day_close_seconds``                     histo.   prepare + commit of one day
``streamfilter_release_lag_seconds``                   gauge    end of last closed day (UTC) →
                                                                its releases acknowledged
``streamfilter_last_closed_day_timestamp_seconds``     gauge    UTC midnight starting that day
``streamfilter_allowed_lateness_seconds``              gauge    ``[window] allowed_lateness``
``streamfilter_state_store_commit_seconds``            histo.   one day's store transaction
``streamfilter_state_store_size_bytes``                gauge    state on disk (incl. WAL)
``streamfilter_consumer_lag_records{partition}``       gauge    records behind partition end
``streamfilter_failing_closed``                        gauge    1 once the store failed to commit
``streamfilter_ready``                                 gauge    1 while ``/readyz`` answers 200
``streamfilter_build_info{version,python}``            gauge    1
``streamfilter_privacy_info{mechanism,...}``           gauge    1; mechanism, exhaustion, methods
``streamfilter_privacy_rho``                           gauge    ρ of the zCDP guarantee (per user)
``streamfilter_privacy_sigma``                         gauge    σ per coordinate, data units
``streamfilter_privacy_norm_budget``                  gauge    B_norm: per-user budget on Σ‖q‖²
``streamfilter_privacy_delta``                         gauge    the configured δ
``streamfilter_privacy_epsilon``                       gauge    ε at δ, tightest sound conversion
``streamfilter_privacy_epsilon_by_conversion{...}``    gauge    ε at δ by each sound conversion
``streamfilter_privacy_granularity``                   gauge    lattice step γ
``streamfilter_privacy_ci95_halfwidth``                gauge    95% half-width per coordinate
``streamfilter_privacy_telemetry_rho``                 gauge    ``[telemetry] rho``
``streamfilter_privacy_guarantee_rho``                     gauge    ρ + telemetry ρ: the headline
``streamfilter_release_value{query_id,coordinate}``    gauge    latest *noisy* release (public)
``streamfilter_release_ci95{query_id,coordinate}``     gauge    its 95% half-width
``streamfilter_release_coverage_users{query_id}``      gauge    noisy users it covers (public)
``streamfilter_release_coverage_ci95{query_id}``       gauge    its 95% half-width
``streamfilter_release_population{query_id,coord.}``   gauge    noisy population estimate (public)
``streamfilter_release_population_ci95{query_id,c.}``  gauge    its 95% half-width
``streamfilter_analyst_share{analyst}``                gauge    configured share of every budget
``streamfilter_analyst_sub_budget{analyst}``           gauge    floor(share·B)·γ², data units
``streamfilter_analyst_releases_total{analyst}``       counter  its releases published (public)
=====================================================  =======  ===================================

*Exact* metrics are data-dependent counts of users (``ExactDayStats``). They are statistics of
users and are registered **only** when ``[metrics] trusted_operator_metrics = true``; by default
they do not exist at all. Their names say ``_exact``:

=====================================================  =======  ===================================
``streamfilter_day_users_with_records_exact``          gauge    users with a record, last day
``streamfilter_query_admitted_users_exact{query_id}``  gauge    users admitted by the filter
``streamfilter_query_refused_users_exact{query_id}``   gauge    users refused (budget exhausted)
=====================================================  =======  ===================================

Labels: ``partition`` (source partition names from the configuration), ``reason`` (a fixed set of
reject codes; anything else is counted as ``other``), ``query_id``/``coordinate`` (chosen by the
analyst or the policy, never by the data). No label ever carries a user id.

When *not* to use this: the per-user odometer (budget spent by one user) is not a metric and must
never become one — it may be shown to that user only (docs/design.md §6.11).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import platform
import threading
import time
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, ClassVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from streamfilter import __version__
from streamfilter.engine.contract import RejectReason, Release
from streamfilter.engine.day import ExactDayStats
from streamfilter.engine.params import PrivacyParams
from streamfilter.privacy.quotas import DEFAULT_ANALYST, AnalystQuotas
from streamfilter.privacy.rounding import float_down, float_up
from streamfilter.runtime.observe.observer import DaemonObserver

if TYPE_CHECKING:
    pass


log = logging.getLogger("streamfilter.metrics")


#: Reject reason codes used as label values; any other reason is counted as ``other`` so a label
#: value can never come from the input.
REJECT_REASONS = frozenset(RejectReason)


#: Names of the metrics that exist only with ``trusted_operator_metrics = true``.
EXACT_METRICS = (
    "streamfilter_day_users_with_records_exact",
    "streamfilter_query_admitted_users_exact",
    "streamfilter_query_refused_users_exact",
)


#: At most this many coordinates of one release become ``streamfilter_release_value`` series.
MAX_RELEASE_COORDINATES = 64


_MAX_LABEL_CHARS = 128


_DAY_CLOSE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


_COMMIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def _day_start_utc(day: str) -> float:
    d = dt.date.fromisoformat(day)
    return dt.datetime(d.year, d.month, d.day, tzinfo=dt.UTC).timestamp()


def _label(value: str) -> str:
    return value[:_MAX_LABEL_CHARS]


#: seconds a committed release may wait for the sink's acknowledgement before /readyz says so
OUTBOX_STALL_S = 10.0


class PrometheusObserver(DaemonObserver):
    """Daemon hooks → Prometheus metrics on ``registry`` (see the module table).

    ``params`` fills the privacy-configuration gauges once (they are data-independent).
    ``trusted_operator_metrics`` registers the ``_exact`` gauges; without it the exact counts the
    daemon hands to :meth:`day_closed` are dropped on the floor. ``wall_clock`` measures the lag
    from the end of a day to its releases (injectable for tests).

    Do not use it to export anything per user: hooks carry no user ids, and it must stay so.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        params: PrivacyParams,
        *,
        trusted_operator_metrics: bool = False,
        allowed_lateness_s: float | None = None,
        telemetry_rho: float | None = None,
        wall_clock: Callable[[], float] = time.time,
        quotas: AnalystQuotas | None = None,
    ) -> None:
        self.registry = registry
        self.trusted_operator_metrics = trusted_operator_metrics
        self.wall_clock = wall_clock
        self._is_started = False
        self._is_stopped = False
        self._is_failing_closed = False
        self._sink_outage: str | None = None
        self._source_outage: str | None = None
        self._outbox_since = 0.0
        self._outbox_pending = 0
        self._pending: tuple[str, list[Release]] | None = None
        self._release_series: set[tuple[str, str]] = set()
        r = registry

        # -- input and output volume ------------------------------------------------------
        self.records_consumed = Counter(
            "streamfilter_records_consumed_total",
            "OPERATOR DATA (exact, not differentially private; docs/design.md §6.9): input "
            "records read from the source (including rejected and duplicate ones).",
            ["partition"],
            registry=r,
        )
        self.rejects = Counter(
            "streamfilter_rejects_total",
            "OPERATOR DATA (exact, not differentially private; docs/design.md §6.9): input "
            "records and queries refused before any accounting, by reason code.",
            ["reason"],
            registry=r,
        )
        for reason in sorted(REJECT_REASONS | {"other"}):
            self.rejects.labels(reason)  # every reason exists from the start: rate() works
        self.rejects_dropped = Counter(
            "streamfilter_rejects_dropped_total",
            "Reject records the reject sink refused (skipped; the records were refused anyway).",
            registry=r,
        )
        self.source_partitions = Gauge(
            "streamfilter_source_partitions",
            "Input partitions the daemon reads (added partitions included once seen).",
            registry=r,
        )
        self.partitions_owned_gauge: Gauge | None = None  # cluster workers only (below)
        self.partitions_added = Counter(
            "streamfilter_source_partitions_added_total",
            "Input partitions added while the daemon ran (read from their beginning).",
            registry=r,
        )
        self.offsets_skipped_total = Counter(
            "streamfilter_source_offsets_skipped_total",
            "Input records deleted before they were read and skipped ([source] "
            "on_retention_gap = skip; the log names the partitions).",
            registry=r,
        )
        self.start_time = Gauge(
            "streamfilter_start_time_seconds",
            "When this daemon process started (UTC epoch seconds); its changes count restarts.",
            registry=r,
        )
        self.start_time.set(wall_clock())
        self.outbox_pending = Gauge(
            "streamfilter_outbox_pending_releases",
            "Committed releases not yet acknowledged by the sink (the outbox).",
            registry=r,
        )
        self.outbox_pending_since = Gauge(
            "streamfilter_outbox_pending_since_timestamp_seconds",
            "Since when the outbox has held unsent releases (0 while it is empty).",
            registry=r,
        )
        self.days_closed = Counter(
            "streamfilter_day_closes_total", "Days committed to the state store.", registry=r
        )
        self.releases_published = Counter(
            "streamfilter_releases_published_total",
            "Releases acknowledged by the sink (after the outbox relay).",
            registry=r,
        )
        # -- timing -----------------------------------------------------------------------
        self.day_close_seconds = Histogram(
            "streamfilter_day_close_seconds",
            "Time to close one day: prepare (noise drawn) and commit.",
            buckets=_DAY_CLOSE_BUCKETS,
            registry=r,
        )
        self.release_lag = Gauge(
            "streamfilter_release_lag_seconds",
            "Seconds from the end (UTC) of the last closed day to its releases being acknowledged.",
            registry=r,
        )
        self.last_closed_day = Gauge(
            "streamfilter_last_closed_day_timestamp_seconds",
            "Unix time of the UTC midnight that starts the last closed day.",
            registry=r,
        )
        self.allowed_lateness = Gauge(
            "streamfilter_allowed_lateness_seconds",
            "Configured [window] allowed_lateness: grace after a day ends before it may close.",
            registry=r,
        )
        if allowed_lateness_s is not None:
            self.allowed_lateness.set(allowed_lateness_s)
        # -- state store and source -------------------------------------------------------
        self.commit_seconds = Histogram(
            "streamfilter_state_store_commit_seconds",
            "Duration of one day's state-store transaction.",
            buckets=_COMMIT_BUCKETS,
            registry=r,
        )
        self.store_size = Gauge(
            "streamfilter_state_store_size_bytes",
            "On-disk size of the state store (including its write-ahead log).",
            registry=r,
        )
        self.consumer_lag = Gauge(
            "streamfilter_consumer_lag_records",
            "Records between the read position and the end of an input partition.",
            ["partition"],
            registry=r,
        )
        self.failing_closed_gauge = Gauge(
            "streamfilter_failing_closed",
            "1 once the state store failed to commit: nothing more is released; the daemon exits.",
            registry=r,
        )
        self.ready_gauge = Gauge(
            "streamfilter_ready",
            "1 while /readyz answers 200: started, store open, not failing closed, input and "
            "release sink reachable, no release waiting longer than the stall limit.",
            registry=r,
        )
        self.ready_gauge.set_function(lambda: 1.0 if self.readiness()[0] else 0.0)
        # -- identity and the privacy configuration (data-independent) --------------------
        Gauge(
            "streamfilter_build_info",
            "Build of the running streamfilter (always 1).",
            ["version", "python"],
            registry=r,
        ).labels(__version__, platform.python_version()).set(1)
        self._privacy_gauges(params)
        if telemetry_rho is not None:
            Gauge(
                "streamfilter_privacy_telemetry_rho",
                "[telemetry] rho: the separate zCDP budget of statistics about the run; a user's "
                "total guarantee is at most streamfilter_privacy_rho plus this.",
                registry=r,
            ).set(telemetry_rho)
        Gauge(
            "streamfilter_privacy_guarantee_rho",
            "The headline: each user's total zCDP for the whole run, queries plus at most the "
            "[telemetry] budget (coverage, active set, budget-stats); the population estimate "
            "is paid inside each user's filter and adds nothing.",
            registry=r,
        ).set(float_up(Fraction(params.rho) + Fraction(telemetry_rho or 0.0)))
        # -- analysts' quotas (configuration) and their published releases -----------------
        self.analyst_releases: Counter | None = None
        if quotas is not None and quotas.active:
            share = Gauge(
                "streamfilter_analyst_share",
                "An analyst's configured share of every user's budget (the default analyst: "
                "the rest).",
                ["analyst"],
                registry=r,
            )
            sub_budget = Gauge(
                "streamfilter_analyst_sub_budget",
                "An analyst's per-user sub-budget floor(share·B)·γ², data units².",
                ["analyst"],
                registry=r,
            )
            self.analyst_releases = Counter(
                "streamfilter_analyst_releases_total",
                "Releases of an analyst's queries acknowledged by the sink.",
                ["analyst"],
                registry=r,
            )
            for name in quotas.analysts:
                share.labels(name).set(float(quotas.shares[name]))
                sub_budget.labels(name).set(
                    float_down(quotas.sub_budget_units[name] * Fraction(params.granularity) ** 2)
                )
                self.analyst_releases.labels(name)
        # -- published (noisy) releases: public by construction ---------------------------
        self.release_value = Gauge(
            "streamfilter_release_value",
            "Latest published noisy value of a query coordinate, data units.",
            ["query_id", "coordinate"],
            registry=r,
        )
        self.release_ci95 = Gauge(
            "streamfilter_release_ci95",
            "95% half-width of the latest published value of a query coordinate, data units.",
            ["query_id", "coordinate"],
            registry=r,
        )
        self.release_coverage = Gauge(
            "streamfilter_release_coverage_users",
            "Noisy users the latest release covers (can still afford a full contribution).",
            ["query_id"],
            registry=r,
        )
        self.release_coverage_ci95 = Gauge(
            "streamfilter_release_coverage_ci95",
            "95% half-width of streamfilter_release_coverage_users (it follows the binary "
            "digits of the day number: docs/design.md §2.11).",
            ["query_id"],
            registry=r,
        )
        self.release_population = Gauge(
            "streamfilter_release_population",
            "Noisy estimate of a query coordinate over all users counted so far, data units.",
            ["query_id", "coordinate"],
            registry=r,
        )
        self.release_population_ci95 = Gauge(
            "streamfilter_release_population_ci95",
            "95% half-width of streamfilter_release_population, data units.",
            ["query_id", "coordinate"],
            registry=r,
        )
        # -- exact, data-dependent counts: ONLY when the operator opted in ----------------
        self.users_with_records_exact: Gauge | None = None
        self.admitted_exact: Gauge | None = None
        self.refused_exact: Gauge | None = None
        if trusted_operator_metrics:
            self.users_with_records_exact = Gauge(
                "streamfilter_day_users_with_records_exact",
                "EXACT (trusted_operator_metrics): users with a record on the last closed day.",
                registry=r,
            )
            self.admitted_exact = Gauge(
                "streamfilter_query_admitted_users_exact",
                "EXACT (trusted_operator_metrics): users the filter admitted, last closed day.",
                ["query_id"],
                registry=r,
            )
            self.refused_exact = Gauge(
                "streamfilter_query_refused_users_exact",
                "EXACT (trusted_operator_metrics): users the filter refused, last closed day.",
                ["query_id"],
                registry=r,
            )

    def _privacy_gauges(self, params: PrivacyParams) -> None:
        self.registry.register(_PrivacyGauges(params))

    # ------------------------------------------------------------------ readiness
    def readiness(self) -> tuple[bool, str]:
        """(ready, why): started, store open (not stopped), not failing closed, the input's
        broker answering, and no committed release waiting for the sink longer than
        ``OUTBOX_STALL_S`` (a publish that blocks inside the client during a broker outage
        raises nothing, so the wait itself is the signal). Evaluated at every request and
        scrape."""
        if self._is_failing_closed:
            return False, "failing closed: the state store could not commit"
        if self._is_stopped:
            return False, "stopped"
        if self._sink_outage is not None:
            return False, f"the release sink is unavailable ({self._sink_outage}); retrying"
        if self._outbox_pending and self._outbox_since:
            waited_s = self.wall_clock() - self._outbox_since
            if waited_s > OUTBOX_STALL_S:
                return False, (
                    f"{self._outbox_pending} committed releases not acknowledged by the sink "
                    f"for {waited_s:.0f} s; retrying"
                )
        if self._source_outage is not None:
            return False, f"the input is unavailable ({self._source_outage}); days wait"
        if not self._is_started:
            return False, "starting"
        return True, "ready"

    def restore(
        self,
        last_closed_day: str | None,
        releases: Sequence[Release] = (),
        store_bytes: int | None = None,
    ) -> None:
        """Seed the gauges that describe stored state (called once, after the store loaded): the
        last closed day, that day's releases (public, noisy) and the state's size on disk — so a
        restarted daemon does not read as empty until its next close."""
        if last_closed_day is not None:
            self.last_closed_day.set(_day_start_utc(last_closed_day))
        if releases:
            self._export_releases(releases)
        if store_bytes is not None:
            self.store_size.set(store_bytes)

    # ------------------------------------------------------------------ DaemonObserver
    def started(self) -> None:
        self._is_started, self._is_stopped = True, False

    def records_read(self, partition: str, count: int) -> None:
        self.records_consumed.labels(_label(partition)).inc(count)

    def rejected(self, reason: str) -> None:
        self.rejects.labels(reason if reason in REJECT_REASONS else "other").inc()

    def reject_dropped(self) -> None:
        self.rejects_dropped.inc()

    def outbox(self, pending: int) -> None:
        self._outbox_pending = pending
        self.outbox_pending.set(pending)
        if not pending:
            self._outbox_since = 0.0
        elif not self._outbox_since:
            self._outbox_since = self.wall_clock()
        self.outbox_pending_since.set(self._outbox_since)

    def sink_unavailable(self, reason: str) -> None:
        self._sink_outage = reason

    def sink_available(self) -> None:
        self._sink_outage = None

    def source_unavailable(self, reason: str) -> None:
        self._source_outage = reason

    def source_available(self) -> None:
        self._source_outage = None

    def offsets_skipped(self, partition: str, count: int) -> None:
        self.offsets_skipped_total.inc(count)

    def partitions_owned(self, owned: int) -> None:
        if self.partitions_owned_gauge is None:  # registered by cluster workers only, so that
            # a single process does not read as a worker that owns nothing
            self.partitions_owned_gauge = Gauge(
                "streamfilter_cluster_partitions_owned",
                "Cluster mode: partitions of the events topic this worker owns (the group "
                "assigned them); summed over the workers it equals streamfilter_source_partitions.",
                registry=self.registry,
            )
        self.partitions_owned_gauge.set(owned)

    def partitions(self, count: int, added: list[str]) -> None:
        self.source_partitions.set(count)
        self.partitions_added.inc(len(added))

    def day_closed(
        self,
        day: str,
        close_seconds: float,
        releases: Sequence[Release],
        exact_stats: ExactDayStats,
    ) -> None:
        self.days_closed.inc()
        self.day_close_seconds.observe(close_seconds)
        self.last_closed_day.set(_day_start_utc(day))
        if self.trusted_operator_metrics:
            self._export_exact(exact_stats)
        if releases:
            self._pending = (day, list(releases))  # exported once the sink acknowledged them
        else:
            self.release_lag.set(self.wall_clock() - _day_start_utc(day) - 86400.0)

    def _export_exact(self, stats: ExactDayStats) -> None:
        assert self.users_with_records_exact is not None
        assert self.admitted_exact is not None and self.refused_exact is not None
        self.users_with_records_exact.set(stats.users_with_records)
        for gauge, per_query in (
            (self.admitted_exact, stats.admitted_per_query),
            (self.refused_exact, stats.refused_per_query),
        ):
            gauge.clear()  # only the queries of the last closed day
            for query_id, count in per_query.items():
                gauge.labels(_label(query_id)).set(count)

    def committed(self, commit_seconds: float, store_bytes: int | None) -> None:
        self.commit_seconds.observe(commit_seconds)
        if store_bytes is not None:
            self.store_size.set(store_bytes)

    def published(self, count: int) -> None:
        self.releases_published.inc(count)
        if self._pending is None:
            return  # releases of an earlier run relayed at start-up
        day, releases = self._pending
        self._pending = None
        self.release_lag.set(self.wall_clock() - _day_start_utc(day) - 86400.0)
        self._export_releases(releases)

    def _export_releases(self, releases: Sequence[Release]) -> None:
        fresh: set[tuple[str, str]] = set()
        for rel in releases:
            qid = _label(rel.query_id)
            if self.analyst_releases is not None and not rel.query_id.startswith("_"):
                self.analyst_releases.labels(_label(rel.analyst or DEFAULT_ANALYST)).inc()
            coords = list(zip(rel.labels, rel.value, rel.ci95, strict=False))
            for j, (coordinate, value, ci95) in enumerate(coords[:MAX_RELEASE_COORDINATES]):
                key = (qid, _label(coordinate))
                self.release_value.labels(*key).set(value)
                self.release_ci95.labels(*key).set(ci95)
                if rel.population is not None:
                    self.release_population.labels(*key).set(rel.population.value[j])
                    self.release_population_ci95.labels(*key).set(rel.population.ci95[j])
                fresh.add(key)
            if rel.coverage is not None:
                self.release_coverage.labels(qid).set(rel.coverage.users)
                self.release_coverage_ci95.labels(qid).set(rel.coverage.ci95)
        for key in self._release_series - fresh:  # queries that no longer run
            for gauge in (
                self.release_value,
                self.release_ci95,
                self.release_population,
                self.release_population_ci95,
            ):
                with contextlib.suppress(KeyError):
                    gauge.remove(*key)
            for gauge in (self.release_coverage, self.release_coverage_ci95):
                with contextlib.suppress(KeyError):
                    gauge.remove(key[0])
        self._release_series = fresh

    def failing_closed(self, message: str) -> None:
        self._is_failing_closed = True
        self.failing_closed_gauge.set(1)

    def partition_lag(self, partition: str, lag_records: int) -> None:
        self.consumer_lag.labels(_label(partition)).set(lag_records)

    def stopped(self) -> None:
        self._is_stopped = True


class _PrivacyGauges(Collector):
    """The privacy configuration's gauges (``streamfilter_privacy_*``), computed at the first
    scrape and kept: the (ε, δ) statement needs scipy's root finder (~0.5 s of start-up that a
    run nobody scrapes, e.g. ``--until-end``, need not pay). Data-independent, as before."""

    def __init__(self, params: PrivacyParams) -> None:
        self._params = params
        self._lock = threading.Lock()
        self._families: list[GaugeMetricFamily] | None = None

    _INFO = (
        "streamfilter_privacy_info",
        "Privacy configuration of this run (always 1).",
        ["mechanism", "exhaustion", "epsilon_method", "rho_calibration"],
    )
    _SCALARS: ClassVar[dict[str, str]] = {
        "rho": "ρ of the per-user ρ-zCDP guarantee for the whole run.",
        "sigma": "Noise standard deviation per coordinate, data units.",
        "norm_budget": "B_norm: per-user budget on the sum of squared norms.",
        "delta": "The configured δ of the (ε, δ) statement.",
        "epsilon": "ε at the configured δ by the tightest sound conversion.",
        "granularity": "Lattice step γ of contributions and releases.",
        "ci95_halfwidth": "95% half-width of one coordinate's noise.",
    }
    _BY_CONVERSION = (
        "streamfilter_privacy_epsilon_by_conversion",
        "ε at the configured δ by each sound zCDP → (ε, δ) conversion.",
        ["conversion"],
    )

    def describe(self) -> list[GaugeMetricFamily]:
        """The families without values (what the registry checks at registration)."""
        return [
            GaugeMetricFamily(self._INFO[0], self._INFO[1], labels=self._INFO[2]),
            *(
                GaugeMetricFamily(f"streamfilter_privacy_{name}", doc)
                for name, doc in self._SCALARS.items()
            ),
            GaugeMetricFamily(*self._BY_CONVERSION[:2], labels=self._BY_CONVERSION[2]),
        ]

    def collect(self) -> list[GaugeMetricFamily]:
        with self._lock:
            if self._families is None:
                self._families = self._compute()
            return self._families

    def _compute(self) -> list[GaugeMetricFamily]:
        params = self._params
        g = params.guarantee()
        info = GaugeMetricFamily(self._INFO[0], self._INFO[1], labels=self._INFO[2])
        info.add_metric(
            [params.mechanism, str(params.exhaustion), g.method, params.rho_method], 1.0
        )
        values = {
            "rho": g.rho,
            "sigma": g.sigma,
            "norm_budget": g.b_norm,
            "delta": g.delta,
            "epsilon": g.epsilon,
            "granularity": params.granularity,
            "ci95_halfwidth": params.ci95_halfwidth,
        }
        scalars = [
            GaugeMetricFamily(f"streamfilter_privacy_{name}", doc, value=values[name])
            for name, doc in self._SCALARS.items()
        ]
        by = GaugeMetricFamily(*self._BY_CONVERSION[:2], labels=self._BY_CONVERSION[2])
        for method, eps in g.epsilon_by_method.items():
            by.add_metric([method], eps)
        return [info, *scalars, by]
