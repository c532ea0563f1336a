"""The caller's audio handed to the session as soon as each packet is complete.

aiortc gives every audio receiver a jitter buffer that releases a frame only once four
later frames have arrived (`prefetch=4`): 80 ms of delay on every inbound frame, meant to
smooth playback. The server plays nothing back; it runs voice detection, whose every
decision (a barge-in, the end of a turn) came 80 ms late. With no prefetch the buffer
still puts packets back in order and still waits for a missing one (up to its capacity),
so reordering and loss are handled as before; only the fixed delay goes, but for the one
frame it needs to see that a frame is complete (the next packet's timestamp): 20 ms.

Like guards.py and inline_decode.py this stands on aiortc's internals: it checks them and
leaves a receiver it does not recognise as it is.
"""

from __future__ import annotations

from aiortc import RTCRtpReceiver
from aiortc.jitterbuffer import JitterBuffer

_BUFFER = "_RTCRtpReceiver__jitter_buffer"
_KIND = "_RTCRtpReceiver__kind"


def release_at_once(receiver: RTCRtpReceiver) -> bool:
    """Drop the fixed prefetch of `receiver`'s audio jitter buffer; False (nothing changed)
    for a video receiver, or an aiortc whose receiver is not the one we know."""
    buffer = getattr(receiver, _BUFFER, None)
    if getattr(receiver, _KIND, None) != "audio" or not isinstance(buffer, JitterBuffer):
        return False
    if not isinstance(getattr(buffer, "_prefetch", None), int):
        return False
    buffer._prefetch = 0
    return True
