"""Who is in the workers' consumer group, as the group's coordinator says (cluster mode,
docs/design.md §7.3): the evidence a worker needs before it takes the releaser lease from a
holder whose lease has not expired yet.

Each worker's group consumer carries the worker's name in its Kafka client id
(:func:`member_client_id`), so a group description (``DescribeGroups``, answered by the broker
that decides who is a member) lists the workers that are members. A worker has **left** when an
earlier stable description listed it and the stable description taken in this worker's current
generation (one per generation of its own membership) does not: its consumer closed
(``LeaveGroup``) or the coordinator expired its session after ``session_timeout`` (killed,
stopped, cut off). Every departure rebalances the group, so the answer for one generation holds
until the next. A worker
never seen as a member (it may not have joined yet) has not demonstrably left: its lease
expires as before. The description needs no ACL beyond the group's ``READ``, which implies
``DESCRIBE``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer

__all__ = ["GroupMembership", "member_client_id"]

log = logging.getLogger("streamfilter.cluster")

#: seconds before an inconclusive look (the group rebalancing, the coordinator not answering) is
#: tried again
RETRY_S = 1.0

#: seconds the coordinator has to describe the group
DESCRIBE_TIMEOUT_S = 5.0


def member_client_id(client: dict[str, Any], worker: str) -> str:
    """The Kafka client id of ``worker``'s group consumer: the configured ``client_id`` (what
    quotas and broker logs match first), then the worker's name in the ledger."""
    return f"{client.get('client_id') or 'streamfilter'}-{worker}"


class GroupMembership:
    """Answers whether a worker has left ``group_id`` (see the module doc); ``consumer`` is this
    worker's own member of the group."""

    def __init__(self, consumer: KafkaConsumer, client: dict[str, Any], group_id: str) -> None:
        self._consumer = consumer
        self._client = client
        self._group_id = group_id
        self._admin: KafkaAdminClient | None = None
        self._seen: set[str] = set()  # client ids listed in any stable description so far
        self._answer: tuple[int, str, bool] | None = None  # generation, worker, left
        self._retry_at = 0.0

    def has_left(self, worker: str) -> bool:
        """Whether ``worker`` was a member and a stable description of this worker's current
        generation no longer lists it. False while this worker is not a stable member itself,
        and whenever the coordinator cannot tell (asked again after ``RETRY_S``)."""
        own = self._consumer.group_metadata()
        if own.generation_id < 0 or not own.member_id:
            return False
        if self._answer is not None and self._answer[:2] == (own.generation_id, worker):
            return self._answer[2]
        now = time.monotonic()
        if now < self._retry_at:
            return False
        members = self._stable_members(own.member_id)
        if members is None:
            self._retry_at = now + RETRY_S
            return False
        self._seen |= members
        holder = member_client_id(self._client, worker)
        left = holder in self._seen and holder not in members
        self._answer = (own.generation_id, worker, left)
        if left:
            log.info(
                "worker %s is no longer a member of consumer group %s (generation %d)",
                worker,
                self._group_id,
                own.generation_id,
            )
        return left

    def _stable_members(self, own_member_id: str) -> set[str] | None:
        """The client ids of the group's members if the coordinator describes it as stable
        with this worker among them; None otherwise (rebalancing, unreachable, not yet a
        member in the coordinator's view)."""
        try:
            if self._admin is None:
                timeout = {"request_timeout_ms": int(DESCRIBE_TIMEOUT_S * 1000)}
                self._admin = KafkaAdminClient(**{**self._client, **timeout})
            described = self._admin.describe_groups([self._group_id])
        except Exception as exc:  # no answer is no evidence: the lease expires as before
            log.debug("could not describe consumer group %s: %s", self._group_id, exc)
            return None
        group = described.get(self._group_id) or {}
        if group.get("error") or group.get("group_state") != "Stable":
            return None
        members = group.get("members") or []
        if not any(m.get("member_id") == own_member_id for m in members):
            return None
        return {str(m.get("client_id")) for m in members}

    def close(self) -> None:
        if self._admin is not None:
            with contextlib.suppress(Exception):
                self._admin.close()
            self._admin = None
