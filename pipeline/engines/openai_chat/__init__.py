"""A Thinker on an OpenAI-compatible model server (vLLM and the like)."""
