"""SIP bridge: phone callers reach the agent over SIP/UDP with RTP G.711 audio.

    SipServer (server.py)      UDP socket, validation, allowlist, auth, routing
      └─ SipCall (call.py)     one dialog: answer, re-INVITE/hold, DTMF INFO, BYE, its CallSession
           └─ CallMedia        RTP port, receive path (jitter.py, dtmf.py) and the paced sender
              (media.py)       (sender.py, output.py); G.711 in g711.py, packets in rtp.py
"""

from .server import SipServer

__all__ = ["SipServer"]
