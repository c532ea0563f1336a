"""The `qwen3_omni.thinker` engine: a PipelineRequest in; reply text and hidden states out.

Chunks, in order: one HiddenStates for the prompt (`metadata["part"] == "prompt"`, with the
prompt's token ids, the Thinker's embeddings of tts_bos/eos/pad and the audio's feature
length: everything the Talker's prompt needs, so the Talker never holds the Thinker's
embedding table), then per reply token a TextDelta as soon as it is chosen and a
HiddenStates (`part == "reply"`) once it has been fed. Reply text is placeholder words
("tok123 ") under random weights and real text with a checkpoint's tokenizer.

Random weights never choose `<|im_end|>`; `min_new_tokens` can hold it off for a real model
too, which gives the fixed reply lengths benchmarks need.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import numpy as np

from ...types import Chunk, End, EntryEngine, ErrorChunk, HiddenStates, PipelineRequest, TextDelta
from .audio_features import AudioFeatures, AudioInput
from .config import TOKENS
from .prefix_cache import PrefixCache
from .prompt import Vocab, chat_prompt, load_vocab
from .sampling import Sampling
from .stage import ModelStage
from .step_batcher import StepBatcher
from .thinker_runner import ThinkerHidden, ThinkerPrompt, ThinkerRunner, ThinkerState
from .vision_input import TOKEN_PIXELS, FrameImages, VisionInput

DEFAULT_INSTRUCTIONS = "You are a helpful voice assistant."


class ThinkerEngine(ModelStage[ThinkerState], EntryEngine):
    name = "qwen3_omni.thinker"
    part = "thinker"

    def __init__(
        self,
        *,
        max_new_tokens: int = 128,
        min_new_tokens: int = 0,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        default_instructions: str = DEFAULT_INSTRUCTIONS,
        image_max_pixels: int = 128 * TOKEN_PIXELS,
        prefix_cache_tokens: int = 0,
        **model: Any,
    ) -> None:
        super().__init__(**model)
        if max_new_tokens < 1:
            raise ValueError("max_new_tokens must be at least 1")
        self.max_new_tokens = max_new_tokens
        self.min_new_tokens = min_new_tokens
        self.sampling = Sampling(temperature=temperature, top_k=top_k, top_p=top_p)
        self.default_instructions = default_instructions
        self.image_max_pixels = image_max_pixels
        """Each camera frame is scaled to at most this (32 x 32 pixels make one token)."""
        self.images: FrameImages | None = None
        self.prefix_cache_tokens = prefix_cache_tokens
        """KV of this many prompt tokens is kept for later turns to reuse (0: none)."""
        self.runner: ThinkerRunner | None = None
        self.vocab: Vocab | None = None
        self.features: AudioFeatures | None = None
        self.tts_embeds: np.ndarray[Any, Any] | None = None

    def _loaded(self) -> None:
        assert self.model is not None and self.config is not None
        prefixes = PrefixCache(self.prefix_cache_tokens) if self.prefix_cache_tokens else None
        self.runner = ThinkerRunner(
            self.model, self.config, sampling=self.sampling, seed=self.seed, prefix_cache=prefixes
        )
        self.vocab = load_vocab(self.model_path)
        mel_bins = int(self.config.thinker_config.audio_config.num_mel_bins)
        self.features = AudioFeatures(mel_bins, self.model_path)
        vision = self.config.thinker_config.vision_config
        self.images = FrameImages(
            patch_size=int(vision.patch_size),
            merge_size=int(vision.spatial_merge_size),
            temporal_patch_size=int(vision.temporal_patch_size),
            max_pixels=self.image_max_pixels,
        )
        special = [TOKENS["tts_bos"], TOKENS["tts_eos"], TOKENS["tts_pad"]]
        self.tts_embeds = self.runner.special_embeddings(special)

    def _batcher(self) -> StepBatcher[ThinkerState, ThinkerHidden]:
        runner = self.runner
        assert runner is not None
        minimum = self.min_new_tokens

        def step(states: list[ThinkerState]) -> list[ThinkerHidden]:
            return runner.step_batch(states, min_new_tokens=minimum)

        return StepBatcher(self.name, self.thread, step, max_batch=self.max_batch)

    def _prompt(self, request: PipelineRequest) -> ThinkerPrompt:
        """On the model thread: log-mel features, image patches and the chat prompt's ids."""
        assert self.features is not None and self.vocab is not None and self.images is not None
        audio: AudioInput | None = self.features(request.audio)
        vision: VisionInput | None = self.images(request.frames)
        ids = chat_prompt(
            self.vocab,
            instructions=request.instructions or self.default_instructions,
            history=[(item.role, item.text) for item in request.history],
            audio_tokens=audio.tokens if audio else 0,
            text=request.text,
            image_tokens=vision.tokens if vision else (),
        )
        return ThinkerPrompt(ids, audio, vision)

    async def generate(
        self, request_id: str, request: PipelineRequest, /
    ) -> AsyncGenerator[Chunk, None]:
        runner, vocab = self.runner, self.vocab
        if runner is None or vocab is None:
            yield ErrorChunk(message="the thinker was not started", stage=self.name)
            return
        self._requests.begin(request_id)
        try:
            prompt = await self.thread.call(self._prompt, request)
            state, hidden = await self.thread.call(
                runner.prefill, prompt, min_new_tokens=self.min_new_tokens
            )
            if self._requests.aborted(request_id):
                return  # aborted
            self._requests.set_state(request_id, state)
            audio_frames = int(prompt.audio.mask.sum()) if prompt.audio is not None else 0
            yield HiddenStates(
                array=hidden.states,
                metadata={
                    "part": "prompt",
                    "token_ids": hidden.token_ids,
                    "tts_embeds": self.tts_embeds,
                    "audio_feature_frames": audio_frames,
                    "image_grid_thw": (
                        prompt.vision.grid_thw.tolist() if prompt.vision is not None else []
                    ),
                },
            )
            assert self.batcher is not None
            with self.batcher.member():
                for produced in range(1, self.max_new_tokens + 1):
                    if self._requests.aborted(request_id):
                        return  # aborted
                    token = state.next_token
                    if token == runner.eos_id:
                        break
                    yield TextDelta(text=vocab.decode(token))
                    if produced == self.max_new_tokens:
                        break  # as in generate(), the last token is chosen but never fed
                    step: ThinkerHidden = await self.batcher.step(state)
                    if self._requests.aborted(request_id):
                        return  # aborted
                    yield HiddenStates(
                        array=step.states, metadata={"part": "reply", "token_ids": step.token_ids}
                    )
            yield End()
        finally:
            self._requests.end(request_id)
