"""What the fork server of `tests/_forked.py` loads once, before it forks a child per command or script.

The command itself (`durable_codemode.cli`, which imports the package, pydantic-ai and temporalio, as every bench
script does), and the pydantic adapters of the payload types a command decodes, as a worker builds them before it
polls (`_converter.warm_up`): cold, they were ~0.3 s of CPU in each `codemode trace` or `audit`. Both are the same
in every child, so building them once changes what a run costs, not what it does.
"""

from durable_codemode._converter import DATA_CONVERTER, warm_up
from durable_codemode.cli import main
from durable_codemode.worker._worker import _PAYLOAD_TYPES

__all__ = ["main"]

warm_up(DATA_CONVERTER, _PAYLOAD_TYPES)
