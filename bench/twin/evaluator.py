"""The cluster twin's evaluator: a reward of 0 or 1 from the answer's text (a hash of
its start), so a group's rewards vary as a real task's do and GRPO keeps most groups."""

import zlib

from streamrl.api import EvaluationRunResult, Evaluator


class TwinEvaluator(Evaluator):
    def evaluate(self, data, evaluation_target):
        answer = evaluation_target.final_answer
        reward = float(zlib.crc32(answer[:64].encode()) & 1)
        return EvaluationRunResult(reward=reward, ground_truth="", metrics={"accuracy": reward})
