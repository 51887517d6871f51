# Sourced before the recipe resolves (environment.env_script): defaults a caller can override.
export KV_STEPS="${KV_STEPS:-80}"
export KV_WARMUP_STEPS="${KV_WARMUP_STEPS:-340}"
export KV_TRAIN_ROWS="${KV_TRAIN_ROWS:-4000}"
