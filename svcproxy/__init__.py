"""svcproxy: a Kubernetes Service proxy split into a frontend and per-node backends."""
