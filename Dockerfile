# The moddeb service image: the web app (`moddeb serve`) and build workers (`moddeb worker`).
#
# There is no registry to pull from: BASE is moddeb's own base builder image, made from the
# Debian archive (mmdebstrap + docker import) the first time moddeb builds anything, so it
# already carries the archive's apt sources, build-essential, dpkg-dev, xz and zstd.
# Python packages come from a wheelhouse made beforehand on the host (whose pip knows its
# package index), so the image build itself needs only the Debian archive:
#
#   pip wheel --wheel-dir dist/wheels . "gunicorn==27.0.1" "psycopg[binary]==3.3.9" \
#       "setuptools>=70" wheel "async-timeout>=4.0.3"   # (Debian's Python 3.11.2 needs it for redis)
#   docker build --network host -t moddeb/service \
#       --build-arg BASE="$(docker images moddeb/base --format '{{.Repository}}:{{.Tag}}' | head -1)" .
#
# (--network host because this engine runs without a bridge network.) See docs/service.md.
ARG BASE
FROM ${BASE}

ENV DEBIAN_FRONTEND=noninteractive \
    LC_ALL=C.UTF-8 \
    PYTHONUNBUFFERED=1 \
    MODDEB_HOME=/var/lib/moddeb \
    PATH=/opt/moddeb/bin:$PATH

# python3 for moddeb; git for git sources; gnupg to sign the repository (web only);
# redis-server so that this image can also be compose's broker where no registry is near.
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        python3 python3-venv git gnupg redis-server ca-certificates \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/moddeb/src
COPY pyproject.toml README.md ./
COPY builder ./builder
COPY web ./web
COPY debian-templates ./debian-templates
COPY dist/wheels /tmp/wheels
# Editable, so that builder finds debian-templates/ and web its templates/ next to the code;
# the venv's own setuptools builds it, and every dependency comes from the wheelhouse.
RUN python3 -m venv /opt/moddeb \
    && /opt/moddeb/bin/pip install --no-cache-dir --no-index --find-links /tmp/wheels \
        "setuptools>=70" wheel \
    && /opt/moddeb/bin/pip install --no-cache-dir --no-index --find-links /tmp/wheels \
        --no-build-isolation -e . "gunicorn==27.0.1" "psycopg[binary]==3.3.9" \
    && rm -rf /tmp/wheels \
    && useradd --system --uid 10001 --home-dir /var/lib/moddeb --create-home moddeb \
    && install -d -o moddeb -g moddeb /srv/moddeb-db

# The base image's labels would make this look like a builder image to `moddeb images`.
LABEL moddeb.kind=service
# Web and worker run unprivileged; compose gives the worker the Docker socket's group.
USER moddeb
VOLUME ["/var/lib/moddeb"]
EXPOSE 8080
ENTRYPOINT ["moddeb"]
CMD ["serve", "--listen", "0.0.0.0:8080"]
