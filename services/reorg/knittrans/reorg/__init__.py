"""KnitTrans reorg sidecar: packing (pure), shared-memory ring and the sidecar service."""
