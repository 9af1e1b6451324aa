"""The shared mode: one gatewrap daemon for every sandbox on the host."""
