"""The close reasons a SIP call's media side gives its session when the SIP side ended it.

A reason that starts with `SIP_ENDED` came from the SIP dialog itself (the caller's BYE, a
CANCEL, a transfer that completed): the call is over on the wire already, so no BYE is sent
back. Apart from both the calls registry (`media_calls.py`) and GPT-Live's SIP call
(`live_sip_call.py`), which the registry builds and which names its own reasons with it.
"""

from __future__ import annotations

SIP_ENDED = "sip:"
"""Close reasons starting so came from the SIP side: no BYE back."""
SIP_BYE = f"{SIP_ENDED}bye"
"""The close reason of a call the caller hung up (a BYE, as the UAS names it)."""
SIP_TRANSFERRED = f"{SIP_ENDED}transferred"
"""The close reason of a call the app transferred (its refer), once the target answered."""
