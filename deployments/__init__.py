"""Thin Ray Serve shells around api/ and engine/, and the builder that wires them (deployments.app)."""
