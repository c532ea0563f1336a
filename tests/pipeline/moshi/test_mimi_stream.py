"""Mimi streamed a frame at a time with its state equals Mimi over the whole sequence: the
codes of each session's microphone exactly, the audio of each session's voice within float
error, for sessions joining, batched and leaving at different frames, past the transformer's
context window; and a step is safe to capture as a CUDA graph (checked on the CPU: static
buffers, no value read back, a step that may run again before its commit)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pipeline.engines.moshi.mimi_frames import FRAME_SAMPLES, MimiFrames
from pipeline.engines.moshi.mimi_stream import StreamedDecoder, StreamedEncoder, codec_row_bytes
from pipeline.engines.moshi.weights import TINY_MIMI, random_codebooks

WINDOW = 6
"""The transformers' context, in their 25 Hz steps: 3 frames, so every clip runs past it."""
FRAMES = 6


@pytest.fixture(scope="module")
def codec() -> Any:
    """The toy Mimi with its transformers weighing fully in (a layer scale of 1, not 0.01)
    and audio within [-1, 1] (its last convolution scaled down), so PCM is rarely clipped."""
    from transformers import MimiConfig, MimiModel

    settings = {**TINY_MIMI, "sliding_window": WINDOW, "layer_scale_initial_scale": 1.0}
    config: Any = MimiConfig(**settings)  # type: ignore[no-untyped-call]
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model: Any = MimiModel(config)
    model.eval()
    random_codebooks(model, seed=0)
    with torch.no_grad():
        last = model.decoder.layers[-1].conv
        last.weight.mul_(0.02)
        last.bias.mul_(0.02)
    return model


def clip(seed: int, frames: int = FRAMES) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(frames * FRAME_SAMPLES) * 6000).astype(np.int16)


@contextmanager
def windowed(codec: Any) -> Iterator[None]:
    """Mimi's whole-sequence encode and decode with the transformers' context window as the
    mask (`0 <= query - key < window`, Kyutai's): transformers' own whole-sequence path
    attends over everything."""
    patched = (codec.encoder_transformer, codec.decoder_transformer)
    for module in patched:
        forward = module.forward

        def masked(hidden: torch.Tensor, *args: Any, _f: Any = forward, **kw: Any) -> Any:
            steps = torch.arange(hidden.shape[1])
            back = steps[:, None] - steps[None, :]
            seen = (back >= 0) & (back < WINDOW)
            floor = torch.finfo(hidden.dtype).min
            kw["attention_mask"] = torch.where(seen, 0.0, floor)[None, None]
            return _f(hidden, *args, **kw)

        module.forward = masked
    try:
        yield
    finally:
        for module in patched:
            del module.forward


