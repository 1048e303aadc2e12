"""One module per model family that needs special handling (each defines `ModelAdapter`
subclasses with the `model_types` they handle); the registry imports them all."""
