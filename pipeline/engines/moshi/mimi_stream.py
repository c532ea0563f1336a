"""Mimi's encoder and decoder run one 80 ms frame at a time over per-row state.

transformers' `MimiModel.encode` can stream its encoder (a `MimiConv1dPaddingCache` and the
transformer's past key values), but in new tensors every call, for one batch that starts
together (no static buffers to capture, no rows that join and leave), with a cache that
keeps 249 keys so that a frame's second position sees 251; its decoder does not stream its
convolutions at all. Here each direction walks the model's own modules (their weights,
transformers' attention layers) itself, reading and writing the state of mimi_state.py for
the first `size` rows:

- encode: 1,920 samples -> the SEANet encoder (causal convolutions, 2 positions out) -> the
  encoder transformer (2 positions over its ring) -> the `replicate` downsampling (1
  position) -> the split residual quantizer's codes;
- decode: codes -> the quantizer's embedding -> the transposed upsampling (2 positions) ->
  the decoder transformer -> the SEANet decoder (transposed convolutions and causal ones)
  -> 1,920 samples.

Nothing here reads a value back to the host or makes a shape that depends on one: every
length is fixed by the frame, so a step over `size` rows can be captured as a CUDA graph.
A frame streamed this way equals the whole-sequence model over the session's audio so far
(tests/pipeline/moshi/test_mimi_stream.py), with the transformer's context window that
Kyutai's Mimi uses (transformers' whole-sequence `encode` attends over everything instead).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .mimi_state import ConvStates, MimiRing

FRAME_SAMPLES = 1920
"""One frame of 24 kHz audio: 80 ms, Mimi's 12.5 Hz frame rate."""


