"""`python -m durable_codemode.cli`: the `codemode` command, for environments without its script on PATH."""

from . import main

if __name__ == "__main__":  # imported, as `pkgutil.walk_packages` does, it runs nothing
    main()
