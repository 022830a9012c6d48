"""The nftables backend."""
