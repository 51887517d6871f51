"""The guide's listing 000_13 (shared/seeds/000_*.txt, code block 13), as printed; only import lines differ."""
from streamrl.api import BaseRolloutWorker

# utils.py (in workspace)
import re

def extract_xml_tag(text: str, tag: str) -> str | None:
    """Extract content from XML-style tags."""
    pattern = f"<{tag}>(.*?)</{tag}>"
    match = re.search(pattern, text, re.DOTALL)
    return match.group(1).strip() if match else None

def extract_json(text: str) -> dict:
    """Extract JSON from text."""
    import json
    # Implementation
    return {}

# my_worker.py

class MyWorker(BaseRolloutWorker):
    def _extract_answer(self, response):
        return extract_xml_tag(response, "answer") or response
