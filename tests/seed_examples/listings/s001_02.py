"""The guide's listing 001_02 (shared/seeds/001_*.txt, code block 2), as printed; only import lines differ."""

# recipe/my_task/agent_workspace/my_worker.py

from streamrl.api import BaseNexAURolloutWorker
from typing import Any

class MyTaskWorker(BaseNexAURolloutWorker):
    """Custom worker with specialized query formatting."""

    def format_task_query(self, data_item: dict[str, Any]) -> str:
        """
        Convert raw data into agent-compatible query.

        Args:
            data_item: Dictionary from dataloader with task data

        Returns:
            Formatted query string for agent
        """
        # Example: Math problem formatting
        problem = data_item.get("problem", "")
        context = data_item.get("context", "")

        query = f"Problem: {problem}\n"
        if context:
            query += f"Context: {context}\n"
        query += "\nProvide your solution step by step."

        return query
