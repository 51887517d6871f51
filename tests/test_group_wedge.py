"""The group-wedge scenario, 20 times for each client StreamRL runs in a consumer group
(kafka-python for the rollout workers, faust for the processor): a member SIGKILLed
while the group joins or rebalances, and restarted. A group that wedges (its members
never given the partitions again) never reads the rest of the topic, and fails here."""

from __future__ import annotations

import pytest

from tests.helpers.group_wedge import run_trials

TRIALS = 20


@pytest.mark.parametrize("client", ["kafka-python", "faust"])
def test_a_member_killed_mid_rebalance_never_wedges_the_group(stack, tmp_path, client):
    trials = run_trials(stack, tmp_path, client, stack.group_membership == "static", TRIALS, records=2000, concurrent=10)
    stuck = [t for t in trials if not t.finished]
    assert not stuck, f"{len(stuck)} of {TRIALS} trials did not read every record: {stuck}"
