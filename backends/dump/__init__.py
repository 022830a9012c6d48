"""The dump backend: prints the node's state and its changes as JSON lines."""
