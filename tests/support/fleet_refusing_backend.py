"""A backend whose dataplane refuses the ports of one Service, run by the node agent's own
``run_agent`` (as ``svcproxy backend NAME`` runs a backend): it records refusals in the
SDK's ``Refusals`` as every backend does, and reports nothing by code of its own.

    python -m tests.support.fleet_refusing_backend SERVICE --api ADDR --node-name NAME ...
"""

from __future__ import annotations

import argparse
import sys

from svcproxy.sdk.agent import add_agent_arguments, config_from_args, run_agent
from svcproxy.sdk.backend import Backend, Changes, NodeState
from svcproxy.sdk.refusals import Refusals

REASON = "the test dataplane refuses this Service"


class RefusingBackend(Backend):
    name = "refusing"
    dataplane = False

    def __init__(self, service: str) -> None:
        self.service = service
        self.refusals = Refusals(self.name)

    def sync(self, state: NodeState, changes: Changes) -> None:
        for key in changes.services:
            if key.name == self.service:
                self.refusals.refuse(key, state.services.get(key), REASON, retry=False)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("service")
    add_agent_arguments(parser)
    args = parser.parse_args(argv)
    config = config_from_args(args)
    return run_agent(RefusingBackend(args.service), config, args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
