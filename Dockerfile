# One image for the web process and both kinds of worker.
# torch==2.13.0 from PyPI is the CUDA build on x86_64 Linux, which GPU workers need.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    PRBENCH_VAR_DIR=/srv/prbench/var MODELS_ROOT=/models DATA_ROOT=/data \
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
WORKDIR /srv/prbench

COPY requirements.txt .
RUN pip install -r requirements.txt

COPY . .
RUN useradd --create-home --uid 1000 prbench && mkdir -p "$PRBENCH_VAR_DIR" /models /data \
    && chown -R prbench "$PRBENCH_VAR_DIR" /models /data
USER prbench

EXPOSE 8000
CMD ["gunicorn", "prbench.wsgi:application", "--bind", "0.0.0.0:8000"]
