"""Which groups each training step trains, as their samples arrive.

`trajectory_pool.batch_groups: published` (the default): step s trains the groups
published for it, once all of them are accounted for (as samples or a GroupFiltered
record). `first_complete`: step s trains the first `batch_size` groups to complete,
whatever step they were published for, but a group trains at most k steps after its
own (k: weight.staleness_threshold, 0 in sync mode), so the step waits for one published
k or more steps before it. What a restart skips is kept in `AccountedGroups`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from kafka import TopicPartition

from streamrl.learner.batching import TrainItem
from streamrl.learner.step_inputs import staleness_split, staleness_split_at_generation
from streamrl.schema.events import GroupFiltered


@dataclass
class StepBuffer:
    """What has arrived for one step: samples by event id, filtered groups, offsets by
    group, and per group how many samples arrived of how many the processor emitted."""

    samples: dict = field(default_factory=dict)
    filtered: dict = field(default_factory=dict)
    group_offsets: dict = field(default_factory=dict)  # group id -> [(partition, offset)]
    arrived: dict = field(default_factory=dict)  # group id -> [arrived, expected]
    complete: int = 0  # groups fully arrived (a group's samples may span several polls)

    def add(self, event, tp: TopicPartition, offset: int) -> str | None:
        """Take in one event; returns the group id when the event completes its group."""
        if isinstance(event, GroupFiltered) and event.reason == "late":
            return None  # its group was already accounted for
        self.group_offsets.setdefault(event.group_id, []).append((tp, offset))
        if isinstance(event, GroupFiltered):
            if event.group_id in self.filtered:
                return None
            self.filtered[event.group_id] = event
            self.complete += 1
            return event.group_id
        if event.event_id in self.samples:  # a re-emitted copy counts once
            return None
        self.samples[event.event_id] = event
        counts = self.arrived.setdefault(event.group_id, [0, event.group_size])
        counts[0] += 1
        if counts[0] != counts[1]:
            return None
        self.complete += 1
        return event.group_id

    @property
    def offsets(self) -> list:
        return [pair for pairs in self.group_offsets.values() for pair in pairs]

    @property
    def groups(self) -> set:
        return set(self.arrived) | set(self.filtered)

    def take(self, group_ids: set[str], into: StepBuffer) -> None:
        """Move the named groups, complete ones, into `into`."""
        for event_id, sample in list(self.samples.items()):
            if sample.group_id in group_ids:
                into.samples[event_id] = self.samples.pop(event_id)
        for group_id in group_ids & set(self.filtered):
            into.filtered[group_id] = self.filtered.pop(group_id)
        for group_id in group_ids & set(self.arrived):
            into.arrived[group_id] = self.arrived.pop(group_id)
        for group_id in group_ids & set(self.group_offsets):
            into.group_offsets[group_id] = self.group_offsets.pop(group_id)
        moved = len(group_ids & into.groups)
        self.complete -= moved
        into.complete += moved


@dataclass
class AccountedGroups:
    """first_complete: which groups the learner has accounted for (trained, dropped as
    stale or filtered), by the step they were published for. Every group of a published
    step up to `through` is; `beyond` names those of later published steps. A snapshot
    keeps both, so a restart skips exactly these groups (in arrival order the groups a
    step takes are not a prefix of any partition)."""

    groups_per_step: int
    through: int = 0
    beyond: dict = field(default_factory=dict)  # published step -> set of group ids

    def holds(self, published_step: int, group_id: str) -> bool:
        return published_step <= self.through or group_id in self.beyond.get(published_step, ())

    def add(self, published_step: int, group_id: str) -> None:
        self.beyond.setdefault(published_step, set()).add(group_id)
        while len(self.beyond.get(self.through + 1, ())) >= self.groups_per_step:
            self.through += 1
            del self.beyond[self.through]

    def state(self) -> dict:
        return {"through": self.through, "beyond": {str(s): sorted(ids) for s, ids in sorted(self.beyond.items())}}

    @classmethod
    def from_state(cls, groups_per_step: int, state: dict) -> AccountedGroups:
        beyond = {int(s): set(ids) for s, ids in state.get("beyond", {}).items()}
        return cls(groups_per_step, int(state["through"]), beyond)


@dataclass
class ArrivalPool:
    """first_complete: the step buffers by published step, and the complete groups in
    the order they completed; a step takes the first `groups_per_step` of them."""

    buffers: dict = field(default_factory=dict)  # published step -> StepBuffer
    ready: list = field(default_factory=list)  # (published step, group id), in completion order

    def add(self, event, tp: TopicPartition, offset: int) -> None:
        done = self.buffers.setdefault(event.step, StepBuffer()).add(event, tp, offset)
        if done is not None:
            self.ready.append((event.step, done))

    def take(self, chosen: list[tuple[int, str]]) -> StepBuffer:
        """The chosen complete groups, as one step's buffer."""
        taken = StepBuffer()
        for published_step in {s for s, _ in chosen}:
            buffer = self.buffers[published_step]
            buffer.take({g for s, g in chosen if s == published_step}, taken)
            if not buffer.group_offsets:
                del self.buffers[published_step]
        chosen_set = set(chosen)
        self.ready = [pair for pair in self.ready if pair not in chosen_set]
        return taken

    @property
    def offsets(self) -> list:
        return [pair for buffer in self.buffers.values() for pair in buffer.offsets]


