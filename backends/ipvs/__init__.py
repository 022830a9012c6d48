"""The IPVS backend."""
