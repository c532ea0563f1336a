"""The real `vllm serve` these tests share (vllm_server.py), started at the first that asks."""

from .vllm_server import vllm

__all__ = ["vllm"]
