"""Shared gRPC server plumbing for the KnitTrans services.

Needs the `admission` or `reorg` extra (uvloop, prometheus-client); the client SDK never imports it.
"""
