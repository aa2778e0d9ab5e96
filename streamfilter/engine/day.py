"""The pure day step: records + queries + ledger state → releases and debits (no I/O).

``close_day`` runs Algorithm 3 for one day: the day's queries in registration order, each user's
contribution admitted by the individual filter against their running budget, the exact integer
sum of admitted contributions, and one batch of ``d`` noise draws per query (the batch size is
fixed by the query, never by the data: docs/design.md §6). Nothing is mutated: the caller commits the
returned :class:`DayOutcome` (state store first, then the in-memory ledger).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from streamfilter.engine.contract import Release
from streamfilter.engine.ledger import BudgetLedger, KeyedUsers, UserKeys
from streamfilter.engine.params import LINF_FAILURE_PROBABILITY, PrivacyParams
from streamfilter.engine.queries import AnyQuery
from streamfilter.engine.records import DayRecords
from streamfilter.privacy.departed import DepartureRule, filter_departures
from streamfilter.privacy.individual_filter import filter_totals, query_vectors
from streamfilter.privacy.noise import RandomBits, SeededRandomBits, discrete_gaussian, gaussian
from streamfilter.privacy.quotas import DEFAULT_ANALYST, AnalystQuotas, analyst_keys
from streamfilter.telemetry.active_set import ACTIVE_SET_QUERY_ID, ActiveSetTracker
from streamfilter.telemetry.coverage import (
    COVERAGE_NOISE_ID,
    CoverageCounts,
    CoverageTracker,
    coverage_counts,
)
from streamfilter.telemetry.population import POPULATION_NOISE_PREFIX, PopulationTracker

__all__ = [
    "AnalystChanges",
    "DayOutcome",
    "DayPartial",
    "ExactDayStats",
    "SeededPerRelease",
    "close_day",
    "noisy_release",
    "partial_day",
    "release_partials",
]


class SeededPerRelease:
    """FOR TESTS ONLY: noise of each (day, query) from PCG64 seeded by (seed, day, query_id).

    A restarted process then draws exactly the noise an uninterrupted one would have drawn, so
    restart tests can compare releases byte for byte. Releases made with it are not private.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def for_release(self, day: str, query_id: str) -> RandomBits:
        digest = hashlib.sha256(f"{self.seed}\x00{day}\x00{query_id}".encode()).digest()
        return SeededRandomBits(int.from_bytes(digest[:16], "little"))

    def uint64(self, size: int) -> np.ndarray:
        return self.for_release("", "").uint64(size)


def _bits_for(bits: RandomBits, day: str, query_id: str) -> RandomBits:
    return bits.for_release(day, query_id) if isinstance(bits, SeededPerRelease) else bits


@dataclass(frozen=True)
class ExactDayStats:
    """Exact, data-dependent counts of one day. SENSITIVE: never released or exported unless the
    operator opted into ``trusted_operator_metrics`` (docs/design.md §6.9)."""

    users_with_records: int
    admitted_per_query: dict[str, int] = field(default_factory=dict)
    refused_per_query: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class AnalystChanges:
    """One named analyst's sub-filter entries changed by a day (its users' new spends)."""

    analyst: str
    users: np.ndarray
    spent_units: np.ndarray
    retired: np.ndarray


