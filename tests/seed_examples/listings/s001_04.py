"""The guide's listing 001_04 (shared/seeds/001_*.txt, code block 4), as printed; only import lines differ."""

from streamrl.api import BaseNexAURolloutWorker, NexAUEvaluationTarget
from typing import Any
from streamrl.api import InMemoryTracer

class ComplexTaskWorker(BaseNexAURolloutWorker):
    """Fully customized worker with pre/post processing."""

    def __init__(self, config):
        super().__init__(config)
        # Initialize custom components
        self.preprocessor = self._init_preprocessor()
        self.postprocessor = self._init_postprocessor()

    def format_task_query(self, data_item: dict[str, Any]) -> str:
        """Format query with preprocessing."""
        # Preprocess data
        processed_data = self.preprocessor(data_item)

        # Build query
        query = self._build_query(processed_data)

        return query

    def run_agent(self, task: dict[str, Any]) -> str | None:
        """
        Override full execution pipeline if needed.

        Use this when you need to:
        - Modify agent execution flow
        - Add custom pre/post processing
        - Implement multi-stage agent interactions
        """
        try:
            # 1. Format query
            query = self.format_task_query(task)

            # 2. Execute agent
            tracer = InMemoryTracer()
            final_answer = self.agent.run(query, client=self.client, tracer=tracer)

            # 3. Post-process output
            final_answer = self.postprocessor(final_answer)

            # 4. Process trace
            trace = tracer.get_trace()
            trajectories = []
            for child in trace.get("children", []):
                self.child_processor(child, trajectories)

            # 5. Evaluate
            evaluation_target = NexAUEvaluationTarget(
                final_answer=final_answer,
                observation=[{"trace": trace}]
            )
            eval_result = self.evaluator.evaluate(task, evaluation_target)

            # 6. Generate tokens and create trajectory
            tokens = self._generate_tokens(trajectories)
            loss_mask = self.get_train_loss_mask(trajectories)

            trajectory = {
                "tokens": tokens,
                "loss_mask": loss_mask,
                "reward": eval_result.reward,
                "final_answer": final_answer,
                "metrics": eval_result.metrics,
                **task
            }

            # 7. Submit to pool
            return self._put_trajectory(trajectory)

        except Exception as e:
            self.logger.error(f"Error in run_agent: {e}")
            return None

    def _init_preprocessor(self):
        # Your preprocessing logic
        return lambda x: x

    def _init_postprocessor(self):
        # Your postprocessing logic
        return lambda x: x

    def _build_query(self, data):
        # Your query building logic
        return str(data)
