"""The worker's side of approvals: who is in which group, whose keys sign decisions, whether unsigned ones count.

The author of a worker gives these to `create_worker`; a run records what they meant for it when it starts (its
tools' approver policies with the groups resolved, and whether decisions must be signed), and the update
validator checks each decision's signature against the keyring of the worker that takes it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..shared._approvals import GROUP_PREFIX, ApproverPolicy, RecordedApproverPolicy
from ..shared._errors import CodeModeUserError
from ..shared._signing import ApproverKeyring

__all__ = ["APPROVER_DIRECTORY_ENV", "APPROVER_KEYS_ENV", "ApprovalAuthority", "ApproverDirectory"]

APPROVER_KEYS_ENV = "CODEMODE_APPROVER_KEYS"
"""The approvers' public key files for `codemode dev` / `codemode worker` / `python worker.py` without
`--approver-keys`: one path, or several separated by `os.pathsep` (`:`)."""
APPROVER_DIRECTORY_ENV = "CODEMODE_APPROVER_DIRECTORY"
"""The approver directory file (`{"finance": ["ana", "bob"]}`) for the bundled worker without `--approver-directory`."""

DirectorySource = Mapping[str, Sequence[str]] | Callable[[str], Iterable[str] | None] | str | os.PathLike[str]
"""Groups and their members: a mapping, a function of the group name (`None`: no such group), or a JSON file."""


class ApproverDirectory:
    """Resolves `group:<name>` approvers to people, when a run starts (so the run records who they were then)."""

    def __init__(self, source: DirectorySource | None) -> None:
        self._lookup: Callable[[str], Iterable[str] | None]
        if source is None:
            self._lookup = lambda group: None
        elif callable(source):
            self._lookup = source
        elif isinstance(source, Mapping):
            groups = {k: list(v) for k, v in source.items()}
            self._lookup = groups.get
        else:
            try:
                loaded: Any = json.loads(Path(source).read_text())
            except OSError as e:
                raise CodeModeUserError(f"cannot read the approver directory {str(source)!r}: {e.strerror or e}") \
                    from e
            except ValueError as e:
                raise CodeModeUserError(f"the approver directory {str(source)!r} is not JSON: {e}") from e
            if not isinstance(loaded, dict) or not all(isinstance(v, list) for v in loaded.values()):
                raise CodeModeUserError(f"the approver directory {str(source)!r} must map group names to lists of "
                                        'people, e.g. {"finance": ["ana", "bob"]}')
            file_groups = {str(k): [str(p) for p in v] for k, v in loaded.items()}
            self._lookup = file_groups.get

    def members(self, group: str) -> list[str]:
        """The people in `group`.

        Raises:
            CodeModeUserError: the directory has no such group.

        """
        found = self._lookup(group)
        if found is None:
            raise CodeModeUserError(f"approver group {group!r} is not in the worker's approver directory: add it "
                                    "to create_worker(approver_directory=...)")
        return [str(p) for p in found]

    def resolve(self, policy: ApproverPolicy) -> RecordedApproverPolicy:
        """`policy` as a run records it: every group replaced by its members now."""
        groups = {name.removeprefix(GROUP_PREFIX) for name in policy.approvers if name.startswith(GROUP_PREFIX)}
        recorded = RecordedApproverPolicy.resolve(policy, {g: self.members(g) for g in groups})
        if len(recorded.approvers) < policy.required:
            raise CodeModeUserError(
                f"the approver policy {recorded.describe()} needs {policy.required} distinct approvers but names "
                f"{len(recorded.approvers)} ({', '.join(recorded.approvers) or 'nobody'}): no call could be approved")
        return recorded


@dataclass(frozen=True)
class ApprovalAuthority:
    """What a worker knows about approvers: its directory, its keyring, and whether it takes unsigned decisions."""

    directory: ApproverDirectory
    keyring: ApproverKeyring
    unsigned: bool
    """The author turned signing off (local development): decisions need no signature, and records say so."""

    def check_can_decide(self, agent: str) -> None:
        """Refuse a run with calls that need approval when no decision could ever be accepted on this worker.

        Raises:
            CodeModeUserError: neither approver keys nor `unsigned_approvals=True`.

        """
        if not self.keyring and not self.unsigned:
            raise CodeModeUserError(
                f"agent {agent!r} has tools whose calls need approval, but this worker holds no approver keys to "
                "check decisions with: give create_worker(approver_keys=...) the approvers' public keys "
                "(`codemode keygen NAME` makes one), or, for local development only, create_worker("
                "unsigned_approvals=True)")
