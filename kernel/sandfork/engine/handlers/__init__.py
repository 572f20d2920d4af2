"""HTTP handlers of the engine's ``/v1`` API."""
