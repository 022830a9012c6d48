"""The pipeline: the engine that takes source events through the intake, the store, the
computation and the publication, on one event loop. Serving and the fleet read it."""
