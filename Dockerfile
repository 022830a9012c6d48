# svcproxy image: the frontend and every backend (choose with the command).
# Built from the wheel: the build stage runs `pip wheel .` (build isolation: the protobuf
# generators come from [build-system] requires), the image installs only the wheels.
# The ebpf backend's programs are compiled in the build stage (clang, libbpf-dev's headers)
# and travel in the wheel; the image needs only the runtime libbpf1 to load them.
FROM python:3.11-slim-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends clang libbpf-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY proto proto
COPY svcproxy svcproxy
COPY frontend frontend
COPY backends backends
# --force: never ship an object copied from the build context; fails here without clang.
RUN python backends/ebpf/build.py --force \
 && pip wheel --no-cache-dir --wheel-dir /wheels . \
 && python -c "import glob, zipfile; (w,) = glob.glob('/wheels/svcproxy-*.whl'); \
zipfile.ZipFile(w).getinfo('svcproxy/backends/ebpf/bpf/svcproxy_sock.bpf.o')"

FROM python:3.11-slim-bookworm
RUN apt-get update \
 && apt-get install -y --no-install-recommends nftables iptables ipset conntrack iproute2 \
    libbpf1 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels svcproxy && rm -rf /wheels \
 && printf '#!/bin/sh\n# kube-proxy'"'"'s command line runs unchanged: svcproxy backend <kube-proxy flags>\nexec svcproxy backend "$@"\n' \
    > /usr/local/bin/kube-proxy && chmod 755 /usr/local/bin/kube-proxy
COPY examples /examples
ENTRYPOINT ["svcproxy"]
CMD ["--help"]
