"""The real-traffic harness shared by every backend's scenario suite."""
