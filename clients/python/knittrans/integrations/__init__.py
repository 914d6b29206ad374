"""Supported integrations of KnitTrans into RL frameworks: :mod:`knittrans.integrations.trl` (TRL's
``GRPOTrainer``, installed with the ``trl`` extra). Each lives in its own subpackage and imports its framework
only there, so the SDK stays installable without any of them."""
