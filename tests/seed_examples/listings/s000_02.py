"""The guide's listing 000_02 (shared/seeds/000_*.txt, code block 2), as printed; only import lines differ."""

from streamrl.api import BaseNexAURolloutWorker, EvaluationRunResult, NexAUEvaluationTarget
from streamrl.api import InMemoryTracer
from dataclasses import dataclass, field
from typing import Any
import logging

logger = logging.getLogger(__name__)

class MyAgentWorker(BaseNexAURolloutWorker):
    """Custom NexAU worker with specialized query formatting."""

    def run_agent(self, task: dict[str, Any]) -> tuple[Any, EvaluationRunResult]:
        """
        Run agent with custom query formatting and processing.

        Override this method to customize:
        - Query formatting
        - Agent configuration
        - Trace processing
        - Evaluation
        """
        # 1. Custom query formatting
        query = self._format_query(task)

        # 2. Load agent with custom LLM client
        agent, client_provider_func = self.load_agent_from_config(
            custom_llm_client_provider=lambda: self._inference_client
        )

        # 3. Run agent
        response = agent.run(query, custom_llm_client_provider=client_provider_func)

        # 4. Extract traces
        traces = []
        for tracer in agent.config.tracers:
            if isinstance(tracer, InMemoryTracer):
                traces = tracer.dump_traces()
                break

        # 5. Process traces
        trajectories = self.trace_processor(traces)

        # 6. Create agent output
        @dataclass
        class AgentOutput:
            final_answer: str
            observation: list
            rl_params: dict = field(default_factory=dict)

        agent_output = AgentOutput(
            final_answer=response,
            observation=agent.history,
            rl_params={"trajectory": trajectories}
        )

        # 7. Evaluate
        evaluation_result = self.evaluator.evaluate(
            task,
            NexAUEvaluationTarget(
                final_answer=agent_output.final_answer,
                observation=agent_output.observation
            ),
        )

        # 8. Attach reward to trajectories
        for traj in trajectories:
            traj["reward"] = evaluation_result.reward
            traj["score"] = {
                "reward_score": evaluation_result.reward,
                **evaluation_result.metrics,
            }

        return agent_output, evaluation_result

    def _format_query(self, task: dict[str, Any]) -> str:
        """
        Custom query formatting for specific task.

        This is where task-specific prompt engineering happens.
        """
        # Example: Structured query format
        instruction = task.get("instruction", "")
        context = task.get("context", "")
        examples = task.get("examples", [])

        query_parts = []

        if instruction:
            query_parts.append(f"Instruction: {instruction}")

        if context:
            query_parts.append(f"\nContext: {context}")

        if examples:
            query_parts.append("\nExamples:")
            for i, ex in enumerate(examples, 1):
                query_parts.append(f"{i}. {ex}")

        query_parts.append("\nPlease solve the task:")

        return "\n".join(query_parts)
