# The example deployment's object store: moto's S3 server, the same version the test suite runs.
# A stand-in, in memory: what it holds goes when it stops. A real deployment uses its own store.
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN pip install "moto[server]==5.2.5"
USER 10001:10001
EXPOSE 5000
