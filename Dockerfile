# svcproxy image: the frontend and every backend (choose with the command).
FROM python:3.11-slim-bookworm
RUN apt-get update \
 && apt-get install -y --no-install-recommends nftables iptables ipset conntrack iproute2 \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY proto proto
COPY svcproxy svcproxy
COPY frontend frontend
COPY backends backends
RUN pip install --no-cache-dir grpcio-tools==1.85.1 mypy-protobuf==5.1.0 \
 && pip install --no-cache-dir --no-build-isolation . \
 && pip uninstall -y grpcio-tools mypy-protobuf
COPY examples /examples
ENTRYPOINT ["svcproxy"]
CMD ["--help"]
