"""Every field svcproxy reads from Services, EndpointSlices and Nodes: what it does with
it (honoured, degraded how, ignored) and the Kubernetes rule its validation mirrors.

The table is declarative: docs/edge-fields.md holds ``markdown()`` verbatim (a test
compares them) and each example is checked against the kind's reader (its verdict and
the object it makes), so the page, the code and the tests say the same thing. A field
svcproxy starts reading goes into its kind's reader (service.py, endpointslice.py,
node.py) and into this table. Regenerate the page's table with
``python -m svcproxy.frontend.edge.fields``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

HONOURED = "honoured"
DEGRADED = "degraded"
IGNORED = "ignored"
V128 = "pkg/apis/core/validation (v1.28)"
DISCOVERY = "pkg/apis/discovery/validation (v1.28)"


@dataclass(frozen=True, slots=True)
class EdgeField:
    """One field: its kind and path, what svcproxy does (``handling``: honoured, degraded
    or ignored, and how), the Kubernetes rule; ``example``: a (path, value) set on a
    valid object that shows the handling (a degraded one warns of ``path``)."""

    kind: str
    field: str
    handling: str
    how: str
    rule: str
    example: tuple[str, Any] | None = None


FIELDS: tuple[EdgeField, ...] = (
    # ---- Service -------------------------------------------------------------------
    EdgeField("Service", "metadata.name", HONOURED, "",
              "ValidateServiceName (NameIsDNS1035Label)"),
    EdgeField("Service", "metadata.namespace", HONOURED, "",
              "ValidateNamespaceName (DNS-1123 label)"),
    EdgeField("Service", "metadata.labels", HONOURED,
              "service.kubernetes.io/service-proxy-name selects the proxy",
              "ValidateLabels"),
    EdgeField("Service", "metadata.annotations", HONOURED,
              "topology-mode / topology-aware-hints, svcproxy.io/* options; a lone "
              "surrogate (a YAML escape) read as U+FFFD, as Go's decoder stores it",
              "ValidateAnnotations (qualified-name keys, 256 KiB); ValidateService: "
              "topology-mode equal to topology-aware-hints when both are set"),
    EdgeField("Service", "metadata.creationTimestamp", HONOURED,
              "orders Services claiming one ClusterIP:port or nodePort (the later is "
              "refused for that port)", "set by the apiserver; allocators refuse the later"),
    EdgeField("Service", "spec.type", HONOURED, "ExternalName is not proxied",
              "supportedServiceType"),
    EdgeField("Service", "spec.clusterIP(s)", HONOURED,
              "an IPv4-mapped address is read as its IPv4 address (Go's To4)",
              "ValidateServiceClusterIPsRelatedFields: IsValidIP (ParseIPSloppy), at most 2 "
              "of different families, clusterIPs[0] = clusterIP, clusterIPs only with "
              "clusterIP; none for ExternalName; the allocator's range (no unspecified, loopback, "
              "link-local, multicast or broadcast address: no service CIDR holds one)",
              ("spec", {"clusterIP": "::ffff:10.96.0.10", "clusterIPs": ["::ffff:10.96.0.10"],
                        "ports": [{"port": 80}]})),
    EdgeField("Service", "spec.ports[].name", HONOURED, "",
              "validateServicePort: ValidateDNS1123Label, required with several ports, unique"),
    EdgeField("Service", "spec.ports[].protocol", HONOURED, "unset is TCP",
              "supportedPortProtocols (SetDefaults_ServicePort)"),
    EdgeField("Service", "spec.ports[].port", HONOURED, "",
              "IsValidPortNum; (port, protocol) unique"),
    EdgeField("Service", "spec.ports[].targetPort", HONOURED, "",
              "ValidatePortNumOrName (0 and \"\" default to port)"),
    EdgeField("Service", "spec.ports[].nodePort", HONOURED, "",
              "IsValidPortNum (0: none), forbidden for ClusterIP, (nodePort, protocol) unique"),
    EdgeField("Service", "spec.ports[].appProtocol", IGNORED, "",
              "ValidateQualifiedName when set", ("spec.ports.0.appProtocol", None)),
    EdgeField("Service", "spec.externalIPs", HONOURED, "",
              "IsValidIP and ValidateNonSpecialIP"),
    EdgeField("Service", "spec.sessionAffinity(Config)", HONOURED, "",
              "supportedSessionAffinityType, validateClientIPAffinityConfig (1-86400 s); "
              "ValidateService: no sessionAffinityConfig with the affinity None"),
    EdgeField("Service", "spec.internalTrafficPolicy", HONOURED, "",
              "validateServiceInternalTrafficFieldsValue: Cluster or Local when set "
              "(\"\" is not)"),
    EdgeField("Service", "spec.externalTrafficPolicy", HONOURED, "",
              "validateServiceExternalTrafficPolicy: Cluster or Local, only on NodePort, "
              "LoadBalancer or a ClusterIP with externalIPs (ExternallyAccessible)"),
    EdgeField("Service", "spec.healthCheckNodePort", HONOURED, "",
              "validateServiceExternalTrafficPolicy: IsValidPortNum, only with type "
              "LoadBalancer and externalTrafficPolicy Local (NeedsHealthCheck)"),
    EdgeField("Service", "spec.loadBalancerSourceRanges", HONOURED,
              "IPv4-mapped ranges of length 96+ are the IPv4 range they map (as Go matches)",
              "ValidateService: only with type LoadBalancer; GetLoadBalancerSourceRanges "
              "(each entry one CIDR, spaces trimmed, ParseCIDRSloppy: no comma)",
              ("spec", {"type": "LoadBalancer", "clusterIP": "10.96.0.10",
                        "clusterIPs": ["10.96.0.10"], "ports": [{"port": 80}],
                        "loadBalancerSourceRanges": ["::ffff:192.168.1.0/120"]})),
    EdgeField("Service",
              "metadata.annotations.service.beta.kubernetes.io/load-balancer-source-ranges",
              IGNORED, "kube-proxy reads spec.loadBalancerSourceRanges alone",
              "ValidateService, without spec.loadBalancerSourceRanges: only with type "
              "LoadBalancer; GetLoadBalancerSourceRanges (trimmed: empty, or CIDRs "
              "separated by commas, each trimmed)"),
    EdgeField("Service", "spec.trafficDistribution", HONOURED, "",
              "validateServiceTrafficDistribution: PreferClose, PreferSameZone, "
              "PreferSameNode when set (\"\" is not; v1.30+)"),
    EdgeField("Service", "spec.ipFamilies, spec.ipFamilyPolicy", IGNORED,
              "a cluster IP's family is its own", "ValidateServiceClusterIPsRelatedFields "
              "(IPv4/IPv6, no repeat, each its cluster IP's family), ipFamilyPolicy enum "
              "when set (\"\" is not), "
              "SingleStack with one IP and one family (alloc.go initIPFamilyFields); none "
              "for ExternalName"),
    EdgeField("Service", "spec.externalName", IGNORED, "ExternalName is not proxied",
              "ValidateDNS1123Subdomain (a trailing dot allowed)"),
    EdgeField("Service", "status.loadBalancer.ingress[].ip", HONOURED, "",
              "ValidateLoadBalancerStatus: IsValidIP"),
    EdgeField("Service", "status.loadBalancer.ingress[].ipMode", HONOURED,
              "unset with an ip is VIP (SetDefaults_Service)",
              "ValidateLoadBalancerStatus (v1.29+): VIP or Proxy when set (\"\" is not), "
              "only with an ip"),
    # ---- EndpointSlice -------------------------------------------------------------
    EdgeField("EndpointSlice", "metadata.name", HONOURED, "",
              "ValidateEndpointSliceName (NameIsDNSSubdomain)"),
    EdgeField("EndpointSlice", "metadata.labels.kubernetes.io/service-name", DEGRADED,
              "missing: that version is not used, the last labelled one stays served, as "
              "kube-proxy skips such an update (logged and counted as rejected)",
              "ValidateLabels; no rule requires it"),
    EdgeField("EndpointSlice",
              "metadata.annotations.endpoints.kubernetes.io/last-change-trigger-time",
              DEGRADED, "not a usable RFC 3339 time: the time the slice was seen",
              "ValidateAnnotations; no rule for the value",
              ("metadata.annotations",
               {"endpoints.kubernetes.io/last-change-trigger-time": "yesterday"})),
    EdgeField("EndpointSlice", "addressType", HONOURED, "FQDN slices are not proxied",
              "validateAddressType"),
    EdgeField("EndpointSlice", "ports[].name", HONOURED, "",
              "validatePorts: ValidateDNS1123Label when set, unique"),
    EdgeField("EndpointSlice", "ports[].protocol", HONOURED, "unset (null) is TCP",
              "validatePorts: supportedPortProtocols (\"\" is not)"),
    EdgeField("EndpointSlice", "ports[].port", DEGRADED,
              "outside 1-65535: that port is left out, the slice's others are served",
              "none (an int32)", ("ports.0.port", 0)),
    EdgeField("EndpointSlice", "ports[].appProtocol", IGNORED, "",
              "validatePorts: ValidateQualifiedName when set"),
    EdgeField("EndpointSlice", "endpoints[].addresses", HONOURED,
              "an IPv4-mapped address in an IPv4 slice is read as its IPv4 address",
              "validateEndpoints: 1-100, IsValidIPv4Address / IsValidIPv6Address and "
              "ValidateEndpointIP, IsFullyQualifiedDomainName",
              ("endpoints.0.addresses", ["::ffff:10.244.1.5"])),
    EdgeField("EndpointSlice", "endpoints[].conditions", HONOURED,
              "unset ready is true, unset serving is ready", "none (booleans)"),
    EdgeField("EndpointSlice", "endpoints[].nodeName", HONOURED, "",
              "ValidateNodeName when set (\"\" is not valid)"),
    EdgeField("EndpointSlice", "endpoints[].zone", HONOURED,
              "any text; not valid UTF-8 (a YAML escape) is degraded to no zone",
              "none", ("endpoints.0.zone", "Zone A")),
    EdgeField("EndpointSlice", "endpoints[].hostname", IGNORED, "",
              "ValidateDNS1123Label when set (\"\" is not valid)"),
    EdgeField("EndpointSlice", "endpoints[].deprecatedTopology", IGNORED, "",
              "ValidateLabels, at most 16, not topology.kubernetes.io/zone",
              ("endpoints.0.deprecatedTopology", {"kubernetes.io/hostname": "node-a"})),
    EdgeField("EndpointSlice", "endpoints[].hints.forZones[].name", HONOURED, "",
              "validateHints: at most 8, unique, IsValidLabelValue (\"\" allowed)",
              ("endpoints.0.hints", {"forZones": [{"name": ""}]})),
    EdgeField("EndpointSlice", "endpoints[].hints.forNodes[].name", HONOURED, "",
              "validateHints (v1.33): at most 8, unique, ValidateNodeName"),
    # ---- Node ----------------------------------------------------------------------
    EdgeField("Node", "metadata.name", HONOURED, "", "ValidateNodeName"),
    EdgeField("Node", "metadata.labels", HONOURED, "topology.kubernetes.io/zone is the zone",
              "ValidateLabels"),
    EdgeField("Node", "metadata.deletionTimestamp", HONOURED, "the node is terminating",
              "set by the apiserver"),
    EdgeField("Node", "spec.podCIDRs, spec.podCIDR", HONOURED,
              "IPv4-mapped ranges as Go reads them",
              "ValidateNode: ValidateCIDR (no space), at most one per family, no duplicate",
              ("spec.podCIDRs", ["::ffff:10.244.1.0/120"])),
    EdgeField("Node", "spec.taints[].key", HONOURED,
              "ToBeDeletedByClusterAutoscaler: terminating",
              "validateNodeTaints (qualified-name key, label value, effect, unique)"),
    EdgeField("Node", "status.addresses[]", DEGRADED,
              "an unknown type, or an InternalIP/ExternalIP that is no IP: that address "
              "is ignored", "none (no status is validated)",
              ("status.addresses", [{"type": "InternalIP", "address": "not-an-ip"}])),
)


def _cell(text: str) -> str:
    return text.replace("|", "\\|") or "-"


def markdown() -> str:
    """The table docs/edge-fields.md holds."""
    rows = ["| Kind | Field | svcproxy | How | Kubernetes rule |",
            "|---|---|---|---|---|"]
    rows += [f"| {f.kind} | `{f.field}` | {f.handling} | {_cell(f.how)} | {_cell(f.rule)} |"
             for f in FIELDS]
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
