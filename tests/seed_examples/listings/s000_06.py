"""The guide's listing 000_06 (shared/seeds/000_*.txt, code block 6), as printed; only import lines differ."""
from streamrl.api import BaseNexAURolloutWorker

class CustomTokenWorker(BaseNexAURolloutWorker):
    def get_train_loss_mask(self, trajectory_infos: list[dict]) -> list[bool]:
        """
        Custom loss masking logic.

        Example: Only train on tokens after specific marker.
        """
        mask = []

        for traj in trajectory_infos:
            response_tokens = traj.get("response_tokens", [])
            response_text = self.tokenizer.decode(response_tokens)

            # Find marker position
            marker = "<final_answer>"
            if marker in response_text:
                # Tokenize up to marker to find split point
                marker_tokens = self.tokenizer.encode(marker, add_special_tokens=False)

                # Find marker position in tokens
                marker_pos = self._find_sublist(response_tokens, marker_tokens)

                if marker_pos >= 0:
                    # Mask tokens before marker, keep tokens after
                    mask.extend([False] * marker_pos)
                    mask.extend([True] * (len(response_tokens) - marker_pos))
                else:
                    # Marker not found, train on all
                    mask.extend([True] * len(response_tokens))
            else:
                # No marker, train on all
                mask.extend([True] * len(response_tokens))

        return mask

    def _find_sublist(self, full_list, sublist):
        """Find position of sublist in full list."""
        sublist_len = len(sublist)
        for i in range(len(full_list) - sublist_len + 1):
            if full_list[i:i+sublist_len] == sublist:
                return i
        return -1
