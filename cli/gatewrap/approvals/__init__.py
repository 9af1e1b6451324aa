"""Breakpoints seen from the host: the approvals store opened by URL, the decisions of a human
(CLI and web page), and the notifications sent when a run asks.

The store itself (SQLite or PostgreSQL, optimistic locking, at-most-once) lives in the Rust
extension (``gatewrap._gate_core.ApprovalStore``); this package only reads it, decides
through it and formats what it holds.
"""
