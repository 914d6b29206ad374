"""The KnitTrans demo: orchestrates every part on one machine."""
