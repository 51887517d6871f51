"""The guide's listing 002_03 (shared/seeds/002_*.txt, code block 3), as printed; only import lines differ."""

from streamrl.api import BaseNexAURolloutWorker
from typing import Any

class MyTaskWorker(BaseNexAURolloutWorker):
    """Custom worker for my task."""

    def format_task_query(self, data_item: dict[str, Any]) -> str:
        """Format data item into task query."""
        # Extract relevant fields
        context = data_item.get("context", "")
        question = data_item.get("question", "")

        # Format prompt
        query = f"""Context: {context}

Question: {question}

Please provide your answer:"""

        return query
