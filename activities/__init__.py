"""Tools of the bundled apps: each app's single-item CRUD tools over its own SQLite store."""
