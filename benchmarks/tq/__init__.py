"""TransferQueue baseline pieces of ``benchmarks/transfer.py``.

Importable only inside the separate TransferQueue venv (``bench-out/tq-venv``), where
``transferqueue==0.1.11`` is installed; ``benchmarks/transferqueue_arm.py`` is the entry point.
"""
