"""Code that runs inside workflow code: the run workflow, the sandbox driver, its guards, approvals, progress.

Everything here is replayed: it must be deterministic (no clock, randomness, environment or file reads but
through Temporal: `tests/test_determinism_lint.py` checks this folder and every module it imports), and it
imports nothing from `worker/`, `client/` or `history/`.
"""
