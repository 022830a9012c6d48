"""``svcproxy status`` and ``svcproxy wait``: what every node applied, read from a frontend.

``status`` pages through GetFleet and prints nodes by state, the slowest nodes, the
nodes whose digest disagrees and the refused service ports, and with ``--service`` on
how many nodes each of its service ports' and endpoints' current decision is applied
(``--output json``: the fleet as the API says it). ``wait`` follows WaitFleet until
the state asked for is applied on every counted node (exit 0), or exits 1 at
``--timeout`` naming the nodes still behind (2 when the frontend refused the request).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import grpc
from google.protobuf.json_format import MessageToDict

from svcproxy.durations import parse_duration
from svcproxy.v1 import nodestate_pb2 as pb
from svcproxy.v1 import nodestate_pb2_grpc as pb_grpc

SLOWEST = 10
RETRY = 0.5
STATE_ORDER = ("APPLIED", "SYNCING", "LAGGING", "DISAGREEING", "UNKNOWN", "DISCONNECTED")


def duration(text: str) -> float:
    """argparse type: a Go duration such as 30s, 500ms or 1m30s."""
    try:
        return parse_duration(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def add_connection_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--api", default="127.0.0.1:12090", metavar="ADDRESS",
                   help="the frontend's gRPC API: HOST:PORT or unix:///path (default "
                   "%(default)s); the caller must be in its --cluster-readers")
    p.add_argument("--api-ca", type=Path, metavar="FILE",
                   help="connect with TLS, trusting this CA bundle for the frontend's cert")
    p.add_argument("--api-cert", type=Path, metavar="FILE",
                   help="client certificate for mutual TLS (with --api-key)")
    p.add_argument("--api-key", type=Path, metavar="FILE", help="private key of --api-cert")
    p.add_argument("--api-token-file", type=Path, metavar="FILE",
                   help="send this ServiceAccount token (audience-bound, projected)")


def status_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "status", help="what every node has applied, from a frontend",
        description="Ask a frontend what every node applied (GetFleet): nodes by state, "
        "the slowest nodes, nodes whose state digest differs from the frontend's, and the "
        "service ports backends refused. A node whose backend does not report is UNKNOWN, "
        "never failed.")
    add_connection_arguments(p)
    p.add_argument("--node", default="", metavar="NAME", help="only this node")
    p.add_argument("--service", default="", metavar="[NAMESPACE/]NAME",
                   help="also count, per service port of this Service and per endpoint of "
                   "it, the connected nodes holding it that applied its current decision")
    p.add_argument("--output", "-o", choices=("table", "json"), default="table",
                   help="table (default) or json (every node, as GetFleet answers)")
    p.set_defaults(func=run_status)


def wait_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "wait", help="wait until a state is applied on every node",
        description="Wait until the state asked for is applied on every node that "
        "watches the frontend and reports (WaitFleet); exit 0 then, or 1 at --timeout "
        "naming the nodes still behind. A pod's preStop hook runs "
        "`svcproxy wait --endpoint-gone $POD_IP --timeout 30s` to keep serving until no "
        "node sends it new connections (docs/fleet.md).")
    add_connection_arguments(p)
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--endpoint-gone", metavar="IP[:PORT]",
                      help="no node sends new connections to this address any more (it is "
                      "in no node's applied internal or external set, terminating "
                      "fallback included)")
    what.add_argument("--endpoint-ready", metavar="IP",
                      help="the endpoint with this IP is in the state every node applied")
    what.add_argument("--service", metavar="NAMESPACE/NAME",
                      help="every node applied this Service's changes up to --revision")
    p.add_argument("--revision", type=int, default=0, metavar="R",
                   help="with --service: the frontend revision (default: its revision "
                   "when the wait starts)")
    p.add_argument("--timeout", type=duration, default=30.0, metavar="DURATION",
                   help="give up after this long, exit 1 (default 30s)")
    p.add_argument("--node-lost-after", type=duration, default=10.0, metavar="DURATION",
                   help="a node that disconnected stops counting this long after (it gets "
                   "a snapshot when it returns) (default 10s)")
    p.add_argument("--quiet", "-q", action="store_true", help="print nothing on success")
    p.set_defaults(func=run_wait)


def _channel(args: argparse.Namespace) -> grpc.Channel:
    from svcproxy.sdk.client import open_channel, tls_credentials

    return open_channel(args.api, tls_credentials(args.api_ca, args.api_cert, args.api_key))


def _metadata(args: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    if not args.api_token_file:
        return ()
    from svcproxy.sdk.credentials import TokenFile

    return TokenFile(args.api_token_file).metadata()


def _fail(args: argparse.Namespace, err: grpc.RpcError) -> int:
    print(f"svcproxy: the frontend at {args.api} answered {err.code().name}: "
          f"{err.details()}", file=sys.stderr)
    return 2


# ---- status ---------------------------------------------------------------
def fetch_fleet(stub: pb_grpc.NodeStateServiceStub, request: pb.GetFleetRequest,
                metadata: tuple[tuple[str, str], ...]) -> pb.Fleet:
    """Every page of GetFleet, merged into one Fleet."""
    merged: pb.Fleet | None = None
    while True:
        page = stub.GetFleet(request, timeout=30, metadata=metadata)
        if merged is None:
            merged = page
        else:
            merged.nodes.extend(page.nodes)
        if not page.next_page_token:
            merged.next_page_token = ""
            return merged
        request.page_token = page.next_page_token


def run_status(args: argparse.Namespace) -> int:
    namespace, _, service = args.service.rpartition("/")
    request = pb.GetFleetRequest(node_name=args.node, namespace=namespace, service=service)
    try:
        with _channel(args) as channel:
            answer = fetch_fleet(pb_grpc.NodeStateServiceStub(channel), request,
                                 _metadata(args))
    except grpc.RpcError as err:
        return _fail(args, err)
    if args.output == "json":
        json.dump(MessageToDict(answer, preserving_proto_field_name=True), sys.stdout,
                  indent=2, sort_keys=True)
        print()
    else:
        print_status(answer, sys.stdout)
    return 0


def _state(node: pb.FleetNode) -> str:
    return pb.FleetNodeState.Name(node.state).removeprefix("NODE_")  # type: ignore[arg-type]


def _key(key: pb.ServicePortKey) -> str:
    port = f":{key.port_name}" if key.port_name else ""
    return f"{key.namespace}/{key.name}{port}/{pb.Protocol.Name(key.protocol)}"  # type: ignore[arg-type]


def _table(out: IO[str], title: str, header: tuple[str, ...], rows: list[tuple[str, ...]]
           ) -> None:
    print(f"\n{title}", file=out)
    if not rows:
        print("  (none)", file=out)
        return
    widths = [max(len(str(r[i])) for r in (header, *rows)) for i in range(len(header))]
    for row in (header, *rows):
        cells = (str(c).ljust(w) for c, w in zip(row, widths, strict=True))
        print("  " + "  ".join(cells).rstrip(), file=out)


def print_status(fleet: pb.Fleet, out: IO[str]) -> None:
    """The table ``svcproxy status`` prints."""
    counts = {k.removeprefix("NODE_"): v for k, v in fleet.nodes_by_state.items()}
    print(f"frontend revision {fleet.revision}, {len(fleet.nodes)} nodes "
          f"(--lag-warning {fleet.lag_warning_seconds:g}s)", file=out)
    print("  " + "  ".join(f"{s} {counts.get(s, 0)}" for s in STATE_ORDER), file=out)
    behind = sorted((n for n in fleet.nodes if n.applied_revision < n.served_revision
                     and n.applied_revision), key=lambda n: (-n.lag_seconds, n.node_name))
    _table(out, "Slowest nodes", ("NODE", "STATE", "APPLIED", "SERVED", "BEHIND", "LAG",
                                  "BACKEND"),
           [(n.node_name, _state(n), str(n.applied_revision), str(n.served_revision),
             str(n.lag_revisions), f"{n.lag_seconds:.1f}s", n.backend)
            for n in behind[:SLOWEST]])
    _table(out, "Disagreeing digests", ("NODE", "REVISION", "APPLIED DIGEST", "SERVED DIGEST"),
           [(n.node_name, str(n.applied_revision), f"{n.applied_digest:016x}",
             f"{n.served_digest:016x}") for n in fleet.nodes
            if n.state == pb.NODE_DISAGREEING])
    refused: dict[str, tuple[list[str], str]] = {}
    for node in fleet.nodes:
        for item in node.refused:
            names, _ = refused.setdefault(_key(item.service), ([], item.reason))
            names.append(node.node_name)
    _table(out, "Refused service ports", ("SERVICE PORT", "NODES", "REASON"),
           [(key, f"{len(names)} ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})",
             reason[:80]) for key, (names, reason) in sorted(refused.items())])
    if fleet.services:
        print_progress(fleet, out)


def print_progress(fleet: pb.Fleet, out: IO[str]) -> None:
    """Per service port, and per endpoint of it: on how many of the connected, reporting
    nodes that hold it its current decision is applied."""
    _table(out, "Service ports", ("SERVICE PORT", "NODES", "APPLIED", "REFUSED"),
           [(_key(p.service), str(p.nodes), str(p.applied_nodes), str(p.refused_nodes))
            for p in fleet.services])
    _table(out, "Endpoints", ("SERVICE PORT", "ENDPOINT", "NODES", "APPLIED"),
           [(_key(p.service), e.ip, str(e.nodes), str(e.applied_nodes))
            for p in fleet.services for e in p.endpoints])


# ---- wait -----------------------------------------------------------------
def wait_request(args: argparse.Namespace) -> pb.WaitFleetRequest:
    return pb.WaitFleetRequest(endpoint_gone=args.endpoint_gone or "",
                               endpoint_ready=args.endpoint_ready or "",
                               service=args.service or "", revision=args.revision,
                               node_lost_after_seconds=args.node_lost_after)


def follow(stub: pb_grpc.NodeStateServiceStub, request: pb.WaitFleetRequest,
           metadata: tuple[tuple[str, str], ...], deadline: float,
           clock: Callable[[], float] = time.monotonic) -> Iterator[pb.WaitFleetProgress]:
    """WaitFleet's messages until done or ``deadline``; a broken stream is opened again
    (UNAVAILABLE) until then. Other statuses are raised."""
    while (left := deadline - clock()) > 0:
        try:
            for progress in stub.WaitFleet(request, timeout=left, metadata=metadata):
                yield progress
                if progress.done:
                    return
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                return
            if err.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            time.sleep(min(RETRY, max(0.0, deadline - clock())))


def run_wait(args: argparse.Namespace) -> int:
    deadline = time.monotonic() + args.timeout
    last: pb.WaitFleetProgress | None = None
    try:
        with _channel(args) as channel:
            stub = pb_grpc.NodeStateServiceStub(channel)
            for progress in follow(stub, wait_request(args), _metadata(args), deadline):
                last = progress
    except grpc.RpcError as err:
        return _fail(args, err)
    what = describe(args)
    if last is not None and last.done:
        if not args.quiet:
            print(f"{what}: applied on all {last.nodes_counted} counted nodes"
                  f"{_unknown(last)}", file=sys.stderr)
        return 0
    if last is None:
        print(f"svcproxy: timed out after {args.timeout:g}s waiting for {what}: the frontend "
              f"at {args.api} did not answer", file=sys.stderr)
        return 1
    more = last.nodes_behind_count - len(last.nodes_behind)
    print(f"svcproxy: timed out after {args.timeout:g}s waiting for {what}: "
          f"{last.nodes_behind_count} of {last.nodes_counted} nodes still behind: "
          f"{', '.join(last.nodes_behind)}{f' and {more} more' if more > 0 else ''}"
          f"{_unknown(last)}", file=sys.stderr)
    return 1


def describe(args: argparse.Namespace) -> str:
    if args.endpoint_gone:
        return f"endpoint {args.endpoint_gone} gone"
    if args.endpoint_ready:
        return f"endpoint {args.endpoint_ready} ready"
    return f"service {args.service} at revision {args.revision or 'now'}"


def _unknown(progress: pb.WaitFleetProgress) -> str:
    if not progress.nodes_unknown:
        return ""
    return (f" ({len(progress.nodes_unknown)} nodes not counted: they do not report: "
            f"{', '.join(progress.nodes_unknown[:5])})")
