"""The guide's listing 000_08 (shared/seeds/000_*.txt, code block 8), as printed; only import lines differ."""
from streamrl.api import BaseNexAURolloutWorker

# agent_workspace/custom_tools.py
def my_tool_function():
    return "result"

# agent_workspace/my_worker.py

class MyWorker(BaseNexAURolloutWorker):
    def rollout(self, task):
        result = my_tool_function()
        # ... use result
