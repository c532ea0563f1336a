"""The peers' bots, each run by its own venv's python as `python -m loadtest.peers.bots.<name>`
from the repository root (loadtest/__init__.py and loadtest/peers/__init__.py import nothing,
so the peer venvs need no Parley package)."""
