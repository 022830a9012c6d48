"""What the ebpf backend names in the kernel is named in one module (``names.py``), with the
strings earlier versions pinned: a restarted backend adopts the old pins by them."""

from __future__ import annotations

from svcproxy.backends.ebpf import names, packet_layout


def test_the_packet_paths_maps_keep_the_names_they_were_pinned_by() -> None:
    assert names.TC_MAPS == ("spp_services", "spp_endpoints", "spp_maglev", "spp_ct",
                             "spp_devices", "spp_affinity", "spp_ranges", "spp_cluster_ips",
                             "spp_xdp_stats", "spp_stats", "spp_local", "spp_local_cidrs",
                             "spp_local_devices")
    assert names.MAPS == ("sp_services", "sp_endpoints", "sp_affinity", "sp_revnat")
    assert names.TC_SUBDIR == "tc" and names.LINK_PREFIX == "link_"


def test_map_names_live_in_names_alone() -> None:
    """packet_layout.py holds layouts only; every map it sizes is one names.py names."""
    assert not [n for n in vars(packet_layout) if n.startswith("MAP")]
    assert set(packet_layout.SIZES) <= set(names.TC_MAPS)
