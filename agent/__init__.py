"""sidecar-medic agent: configuration, runtime, store, detection, API and CLI."""

__version__ = "0.1.0"