def whole(codec: Any, pcm: np.ndarray, *, window: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole clip's codes [codebooks, frames] and their whole decode [samples]."""
    audio = torch.from_numpy(pcm.astype(np.float32) / 32768.0)[None, None]
    with torch.inference_mode():
        if not window:
            codes = codec.encode(audio, num_quantizers=8)[0]
            return codes[0], codec.decode(codes)[0][0, 0]
        with windowed(codec):
            codes = codec.encode(audio, num_quantizers=8)[0]
            return codes[0], codec.decode(codes)[0][0, 0]


def pcm16(audio: torch.Tensor) -> np.ndarray:
    pcm: np.ndarray = (audio.clamp(-1, 1) * 32767).round().to(torch.int16).numpy()
    return pcm


SESSIONS = {"a": (0, 4), "b": (1, FRAMES), "c": (3, FRAMES), "d": (6, 5)}
"""Each session's first frame and the frames of its voice it hears, a frame behind its
microphone (as Moshi's voice is: the decoder's rows fill a frame later); its microphone
sends one frame more. a leaves row 0 at frame 5 and c (row 2) moves into it; d joins at 6
and takes row 2, which still holds c's old state."""


@pytest.mark.parametrize("bucketed", [False, True], ids=["plain", "bucketed"])
def test_sessions_streamed_together_get_their_whole_clip_codes_and_audio(
    codec: Any, bucketed: bool
) -> None:
    """Through the engine's codec (and the GPU's bucketed path, run plainly: three sessions
    run as a bucket of four), each session's codes are exactly those of its whole clip and
    its voice's audio that of the whole decode, to within one PCM16 step."""
    clips = {s: clip(i, n + 1) for i, (s, (_, n)) in enumerate(SESSIONS.items())}
    reference = {s: whole(codec, clips[s]) for s in SESSIONS}
    frames = MimiFrames(codec, codebooks=8, rows=4, bucketed=bucketed)
    frames.warm()
    heard: dict[str, list[torch.Tensor]] = {s: [] for s in SESSIONS}
    said: dict[str, list[np.ndarray]] = {s: [] for s in SESSIONS}
    for tick in range(max(at + n + 1 for at, n in SESSIONS.values())):
        live = {s: tick - at for s, (at, n) in SESSIONS.items() if 0 <= tick - at <= n}
        for s in set(SESSIONS) - set(live):
            frames.forget(s)
        mic = {s: clips[s][t * FRAME_SAMPLES : (t + 1) * FRAME_SAMPLES] for s, t in live.items()}
        for s, codes in frames.encode(mic).items():
            heard[s].append(codes)
        voice = {s: reference[s][0][:, t - 1] for s, t in live.items() if t > 0}
        for s, pcm in frames.decode(voice).items():
            said[s].append(pcm)
    for s, (_, n) in SESSIONS.items():
        codes, audio = reference[s]
        assert torch.equal(torch.stack(heard[s], dim=1), codes)
        expected = pcm16(audio[: n * FRAME_SAMPLES]).astype(np.int32)
        assert np.abs(np.concatenate(said[s]) - expected).max() <= 1
        assert np.abs(expected).max() < 32767  # a waveform, not a clipped square
    within = WINDOW // 2  # frames whose transformer steps all lie inside the first window
    plain_codes, _ = whole(codec, clips["b"], window=False)
    assert torch.equal(torch.stack(heard["b"], dim=1)[:, :within], plain_codes[:, :within])


def test_the_streamed_audio_is_the_whole_decode_past_the_window_within_float_error(
    codec: Any,
) -> None:
    """Float32 on the CPU: the streamed audio differs from the windowed whole decode by
    float rounding only (the convolutions sum in another order), a million times less than
    the audio; transformers' whole decode, which attends past the window, differs from it
    by far more after the window and not at all inside it."""
    codes = torch.stack([whole(codec, clip(seed))[0] for seed in (7, 8)])  # [2, 8, frames]
    with torch.inference_mode():
        with windowed(codec):
            reference = codec.decode(codes)[0][:, 0]
        unwindowed = codec.decode(codes)[0][:, 0]
        decoder = StreamedDecoder(codec, rows=3, codebooks=8)
        for row in range(3):
            decoder.reset(row)
        streamed = []
        for t in range(FRAMES):
            decoder.codes[:2].copy_(codes[:, :, t : t + 1])
            streamed.append(decoder.step(2))
            decoder.commit(2)
    audio = torch.cat(streamed, dim=1)
    tolerance = 1e-5 * float(reference.abs().max())
    inside = WINDOW // 2 * FRAME_SAMPLES
    assert float((audio - reference).abs().max()) <= tolerance  # measured: 4.3e-7 of the peak
    assert float((unwindowed - reference)[:, :inside].abs().max()) <= tolerance
    assert float((unwindowed - reference)[:, inside:].abs().max()) > 10 * tolerance


class HostReads(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Records every operation that reads a tensor's value back to the host or makes a
    shape from its values: what a CUDA graph capture refuses (or bakes in)."""

    READS = {"_local_scalar_dense", "item", "nonzero", "masked_select", "unique", "_unique2"}

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.reads: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func.overloadpacket.__name__ in self.READS:
            self.reads.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def test_a_step_is_capture_safe(codec: Any) -> None:
    """What a CUDA graph of a step needs, checked on the CPU: the state and inputs are the
    same tensors at the same addresses whatever joins and leaves; a step reads no value
    back (transformers' whole-sequence encode does, 30 times a call); and a step run twice
    before its commit, as the capture's warm-up runs do, gives the same codes and state."""
    frames = MimiFrames(codec, codebooks=8, rows=4, bucketed=True)
    directions: list[StreamedEncoder | StreamedDecoder] = [frames.encoder, frames.decoder]
    buffers = [t for d in directions for t in d.tensors()]
    addresses = [t.data_ptr() for t in buffers]
    frames.warm()
    pcm = clip(3)[:FRAME_SAMPLES]
    for tick in range(3):
        frames.encode({s: pcm for s in ("a", "b", "c")[: tick + 1]})
        frames.decode({s: torch.arange(8) for s in ("a", "b")[:tick]})
    frames.forget("a")
    with torch.inference_mode():
        for direction in directions:
            with HostReads() as host:
                first = direction.step(3).clone()
            assert host.reads == []
            state = [t.clone() for t in direction.tensors()]
            again = direction.step(3)
            assert torch.equal(first, again)
            assert all(torch.equal(a, b) for a, b in zip(state, direction.tensors(), strict=True))
        with HostReads() as host:
            codec.encode(torch.zeros(1, 1, FRAME_SAMPLES), num_quantizers=8)
        assert host.reads
    assert [t.data_ptr() for t in buffers] == addresses


def test_a_session_row_of_codec_state_is_what_the_sizing_counts(codec: Any) -> None:
    frames = MimiFrames(codec, codebooks=8, rows=3)
    held = sum(
        t.numel() * t.element_size() for d in (frames.encoder, frames.decoder) for t in d.tensors()
    )
    assert held == 3 * codec_row_bytes(codec.config, codebooks=8, dtype=torch.float32)
