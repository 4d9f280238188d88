"""Example data shipped with the package: the demo corpus and scenario."""
