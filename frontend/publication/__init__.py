"""Publication: the views, their revisioned changelog, digests, coalescing and the wire
encoding of changes and snapshots."""
