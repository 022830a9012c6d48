"""Backends: each turns a node's state into dataplane programming."""
