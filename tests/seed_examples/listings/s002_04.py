"""The guide's listing 002_04 (shared/seeds/002_*.txt, code block 4), as printed; only import lines differ."""
from streamrl.api import BaseNexAURolloutWorker

class MyTaskWorker(BaseNexAURolloutWorker):
    def get_train_loss_mask(self, trajectory_infos: list[dict]) -> list[bool]:
        """Custom loss mask for training."""
        mask = []
        for traj_info in trajectory_infos:
            # Only train on final answer, not intermediate steps
            is_final_answer = traj_info.get("is_final", False)
            mask.append(is_final_answer)
        return mask
