"""Process plumbing around a sweep: the Hydra entry point, signals, a full disk, a guarded Ray,
and the launcher's errors."""
