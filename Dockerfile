# syntax=docker/dockerfile:1
# ragwarden as a container: `ragwarden serve` (the HTTP API, /mcp and /console) on port 8000, as a
# non-root user, the embedding model inside the image (nothing is downloaded when it runs).
#
#   docker build -t ragwarden-datalayer:0.1.0 .
#   docker run -p 8000:8000 -e RAGWARDEN_WAREHOUSE=s3://bucket/warehouse -e AWS_REGION=... \
#     -e RAGWARDEN_JWT_JWKS=... -e RAGWARDEN_JWT_ISSUER=... -e RAGWARDEN_JWT_AUDIENCE=... ragwarden-datalayer:0.1.0
#
# deploy/compose.yaml runs two replicas of it behind a TLS proxy (docs/operations.md).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1

# The CPU build of torch first, from PyTorch's own index: the default index's build of the same
# version is the CUDA one, which pulls gigabytes of GPU libraries this image never uses. The
# install of the checkout then finds torch==2.13.0 satisfied (2.13.0+cpu).
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0

# The checkout (the distribution ragwarden-datalayer, the command ragwarden), read through a bind
# mount: the build writes into it, and none of it stays in a layer.
RUN --mount=type=bind,target=/src,rw cd /src && pip install .

# The default encoder (onnx-int8) is an export of the packaged model: made once here, not by each
# container as it starts, and read-only from then on.
ENV RAGWARDEN_EMBED_CACHE=/opt/ragwarden/onnx
RUN python -c "import os, pathlib; from ragwarden.embedder import ensure_export; \
ensure_export('onnx-int8', pathlib.Path(os.environ['RAGWARDEN_EMBED_CACHE']))"

# A numeric user, so an orchestrator can verify that it is not root (Kubernetes' runAsNonRoot).
# /var/lib/ragwarden is its own: a volume mounted there holds a warehouse in a folder.
RUN useradd --create-home --uid 10001 --user-group --shell /usr/sbin/nologin ragwarden \
    && install -d -o 10001 -g 10001 /var/lib/ragwarden
USER 10001:10001
WORKDIR /home/ragwarden

EXPOSE 8000
# Ready once the warehouse answers and a policy is in force (/healthz only says the process answers).
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=4)"]
CMD ["ragwarden", "serve", "--host", "0.0.0.0", "--port", "8000"]
