"""The frontend: watches the cluster, computes each node's state, serves it over gRPC."""
