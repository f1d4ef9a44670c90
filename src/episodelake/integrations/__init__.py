"""Optional integrations (Gymnasium, torch, TensorDict, JAX); each module imports its peer lazily."""
