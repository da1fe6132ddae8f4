# canopy broker image; compose.yaml builds it (`build: .`). Every option is a CANOPY_*
# environment variable (see README.md, "Configuration"), so one image serves every node.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    CANOPY_DATA_DIR=/data \
    CANOPY_LISTEN=0.0.0.0:9092

WORKDIR /src
# Only what the package needs (see .dockerignore); a non-editable install puts `canopy`
# in /usr/local/bin.
COPY pyproject.toml README.md ./
COPY protocol ./protocol
COPY storage ./storage
COPY broker ./broker
COPY replication ./replication
COPY controller ./controller
COPY canopy_spark ./canopy_spark
RUN pip install . && canopy --help >/dev/null

VOLUME /data
EXPOSE 9092 8080
WORKDIR /data
CMD ["canopy", "serve"]
