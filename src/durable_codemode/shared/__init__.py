"""What workflow code and every other side share: the data that crosses the workflow boundary, names, errors.

Replayed (workflow code imports it), so `tests/test_determinism_lint.py` checks this folder as it checks
`workflow/`; it imports nothing of the library outside itself.
"""
