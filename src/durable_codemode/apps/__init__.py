"""The bundled apps (cart, calendar, chat, kanban, inventory): their agents and their tools, for the demo and bench.

The repository keeps them at its root, as Temporal's samples do (`workflows/`: the agents; `activities/`: each
app's tools over its own SQLite store); here they are the same folders under our own name (links in a checkout,
copies in the wheel), so installing durable-codemode never adds a top-level `workflows` or `activities` package
that would shadow, or be shadowed by, a project's own. The runtime never imports them at import time:
`durable_codemode._bundled` loads them by name when the demo, `codemode bench` or the bundled worker needs them.
"""
