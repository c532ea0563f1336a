"""vLLM-Omni's streaming video chat protocol for Qwen3-Omni (`/v1/video/chat/stream`),
over a WebSocket."""
