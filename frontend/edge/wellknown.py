"""The labels, annotations and taint keys the edge kinds read, each written once: those
Kubernetes defines (k8s.io/api's well_known_labels.go, discovery's and core's) and the
annotations of svcproxy's own options."""

from __future__ import annotations

# core/v1: a Service a proxy other than the default one programs (kube-proxy skips it).
SERVICE_PROXY_NAME_LABEL = "service.kubernetes.io/service-proxy-name"
TOPOLOGY_MODE_ANNOTATION = "service.kubernetes.io/topology-mode"
TOPOLOGY_HINTS_ANNOTATION = "service.kubernetes.io/topology-aware-hints"  # deprecated
# The order kube-proxy reads them in: topology-mode first, else the deprecated one.
TOPOLOGY_ANNOTATIONS = (TOPOLOGY_MODE_ANNOTATION, TOPOLOGY_HINTS_ANNOTATION)
# ValidateService checks it without spec.loadBalancerSourceRanges (svcproxy reads the
# field alone, as kube-proxy does).
SOURCE_RANGES_ANNOTATION = "service.beta.kubernetes.io/load-balancer-source-ranges"
ZONE_LABEL = "topology.kubernetes.io/zone"
# discovery/v1: the Service a slice belongs to; when its endpoints last changed.
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
TRIGGER_TIME_ANNOTATION = "endpoints.kubernetes.io/last-change-trigger-time"
# The cluster autoscaler's taint on a node it is removing (kube-proxy's health check).
TO_BE_DELETED_TAINT = "ToBeDeletedByClusterAutoscaler"
# svcproxy's per-Service options (svcproxy.io/...) are annotations with this prefix.
OPTION_PREFIX = "svcproxy.io/"
