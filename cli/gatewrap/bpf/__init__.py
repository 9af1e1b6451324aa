"""Kernel side of gatewrap: compile, pin, attach and configure the cgroup hooks in ``bpf/``."""
