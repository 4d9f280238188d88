"""Interfaces: the command line and the demo (HTTP and MCP services come later)."""
