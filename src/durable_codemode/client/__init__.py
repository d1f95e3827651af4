"""What a Temporal client does: connect, start runs, decide approvals, list and watch runs, the dev server."""
