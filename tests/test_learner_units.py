"""Learner pieces with hand-computed expectations: micro-batching, staleness, KL control,
the trainers' one-step behaviour, and checkpoint round trips."""

import numpy as np
import pytest
import torch

from streamrl.algos.kl import AdaptiveKLController, kl_reward_to_go
from streamrl.learner.batching import TrainItem, collate, micro_batches_by_tokens
from streamrl.learner.checkpoint import latest_checkpoint, load_state
from streamrl.learner.parallel import Placement
from streamrl.learner.snapshots import SnapshotStore, load_snapshot
from streamrl.learner.step_inputs import staleness_split
from streamrl.learner.trainers import CrossEntropyTrainer, GRPOTrainer, totals_of
from streamrl.runtime.config import Algorithm as AlgorithmConfig
from streamrl.runtime.config import Trainer as TrainerConfig
from streamrl.runtime.tiny_lm import build_tiny_model, load


def item(tokens, mask, advantage=0.0, version=0, logprobs=None):
    tokens = np.array(tokens, dtype=np.int32)
    return TrainItem(
        tokens=tokens,
        mask=np.array(mask, dtype=np.uint8),
        behaviour_logprobs=np.array(logprobs or [0.0] * len(tokens), dtype=np.float32),
        advantage=advantage,
        weight_version=version,
        trajectory_id=f"t{version}-{len(tokens)}",
    )


def test_micro_batches_respect_the_token_budget():
    # budget 10: [4, 4] -> 2 * 4 = 8 fits, a third makes 12; [6] alone; [3, 2, 3] -> 3 * 3 = 9
    assert micro_batches_by_tokens([4, 4, 4, 6, 3, 2, 3], 10) == [[0, 1], [2], [3], [4, 5, 6]]
    assert micro_batches_by_tokens([50, 2], 10) == [[0], [1]]  # too long for the budget: alone


def test_collate_right_pads_and_broadcasts_the_advantage():
    batch = collate([item([5, 6, 7], [0, 1, 1], advantage=2.0), item([8], [1], advantage=-1.0)], pad_id=0)
    assert batch.input_ids.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch.loss_mask.tolist() == [[0, 1, 1], [1, 0, 0]]
    assert batch.advantages.tolist() == [[2, 2, 2], [-1, 0, 0]]


def test_staleness_split_drops_samples_beyond_the_threshold():
    items = [item([1], [1], version=v) for v in (9, 8, 7, 6)]
    kept, dropped = staleness_split(items, learner_version=9, threshold=2)
    assert [i.weight_version for i in kept] == [9, 8, 7]
    assert [i.weight_version for i in dropped] == [6]


def test_staleness_counts_published_versions_with_sync_every():
    from streamrl.runtime.versions import is_version_step, versions_behind

    # a version every 3 steps; the learner has trained step 7, so version 6 is its newest
    assert [versions_behind(7, v, 3) for v in (6, 3, 0)] == [0, 1, 2]
    assert [is_version_step(s, 3, 10) for s in range(1, 11)] == [False, False, True] * 3 + [True]
    items = [item([1], [1], version=v) for v in (6, 3, 0)]
    kept, dropped = staleness_split(items, learner_version=7, threshold=1, sync_every=3)
    assert [i.weight_version for i in kept] == [6, 3] and [i.weight_version for i in dropped] == [0]


def test_adaptive_kl_controller():
    ctrl = AdaptiveKLController(kl_coef=0.1, target_kl=1.0, horizon=10)
    ctrl.update(current_kl=1.1, n_steps=1)  # error +0.1 -> coef * (1 + 0.1 / 10)
    assert ctrl.kl_coef == pytest.approx(0.1 * 1.01)
    ctrl.update(current_kl=5.0, n_steps=1)  # error clipped to +0.2
    assert ctrl.kl_coef == pytest.approx(0.1 * 1.01 * 1.02)


def test_kl_reward_to_go_sums_later_trained_tokens():
    kl = torch.tensor([[0.5, 0.1, 0.2, 0.3]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0]])
    assert kl_reward_to_go(kl, mask)[0].tolist() == pytest.approx([0.6, 0.6, 0.5, 0.3])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("model"), seed=3)