class ConvWalk:
    """Runs stacks of Mimi's layers (causal convolutions, transposed convolutions, residual
    blocks, activations) over one frame per row, each convolution with its state."""

    def __init__(
        self, modules: Sequence[Any], *, rows: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        from transformers.models.mimi import modeling_mimi as mimi

        self._residual_block = mimi.MimiResnetBlock
        shapes: list[tuple[int, int]] = []
        self._causal: dict[int, tuple[int, int, bool]] = {}
        """Per causal convolution (by id): its state's index, its length, whether it pads
        by repeating its first sample (`replicate`) rather than with zeros."""
        self._transposed: dict[int, tuple[int, int]] = {}
        """Per transposed convolution: its overlap state's index and length."""
        for module in (m for top in modules for m in top.modules()):
            conv: Any = getattr(module, "conv", None)
            if isinstance(module, mimi.MimiConv1d):
                if not module.causal:
                    raise ValueError("Mimi streams only with causal convolutions")
                reach = (conv.kernel_size[0] - 1) * conv.dilation[0] + 1
                length = reach - conv.stride[0]
                replicate = module.pad_mode == "replicate"
                if module.pad_mode not in ("constant", "replicate"):
                    raise ValueError(f"no streaming for {module.pad_mode!r} padding")
                self._causal[id(module)] = (len(shapes), length, replicate)
                shapes.append((conv.in_channels, length))
            elif isinstance(module, mimi.MimiConvTranspose1d):
                length = conv.kernel_size[0] - conv.stride[0]
                if module.padding_left != 0 or module.padding_right != length:
                    raise ValueError("Mimi streams only with its right-trimmed upsampling")
                self._transposed[id(module)] = (len(shapes), length)
                shapes.append((conv.out_channels, length))
        self.states = ConvStates(shapes, rows=rows, dtype=dtype, device=device)
        self.fresh = torch.ones(rows, dtype=torch.bool, device=device)
        """Per row: no frame yet (a `replicate` convolution's context is its first sample)."""

    def run(self, layers: Sequence[Any], x: torch.Tensor, size: int) -> torch.Tensor:
        for layer in layers:
            x = self._through(layer, x, size)
        return x

    def _through(self, layer: Any, x: torch.Tensor, size: int) -> torch.Tensor:
        if id(layer) in self._causal:
            return self._causal_conv(layer, x, size)
        if id(layer) in self._transposed:
            return self._transposed_conv(layer, x, size)
        if isinstance(layer, self._residual_block):
            y = x
            for inner in layer.block:
                y = self._through(inner, y, size)
            return self._through(layer.shortcut, x, size) + y
        out: torch.Tensor = layer(x)  # an activation (or the identity shortcut)
        return out

    def _causal_conv(self, layer: Any, x: torch.Tensor, size: int) -> torch.Tensor:
        """The whole sequence pads each convolution's input on the left; a frame takes the
        end of the frame before instead."""
        index, length, replicate = self._causal[id(layer)]
        if length:
            past = self.states.held_of(index, size)
            if replicate:
                first = x[:, :, :1].expand_as(past)
                past = torch.where(self.fresh[:size, None, None], first, past)
            x = torch.cat([past, x], dim=2)
            self.states.next_of(index, size).copy_(x[:, :, x.shape[2] - length :])
        out: torch.Tensor = layer.conv(x)
        return out

    def _transposed_conv(self, layer: Any, x: torch.Tensor, size: int) -> torch.Tensor:
        """A transposed convolution's output runs `length` samples past the frame: those
        belong to the next frame's start (the whole sequence sums them there)."""
        index, length = self._transposed[id(layer)]
        y: torch.Tensor = layer.conv(x)
        if not length:
            return y
        body = y.shape[2] - length
        if length > body:
            raise ValueError("a frame shorter than a transposed convolution's overlap")
        out = torch.cat(
            [y[:, :, :length] + self.states.held_of(index, size), y[:, :, length:body]], 2
        )
        tail = y[:, :, body:]
        if layer.conv.bias is not None:
            tail = tail - layer.conv.bias[:, None]  # the next frame's output has its own
        self.states.next_of(index, size).copy_(tail)
        return out

    def commit(self, size: int) -> None:
        self.states.commit(size)
        self.fresh[:size] = False

    def reset(self, row: int) -> None:
        self.states.reset(row)
        self.fresh[row] = True

    def move(self, source: int, target: int) -> None:
        self.states.move(source, target)
        self.fresh[target] = self.fresh[source]

    def tensors(self) -> list[torch.Tensor]:
        return [*self.states.tensors(), self.fresh]


def run_transformer(model: Any, ring: MimiRing, hidden: torch.Tensor, size: int) -> torch.Tensor:
    """Mimi's transformer (its layers; it has no final norm) over the frame's positions,
    [size, steps, hidden], with the ring as its cache."""
    positions = ring.positions(size)
    mask = ring.mask(size)
    for layer in model.layers:
        out = layer(
            hidden,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=ring,
            use_cache=True,
        )
        hidden = out[0] if isinstance(out, tuple) else out
    return hidden


class _Direction:
    """A direction's state: its convolutions' and its transformer's."""

    def __init__(self, codec: Any, convs: Sequence[Any], *, rows: int) -> None:
        config = codec.config
        parameter = next(codec.parameters())
        self.device, self.dtype = parameter.device, parameter.dtype
        self.codec = codec
        if round(config.sampling_rate / config.frame_rate) != FRAME_SAMPLES:
            raise ValueError(f"Mimi's frame is not {FRAME_SAMPLES} samples")
        self.convs = ConvWalk(convs, rows=rows, dtype=self.dtype, device=self.device)
        self.ring = MimiRing(
            layers=int(config.num_hidden_layers),
            rows=rows,
            heads=int(config.num_key_value_heads),
            head_dim=int(config.head_dim),
            window=int(config.sliding_window),
            steps=round(config.encodec_frame_rate / config.frame_rate),
            dtype=self.dtype,
            device=self.device,
        )

    def commit(self, size: int) -> None:
        """The first `size` rows' step is done: its state becomes theirs."""
        self.convs.commit(size)
        self.ring.commit(size)

    def reset(self, row: int) -> None:
        """A new session in `row`: a stream from silence, as the whole sequence starts."""
        self.convs.reset(row)
        self.ring.reset(row)

    def move(self, source: int, target: int) -> None:
        self.convs.move(source, target)
        self.ring.move(source, target)

    def tensors(self) -> list[torch.Tensor]:
        return [*self.convs.tensors(), *self.ring.tensors()]


class StreamedEncoder(_Direction):
    def __init__(self, codec: Any, *, rows: int, codebooks: int) -> None:
        super().__init__(codec, [*codec.encoder.layers, codec.downsample], rows=rows)
        self.codebooks = codebooks
        self.audio = torch.zeros(rows, 1, FRAME_SAMPLES, dtype=self.dtype, device=self.device)
        """The step's input: each row's frame of audio in [-1, 1]."""

    def step(self, size: int) -> torch.Tensor:
        """The first `size` rows' frames -> their codes, [size, codebooks]."""
        codec = self.codec
        x = self.convs.run(codec.encoder.layers, self.audio[:size], size)
        hidden = run_transformer(codec.encoder_transformer, self.ring, x.transpose(1, 2), size)
        x = self.convs.run([codec.downsample], hidden.transpose(1, 2), size)
        codes: torch.Tensor = codec.quantizer.encode(x, self.codebooks)  # [codebooks, size, 1]
        return codes[:, :, 0].transpose(0, 1)

    def tensors(self) -> list[torch.Tensor]:
        return [*super().tensors(), self.audio]


class StreamedDecoder(_Direction):
    def __init__(self, codec: Any, *, rows: int, codebooks: int) -> None:
        super().__init__(codec, [codec.upsample, *codec.decoder.layers], rows=rows)
        self.codes = torch.zeros(rows, codebooks, 1, dtype=torch.long, device=self.device)
        """The step's input: each row's frame of codes."""

    def step(self, size: int) -> torch.Tensor:
        """The first `size` rows' codes -> their audio, [size, 1920] in the model's dtype."""
        codec = self.codec
        embedded = codec.quantizer.decode(self.codes[:size])  # [size, hidden, 1]
        x = self.convs.run([codec.upsample], embedded, size)
        hidden = run_transformer(codec.decoder_transformer, self.ring, x.transpose(1, 2), size)
        audio = self.convs.run(codec.decoder.layers, hidden.transpose(1, 2), size)
        return audio[:, 0]

    def tensors(self) -> list[torch.Tensor]:
        return [*super().tensors(), self.codes]


def codec_row_bytes(codec_config: Any, *, codebooks: int, dtype: torch.dtype) -> int:
    """Device bytes one session's row of both directions holds (state and inputs), counted
    from the same allocation as the engine's over a codec built on the meta device."""
    from transformers import MimiModel

    with torch.device("meta"):
        codec: Any = MimiModel(codec_config)
    codec = codec.to(dtype)
    directions = (
        StreamedEncoder(codec, rows=1, codebooks=codebooks),
        StreamedDecoder(codec, rows=1, codebooks=codebooks),
    )
    return sum(t.numel() * t.element_size() for d in directions for t in d.tensors())
