"""Developer tools (differential testers, golden generators); not installed with the package."""
