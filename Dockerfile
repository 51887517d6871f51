FROM python:3.11-slim
# The torch build to install: CUDA for the GPU services of docker-compose.yml (the
# learner, under torchrun), CPU for a laptop (--build-arg TORCH_INDEX=.../whl/cpu).
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu126
WORKDIR /app
COPY . .
# every extra but `local`: the cluster has its own Kafka and PostgreSQL (docker-compose.yml)
RUN pip install --no-cache-dir --extra-index-url ${TORCH_INDEX} ".[ui,plots,service,lora,agents,rewards,trackers]"
ENTRYPOINT []
