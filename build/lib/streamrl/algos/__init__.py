"""The RL maths: advantage estimators, policy losses and off-policy corrections, loss
aggregations, KL estimators and controllers, learning-rate schedules. Small pure
functions in registries (`runtime/registry.py`), imported by the processor, the learner,
replay and custom trainers alike. Imports only `runtime/` and `schema/`."""
