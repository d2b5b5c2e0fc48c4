"""The team server: an authenticated HTTP API in front of the state database (docs/server.md)."""
