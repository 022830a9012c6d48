# svcproxy image: the frontend and every backend (choose with the command).
# Built from the wheel: the build stage runs `pip wheel .` (build isolation: the protobuf
# generators come from [build-system] requires), the image installs only the wheels.
FROM python:3.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY proto proto
COPY svcproxy svcproxy
COPY frontend frontend
COPY backends backends
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim-bookworm
RUN apt-get update \
 && apt-get install -y --no-install-recommends nftables iptables ipset conntrack iproute2 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels svcproxy && rm -rf /wheels \
 && printf '#!/bin/sh\n# kube-proxy'"'"'s command line runs unchanged: svcproxy backend <kube-proxy flags>\nexec svcproxy backend "$@"\n' \
    > /usr/local/bin/kube-proxy && chmod 755 /usr/local/bin/kube-proxy
COPY examples /examples
ENTRYPOINT ["svcproxy"]
CMD ["--help"]
