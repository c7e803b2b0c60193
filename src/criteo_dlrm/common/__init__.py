"""Helpers the core and the Kedro adapters share: the Criteo layout, errors, worker processes, progress, files."""
