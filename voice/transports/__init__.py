"""Transports: the wire between callers and a call session (replay, SIP, WebRTC, LiveKit)."""
