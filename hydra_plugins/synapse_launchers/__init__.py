"""Synapse's Hydra launcher plugins (Hydra finds plugins only under the ``hydra_plugins`` namespace)."""
