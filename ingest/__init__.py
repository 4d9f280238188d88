"""Ingest: source loaders and ACL readers, chunking, and the idempotent per-document writer."""
