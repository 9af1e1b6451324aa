"""gatewrap: run an AI agent so that all of its network egress passes one admission gate."""

__version__ = "0.1.0"
