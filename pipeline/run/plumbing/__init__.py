"""Process plumbing around a sweep: the Hydra entry point, a full disk, a guarded Ray, and the
launcher's errors; may import the base modules only, so any part of run may use it."""
