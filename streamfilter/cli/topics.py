"""``streamfilter topics create``: create the Kafka topics a configuration names."""

from __future__ import annotations

import argparse

from streamfilter.config import load_config
from streamfilter.errors import ConfigError


def cmd_topics(args: argparse.Namespace) -> int:
    from streamfilter.runtime.app import topic_specs
    from streamfilter.runtime.io.kafka import create_topics

    settings = load_config(args.config)
    specs = topic_specs(settings)
    if not specs:
        raise ConfigError("no section of this configuration uses kind = 'kafka'")
    created = create_topics(settings.kafka.client_config(), specs)
    for spec in specs:
        state = "created" if spec.name in created else "exists"
        print(
            f"{spec.name}\t{spec.role}\tpartitions={spec.partitions}\treplication={spec.replication_factor}\t{state}"
        )
    return 0
