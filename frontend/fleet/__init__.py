"""The fleet: what every node has applied, from its reports (see docs/fleet.md)."""
