"""The cascade's Code2Wav: Piper phoneme ids in, speech out, one audio chunk per clause.

Batching. Piper's ONNX model (VITS) takes a padded batch of phoneme id rows with their
lengths, so concurrent clauses of different requests run as one call: a `BatchWorker` thread
collects the clauses that arrive within a short window and renders them together (on 2 cores
four clauses take ~0.22 s as one call against ~0.33 s one by one). A padded row's audio runs
on past its end, so the voice is loaded with the model's per-phoneme durations exposed (see
`voice.py`), and each row is cut at the sum of its durations. Without durations (no `onnx`
package) rows cannot be cut, and clauses run one per call.

Voices and speed. Each clause is rendered with the voice its phoneme ids were made for (the
Talker names it in the chunk's metadata; without that, the request's `voice`), at the request's
`speed`: Piper's `length_scale` is the voice's own divided by the speed, so speed 1.5 speaks in
two thirds of the time. The model takes one voice and one set of scales per call, so a batch
collected by the worker is split into runs of one (voice, length_scale) each, and only those
rows share an ONNX call.

Each clause is normalised to full scale as Piper does per sentence, resampled with soxr to the
request's output rate and converted to PCM16, all on the worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import soxr

from ...requests import RequestTracker
from ...step_watch import step_done
from ...types import AudioChunk, Chunk, CodecCodes, End, ErrorChunk, StageInput, StreamEngine
from ...voices import CATALOGUE, VoiceCatalogue, clamp_speed
from .batching import BatchWorker
from .voice import VOICE_PACKAGE, EngineVoices, has_durations

if TYPE_CHECKING:
    from piper import PiperVoice

Pcm = npt.NDArray[np.int16]


@dataclass(eq=False)
class _Clause:
    ids: npt.NDArray[np.int32]
    voice: PiperVoice
    length_scale: float
    output_rate: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Pcm | None]
    cancelled: bool = False


def _settle(future: asyncio.Future[Pcm | None], result: Pcm | BaseException | None) -> None:
    if future.done():
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)


class Code2WavEngine(StreamEngine):
    """Renders each CodecCodes chunk (Piper phoneme ids) of its upstream to an AudioChunk."""

    name = "cascade.code2wav"

    def __init__(
        self,
        *,
        voice_package: str = VOICE_PACKAGE,
        batch_window_ms: float = 20.0,
        max_batch: int = 8,
        catalogue: VoiceCatalogue = CATALOGUE,
    ) -> None:
        self.voice_package = voice_package
        self.batch_window_ms = batch_window_ms
        self.max_batch = max_batch
        self._voices = EngineVoices(voice_package, catalogue)
        self.last_runs: list[int] = []
        """How many rows each ONNX call of the most recent batch rendered (one per voice)."""
        self._worker: BatchWorker[_Clause] | None = None
        self._requests: RequestTracker[_Clause] = RequestTracker()
        """Each request's state is the clause it is waiting for, if any."""

    @property
    def batch_size(self) -> int:
        """How many clauses the most recent batch rendered."""
        return self._worker.last_batch_size if self._worker else 0

    def stalled(self, bound_s: float) -> str | None:
        return self._worker.watch.stalled(bound_s) if self._worker else None

    async def start(self) -> None:
        if self._worker is not None:
            return
        await self._voices.start()
        self._worker = BatchWorker(
            "parley-code2wav",
            self._render,
            window_s=self.batch_window_ms / 1000,
            max_batch=self.max_batch,
        )
        self._worker.start()

    async def close(self) -> None:
        for clause in self._requests.clear():
            self._drop(clause)
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.close()
            await asyncio.to_thread(worker.join)

    def active_requests(self) -> int:
        return len(self._requests)

    async def abort(self, request_id: str) -> None:
        if (clause := self._requests.abort(request_id)) is not None:
            self._drop(clause)

    async def generate(self, request_id: str, inputs: StageInput) -> AsyncGenerator[Chunk, None]:
        if self._worker is None:
            yield ErrorChunk(message="code2wav was not started", stage=self.name)
            return
        if inputs.request.output_text_only:
            yield End()
            return
        request = inputs.request
        rate = request.output_sample_rate
        speed = clamp_speed(request.speed)
        voices: dict[str, PiperVoice] = {}
        self._requests.begin(request_id)
        try:
            async for chunk in inputs.chunks:
                if self._requests.aborted(request_id):
                    return
                if isinstance(chunk, ErrorChunk):
                    yield chunk
                    return
                if isinstance(chunk, End):
                    break
                if not isinstance(chunk, CodecCodes) or not len(chunk.codes):
                    continue
                package = chunk.metadata.get("voice") or self._voices.package_for(request.voice)
                if (voice := voices.get(package)) is None:
                    _, voice = await self._voices.load(package)
                    voices[package] = voice
                length_scale = round(float(voice.config.length_scale) / speed, 4)
                try:
                    pcm = await self._synthesize(request_id, chunk.codes, voice, length_scale, rate)
                except Exception as exc:
                    yield ErrorChunk(message=f"{type(exc).__name__}: {exc}", stage=self.name)
                    return
                if pcm is None:
                    return  # aborted while rendering
                yield AudioChunk(pcm=pcm, sample_rate=rate)
            if not self._requests.aborted(request_id):
                yield End()
        finally:
            if (clause := self._requests.end(request_id)) is not None:
                self._drop(clause)

    async def _synthesize(
        self,
        request_id: str,
        ids: npt.NDArray[np.int32],
        voice: PiperVoice,
        length_scale: float,
        rate: int,
    ) -> Pcm | None:
        assert self._worker is not None
        loop = asyncio.get_running_loop()
        clause = _Clause(ids, voice, length_scale, rate, loop, loop.create_future())
        self._requests.set_state(request_id, clause)
        self._worker.submit(clause)
        try:
            return await clause.future
        finally:
            if self._requests.state(request_id) is clause:
                self._requests.set_state(request_id, None)
            clause.cancelled = True  # done with it either way: never render it now

    def _drop(self, clause: _Clause) -> None:
        clause.cancelled = True
        if self._worker is not None:
            self._worker.discard(clause)
        _settle(clause.future, None)

    def _render(self, clauses: list[_Clause]) -> None:
        """Worker thread: one ONNX call per (voice, length_scale) run, each row to its request."""
        runs: dict[tuple[int, float], list[_Clause]] = {}
        for clause in clauses:
            runs.setdefault((id(clause.voice), clause.length_scale), []).append(clause)
        groups: list[list[_Clause]] = []
        for run in runs.values():  # a model without durations cannot cut padded rows: one each
            groups.extend([run] if has_durations(run[0].voice) else [[c] for c in run])
        self.last_runs = [len(group) for group in groups]
        for group in groups:
            self._render_run(group)
            step_done()

    def _render_run(self, clauses: list[_Clause]) -> None:
        """One ONNX call for clauses of one voice and one length_scale."""
        voice = clauses[0].voice
        try:
            lengths = np.array([len(c.ids) for c in clauses], dtype=np.int64)
            ids = np.zeros((len(clauses), int(lengths.max())), dtype=np.int64)
            for row, clause in enumerate(clauses):
                ids[row, : len(clause.ids)] = clause.ids
            config = voice.config
            scales = np.array(
                [config.noise_scale, clauses[0].length_scale, config.noise_w_scale],
                dtype=np.float32,
            )
            args = {"input": ids, "input_lengths": lengths, "scales": scales}
            if config.num_speakers > 1:
                speaker = config.default_speaker_id or 0
                args["sid"] = np.full(len(clauses), speaker, dtype=np.int64)
            outputs = voice.session.run(None, args)
            audio = np.asarray(outputs[0], dtype=np.float32).reshape(len(clauses), -1)
            if len(outputs) > 1:
                frames = np.asarray(outputs[1]).reshape(len(clauses), -1).sum(axis=1)
                samples = (frames * config.hop_length).astype(np.int64)
            else:
                samples = np.full(len(clauses), audio.shape[1], dtype=np.int64)
            results: list[Pcm | BaseException] = [
                _to_pcm16(row[:count], config.sample_rate, clause.output_rate)
                for clause, row, count in zip(clauses, audio, samples, strict=True)
            ]
        except Exception as exc:
            results = [RuntimeError(f"{type(exc).__name__}: {exc}") for _ in clauses]
        for clause, result in zip(clauses, results, strict=True):
            with contextlib.suppress(RuntimeError):  # that request's loop is gone
                clause.loop.call_soon_threadsafe(_settle, clause.future, result)


def _to_pcm16(audio: npt.NDArray[np.float32], voice_rate: int, output_rate: int) -> Pcm:
    peak = float(np.abs(audio).max()) if len(audio) else 0.0
    if peak < 1e-8:
        return np.zeros(len(audio) * output_rate // voice_rate, dtype=np.int16)
    audio = audio / peak
    if output_rate != voice_rate:
        audio = soxr.resample(audio, voice_rate, output_rate)
    return (np.clip(audio, -1.0, 1.0) * 32767).astype(np.int16)
