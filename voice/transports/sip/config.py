"""Settings of the SIP bridge (`SipServer`); the agent's ``sip:`` section."""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import Field, model_validator

from voice.settings import Section


class SipConfig(Section):
    bind: str = Field("127.0.0.1:5070", description="HOST:PORT for SIP over UDP ([::1]:5070 for IPv6)")
    rtp_ports: tuple[int, int] = (20000, 20999)
    max_calls: int | None = Field(
        None, ge=1, le=1000,
        description="this bridge's own cap on calls, below the agent's shared agent.max_calls; None: the agent's only")
    allow: list[str] = Field(default_factory=lambda: ["127.0.0.0/8", "::1/128"], description="source CIDRs")
    auth_user: str | None = None
    auth_password: str | None = None
    realm: str = "voice-agent"
    codecs: list[Literal["PCMU", "PCMA"]] = Field(default_factory=lambda: ["PCMU", "PCMA"], min_length=1)
    public_address: str | None = Field(None, description="IP to advertise in SDP/Contact (behind NAT)")
    answer_delay_ms: int = Field(0, ge=0, le=60000, description="ring this long before answering")
    jitter_ms: int = Field(
        60, ge=0, le=1000, description="receive jitter buffer depth (adaptive: the most it grows to)")
    jitter_min_ms: int | None = Field(
        20, ge=0, le=1000,
        description="adaptive receive buffer: starts this deep, one frame more per packet that came too late, up to "
                    "jitter_ms; None: fixed at jitter_ms")
    rtp_timeout_s: float = Field(60.0, ge=0, le=3600, description="hang up after this long without RTP (0: never)")
    transfer_timeout_s: float = Field(
        30.0, gt=0, le=600, description="how long a transfer (REFER) may wait for the target to answer before the "
                                        "call goes on with the agent")

    @model_validator(mode="after")
    def _check(self) -> SipConfig:
        host, sep, port = self.bind.rpartition(":")
        if not sep or not port.isdigit() or not 0 <= int(port) <= 65535 or not host:
            raise ValueError(f"bind must be HOST:PORT, got {self.bind!r}")
        if self.jitter_min_ms is not None and self.jitter_min_ms > self.jitter_ms:
            raise ValueError(f"jitter_min_ms ({self.jitter_min_ms}) must not exceed jitter_ms ({self.jitter_ms})")
        lo, hi = self.rtp_ports
        if not 1024 <= lo < hi <= 65535:
            raise ValueError(f"rtp_ports must be LOW < HIGH within 1024-65535, got {lo}-{hi}")
        for cidr in self.allow:
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise ValueError(f"allow: {cidr!r} is not an IP network (CIDR)") from None
        if self.public_address is not None:
            try:
                ipaddress.ip_address(self.public_address)
            except ValueError:
                raise ValueError(f"public_address must be an IP address, got {self.public_address!r}") from None
        if (self.auth_user is None) != (self.auth_password is None):
            raise ValueError("auth_user and auth_password go together")
        return self