def test_grpo_step_raises_the_logprob_of_a_positive_advantage(tiny):
    tokenizer, model = load(tiny)
    prompt = tokenizer("12+34=")["input_ids"]
    good, bad = tokenizer("6")["input_ids"][0], tokenizer("9")["input_ids"][0]
    trainer = GRPOTrainer(
        model,
        tokenizer.pad_token_id,
        TrainerConfig(lr=1e-2, micro_batch_tokens=64, grad_clip=1.0),
        AlgorithmConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, loss_agg_mode="token-mean"),
    )

    def logprob(token):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt])).logits[0, -1]
        return float(torch.log_softmax(logits, -1)[token])

    before_good, before_bad = logprob(good), logprob(bad)
    items = [
        item([*prompt, good], [0] * len(prompt) + [1], advantage=1.0, logprobs=[0.0] * len(prompt) + [before_good]),
        item([*prompt, bad], [0] * len(prompt) + [1], advantage=-1.0, logprobs=[0.0] * len(prompt) + [before_bad]),
    ]
    result = trainer.step(items)
    assert result.metrics["ratio"] == pytest.approx(1.0, abs=1e-5)  # behaviour == current policy
    assert result.tokens == 2 and result.samples == 2
    assert logprob(good) > before_good and logprob(bad) < before_bad


def test_grpo_loss_and_gradient_at_ratio_one_are_the_policy_gradient_by_hand(tiny):
    """At ratio 1 (the behaviour logprobs are the current policy's) PPO's clipped loss is
    the plain policy gradient. Token-mean over the step's N trained tokens:
        loss = -(1/N) sum_i A_i n_i = -(1/3)(1.0 * 1 + (-0.25) * 2) = -1/6
    (item 1: one trained token, advantage 1; item 2: two, advantage -0.25), and its
    gradient is that of -(1/N) sum_i A_i sum_t log p(token_it). One optimizer step then
    changes every parameter tensor."""
    tokenizer, model = load(tiny)
    prompt = tokenizer("12+34=")["input_ids"]
    first, second = [tokenizer("6")["input_ids"][0]], [tokenizer("9")["input_ids"][0], tokenizer.eos_token_id]
    trainer = GRPOTrainer(
        model,
        tokenizer.pad_token_id,
        TrainerConfig(lr=1e-2, micro_batch_tokens=64, grad_clip=None),
        AlgorithmConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, loss_agg_mode="token-mean"),
    )

    def response_logprobs(response):  # log p of each response token after the prompt, with gradient
        logits = model(input_ids=torch.tensor([prompt + response])).logits[0]
        logprobs = torch.log_softmax(logits.float(), -1)
        return torch.stack([logprobs[len(prompt) - 1 + t, token] for t, token in enumerate(response)])

    with torch.no_grad():
        behaviour = [response_logprobs(r).tolist() for r in (first, second)]
    items = [
        item([*prompt, *r], [0] * len(prompt) + [1] * len(r), advantage=a, logprobs=[0.0] * len(prompt) + b)
        for r, a, b in ((first, 1.0, behaviour[0]), (second, -0.25, behaviour[1]))
    ]
    model.eval()  # no dropout in either forward
    model.zero_grad()
    loss, _ = trainer.micro_batch_loss(collate(items, tokenizer.pad_token_id), totals_of(items))
    loss.backward()
    assert loss.item() == pytest.approx(-1 / 6, abs=1e-6)
    trainer_grads = {name: p.grad.clone() for name, p in model.named_parameters()}

    model.zero_grad()
    by_hand = -(1.0 * response_logprobs(first).sum() - 0.25 * response_logprobs(second).sum()) / 3
    by_hand.backward()
    for name, p in model.named_parameters():
        # float32 sums in another order (one padded batch of two rows against two single
        # rows): measured at most 4.2e-7 apart on gradients up to 0.8
        torch.testing.assert_close(trainer_grads[name], p.grad, rtol=1e-5, atol=1e-6, msg=name)

    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer.step(items)
    unchanged = [name for name, p in model.named_parameters() if torch.equal(p, before[name])]
    assert not unchanged, f"an optimizer step left {unchanged} as they were"


