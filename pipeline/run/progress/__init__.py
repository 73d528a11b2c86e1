"""Live progress: the events a server group emits, the driver's display, and the Ray actor between
them; may import the base modules only, so a group and the driver alike may use it."""
