"""The cascade's Talker: the Thinker's streamed reply in, Piper phoneme ids per clause out.

Speech can start as soon as the first clause of the reply is known, long before the reply is,
so the Talker cuts the text stream into clauses as it arrives and sends each one on the moment
it is complete. A clause ends at . ! ? ; : (or a comma once it is long enough to breathe) when
whitespace follows: a full stop straight after a digit may be a decimal point, and the next
token settles it. What is left when the stream ends is the last clause.

The first clause is special: the user is waiting for the first sound, so it also ends at any
comma, or after `first_clause_words` words, whichever comes first (at once where its last
word is one no token continues, "of", "the", "is": WHOLE_WORDS). Later clauses are cut only
at punctuation, which reads more naturally.

Phonemizing a clause with Piper's espeak-ng takes well under a millisecond, so it runs inline.
Each request speaks with the voice it names (`request.voice`, see `pipeline/voices.py`): the
Talker phonemizes with that voice's espeak-ng voice and phoneme map, and tells Code2Wav which
voice the ids are for in each chunk's metadata ("voice": the package).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING

from ...requests import RequestTracker, TracksRequests
from ...types import Chunk, CodecCodes, End, ErrorChunk, StageInput, StreamEngine, TextDelta
from ...voices import CATALOGUE, VoiceCatalogue
from .voice import VOICE_PACKAGE, EngineVoices, clause_phoneme_ids

if TYPE_CHECKING:
    from piper import PiperVoice

ENDS = frozenset(".!?;:\n")
CLOSERS = frozenset("\"')]\u201d\u2019")
COMMA_AFTER = 40
"""A comma ends a clause once the clause has at least this many characters."""
FIRST_CLAUSE_WORDS = 3
"""The first clause ends after this many words even without punctuation (0: never). Fewer
words are heard sooner (each is a Thinker token or two, 55-77 ms on a small CPU), at the
cost of a phrase break after them: three put the cascade's first audio under 900 ms on a
slower machine where four did not (loadtest.voice_bench)."""


_WHOLE = """a an the of to in on at for from with by about as and or but if so than that this
these those there here is are was were be been am has have had do does did will would can could
should may might must not no it its it's i i'm you you're we they he she his her their our your
my me us them what which who when where why how all some any each more most very just also only"""
WHOLE_WORDS = frozenset(_WHOLE.split())
"""Words that no token continues (SmolLM2 writes "often", "into", "there's" as tokens of their
own): a first clause whose last word is one of them is cut as soon as that word arrives,
not one token later when the next word's leading space shows that the word has ended."""


class ClauseSplitter:
    """Cuts streamed text into clauses; `feed` returns the clauses that just completed."""

    def __init__(
        self, comma_after: int = COMMA_AFTER, first_clause_words: int = FIRST_CLAUSE_WORDS
    ) -> None:
        self.comma_after = comma_after
        self.first_clause_words = first_clause_words
        self._buffer = ""
        self._scanned = 0
        self._emitted = False

    def _first_clause_full(self, start: int, i: int) -> bool:
        """Whether the first clause has enough words to be spoken now (cut at buffer[i])."""
        if self._emitted or not self.first_clause_words or not self._buffer[i].isspace():
            return False
        return len(self._buffer[start:i].split()) >= self.first_clause_words

    def feed(self, text: str) -> list[str]:
        self._buffer += text
        clauses: list[str] = []
        start, i = 0, self._scanned
        while i < len(self._buffer):
            char = self._buffer[i]
            if self._first_clause_full(start, i):
                clauses.append(self._buffer[start:i].strip())
                self._emitted = True
                start = i
                i += 1
                continue
            comma_after = self.comma_after if self._emitted else 0
            if char in ENDS or (char == "," and i - start >= comma_after):
                end = i
                while end + 1 < len(self._buffer) and self._buffer[end + 1] in CLOSERS:
                    end += 1
                if end + 1 == len(self._buffer):
                    break  # undecided until the next text shows what follows
                if self._buffer[end + 1].isspace():
                    if clause := self._buffer[start : end + 1].strip():
                        clauses.append(clause)
                        self._emitted = True
                    start = end + 1
                i = end + 1
            else:
                i += 1
        if self._first_clause_whole(start):
            clauses.append(self._buffer[start:].strip())
            self._emitted = True
            start = i = len(self._buffer)
        self._buffer = self._buffer[start:]
        self._scanned = i - start
        return clauses

    def _first_clause_whole(self, start: int) -> bool:
        """Whether the first clause has its words already, the last a whole word by itself
        (WHOLE_WORDS): then it need not wait for the next one to begin."""
        if self._emitted or not self.first_clause_words or self._buffer[-1:].isspace():
            return False
        words = self._buffer[start:].split()
        return len(words) >= self.first_clause_words and words[-1].lower() in WHOLE_WORDS

    def flush(self) -> str:
        rest, self._buffer, self._scanned = self._buffer.strip(), "", 0
        return rest


class TalkerEngine(TracksRequests, StreamEngine):
    """Streams one CodecCodes (phoneme ids, with the clause text and sample rate) per clause."""

    name = "cascade.talker"

    def __init__(
        self,
        *,
        voice_package: str = VOICE_PACKAGE,
        comma_after: int = COMMA_AFTER,
        first_clause_words: int = FIRST_CLAUSE_WORDS,
        catalogue: VoiceCatalogue = CATALOGUE,
    ):
        self.voice_package = voice_package
        self.comma_after = comma_after
        self.first_clause_words = first_clause_words
        self._voices = EngineVoices(voice_package, catalogue)
        self._started = False
        self._requests: RequestTracker[None] = RequestTracker()

    async def start(self) -> None:
        await self._voices.start()
        self._started = True

    async def generate(self, request_id: str, inputs: StageInput) -> AsyncGenerator[Chunk, None]:
        if not self._started:
            yield ErrorChunk(message="the talker was not started", stage=self.name)
            return
        if inputs.request.output_text_only:
            yield End()  # no speech wanted: the graph unblocks the upstream when we stop reading
            return
        splitter = ClauseSplitter(self.comma_after, self.first_clause_words)
        with self._requests.track(request_id):
            package, voice = await self._voices.for_name(inputs.request.voice)
            async for chunk in inputs.chunks:
                if self._requests.aborted(request_id):
                    return
                if isinstance(chunk, ErrorChunk):
                    yield chunk
                    return
                if isinstance(chunk, End):
                    break
                if isinstance(chunk, TextDelta) and chunk.kind == "output":
                    for clause in splitter.feed(chunk.text):
                        if (codes := _codes(voice, package, clause)) is not None:
                            yield codes
            rest = splitter.flush()
            if rest and (codes := _codes(voice, package, rest)) is not None:
                yield codes
            if not self._requests.aborted(request_id):
                yield End()


def _codes(voice: PiperVoice, package: str, clause: str) -> CodecCodes | None:
    ids = clause_phoneme_ids(voice, clause)
    if not len(ids):
        return None
    rate = int(voice.config.sample_rate)
    return CodecCodes(codes=ids, metadata={"text": clause, "sample_rate": rate, "voice": package})