@dataclass(frozen=True)
class DayOutcome:
    """Everything one closed day changes; committed atomically by the caller."""

    day: str
    releases: list[Release]
    changed_users: np.ndarray
    spent_units: np.ndarray
    retired: np.ndarray
    exact_stats: ExactDayStats
    #: opt-in active-set estimate (``[telemetry] active_set``): the tracker after this day.
    #: Its state holds exact partial counts: stored with the day, never published.
    active_set: ActiveSetTracker | None = None
    #: coverage tracker after this day (``[telemetry] coverage``; None when off). Its state
    #: holds exact partial counts: stored with the day, never published.
    coverage: CoverageTracker | None = None
    #: population estimate's departed counters after this day (None when off). Their state
    #: holds exact partial sums: stored with the day, never published.
    population: PopulationTracker | None = None
    #: the day's changes of the named analysts' sub-filters (docs/design.md §2.13)
    analyst_changes: tuple[AnalystChanges, ...] = ()

    def budget_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(keys, spent_units, retired)`` the store writes for the day: the users' global
        entries, then each analyst's under :func:`~streamfilter.privacy.quotas.analyst_key`
        (one packed budget row holds both)."""
        if not self.analyst_changes:
            return self.changed_users, self.spent_units, self.retired
        users = [np.asarray(self.changed_users, dtype=object)]
        spent, retired = [self.spent_units], [self.retired]
        for change in self.analyst_changes:
            users.append(analyst_keys(change.analyst, change.users))
            spent.append(change.spent_units)
            retired.append(change.retired)
        return np.concatenate(users), np.concatenate(spent), np.concatenate(retired)

    @property
    def active_set_state(self) -> bytes | None:
        """The tracker to store atomically with the day (``None`` when the estimate is off)."""
        return None if self.active_set is None else self.active_set.to_json().encode()

    @property
    def population_state(self) -> bytes | None:
        """The population counters to store atomically with the day (``None`` when off)."""
        return None if self.population is None else self.population.to_json().encode()

    @property
    def coverage_state(self) -> bytes | None:
        """The coverage tracker to store atomically with the day (``None`` when off)."""
        return None if self.coverage is None else self.coverage.to_json().encode()


def noisy_release(
    day: str,
    query: AnyQuery,
    total_units: np.ndarray,
    params: PrivacyParams,
    bits: RandomBits,
) -> Release:
    """Add one noise batch of size d to an exact integer sum and build the release.

    Discrete Gaussian: value = γ·(S + Z), Z ~ N_Z(0, s²)^d (CKS 2020), so the value is on the
    lattice. Continuous Gaussian: value = γ·S + N(0, σ²)^d.
    """
    d = len(total_units)
    gamma = params.granularity
    bits = _bits_for(bits, day, query.query_id)
    if params.mechanism == "discrete_gaussian":
        z = discrete_gaussian(bits, params.sigma2_units, d)
        value = [float(int(s) + int(n)) * gamma for s, n in zip(total_units, z, strict=True)]
    else:
        g = gaussian(bits, params.sigma, d)
        value = [float(int(s)) * gamma + float(n) for s, n in zip(total_units, g, strict=True)]
    half = params.ci95_halfwidth
    return Release(
        day=day,
        query_id=query.query_id,
        labels=query.labels(),
        value=value,
        sigma=params.sigma_released,
        ci95=[half] * d,
        mechanism=params.mechanism,
        granularity=gamma,
        linf_bound=params.linf_bound(d),
        linf_failure_probability=LINF_FAILURE_PROBABILITY,
        analyst=query.analyst,
    )


#: users per block of the day close (temporaries of ~0.5 MiB per column)
BLOCK_USERS = 1 << 16


def _query_vectors(dense: np.ndarray, cols: list[int], weights: np.ndarray) -> np.ndarray:
    """Each user's unclipped vector (data units, (n, d)): ``query_vectors`` of the columns
    ``cols`` of the column-major ``dense`` (a view when they are contiguous)."""
    if cols == list(range(cols[0], cols[0] + len(cols))):
        sub = dense[:, cols[0] : cols[0] + len(cols)]
    else:
        sub = dense[:, cols]
    return query_vectors(sub, weights)


@dataclass(frozen=True)
class AnalystState:
    """The day's users' sub-filter state per analyst (docs/design.md §2.13), updated in place
    by the day close: ``spent``/``retired`` per analyst, the default one's ``spent`` derived
    (global minus the named analysts') and its ``retired`` the global flag."""

    quotas: AnalystQuotas
    spent: dict[str, np.ndarray]
    retired: dict[str, np.ndarray]


def _filter_day(
    records: DayRecords,
    queries: Sequence[AnyQuery],
    params: PrivacyParams,
    spent: np.ndarray,
    retired: np.ndarray,
    departed: list[_Departed] | None = None,
    analysts: AnalystState | None = None,
) -> tuple[list[np.ndarray], list[int], list[int]]:
    """The day's queries over all users, on blocks of users: (sums, admitted, refused) per query.

    With ``departed`` (one per query), users follow the departure rule of ``privacy.departed``
    and the departing vectors and their squares are summed into it. With ``analysts``, a
    query's contributions must fit both the user's budget and its analyst's sub-budget
    (``privacy.quotas``): the filter sees the smaller remainder, and the cost is charged to
    both. Every step is row-wise (each user's own queries stay in order) and sums are exact, so
    blocks change no result; they bound the temporaries. ``spent``/``retired`` (and the
    analysts' state) are updated in place.
    """
    lattice = params.lattice
    budget = params.budget_units
    columns = list(dict.fromkeys(c for q in queries for c in q.coordinates()))
    column_of = {c: j for j, c in enumerate(columns)}
    query_cols = [[column_of[c] for c in q.coordinates()] for q in queries]
    weights = [q.weights() for q in queries]
    totals = [np.zeros(w.shape[1], np.int64) for w in weights]
    admitted_n = [0] * len(queries)
    refused_n = [0] * len(queries)
    for start in range(0, records.n_users, BLOCK_USERS):
        stop = min(start + BLOCK_USERS, records.n_users)
        dense = records.matrix(columns, order="F", rows=(start, stop))
        spent_b, retired_b = spent[start:stop], retired[start:stop]  # views: updated in place
        for j, query in enumerate(queries):
            x = _query_vectors(dense, query_cols[j], weights[j])
            if departed is not None:
                acc = departed[j]
                dep = filter_departures(
                    x, query.clip, lattice, spent_b, retired_b, budget, acc.rule
                )
                totals[j] += dep.total_units
                np.add(acc.units, dep.departed_units, out=acc.units)
                np.add(acc.squares, dep.squares_units, out=acc.squares)
                spent_b += dep.cost_units
                nonzero = (x != 0).any(axis=1)
                admitted_n[j] += int(np.count_nonzero(dep.admitted & nonzero))
                refused_n[j] += int(np.count_nonzero(~dep.admitted & nonzero))
                continue
            if analysts is not None:
                owner = analysts.quotas.owner(query.analyst)
                own_spent = analysts.spent[owner][start:stop]
                own_retired = analysts.retired[owner][start:stop]
                # the filter of Algorithm 3 against min(B − spent, B_a − spent_a)
                remaining = analysts.quotas.remaining_units(owner, spent_b, own_spent)
                own_budget_spent = budget - remaining
                step = filter_totals(
                    x, query.clip, lattice, own_budget_spent, own_retired, budget, params.exhaustion
                )
                own_spent += step.cost_units
                own_retired |= step.newly_retired
            else:
                step = filter_totals(
                    x, query.clip, lattice, spent_b, retired_b, budget, params.exhaustion
                )
                retired_b |= step.newly_retired
            totals[j] += step.total_units
            spent_b += step.cost_units
            admitted_n[j] += step.admitted_nonzero
            refused_n[j] += step.refused_nonzero
    return totals, admitted_n, refused_n


@dataclass(frozen=True)
class _Departed:
    """One query's departure rule and the day's exact departed sums (SENSITIVE)."""

    rule: DepartureRule
    units: np.ndarray
    squares: np.ndarray

    @classmethod
    def of(cls, query: AnyQuery, params: PrivacyParams) -> _Departed:
        d = query.weights().shape[1]
        rule = DepartureRule.of(params.lattice.max_cost_units(query.clip), d, params.sigma2_units)
        return cls(rule, np.zeros(d, np.int64), np.zeros(d, np.int64))


def with_coverage(
    day: str,
    releases: Sequence[Release],
    queries: Sequence[AnyQuery],
    tracker: CoverageTracker,
    counts: CoverageCounts | tuple[CoverageCounts, ...],
    params: PrivacyParams,
    bits: RandomBits,
) -> tuple[list[Release], CoverageTracker]:
    """The day's query releases with their coverage (docs/design.md §2.11): the day's exact
    ``counts`` go into ``tracker`` with noise from the day's own coverage key, so no other
    released value moves; returns the releases and the tracker after the day. With analysts,
    ``counts`` has one entry per analyst (the tracker's groups) and each query's coverage is
    its analyst's (§2.13)."""
    groups = counts if isinstance(counts, tuple) else (counts,)
    estimates, after = tracker.step_groups(groups, _bits_for(bits, day, COVERAGE_NOISE_ID))
    of_analyst = {n: e for (n, _), e in zip(tracker.groups(), estimates, strict=True)}
    gamma = params.granularity
    covered = []
    for r, q in zip(releases, queries, strict=True):
        name = q.analyst or DEFAULT_ANALYST
        if tracker.ladders and name not in of_analyst:
            raise ValueError("the coverage tracker has no group for the query's analyst")
        estimate = of_analyst[name] if tracker.ladders else estimates[0]
        cost = params.lattice.max_cost_units(q.clip)
        covered.append(replace(r, coverage=estimate.for_cost(cost, gamma)))
    return covered, after


def close_day(
    records: DayRecords,
    queries: Sequence[AnyQuery],
    ledger: BudgetLedger,
    params: PrivacyParams,
    bits: RandomBits,
    active_set: ActiveSetTracker | None = None,
    coverage: CoverageTracker | None = None,
    population: PopulationTracker | None = None,
    quotas: AnalystQuotas | None = None,
    analyst_ledgers: Mapping[str, BudgetLedger] | None = None,
) -> DayOutcome:
    """Algorithm 3 for one day (Theorem 4.5); see ``privacy.individual_filter`` for the argument.

    With ``quotas`` declaring analysts, each query is also held to its analyst's per-user
    sub-budget (``privacy.quotas``, docs/design.md §2.13); ``analyst_ledgers`` holds every named
    analyst's spends (those of analysts no longer declared too: the default analyst's spend is
    what is left of the global one), and the outcome's ``analyst_changes`` the day's changes.

    With ``population``, users follow the departure rule (``privacy.departed``) and each query's
    release carries its population estimate (``telemetry.population``; noise from its own key).

    With ``active_set`` (opt-in), the day's departures from the active set are counted into it
    and its ``_active_set`` release follows the queries' releases (``telemetry.active_set``). With
    ``coverage``, the day's exact coverage counts go into it and each query's release carries
    its coverage (``telemetry.coverage``; noise from its own per-release key, so no other value
    moves).
    """
    users = records.users
    keys = ledger.keys_of(users, records.keys)
    located = ledger.locate(users, keys)
    spent, retired = ledger.state_at(located)
    spent_before, retired_before = spent.copy(), retired.copy()
    budget = params.budget_units
    departed = None if population is None else [_Departed.of(q, params) for q in queries]
    state = None
    if quotas is not None and quotas.active:
        if population is not None:
            raise ValueError("the population estimate does not support analysts yet")
        state = _analyst_state(quotas, analyst_ledgers or {}, users, keys, spent, retired)
        analyst_before = {
            a: (state.spent[a].copy(), state.retired[a].copy()) for a in quotas.analysts
        }
    totals, admitted_n, refused_n = _filter_day(
        records, queries, params, spent, retired, departed, state
    )
    analyst_changes: list[AnalystChanges] = []
    if state is not None:
        for a in quotas.named if quotas is not None else ():
            s_after, r_after = state.spent[a], state.retired[a]
            s_before, r_before = analyst_before[a]
            moved = np.flatnonzero((s_after != s_before) | (r_after != r_before))
            if len(moved):
                who = KeyedUsers.wrap(users[moved], keys.take(moved))
                analyst_changes.append(AnalystChanges(a, who, s_after[moved], r_after[moved]))
    absent = None
    if population is not None and departed is not None and population.pending:
        # yesterday's newly departing users without a record today leave with a zero vector
        absent = _pending_departures(population.pending, users, departed, ledger, params)
        if absent is not None:
            users = np.concatenate([np.asarray(users, dtype=object), absent[0]])
            spent_before = np.concatenate([spent_before, absent[1]])
            retired_before = np.concatenate([retired_before, absent[2]])
            spent = np.concatenate([spent, absent[3]])
            retired = np.concatenate([retired, absent[2]])
    releases = [
        noisy_release(records.day, query, total, params, bits)
        for query, total in zip(queries, totals, strict=True)
    ]
    populated = None
    if population is not None and departed is not None:
        states, squares = {}, {}
        for i, (release, dep) in enumerate(zip(releases, departed, strict=True)):
            qid = release.query_id
            noise = _bits_for(bits, records.day, POPULATION_NOISE_PREFIX + qid)
            releases[i], states[qid], squares[qid] = population.step(
                release, dep.units, dep.squares, dep.rule, params, noise
            )
        pending = users[_departing_next(departed, params, spent, retired)]
        populated = population.advanced(states, squares, pending)
    admitted_counts = {q.query_id: a for q, a in zip(queries, admitted_n, strict=True)}
    refused_counts = {q.query_id: r for q, r in zip(queries, refused_n, strict=True)}
    tracker = None
    if active_set is not None:
        noise = _bits_for(bits, records.day, ACTIVE_SET_QUERY_ID)
        extra, tracker = active_set.step(
            records.day, spent_before, retired_before, spent, retired, budget, noise
        )
        releases.extend([extra] if extra is not None else [])
    covered = None
    if coverage is not None:
        counts: CoverageCounts | tuple[CoverageCounts, ...]
        if bool(coverage.ladders) != (state is not None):
            raise ValueError("the coverage tracker's analysts are not the run's")
        if coverage.ladders and state is not None:
            counts = _analyst_coverage_counts(
                coverage, state, analyst_before, spent_before, spent, budget
            )
        else:
            counts = coverage_counts(
                spent_before, retired_before, spent, retired, budget, coverage.thresholds_units
            )
        releases[: len(queries)], covered = with_coverage(
            records.day, releases[: len(queries)], queries, coverage, counts, params, bits
        )
    changed = np.flatnonzero((spent != spent_before) | (retired != retired_before))
    if absent is None:
        changed_users = KeyedUsers.wrap(
            users if len(changed) == len(users) else users[changed],  # every user: no copy
            keys.take(changed),
            located.take(changed),
        )
    else:
        changed_users = KeyedUsers.wrap(users[changed], ledger.keys_of(users[changed]))
    return DayOutcome(
        day=records.day,
        releases=releases,
        changed_users=changed_users,
        spent_units=spent[changed],
        retired=retired[changed],
        exact_stats=ExactDayStats(
            users_with_records=records.n_users,
            admitted_per_query=admitted_counts,
            refused_per_query=refused_counts,
        ),
        active_set=tracker,
        coverage=covered,
        population=populated,
        analyst_changes=tuple(analyst_changes),
    )


def _analyst_state(
    quotas: AnalystQuotas,
    ledgers: Mapping[str, BudgetLedger],
    users: np.ndarray,
    keys: UserKeys,
    spent: np.ndarray,
    retired: np.ndarray,
) -> AnalystState:
    """The day's users' spends per analyst: each named analyst's from its ledger (zeros for
    users it never charged), the default analyst's the global spend minus every stored
    analyst's (a state from before analysts: all of it)."""
    spent_of: dict[str, np.ndarray] = {}
    retired_of: dict[str, np.ndarray] = {}
    for name, ledger in ledgers.items():
        spent_of[name], retired_of[name] = ledger.state(users, keys)
    for name in quotas.named:
        if name not in spent_of:
            spent_of[name] = np.zeros(len(users), np.int64)
            retired_of[name] = np.zeros(len(users), bool)
    spent_of[DEFAULT_ANALYST] = quotas.default_spent(spent, list(spent_of.values()))
    retired_of[DEFAULT_ANALYST] = retired  # the default analyst's retirement is the global flag
    return AnalystState(quotas, spent_of, retired_of)


def _analyst_coverage_counts(
    tracker: CoverageTracker,
    state: AnalystState,
    before: Mapping[str, tuple[np.ndarray, np.ndarray]],
    spent_before: np.ndarray,
    spent_after: np.ndarray,
    budget_units: int,
) -> tuple[CoverageCounts, ...]:
    """Each analyst's exact coverage counts of the day (its group of the tracker): counted on
    its first charge (or retirement), departed from a threshold when ``min(B − spent, B_a −
    spent_a)`` falls below it — monotone, so one event per user and stream (§2.11, §2.13)."""
    out = []
    for name, thresholds in tracker.groups():
        if name is None or name not in state.spent:
            raise ValueError("the coverage tracker's analysts are not the run's")
        own_before, retired_before = before[name]
        own_after, retired_after = state.spent[name], state.retired[name]
        out.append(
            coverage_counts(
                own_before,
                retired_before,
                own_after,
                retired_after,
                budget_units,
                thresholds,
                state.quotas.remaining_units(name, spent_before, own_before),
                state.quotas.remaining_units(name, spent_after, own_after),
            )
        )
    return tuple(out)


def _departing_next(
    departed: Sequence[_Departed], params: PrivacyParams, spent: np.ndarray, retired: np.ndarray
) -> np.ndarray:
    """Users who, after the day, depart some query at their next step (``D <= R < c + D``)."""
    remaining = params.budget_units - spent
    out = np.zeros(len(spent), dtype=bool)
    for dep in departed:
        out |= (remaining >= dep.rule.depart_at) & (remaining < dep.rule.live_at)
    return out & ~retired


def _pending_departures(
    pending: Sequence[str],
    present: np.ndarray,
    departed: Sequence[_Departed],
    ledger: BudgetLedger,
    params: PrivacyParams,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """The departure step of ``privacy.departed`` with a zero vector for the users due to
    depart today (they entered a departure window yesterday) who sent no record: they leave the
    query with what they contributed today, nothing, so a user active on some days only is not
    counted at the value of a day with a record. Returns ``(users, spent_before, retired,
    spent_after)`` or ``None``."""
    seen = set(np.asarray(present, dtype=object).tolist())
    absent = np.array([u for u in pending if u not in seen], dtype=object)
    if not len(absent):
        return None
    spent, retired = ledger.state_at(ledger.locate(absent))
    after = spent.copy()
    budget = params.budget_units
    for dep in departed:  # a zero vector has zero squares: the charge is R − D + 1
        remaining = budget - after
        leaving = ~retired & (remaining >= dep.rule.depart_at) & (remaining < dep.rule.live_at)
        after += np.where(leaving, remaining - dep.rule.depart_at + 1, 0)
    return absent, spent, retired, after


@dataclass(frozen=True)
class DayPartial:
    """One part of a day (a cluster worker's partition, docs/design.md §7.2): the exact integer
    sums of its users' admitted contributions per query and its users' new budgets; no noise.

    Every user of the day is in exactly one part, and every step of ``_filter_day`` is row-wise,
    so adding the parts' ``sums`` (and ``counters``) gives exactly the single process's sums
    (and counts). ``counters`` are named exact per-user counts of the part (SENSITIVE, like
    :class:`ExactDayStats`): stored beside the partial sums, never published."""

    day: str
    sums: dict[str, np.ndarray]
    counters: dict[str, int]
    changed_users: np.ndarray
    spent_units: np.ndarray
    retired: np.ndarray


def partial_day(
    records: DayRecords,
    queries: Sequence[AnyQuery],
    ledger: BudgetLedger,
    params: PrivacyParams,
    coverage_thresholds_units: tuple[int, ...] | None = None,
) -> DayPartial:
    """Algorithm 3's admission and exact sums for the users of ``records`` (one part of the
    day), against their budgets in ``ledger``; no noise (that is :func:`release_partials`).
    With ``coverage_thresholds_units`` the part's exact coverage counts are among its
    ``counters`` (sums over its users, so the parts' counts add: :func:`coverage_counts_of`)."""
    users = records.users
    keys = ledger.keys_of(users, records.keys)
    located = ledger.locate(users, keys)
    spent, retired = ledger.state_at(located)
    spent_before, retired_before = spent.copy(), retired.copy()
    totals, admitted_n, refused_n = _filter_day(records, queries, params, spent, retired)
    changed = np.flatnonzero((spent != spent_before) | (retired != retired_before))
    counters = {"users_with_records": records.n_users}
    for query, a, r in zip(queries, admitted_n, refused_n, strict=True):
        counters[f"admitted:{query.query_id}"] = a
        counters[f"refused:{query.query_id}"] = r
    if coverage_thresholds_units is not None:
        counts = coverage_counts(
            spent_before,
            retired_before,
            spent,
            retired,
            params.budget_units,
            coverage_thresholds_units,
        )
        counters[_COUNTED] = counts.counted
        for k, departed in enumerate(counts.departed):
            counters[f"{_DEPARTED}{k}"] = departed
    return DayPartial(
        day=records.day,
        sums={q.query_id: t for q, t in zip(queries, totals, strict=True)},
        counters=counters,
        changed_users=users[changed],
        spent_units=spent[changed],
        retired=retired[changed],
    )


#: names of the coverage counts among a part's ``counters``
_COUNTED, _DEPARTED = "coverage:counted", "coverage:departed:"


def coverage_counts_of(counters: dict[str, int], thresholds: int) -> CoverageCounts:
    """The day's :class:`CoverageCounts` from the summed ``counters`` of its parts."""
    return CoverageCounts(
        counters.get(_COUNTED, 0),
        tuple(counters.get(f"{_DEPARTED}{k}", 0) for k in range(thresholds)),
    )


def release_partials(
    day: str,
    queries: Sequence[AnyQuery],
    sums: dict[str, np.ndarray],
    params: PrivacyParams,
    bits: RandomBits,
    coverage: tuple[CoverageTracker, CoverageCounts] | None = None,
) -> tuple[list[Release], CoverageTracker | None]:
    """The day's releases from the exact sums over all parts: the same :func:`noisy_release`
    as the single process, one noise batch per query in registration order; with
    ``coverage`` (the tracker and the parts' summed counts), each carries its coverage as in
    :func:`close_day`. Returns the releases and the tracker after the day."""
    releases = [noisy_release(day, q, sums[q.query_id], params, bits) for q in queries]
    if coverage is None:
        return releases, None
    tracker, counts = coverage
    return with_coverage(day, releases, queries, tracker, counts, params, bits)


def exact_stats_of(counters: dict[str, int], queries: Sequence[AnyQuery]) -> ExactDayStats:
    """:class:`ExactDayStats` from the summed ``counters`` of a day's parts."""
    return ExactDayStats(
        users_with_records=counters.get("users_with_records", 0),
        admitted_per_query={q.query_id: counters.get(f"admitted:{q.query_id}", 0) for q in queries},
        refused_per_query={q.query_id: counters.get(f"refused:{q.query_id}", 0) for q in queries},
    )
