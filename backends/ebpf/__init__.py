"""The ebpf backend: socket-level load balancing with cgroup BPF programs."""