class StepGroups:
    """The arriving samples of a run, by the step that will train them."""

    def __init__(self, groups_per_step: int, first_complete: bool, deferral: int, accounted: AccountedGroups):
        self.groups_per_step, self.first_complete, self.deferral = groups_per_step, first_complete, deferral
        self.accounted = accounted
        self.by_step: dict[int, StepBuffer] = defaultdict(StepBuffer)  # published: by the step
        self.pool = ArrivalPool()  # first_complete

    @classmethod
    def of(cls, recipe, trained_step: int, snapshot: dict) -> StepGroups:
        """A learner's, having trained `trained_step` steps (`snapshot`: its state, if any)."""
        first_complete = recipe.trajectory_pool.batch_groups == "first_complete"
        groups_per_step = recipe.trajectory_pool.batch_size
        accounted = AccountedGroups(groups_per_step, through=trained_step)
        if first_complete and snapshot:
            accounted = AccountedGroups.from_state(groups_per_step, snapshot["accounted"])
        # how many steps past the one it was published for a group may train (0 in sync mode)
        deferral = 0 if recipe.weight.sync_mode == "sync" else recipe.weight.staleness_threshold
        return cls(groups_per_step, first_complete, deferral, accounted)

    def add(self, event, tp: TopicPartition, offset: int) -> None:
        """Take in a Sample or GroupFiltered record (one accounted for already, trained
        before a restart or a re-emitted copy, is passed over)."""
        if self.accounted.holds(event.step, event.group_id):
            return
        if self.first_complete:
            self.pool.add(event, tp, offset)
        else:
            self.by_step[event.step].add(event, tp, offset)

    def take(self, step: int, recorded_groups: list[str] | None = None) -> StepBuffer | None:
        """Step `step`'s groups once they are complete, else None. `recorded_groups`:
        re-training a recorded step after a restart (first_complete), exactly those
        (published: the step's own, whose recorded samples the learner picks)."""
        if not self.first_complete:
            return self.by_step.pop(step) if self.by_step[step].complete >= self.groups_per_step else None
        chosen = self.choose(step, recorded_groups or None)
        return self.pool.take(chosen) if chosen is not None else None

    def choose(self, step: int, recorded_groups: list[str] | None) -> list[tuple[int, str]] | None:
        """first_complete: the (published step, group id) pairs step `step` trains."""
        ready = self.pool.ready
        if recorded_groups is not None:
            chosen = [pair for pair in ready if pair[1] in set(recorded_groups)]
            return chosen if len(chosen) == len(recorded_groups) else None
        overdue_through = step - self.deferral
        ready_by_step: dict[int, int] = defaultdict(int)
        for published_step, _ in ready:
            ready_by_step[published_step] += 1
        for published_step in range(self.accounted.through + 1, overdue_through + 1):
            accounted = len(self.accounted.beyond.get(published_step, ()))
            if accounted + ready_by_step[published_step] < self.groups_per_step:
                return None  # a group published for it is still being generated
        overdue = [pair for pair in ready if pair[0] <= overdue_through]
        chosen = (overdue + [pair for pair in ready if pair[0] > overdue_through])[: self.groups_per_step]
        return chosen if len(chosen) == self.groups_per_step else None

    def staleness_split(
        self, items: list[TrainItem], published: dict[str, int], learner_version: int, threshold: float, sync_every: int
    ) -> tuple[list[TrainItem], list[TrainItem]]:
        """(kept, dropped): the bound counted from the learner's version (published) or
        from the step each group was published for (first_complete)."""
        if self.first_complete:
            return staleness_split_at_generation(items, published, threshold, sync_every)
        return staleness_split(items, learner_version, threshold, sync_every)

    def account(self, step: int, published: dict[str, int]) -> None:
        """After step `step` trained: its groups (group id -> published step) are accounted for."""
        if not self.first_complete:
            self.accounted.through = step  # every group of the steps up to it
            return
        for group_id, published_step in published.items():
            self.accounted.add(published_step, group_id)

    @property
    def pending_offsets(self) -> list:
        """(partition, offset) of every event read and not yet trained."""
        if self.first_complete:
            return self.pool.offsets
        return [pair for buffer in self.by_step.values() for pair in buffer.offsets]

    def state(self) -> dict:
        """What a snapshot keeps for a restart to skip exactly the accounted groups
        (published: the snapshot's step says it)."""
        return {"accounted": self.accounted.state()} if self.first_complete else {}
