"""specsweep's Hydra plugins: a sweeper that plans a grid into server groups, and a Ray launcher.

Hydra discovers plugins only under the ``hydra_plugins`` namespace package.
"""
