"""Admission: what a request to the API must be before any layer above serves it (its
validation, the epoch of a resume) and the refusal it gets otherwise. Serving, the access
checks and the fleet all refuse through it; it imports only the edge and runtime."""
