"""What recap keeps with a model and on disk: the per-model holder (`model_state`), the
measurement store (`measurements`) and the persistent memories' scopes (`memory_pool`).
The lowest floor: it imports nothing of recap above it."""
