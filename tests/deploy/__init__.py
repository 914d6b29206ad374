"""Offline checks of deploy/: the image, the Kubernetes manifests, the Prometheus rules and the dashboard."""
