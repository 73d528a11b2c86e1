"""specsweep's Hydra plugins: a sweeper that plans a grid into server groups, and a Ray launcher;
may import the commands' helpers (compose), run and below, like ``pipeline.sweep``, whose other entry
they are.

Hydra discovers plugins only under the ``hydra_plugins`` namespace package.
"""
