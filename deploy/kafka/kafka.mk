# Single-node Apache Kafka 4.x broker (KRaft) for tests and local use; see deploy/kafka/README.md.
# Included from the top-level Makefile:  include deploy/kafka/kafka.mk
# Also usable on its own:                make -f deploy/kafka/kafka.mk kafka-up
#
#   make kafka-up   [KAFKA_PORT=9092] [KAFKA_CONTROLLER_PORT=9093] [KAFKA_KEEP_DATA=1]
#   make kafka-down [KAFKA_PORT=9092] [KAFKA_KEEP_DATA=1]
#
# Variables given on the make command line reach the scripts through the environment.

KAFKA_MK_DIR := $(patsubst %/,%,$(dir $(lastword $(MAKEFILE_LIST))))

.PHONY: kafka-up kafka-down

kafka-up:
	@$(KAFKA_MK_DIR)/kafka-up.sh

kafka-down:
	@$(KAFKA_MK_DIR)/kafka-down.sh
