"""A run's sandbox: its network namespace, its cgroup v2 leaf and the user it runs as."""
