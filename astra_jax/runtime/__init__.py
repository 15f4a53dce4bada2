"""What every layer may lean on: the user's-input error (errors), process-level
multi-host helpers (distributed), disk-full and read-only reporting (faults), fallback counts
(degraded), the hung-step watchdog, host memory and CPU-thread budgets, private temporary
names, and the command-line start-up the tools share (cli).

Layer 1 of 13 (tests/test_layout.py): imports no other package of astra_jax.
"""
