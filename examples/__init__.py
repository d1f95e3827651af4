"""pydantic-ai's own examples (pydantic-ai-examples 2.62.0), made durable with the fewest edits.

Each module keeps its agents, tools, deps and output types as pydantic-ai wrote them; what changed is listed in
docs/examples.md (and in each module's docstring). Run one with its model's API key set, e.g.
`OPENAI_API_KEY=... python -m examples.bank_support`: it serves its agent on its own task queue and runs it, on
the server at `TEMPORAL_ADDRESS`, else on an embedded dev server. `tests/test_examples.py` runs each against a
real dev server with a scripted model, compares its usage with `agent.run()`, and replays every run.
"""
