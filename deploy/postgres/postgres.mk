# Throw-away PostgreSQL cluster (loopback only) for tests and local use; see deploy/postgres/README.md.
# Included from the top-level Makefile:  include deploy/postgres/postgres.mk
#
#   make pg-up   [PG_PORT=55432]      prints the connection URL on its last line
#   make pg-down [PG_PORT=55432]

PG_MK_DIR := $(patsubst %/,%,$(dir $(lastword $(MAKEFILE_LIST))))

.PHONY: pg-up pg-down

pg-up:
	@$(PG_MK_DIR)/pg-up.sh

pg-down:
	@$(PG_MK_DIR)/pg-down.sh
