FROM python:3.11-slim
WORKDIR /app
COPY . .
RUN pip install --no-cache-dir --extra-index-url https://download.pytorch.org/whl/cpu -e .
ENTRYPOINT []
