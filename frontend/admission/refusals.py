"""A refused call: the status and message a client gets, and the count of invalid requests."""

from __future__ import annotations

import grpc

from svcproxy.frontend.runtime.metrics import counter

INVALID = counter("svcproxy_frontend_invalid_requests_total",
                  "Requests refused with INVALID_ARGUMENT, by method.", ["method"])


class Refused(Exception):
    """A call refused with a status; picklable, so a stream worker gets it whole."""

    def __init__(self, code: str, message: str, delay: float = 0.0) -> None:
        super().__init__(code, message, delay)
        self.code_name = code
        self.message = message
        # How long the call's process holds the refusal back (RefusalDelay).
        self.delay = delay

    @property
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode[self.code_name]

    async def abort(self, context: grpc.aio.ServicerContext) -> None:
        await context.abort(self.code, self.message)
