"""Retrieval: vector, full-text and hybrid search under the compiled filter, then a post-check."""
