"""How a sweep searches: the sweep-level strategies (grid, predict, capacity) and their plans, and the
load profiles a server group walks on the worker; may import run's plan and outcomes, record,
analysis and below, never the driver, a group or finish."""
