"""The built-in tool-use recipe end to end: a short run of recipes/kv_agent (warm-up,
then GRPO over multi-turn tool-calling episodes through the topics) keeps its sampled
and held-out success through GRPO, trains only the assistant's turns, and records every
trajectory turn by turn."""

from __future__ import annotations

from tests.conftest import REPO, run_cli

RECIPE = str(REPO / "recipes" / "kv_agent" / "recipe.yaml")
STEPS = 30


def test_the_key_value_agent_recipe_trains_grpo_on_its_multi_turn_episodes(stack, ledger, run_id, tmp_path):
    env = {"KV_STEPS": str(STEPS), "KV_VALIDATE_EVERY": str(STEPS)}
    result = run_cli("run", RECIPE, "--run", run_id, "--out", str(tmp_path), env=env, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    steps = ledger.execute(
        "select (metrics->>'reward_mean')::float, (metrics->>'entropy')::float from train_steps where run_id = %s order by step",
        (run_id,),
    ).fetchall()
    rewards = [reward for reward, _ in steps]
    held_out = dict(
        ledger.execute(
            "select step, avg(reward) from evaluations where run_id = %s and is_val group by step order by step", (run_id,)
        ).fetchall()
    )
    print(
        f"\ntraining reward by step: {[round(r, 3) for r in rewards]}\nentropy by step: "
        f"{[round(e, 3) for _, e in steps if e is not None]}\ngreedy held-out success: {held_out}"
    )
    assert len(rewards) == STEPS and set(held_out) == {0, STEPS}
    # The warm-up lands near the top here (greedy held-out 1.0, sampled ~0.72), and GRPO's
    # first steps dip before it recovers (docs/training.md): measured, steps 0-2 -> 26-30
    # gained +0.01 to +0.07, too little over 30 steps to assert a rise without flakiness.
    # What is asserted is that GRPO on these episodes keeps the sampled policy where the
    # warm-up left it or above, and the greedy one right.
    before, after = sum(rewards[:3]) / 3, sum(rewards[-5:]) / 5
    assert after >= before - 0.03 and after >= 0.7, f"training reward {before:.3f} -> {after:.3f}"
    assert held_out[STEPS] >= 0.95 * held_out[0], held_out

    # episodes are multi-turn: a tool turn between two assistant turns, recorded per turn
    shapes = dict(
        ledger.execute(
            """
        select roles, count(*) from (
            select trajectory_id, string_agg(role, ',' order by turn_index) as roles
            from trajectory_turns where run_id = %s and not is_val group by trajectory_id) s
        group by roles order by count(*) desc""",
            (run_id,),
        ).fetchall()
    )
    assert shapes.get("prompt,assistant,tool,assistant", 0) > 0.5 * sum(shapes.values())
    trained_roles = {
        r[0] for r in ledger.execute("select distinct role from trajectory_turns where run_id = %s and trained", (run_id,))
    }
    assert trained_roles == {"assistant"}
