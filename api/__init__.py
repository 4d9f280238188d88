"""Interfaces over the face: the command line, the HTTP service, the MCP server and the console.

Nothing here reaches storage but through ``Warehouse``; identity comes from ``credentials``."""
