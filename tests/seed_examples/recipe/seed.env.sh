#!/bin/bash
# Set task-specific environment variables (the caller's values win)
export SEED_DATA_DIR="${SEED_DATA_DIR:-/tmp/streamrl-seed-data}"
export SEED_TRACE_DIR="${SEED_TRACE_DIR:-/tmp/streamrl-seed-traces}"
