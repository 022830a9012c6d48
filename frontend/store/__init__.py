"""The store: the cluster's objects as the sources sent them, parsed and typed."""
