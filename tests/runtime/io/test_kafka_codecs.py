"""Every codec producers use, written by a non-Python client (kcat / librdkafka), is read; a batch
the client cannot decode is a reject and the run goes on."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.conftest import require
from tests.runtime.io.test_kafka_daemon import (
    QUERIES,
    cli,
    config_text,
    make_events,
    read_topic,
    reference,
    released,
    unique_topic,
)

pytestmark = pytest.mark.kafka

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


def kcat_produce(bootstrap: str, topic: str, codec: str, records: list[bytes]) -> None:
    """Produce ``records`` (keyed by user id) with kcat, compressed with ``codec``, in batches
    large enough that librdkafka really compresses them (it sends a batch uncompressed when
    compression would not make it smaller)."""
    lines = []
    for raw in records:
        try:
            key = json.loads(raw)["user_id"]
        except ValueError:
            key = "garbage"
        lines.append(key.encode() + b"\t" + raw)
    subprocess.run(
        ["kcat", "-P", "-b", bootstrap, "-t", topic, "-K\t", "-z", codec, "-X", "linger.ms=200"],
        input=b"\n".join(lines) + b"\n",
        check=True,
        timeout=60,
        capture_output=True,
    )


def setup_codec_topics(tmp_path, bootstrap, events):
    from kafka import KafkaProducer

    require(shutil.which("kcat") is not None, "kcat (Debian package kcat) is not installed")
    work = tmp_path / "kafka"
    work.mkdir()
    topics = {k: unique_topic(k) for k in ("events", "queries", "releases", "rejects")}
    (work / "streamfilter.toml").write_text(config_text("kafka", topics, bootstrap))
    cli(["topics", "create", "--config", "streamfilter.toml"], cwd=work)
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    for q in QUERIES:
        producer.send(topics["queries"], value=json.dumps(q).encode())
    producer.close()
    chunk = -(-len(events) // len(CODECS))
    for i, codec in enumerate(CODECS):
        kcat_produce(bootstrap, topics["events"], codec, events[i * chunk : (i + 1) * chunk])
    return work, topics


@pytest.mark.timeout(240)
def test_every_codec_written_by_kcat_is_read_by_the_daemon(kafka_bootstrap, tmp_path):
    events = make_events(days=3, users=200)
    expected = reference(tmp_path, events)
    work, topics = setup_codec_topics(tmp_path, kafka_bootstrap, events)
    proc = cli(["run", "--config", "streamfilter.toml", "--until-end", "--testing"], cwd=work)
    summary = json.loads(proc.stderr.strip().splitlines()[-1])["summary"]
    assert summary["records_read"] == len(events)
    got = released(kafka_bootstrap, topics["releases"])
    assert set(got) == set(expected)
    for key, values in got.items():
        assert values == {expected[key]}, key
    rejects = [json.loads(r.value) for r in read_topic(kafka_bootstrap, topics["rejects"])]
    assert [r["reason"] for r in rejects] == ["malformed_json"] * events.count(b"{not json")


@pytest.mark.timeout(240)
def test_a_batch_the_client_cannot_decode_is_a_reject_and_the_run_goes_on(
    kafka_bootstrap, tmp_path, monkeypatch, capsys
):
    """The daemon in this process with kafka-python's snappy, lz4 and zstd codecs switched off:
    each record of those batches is rejected as ``undecodable_batch`` with its partition and
    offset, the gzip and uncompressed records are read, and the run ends normally. (This also
    shows that kcat really compressed those batches.)"""
    from kafka import codec

    from streamfilter.cli.main import main

    events = make_events(days=3, users=150)
    work, topics = setup_codec_topics(tmp_path, kafka_bootstrap, events)
    for name in ("has_snappy", "has_lz4", "has_zstd"):
        monkeypatch.setattr(codec, name, lambda: False)
    monkeypatch.chdir(work)
    assert main(["run", "--config", "streamfilter.toml", "--until-end", "--testing"]) == 0
    summary = json.loads(capsys.readouterr().err.strip().splitlines()[-1])["summary"]
    rejects = [json.loads(r.value) for r in read_topic(kafka_bootstrap, topics["rejects"])]
    undecodable = [r for r in rejects if r["reason"] == "undecodable_batch"]
    chunk = -(-len(events) // len(CODECS))
    assert len(undecodable) == len(events) - 2 * chunk  # the snappy, lz4 and zstd records
    assert summary["rejects_by_reason"]["undecodable_batch"] == len(undecodable)
    assert summary["records_read"] == len(events)
    where = {tuple(r["source"].rsplit(":", 2)) for r in undecodable}  # topic:partition:offset
    assert len(where) == len(undecodable)
    assert {t for t, _, _ in where} == {topics["events"]}
    assert all("codec" in r["detail"] and "raw" in r for r in undecodable)
    assert summary["events_accepted"] > 0
