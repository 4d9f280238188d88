"""Governance: tags, the propagation rule, the policy engine and its compilation to a filter.

This subpackage imports nothing else of ragwarden but its errors, so the rules can be read
and tested alone.
"""
