"""A full-duplex speech model of Kyutai Moshi's architecture (transformers' classes): every
80 ms one step reads a frame of each session's microphone and writes a frame of its voice."""
