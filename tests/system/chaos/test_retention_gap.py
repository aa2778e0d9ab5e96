"""Records deleted from a partition's start beyond the stored position
(``delete_records`` here; retention while the daemon was down alike) are never skipped silently.

Failed before: the restart sought to the new beginning (``max(stored, beginning)``), released
what was left, and no reject, log or metric said so.
"""

from __future__ import annotations

import pytest

from tests.runtime.io.test_kafka_daemon import cli
from tests.system.chaos.harness import events, kafka_world, produce

pytestmark = pytest.mark.kafka
RUN = ["run", "--config", "streamfilter.toml", "--until-end", "--testing"]


def delete_before(bootstrap: str, topic: str, offset: int) -> None:
    from kafka import KafkaAdminClient, TopicPartition

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.delete_records({TopicPartition(topic, 0): offset})
    finally:
        admin.close()


@pytest.mark.timeout(240)
def test_a_retention_gap_stops_the_daemon_unless_the_operator_opts_in(kafka_bootstrap, tmp_path):
    work, topics = kafka_world(tmp_path, kafka_bootstrap)
    produce(kafka_bootstrap, topics["events"], events(["2026-01-01", "2026-01-02"], 100))
    cli(RUN, cwd=work)  # stored resume offset: 200
    produce(kafka_bootstrap, topics["events"], events(["2026-01-03"], 100, seed=3))
    delete_before(kafka_bootstrap, topics["events"], 250)  # 50 unread records gone

    proc = cli(RUN, cwd=work, check=False)
    assert proc.returncode == 4, proc.stderr
    assert f"{topics['events']}:0: 50 records" in proc.stderr
    assert 'on_retention_gap = "skip"' in proc.stderr

    config = work / "streamfilter.toml"
    config.write_text(
        config.read_text().replace(
            '[source]\nkind = "kafka"', '[source]\non_retention_gap = "skip"\nkind = "kafka"'
        )
    )
    proc = cli(RUN, cwd=work)
    assert (
        f"skipping input records deleted before they were read — {topics['events']}:0: 50 records"
        in proc.stderr
    )
