set -e
export HF_HUB_DISABLE_PROGRESS_BARS=1 PYTHONUNBUFFERED=1
python3 -c "from streamrl.runtime.tiny_lm import build_tiny_model; build_tiny_model('/tmp/tiny', seed=11)"
for dtype in float32 bfloat16; do
  STREAMRL_TEST_DEVICE=cuda STREAMRL_TEST_DTYPE=$dtype python3 tests/helpers/dist_learner.py /tmp/tiny /tmp/w-$dtype train
  STREAMRL_TEST_DEVICE=cuda STREAMRL_TEST_DTYPE=$dtype python3 tests/helpers/dist_learner.py /tmp/tiny /tmp/w-$dtype resume
done
STREAMRL_TEST_DEVICE=cpu python3 tests/helpers/dist_learner.py /tmp/tiny /tmp/w-cpu train
python3 - <<'PY'
import torch
cpu = torch.load('/tmp/w-cpu/params-train.pt'); gpu = torch.load('/tmp/w-float32/params-train.pt'); bf = torch.load('/tmp/w-bfloat16/params-train.pt')
print("cuda fp32 vs cpu fp32, max |diff| after 3 steps:", max((cpu[k]-gpu[k]).abs().max().item() for k in cpu))
print("cuda bf16 vs cpu fp32, max |diff| after 3 steps:", max((cpu[k]-bf[k]).abs().max().item() for k in cpu))
from streamrl.producers.inference import EmbeddedEngine, SamplingParams
e = EmbeddedEngine('/tmp/w-float32/weights/v000004', device='auto')
out = e.generate([[5, 6, 7], [8, 9]], SamplingParams(max_new_tokens=8, temperature=1.0))
print("embedded engine on", e.device, [len(c.response_token_ids) for c in out], [round(c.logprobs[0], 3) for c in out])
PY
