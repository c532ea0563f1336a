"""The outbound track's own Opus: mono packets that decode to the answer, silence from a
cached packet once the encoder has gone quiet, and Opus only when the answer says so."""

from __future__ import annotations

import fractions

import av
import numpy as np
import numpy.typing as npt

from loadtest.speech import speak
from realtime.transports.webrtc.opus_out import (
    FRAME_SAMPLES,
    TAIL_FRAMES,
    OpusPacketizer,
    silent_packet,
)
from realtime.transports.webrtc.outbound import OUTPUT_RATE, OutboundAudioTrack, sends_opus
from sessions.playout import PlayoutBuffer

SILENCE = np.zeros(FRAME_SAMPLES, dtype=np.int16)


def tone(frames: int, hz: float = 440.0) -> npt.NDArray[np.int16]:
    t = np.arange(frames * FRAME_SAMPLES) / OUTPUT_RATE
    pcm: npt.NDArray[np.int16] = np.rint(10_000 * np.sin(2 * np.pi * hz * t)).astype(np.int16)
    return pcm


def decode(packets: list[bytes]) -> npt.NDArray[np.int16]:
    """What a peer hears: aiortc's decoder setup (stereo s16), left channel."""
    codec = av.CodecContext.create("libopus", "r")
    assert isinstance(codec, av.AudioCodecContext)
    codec.format, codec.layout, codec.sample_rate = "s16", "stereo", OUTPUT_RATE
    out = []
    for i, data in enumerate(packets):
        packet = av.Packet(data)
        packet.pts, packet.time_base = i * FRAME_SAMPLES, fractions.Fraction(1, OUTPUT_RATE)
        for frame in codec.decode(packet):
            out.append(frame.to_ndarray().reshape(-1, 2)[:, 0])
    return np.concatenate(out)


def test_voiced_frames_decode_to_the_answer_with_their_pts() -> None:
    opus = OpusPacketizer()
    pcm = tone(25)
    packets = []
    for i in range(25):
        pts = i * FRAME_SAMPLES
        packet = opus.packet(pcm[pts : pts + FRAME_SAMPLES], pts, silent=False)
        assert packet.pts == pts and packet.time_base == fractions.Fraction(1, OUTPUT_RATE)
        packets.append(bytes(packet))
    heard = decode(packets).astype(np.float64)
    # The codec delays the sound by its look-ahead: line the two up first.
    sent = pcm.astype(np.float64)[4800:19200]
    best = max(
        range(0, 700),
        key=lambda lag: float(np.dot(sent, heard[4800 + lag : 19200 + lag])),
    )
    got = heard[4800 + best : 19200 + best]
    assert np.corrcoef(sent, got)[0, 1] > 0.99
    assert abs(np.sqrt(np.mean(got**2)) / np.sqrt(np.mean(sent**2)) - 1) < 0.1
    assert opus.encoded == 25


def test_silence_after_speech_costs_a_cached_packet_once_its_tail_is_coded() -> None:
    """After speech libopus codes silence as 55-byte frames for ever: the packetizer codes
    the speech's tail, then sends the settled 3-byte packet without coding, and the peer
    hears the speech, silence, and the speech again."""
    opus = OpusPacketizer()
    speech = speak("What is the weather like in Boston?", rate=OUTPUT_RATE)
    voiced = np.concatenate([speech, np.zeros(-len(speech) % FRAME_SAMPLES, np.int16)])
    frames = voiced.reshape(-1, FRAME_SAMPLES)
    packets = [bytes(opus.packet(f, 0, silent=False)) for f in frames]
    sizes = [len(bytes(opus.packet(SILENCE, 0, silent=True))) for _ in range(40)]
    assert min(sizes[:TAIL_FRAMES]) > 3 and set(sizes[TAIL_FRAMES:]) == {3}
    assert opus.encoded == len(frames) + TAIL_FRAMES  # then no coding at all
    packets += [silent_packet()] * 40
    packets += [bytes(opus.packet(f, 0, silent=False)) for f in frames]  # sound again: coded
    assert opus.encoded == 2 * len(frames) + TAIL_FRAMES
    heard = decode(packets).astype(np.float64)
    n = len(voiced)
    gap = heard[n + 10 * FRAME_SAMPLES : n + 40 * FRAME_SAMPLES]
    assert np.abs(gap).max() < 50  # the silence decodes to silence
    again = heard[n + 40 * FRAME_SAMPLES :]
    lag = max(range(0, 700), key=lambda k: float(np.dot(voiced[:-700], again[k : k + n - 700])))
    assert np.corrcoef(voiced[:-700], again[lag : lag + n - 700])[0, 1] > 0.95


async def test_an_opus_track_hands_aiortc_packets_and_reports_the_edges() -> None:
    playout = PlayoutBuffer(OUTPUT_RATE)
    edges: list[str] = []
    track = OutboundAudioTrack(playout, lambda: edges.append("start"), lambda: edges.append("stop"))
    track.encode_opus()
    try:
        await playout.write(tone(3), OUTPUT_RATE)
        packets = [await track.recv() for _ in range(12)]
    finally:
        track.stop()
    opus = [p for p in packets if isinstance(p, av.Packet)]
    assert len(opus) == len(packets)
    assert [p.pts for p in opus] == [FRAME_SAMPLES * i for i in range(12)]
    sizes = [len(bytes(p)) for p in opus]
    assert min(sizes[:3]) > 3 and sizes[-1] <= 3  # the answer, then cached silence
    assert edges == ["start", "stop"] and track.frames_sent == 12


ANSWER = """v=0
o=- 1 1 IN IP4 127.0.0.1
s=-
t=0 0
m=audio 9 UDP/TLS/RTP/SAVPF {payloads}
c=IN IP4 127.0.0.1
a=mid:0
a=sendrecv
a=rtcp-mux
{rtpmaps}
"""


def answer(*codecs: tuple[int, str]) -> str:
    return ANSWER.format(
        payloads=" ".join(str(pt) for pt, _ in codecs),
        rtpmaps="\n".join(f"a=rtpmap:{pt} {name}" for pt, name in codecs),
    ).replace("\n", "\r\n")


def test_opus_only_when_the_answer_sends_opus_first() -> None:
    assert sends_opus(answer((111, "opus/48000/2"), (0, "PCMU/8000")))
    assert not sends_opus(answer((0, "PCMU/8000"), (111, "opus/48000/2")))
    assert not sends_opus(answer((8, "PCMA/8000")))


def test_a_new_calls_silence_is_the_settled_packet_and_codes_nothing() -> None:
    """A fresh encoder fed zeros codes 55-byte frames until it has heard sound: a call's
    silence before its first answer is the settled 3-byte packet instead."""
    opus = OpusPacketizer()
    packets = [bytes(opus.packet(SILENCE, i * FRAME_SAMPLES, silent=True)) for i in range(50)]
    assert set(packets) == {silent_packet()} and len(silent_packet()) == 3
    assert opus.encoded == 0
    heard = decode([*packets, *(bytes(opus.packet(f, 0, False)) for f in tone(5).reshape(5, -1))])
    assert np.abs(heard[: 50 * FRAME_SAMPLES]).max() == 0  # silence decodes to silence
    assert opus.encoded == 5
