"""The guide's listing 000_09 (shared/seeds/000_*.txt, code block 9), as printed; only import lines differ."""
from tests.seed_examples.listings._helpers import logger

def rollout(self, task):
    try:
        # Main logic
        result = self._process_task(task)
        trajectory = self._create_trajectory(result, task)
        return self._put_trajectory(trajectory)
    except KeyError as e:
        logger.error(f"Missing required field: {e}")
        return None
    except ValueError as e:
        logger.error(f"Invalid task data: {e}")
        return None
    except Exception as e:
        logger.exception(f"Unexpected error in rollout: {e}")
        # Activity tracker will auto-report this
        return None