def test_cross_entropy_step_lowers_the_loss(tiny):
    tokenizer, model = load(tiny)
    prompt, answer = tokenizer("12+34=")["input_ids"], tokenizer("6")["input_ids"] + [tokenizer.eos_token_id]
    trainer = CrossEntropyTrainer(model, tokenizer.pad_token_id, TrainerConfig(lr=1e-2, micro_batch_tokens=64, grad_clip=1.0))
    batch = [item(prompt + answer, [0] * len(prompt) + [1] * len(answer))]
    first = trainer.step(batch).loss
    for _ in range(5):
        last = trainer.step(batch).loss
    assert last < first


def test_a_snapshot_round_trip_restores_model_optimizer_and_rng(tiny, tmp_path):
    tokenizer, model = load(tiny)
    config = TrainerConfig(lr=1e-2, micro_batch_tokens=64, grad_clip=1.0)
    trainer = CrossEntropyTrainer(model, tokenizer.pad_token_id, config)
    trainer.step([item([5, 6, 7], [0, 1, 1])])
    torch.manual_seed(123)
    store = SnapshotStore(tmp_path / "checkpoints", Placement(torch.device("cpu")))
    store.save(4, model, trainer.optimizer, {"offsets": {"t:0": 17}}, keep_every=0)
    saved = {name: value.clone() for name, value in model.state_dict().items()}
    expected_draw = torch.rand(3)
    trainer.step([item([8, 9, 10, 11], [0, 0, 1, 1])])  # the write is staged: the next step trains meanwhile
    assert latest_checkpoint(tmp_path / "checkpoints") is None  # not complete until finished
    store.finish()
    folder = latest_checkpoint(tmp_path / "checkpoints")
    assert folder.name == "step-000004" and load_state(folder) == {"step": 4, "offsets": {"t:0": 17}}
    assert (folder / "shards" / ".metadata").is_file() and not list(folder.glob("*.safetensors"))

    _, restored = load(tiny)  # the model's files at their start; the snapshot holds the weights
    fresh = CrossEntropyTrainer(restored, tokenizer.pad_token_id, config)
    load_snapshot(folder, restored, fresh.optimizer)
    assert all(torch.equal(saved[name], value) for name, value in restored.state_dict().items())
    assert fresh.optimizer.state_dict()["state"][0]["step"] == 1  # as at the snapshot, not the step after
    assert torch.equal(torch.rand(3), expected_draw)  # the RNG continues where it was saved

    # a learner killed while a snapshot is written resumes from the previous complete one
    store.save(5, model, trainer.optimizer, {"offsets": {}}, keep_every=0)
    store.pending.future.result()  # the shards are on disk, but state.json is not: the kill came first
    assert latest_checkpoint(tmp_path / "checkpoints").name == "step-000004"
    store.finish()
    assert latest_checkpoint(tmp_path / "checkpoints").name == "step-000005"
    assert not (tmp_path / "checkpoints" / "step-000004").exists()  # only the newest is kept (keep_every=0)


def test_step_buffer_counts_a_group_once_all_its_samples_arrived():
    from kafka import TopicPartition

    from streamrl.learner.step_groups import StepBuffer
    from streamrl.schema.events import GroupFiltered, Sample

    tp = TopicPartition("t", 0)
    buffer = StepBuffer()
    a0, a1 = (Sample(run_id="r", trajectory_id=f"a-{i}", group_id="a", group_size=2, step=1) for i in range(2))
    buffer.add(a0, tp, 0)
    assert buffer.complete == 0  # half of group a
    buffer.add(a0, tp, 1)  # a re-emitted copy
    assert buffer.complete == 0
    buffer.add(a1, tp, 2)
    buffer.add(GroupFiltered(run_id="r", group_id="b", reason="zero_variance", step=1), tp, 3)
    buffer.add(GroupFiltered(run_id="r", group_id="b", reason="zero_variance", step=1), tp, 4)
    assert buffer.complete == 2 and buffer.groups == {"a", "b"} and len(buffer.samples) == 2


