"""A small network-namespace lab: nodes, pods, clients and real packets.

Used by the real-traffic scenario suite (``tests/support/netns``) and by the packet
demo (``scripts/demo_packets.py``). Everything it creates carries a per-run
tag in its name and is removed by ``Lab.destroy()``.
"""
