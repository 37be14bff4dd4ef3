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
# Static files are part of the image, collected as production serves them (DEBUG off: hashed
# names, compressed), so the image's own CMD starts without a collectstatic. The key is a
# throwaway that only this step sees; nothing here reads a database or a broker.
RUN DEBUG=0 ALLOWED_HOSTS=build CELERY_BROKER_URL=memory:// \
    SECRET_KEY="$(python -c 'import secrets; print(secrets.token_urlsafe(50))')" \
    python manage.py collectstatic --noinput -v0

EXPOSE 8000
CMD ["gunicorn", "--config", "gunicorn.conf.py", "prbench.wsgi:application", "--bind", "0.0.0.0:8000"]
