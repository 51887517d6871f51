"""The guide-style recipe's worker: the guide's MySimpleWorker (listing 000_01) with the
guide's "Monitor Training" call (listing 001_19, a statement from inside a worker) made in
its reward step. Not a listing itself: the glue that puts the two in one rollout."""

from tests.seed_examples.listings.s000_01 import MySimpleWorker


class LoggingWorker(MySimpleWorker):
    def _compute_reward(self, answer, task):
        self._activity_tracker.experiment_logger_post(
            backend="wandb",
            data={
                "custom_metric": float(len(answer)),
                "agent_calls": 1,
            },
            step=task["step"]
        )
        return super()._compute_reward(answer, task)
