"""The built-in environments, one module each; ``registry`` maps ``spec.environment.type`` to a factory."""
