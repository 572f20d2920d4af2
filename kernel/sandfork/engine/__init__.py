"""The Sandfork engine: sandboxes, their metadata and the HTTP API."""
