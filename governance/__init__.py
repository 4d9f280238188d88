"""Governance: the rules, readable and testable alone.

Tags, the propagation rule, the policy engine and its compilation to a filter, callers and
operations, receipts and their hash chain, and lineage events. Nothing here touches storage: it
imports ragwarden's errors and packaged policy files only (the audit log is handed the table it
writes).
"""