def test_first_complete_groups_train_in_completion_order_and_a_restart_skips_exactly_them():
    """trajectory_pool.batch_groups first_complete: a step takes the first batch_size
    groups to complete, whatever step they were published for; the accounting a snapshot
    keeps skips exactly the accounted groups, and moves its `through` mark only once every
    group of a published step is accounted for."""
    from kafka import TopicPartition

    from streamrl.learner.step_groups import AccountedGroups, ArrivalPool
    from streamrl.schema.events import GroupFiltered, Sample

    tp = TopicPartition("t", 0)
    pool = ArrivalPool()

    def sample(step, group, i):
        return Sample(run_id="r", trajectory_id=f"{group}-{i}", group_id=group, group_size=2, step=step)

    # step 1's group "slow" is half done when step 2's two groups complete
    arrivals = [sample(1, "slow", 0), sample(2, "b", 0), sample(2, "b", 1), sample(1, "a", 0), sample(1, "a", 1)]
    arrivals += [GroupFiltered(run_id="r", group_id="c", reason="zero_variance", step=2)]
    for offset, event in enumerate(arrivals):
        pool.add(event, tp, offset)
    assert pool.ready == [(2, "b"), (1, "a"), (2, "c")]
    taken = pool.take(pool.ready[:2])
    assert taken.groups == {"a", "b"} and len(taken.samples) == 4 and taken.complete == 2
    assert pool.ready == [(2, "c")]
    # what a restart must read again: the half-done group and the untaken filtered one
    assert sorted(offset for _, offset in pool.offsets) == [0, 5]

    accounted = AccountedGroups(groups_per_step=2)
    accounted.add(2, "b")
    accounted.add(1, "a")
    assert accounted.through == 0 and accounted.holds(2, "b") and not accounted.holds(1, "slow")
    restored = AccountedGroups.from_state(2, accounted.state())
    restored.add(1, "slow")
    assert restored.through == 1 and restored.beyond == {2: {"b"}}
    assert restored.holds(1, "anything of step 1") and not restored.holds(2, "c")


def test_a_first_complete_step_waits_for_a_group_k_steps_overdue():
    """A group trains at most k (weight.staleness_threshold) steps after the one it was
    published for: step 4 at k = 2 waits for step 2's last group, then trains it first."""
    from kafka import TopicPartition

    from streamrl.learner.step_groups import AccountedGroups, StepGroups
    from streamrl.schema.events import Sample

    groups = StepGroups(2, first_complete=True, deferral=2, accounted=AccountedGroups(2, through=1))
    groups.account(2, {"s2-a": 2})  # trained in step 2
    tp = TopicPartition("t", 0)
    for offset, (step, group) in enumerate([(3, "s3-a"), (3, "s3-b"), (4, "s4-a"), (2, "s2-a")]):
        groups.add(Sample(run_id="r", trajectory_id=group, group_id=group, group_size=1, step=step), tp, offset)
    assert groups.choose(3, None) == [(3, "s3-a"), (3, "s3-b")]  # step 2's last group not yet overdue
    assert groups.choose(4, None) is None  # now it is: step 4 waits for it
    groups.add(Sample(run_id="r", trajectory_id="s2-b", group_id="s2-b", group_size=1, step=2), tp, 4)
    assert groups.choose(4, None) == [(2, "s2-b"), (3, "s3-a")]
    assert groups.choose(4, ["s4-a", "s3-b"]) == [(3, "s3-b"), (4, "s4-a")]  # a recorded step's own
    taken = groups.take(4)
    assert taken is not None and taken.groups == {"s2-b", "s3-a"}
    assert sorted(offset for _, offset in groups.pending_offsets) == [1, 2]  # s2-a's copy was passed over


