"""The agents this repository deploys: each bundled app's agent, a few lines on top of `durable_codemode`.

- `workflows.cart`: the shopping-cart agent over `activities.cart` (`codemode demo` runs it offline).

`worker.py` and `codemode dev` / `codemode worker` serve what `workflows.cart.agents()` returns. The run
workflow itself is the library's `CodeModeRunWorkflow`; an app only defines its agent, tools and model.
"""
