"""The guide's listing 001_03 (shared/seeds/001_*.txt, code block 3), as printed; only import lines differ."""
from streamrl.api import BaseNexAURolloutWorker

class MyTaskWorker(BaseNexAURolloutWorker):
    def get_train_loss_mask(self, trajectory_infos: list[dict]) -> list[bool]:
        """
        Define loss mask for training.

        Args:
            trajectory_infos: List of trajectory dicts from trace processing
                Each contains: prompt_messages, tools, response_message, etc.

        Returns:
            Boolean mask - True for tokens to train on, False to skip
        """
        # Example 1: Train on all response tokens (default)
        return [True] * len(trajectory_infos)

        # Example 2: Skip tool call tokens, only train on final answer
        mask = []
        for traj in trajectory_infos:
            response_msg = traj.get("response_message", {})
            # Skip if message contains tool calls
            has_tool_calls = bool(response_msg.get("tool_calls"))
            mask.append(not has_tool_calls)
        return mask

        # Example 3: Only train on tokens after certain keyword
        # (Requires more complex token-level analysis)
