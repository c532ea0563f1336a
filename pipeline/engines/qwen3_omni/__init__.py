"""Qwen3-Omni's three stages (Thinker -> Talker -> Code2Wav) on transformers' classes.

Layers: `config`/`weights` build a stage's part of the model (real checkpoint or seeded
random weights); the `*_runner` modules step it, plain and synchronous; the engines
(`thinker`, `talker`, `code2wav`) adapt runners to the engine contract, with all compute on
one model thread per stage (`model_thread`).
"""