def test_custom_trainer_prepare_trajectories_with_the_grpo_helper():
    """The guide's remote-API trainer shape: change rewards in `_prepare_trajectories`,
    re-derive advantages with compute_grpo_advantage_for_trajectories, log a metric."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from streamrl.learner.batching import TrainItem
    from streamrl.learner.trainers import GRPOTrainer, compute_grpo_advantage_for_trajectories
    from streamrl.runtime.tiny_lm import build_tokenizer, tiny_config

    class LengthPenalty(GRPOTrainer):
        def _prepare_trajectories(self, trajectories, metrics):
            for item in trajectories:
                item.reward -= 0.5 * (int(item.mask.sum()) > 2)  # long answers lose half a point
            compute_grpo_advantage_for_trajectories(trajectories)
            metrics["custom/advantage_mean"] = float(np.mean([t.advantage for t in trajectories]))
            self.seen = [t.advantage for t in trajectories]
            return trajectories

    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(tokenizer, hidden_size=32, layers=1, heads=2))
    trainer = LengthPenalty(
        model,
        tokenizer.pad_token_id,
        TrainerConfig(lr=1e-3, micro_batch_tokens=64),
        AlgorithmConfig(clip_ratio_low=0.2, clip_ratio_high=0.2),
    )

    def item(group, reward, trained):
        tokens = np.arange(5, 5 + 2 + trained, dtype=np.int32)
        return TrainItem(
            tokens=tokens,
            mask=np.array([0, 0] + [1] * trained, np.uint8),
            behaviour_logprobs=np.zeros(len(tokens), np.float32),
            reward=reward,
            group_id=group,
        )

    # group a: rewards 1, 1, 0 become 1, 0.5, 0 after the penalty (the second is long)
    items = [item("a", 1.0, 1), item("a", 1.0, 3), item("a", 0.0, 1), item("b", 1.0, 1), item("b", 0.0, 1)]
    result = trainer.step(items)
    # GRPO with the sample standard deviation: (r - mean) / (std + 1e-6)
    # a: mean 0.5, std 0.5 -> 1, 0, -1;  b: mean 0.5, std sqrt(0.5) -> +-0.70711
    np.testing.assert_allclose(trainer.seen, [1.0, 0.0, -1.0, 0.70711, -0.70711], atol=1e-4)
    assert result.metrics["custom/advantage_mean"] == pytest.approx(0.0, abs=1e-6)


def test_weight_versions_are_written_from_a_copy_and_announced_in_order(tiny, tmp_path):
    """The version is the weights when it was started, not when the writer got to it; the
    versions come out oldest first, only once written; a failed write raises."""
    import threading

    from streamrl.learner.checkpoint import write_weight_version
    from streamrl.learner.version_writes import VersionWrites, cpu_copy
    from streamrl.runtime.folders import directory_sha256
    from streamrl.runtime.tiny_lm import load

    tokenizer, model = load(tiny)
    writes = VersionWrites()
    gate = threading.Event()
    copy = cpu_copy(model.state_dict())
    # the copy keeps the tied embeddings tied: its folder is the model's own, byte for byte
    # (a resumed learner compares the re-trained weights with a version by their hash)
    assert directory_sha256(write_weight_version(tmp_path / "direct", 1, model, tokenizer)) == directory_sha256(
        write_weight_version(tmp_path / "copied", 1, model, tokenizer, copy)
    )

    def slow_write():
        gate.wait(10)
        return write_weight_version(tmp_path, 1, model, tokenizer, copy)

    writes.submit(1, slow_write)
    with torch.no_grad():  # the next step changes the weights while version 1 is being written
        model.model.embed_tokens.weight.add_(1.0)
    writes.done(2, tmp_path / "v000002")
    assert writes.written() == []  # version 1 is not on disk yet, and 2 waits behind it
    gate.set()
    assert writes.written(wait=True) == [(1, tmp_path / "v000001"), (2, tmp_path / "v000002")]
    written = load(tmp_path / "v000001")[1]
    assert torch.equal(written.model.embed_tokens.weight, copy["model.embed_tokens.weight"])
    assert not torch.equal(written.model.embed_tokens.weight, model.model.embed_tokens.weight)

    def fails():
        raise OSError("disk full")

    writes.submit(3, fails)
    writes.wait_idle()
    with pytest.raises(OSError, match="disk full"):
        writes.written()
    writes.close()


def test_broadcast_buckets_hold_consecutive_tensors_up_to_the_byte_limit():
    from streamrl.learner.weight_broadcast import buckets

    tensors = [torch.zeros(10), torch.zeros(100), torch.zeros(5), torch.zeros(1)]  # 40, 400, 20, 4 bytes
    assert buckets(tensors, 400) == [1, 1, 2]  # 40 + 400 > 400: the large one starts a bucket of its own
    assert buckets(tensors, 100) == [1, 1, 2]  # a tensor over the limit goes alone
    assert buckets(tensors, 10**6) == [4] and buckets([], 10) == []
