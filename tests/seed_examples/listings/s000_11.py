"""The guide's listing 000_11 (shared/seeds/000_*.txt, code block 11), as printed; only import lines differ."""
from streamrl.api import BaseRolloutWorker

class MyWorker(BaseRolloutWorker):
    def __init__(self, config):
        super().__init__(config)
        # Load worker-specific config
        self.use_few_shot = config.get("use_few_shot", True)
        self.num_examples = config.get("num_examples", 3)
        self.answer_format = config.get("answer_format", "xml")
