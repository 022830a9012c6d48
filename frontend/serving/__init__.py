"""Serving: the gRPC API over the publication (streams, pages, limits, request checks,
readiness, stream workers)."""
