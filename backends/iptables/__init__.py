"""The iptables backend."""
