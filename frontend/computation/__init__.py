"""Computation: each service's records per node (endpoint selection, node classes, the
initial load at sync), pure functions of the store's objects."""
