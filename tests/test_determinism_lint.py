"""Workflow-side modules must not read clocks, randomness, the environment or files directly.

They run inside workflow code (and are passed through Temporal's sandbox, so the sandbox does not catch them):
every such read must go through `workflow.now()`, `workflow.random()`, `workflow.sleep()` or the recorded spec.
A line may opt out with `# determinism: ok (<reason>)`.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

WORKFLOW_SIDE = ["_workflow.py", "_sandbox.py", "_results.py", "_names.py", "_types.py", "_stubs.py", "_progress.py",
                 "_telemetry.py", "_guards.py"]
DENYLIST = {
    r"\bdatetime\.(now|utcnow|today)\(": "use workflow.now()",
    r"\bdate\.today\(": "use workflow.now().date()",
    r"\btime\.(time|monotonic|perf_counter|sleep)\(": "use workflow.now() / workflow.sleep()",
    r"\bimport random\b|\brandom\.(random|randint|choice|seed)\(": "use workflow.random()",
    r"\buuid\.uuid[14]\(": "use workflow.uuid4()",
    r"\bos\.(environ|getenv)\b": "read the recorded AgentSpec.env",
    r"(?<![\w.])open\(": "no file I/O in workflow code",
    r"\basyncio\.sleep\(": "use workflow.sleep()",
    r"\bthreading\.": "no threads in workflow code",
}
SRC = Path(__file__).parent.parent / "src" / "durable_codemode"


@pytest.mark.parametrize("module", WORKFLOW_SIDE)
def test_workflow_side_module_is_deterministic(module: str) -> None:
    problems = []
    for n, line in enumerate((SRC / module).read_text().splitlines(), 1):
        code = re.sub(r"\"[^\"]*\"|'[^']*'", '""', line).split("#", 1)[0]  # strings and comments are not calls
        if "determinism: ok (" in line:
            continue
        for pattern, fix in DENYLIST.items():
            if re.search(pattern, code):
                problems.append(f"{module}:{n}: {line.strip()}  -> {fix}")
    assert not problems, "\n".join(problems)
