"""Optional integrations (Gymnasium, torch, TensorDict, JAX, matplotlib); each module imports its peer
lazily.

May import: the façade (``episodelake.dataset``) and every folder below it.
"""
