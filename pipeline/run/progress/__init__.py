"""Live progress: the events a server group emits, the driver's display, and the Ray actor between them."""
